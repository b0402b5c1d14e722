"""Bad input through the Python API: the documented error class, and nothing written."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden._json import MAX_PAYLOAD_BYTES

from . import cli_app
from .conftest import FAST
from .helpers import is_sqlite, snapshot, sql

NOT_JSON: list[Any] = [
    {1, 2},
    object(),
    {"when": object()},
    [1, {2}],
    {1: "a key that is not a string"},
    2**64,
    b"bytes",
]


def test_submit_refuses_bad_input_before_writing_anything(store_url: str) -> None:
    app = cli_app.build(store_url)
    try:
        with pytest.raises(sw.UnknownNameError, match=r"unknown workflow 'nope' \(declared: "):
            app.submit("nope", {})
        for value in NOT_JSON:
            with pytest.raises(sw.PayloadError, match="the task input is not JSON-serialisable"):
                app.submit("process", value)
        with pytest.raises(sw.PayloadError, match=f"over the limit of {MAX_PAYLOAD_BYTES}"):
            app.submit("process", "x" * (MAX_PAYLOAD_BYTES - 1))  # 2 quotes: 1 byte over
        assert app.tasks() == []
        assert snapshot(store_url).tasks == 0
        # The limit itself is allowed, and the value comes back whole.
        at_limit = "x" * (MAX_PAYLOAD_BYTES - 2)
        assert app.submit("process", at_limit, task_id="at-limit") == "at-limit"
        assert app.status("at-limit").input == at_limit
    finally:
        app.close()


async def test_a_refused_submission_rolls_back_the_applications_own_rows(store_url: str) -> None:
    app = cli_app.build(store_url)
    mark = "?" if is_sqlite(store_url) else "%s"
    try:
        async with app.transaction() as tx:
            await tx.execute("CREATE TABLE cli_orders (order_id TEXT PRIMARY KEY)")
        for bad in ({"items": {"a set"}}, "x" * MAX_PAYLOAD_BYTES):
            with pytest.raises(sw.PayloadError):
                async with app.transaction() as tx:
                    await tx.execute(f"INSERT INTO cli_orders VALUES ({mark})", ("o-1",))
                    await tx.submit("process", bad, task_id="o-1")
        with pytest.raises(sw.UnknownNameError):
            async with app.transaction() as tx:
                await tx.execute(f"INSERT INTO cli_orders VALUES ({mark})", ("o-1",))
                await tx.submit("nope", {}, task_id="o-1")
        assert await app.tasks_async() == []
    finally:
        await app.aclose()
    assert sql(store_url, "SELECT count(*) FROM cli_orders") == [(0,)]


def test_nan_is_refused_rather_than_stored_as_null(sqlite_url: str) -> None:
    app = cli_app.build(sqlite_url)
    try:
        with pytest.raises(sw.PayloadError):
            app.submit("process", {"amount": float("nan")}, task_id="nan")
    finally:
        app.close()


async def test_a_step_on_an_operation_no_agent_of_the_app_declares(store_url: str) -> None:
    """ctx.step takes an Operation object, so no step can name an operation that does not
    exist; but it can name one of an agent the App never declared (another App's, or one
    left out). No worker would serve it: the task fails at once with a clear error, no step
    is recorded and nothing of the operation runs."""
    app = sw.App("ghosts", store=store_url)
    app.agent("desk")
    ghost = sw.Agent("ghost")  # not declared on the app
    calls: list[Any] = []

    @ghost.operation
    async def haunt(call: sw.Call, value: Any) -> None:
        calls.append(value)

    @app.workflow(complete_within=timedelta(seconds=30), max_failures=1)
    async def spooky(ctx: sw.Context, value: Any) -> Any:
        return await ctx.step(ghost.haunt, value)

    worker = sw.Worker(app, FAST)
    running = asyncio.create_task(worker.run())
    try:
        await app.submit_async(spooky, 1, task_id="t")
        with pytest.raises(sw.TaskFailed, match=r"'ghost\.haunt' is not one of the App's"):
            await app.result_async("t", timeout=20)
        view = await app.show_async("t")
    finally:
        worker.stop.set()
        await asyncio.wait_for(running, 30)
        await app.aclose()
    assert calls == []
    assert view.steps == []
    assert view.task.process_state == sw.TaskState.ERROR
    assert [e.kind for e in view.events] == ["alert"]
