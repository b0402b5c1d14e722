"""A value wrapped as Secret reaches its operation and is never shown."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw

from ..contract.test_engine import FAST
from .helpers import invoke

CARD = "4111-1111-1111-1111"


async def test_a_secret_reaches_its_operation_and_is_never_shown(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app = sw.App("vault", store=store_url)
    payments = app.agent("payments")
    seen: list[Any] = []

    @payments.operation
    async def charge(call: sw.Call, order: dict[str, Any]) -> dict[str, Any]:
        seen.append(order["card"])
        if order["card"].reveal() == CARD:
            raise sw.PermanentError("card declined")  # an alert, and the task in error
        return {}

    @app.workflow(complete_within=timedelta(seconds=30), on_failure="stop")
    async def pay(ctx: sw.Context, order: dict[str, Any]) -> Any:
        return await ctx.step(payments.charge, order)

    worker = sw.Worker(app, FAST)
    running = asyncio.create_task(worker.run())
    try:
        order = {"id": 1, "card": sw.Secret(CARD)}
        await app.submit_async(pay, order, task_id="t", reply_to="shop")
        with pytest.raises(sw.TaskFailed):
            await app.result_async("t", timeout=20)
        view = await app.show_async("t")
        store = await app.store()
        messages = [*await store.outbox(task_id="t"), *await store.outbox(channel="alerts")]
    finally:
        worker.stop.set()
        await asyncio.wait_for(running, 30)
        await app.aclose()
    # The operation got the secret, wrapped; the stored input gives it back the same way.
    assert [s.reveal() for s in seen] == [CARD]
    assert view.task.input["card"] == sw.Secret(CARD)
    assert CARD not in repr(view)
    assert messages and CARD not in repr(messages)
    assert CARD not in caplog.text
    for args in (["show", "t"], ["show", "t", "--json"], ["tasks", "--json"]):
        shown = await asyncio.to_thread(invoke, "--store", store_url, *args)
        assert shown.exit_code == 0, shown.output
        assert CARD not in shown.output and "***" in shown.output
