"""Changing a workflow's code while its tasks run, with `ctx.patched` and
`ctx.deprecate_patch`, on each store: a task recorded by the old code replays the old path, a
task that had not got that far (or started after the change) takes the new one, and keeps
taking it on every replay."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw

from ..support.poll import until
from ..support.worker import RESUME, running

STOP_NOW = dataclasses.replace(RESUME, drain_timeout=0.2)


class Shop:
    """One release of an order workflow's code: `version` 1 reserves then charges; 2 adds a
    fraud check between them behind `ctx.patched("fraud-check")`; 3 keeps only the new path
    (`ctx.deprecate_patch`). Calls block while their gate (per operation) is closed."""

    calls: Counter[str]

    def __init__(self, store_url: str, version: int, calls: Counter[str]) -> None:
        self.app = sw.App("shop", store=store_url)
        self.calls = calls
        self.gates: dict[str, asyncio.Event] = {}
        svc = self.app.agent("svc")

        async def called(name: str, order: str) -> str:
            gate = self.gates.get(name)
            if gate is not None:
                await gate.wait()
            self.calls[f"{name}:{order}"] += 1
            return f"{name} {order}"

        @svc.operation
        async def reserve(call: sw.Call, order: str) -> str:
            return await called("reserve", order)

        @svc.operation
        async def fraud(call: sw.Call, order: str) -> str:
            return await called("fraud", order)

        @svc.operation
        async def charge(call: sw.Call, order: str) -> str:
            return await called("charge", order)

        async def v1(ctx: sw.Context, order: str) -> list[str]:
            return [await ctx.step(reserve, order), await ctx.step(charge, order)]

        async def v2(ctx: sw.Context, order: str) -> list[str]:
            done = [await ctx.step(reserve, order)]
            if ctx.patched("fraud-check"):
                done.append(await ctx.step(fraud, order))
            done.append(await ctx.step(charge, order))
            return done

        async def v3(ctx: sw.Context, order: str) -> list[str]:
            done = [await ctx.step(reserve, order)]
            ctx.deprecate_patch("fraud-check")
            done.append(await ctx.step(fraud, order))
            done.append(await ctx.step(charge, order))
            return done

        body: Callable[[sw.Context, str], Awaitable[list[str]]] = {1: v1, 2: v2, 3: v3}[version]
        self.order = self.app.workflow(
            body, name="order", complete_within=timedelta(seconds=20), max_failures=3
        )

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())


async def _steps(app: sw.App, task_id: str) -> list[str]:
    view = await app.show_async(task_id)
    return [s.operation for s in sorted(view.steps, key=lambda s: s.seq)]


async def _started(app: sw.App, task_id: str, operation: str) -> None:
    async def recorded() -> bool:
        return operation in await _steps(app, task_id)

    await until(recorded)


@pytest.fixture
def calls() -> Counter[str]:
    return Counter()


async def test_tasks_recorded_by_the_old_code_replay_it_and_new_ones_take_the_patch(
    store_url: str, calls: Counter[str]
) -> None:
    old = Shop(store_url, 1, calls)
    hold_charge, hold_reserve = old.gate("charge"), old.gate("reserve")
    try:
        async with running(old.app, STOP_NOW):
            await old.app.submit_async(old.order, "past", task_id="past")  # reaches charge
            hold_reserve.set()
            await _started(old.app, "past", "charge")
            hold_reserve.clear()
            await old.app.submit_async(old.order, "before", task_id="before")  # at reserve
            await _started(old.app, "before", "reserve")
    finally:
        hold_reserve.set()
        hold_charge.set()
        await old.app.aclose()

    new = Shop(store_url, 2, calls)
    try:
        async with running(new.app, RESUME):
            await new.app.submit_async(new.order, "after", task_id="after")
            results = {t: await new.app.result_async(t, timeout=30) for t in
                       ("past", "before", "after")}  # fmt: skip
        # The task past the patch's place when the code changed goes on down the old path;
        # the one that had not reached it, and the new one, take the new path.
        assert results == {
            "past": ["reserve past", "charge past"],
            "before": ["reserve before", "fraud before", "charge before"],
            "after": ["reserve after", "fraud after", "charge after"],
        }
        assert await _steps(new.app, "past") == ["reserve", "charge"]
        assert await _steps(new.app, "after") == ["reserve", "fraud", "charge"]
        store = await new.app.store()
        assert [(w.kind, w.name, w.position) for w in await store.waits("after")] == [
            ("patch", "fraud-check", "2")
        ]
        assert await store.waits("past") == []
        assert calls["fraud:past"] == 0 and calls["reserve:before"] == 1
    finally:
        await new.app.aclose()


async def test_a_patched_task_replays_the_new_path_and_deprecating_the_patch_keeps_it_going(
    store_url: str, calls: Counter[str]
) -> None:
    """A task that took the patch is stopped mid-way and resumed, first by the same release
    (it takes the new path again, runs no step twice), then by the release that deprecates
    the patch; a task started by that release records no marker."""
    two = Shop(store_url, 2, calls)
    hold = two.gate("charge")
    try:
        async with running(two.app, STOP_NOW):
            await two.app.submit_async(two.order, "x", task_id="x")
            await _started(two.app, "x", "charge")
        async with running(two.app, STOP_NOW):  # replayed by the same code: charge adopted
            await until(lambda: _has_two_runs(two.app, "x"))
    finally:
        hold.set()
        await two.app.aclose()

    three = Shop(store_url, 3, calls)
    try:
        async with running(three.app, RESUME):
            await three.app.submit_async(three.order, "y", task_id="y")
            assert await three.app.result_async("x", timeout=30) == [
                "reserve x", "fraud x", "charge x"
            ]  # fmt: skip
            assert await three.app.result_async("y", timeout=30) == [
                "reserve y", "fraud y", "charge y"
            ]  # fmt: skip
        store = await three.app.store()
        assert [w.kind for w in await store.waits("x")] == ["patch"]
        assert await store.waits("y") == []
        assert calls["reserve:x"] == 1 and calls["fraud:x"] == 1
    finally:
        await three.app.aclose()


async def _has_two_runs(app: sw.App, task_id: str) -> bool:
    return (await app.status_async(task_id)).attempt >= 2


async def test_a_patch_whose_place_holds_another_patch_fails_the_task(
    store_url: str,
) -> None:
    """Two patches swapped at one place: the replay says so (NonDeterminismError) rather
    than take a path the task never took."""
    app = sw.App("shop", store=store_url)
    svc = app.agent("svc")
    gate = asyncio.Event()
    patch = {"name": "a"}

    @svc.operation
    async def work(call: sw.Call, what: str) -> str:
        await gate.wait()
        return what

    @app.workflow(complete_within=timedelta(seconds=20), on_failure="stop")
    async def order(ctx: sw.Context, _: Any) -> Any:
        if ctx.patched(patch["name"]):
            return await ctx.step(work, "patched")
        return None

    try:
        async with running(app, STOP_NOW):
            await app.submit_async(order, None, task_id="t")
            await _started(app, "t", "work")
        patch["name"] = "b"
        gate.set()
        async with running(app, RESUME):
            with pytest.raises(sw.TaskFailed) as failed:
                await app.result_async("t", timeout=30)
        assert failed.value.state == sw.TaskState.ERROR
        assert "patch 'b' but patch 'a' is recorded there" in (failed.value.error or "")
    finally:
        await app.aclose()
