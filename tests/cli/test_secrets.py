"""A value wrapped as Secret reaches its operation and is never shown."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden.store import Store

from ..support.worker import FAST
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
        assert isinstance(store, Store)  # one database: a channel's messages are its own
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


TOKEN = "tok_live_5f2a9c"
OTHER_CARD = "5500-0000-0000-0004"
RECEIPT = "rcpt_7d41e0"


async def test_a_secret_in_a_result_an_alert_or_a_status_message_is_never_shown(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Secrets returned by operations and workflows, and given by the operator's `skip`,
    are masked like those of the input: in the alerts a sink is given, the status messages,
    the error of a failed task, `show` and `tasks`, and the logs."""
    caplog.set_level(logging.DEBUG)
    app = sw.App("vault", store=store_url)
    alerts: list[dict[str, Any]] = []
    alerted = asyncio.Event()

    async def page(alert: dict[str, Any]) -> None:
        alerts.append(alert)
        alerted.set()

    app.add_alert_sink(sw.CallableSink(page, name="pager"))
    bank = app.agent("bank")

    @bank.operation
    async def tokenize(call: sw.Call, card: sw.Secret[str]) -> dict[str, Any]:
        return {"token": sw.Secret(TOKEN), "last4": card.reveal()[-4:]}

    @bank.operation
    async def charge(call: sw.Call, card: sw.Secret[str], token: sw.Secret[str]) -> str:
        if card.reveal() == CARD:
            raise sw.PermanentError("card declined")
        return "charged"

    @app.workflow(complete_within=timedelta(seconds=30), on_failure="stop")
    async def pay(ctx: sw.Context, order: dict[str, Any]) -> Any:
        tokenized = await ctx.step(bank.tokenize, order["card"])
        await ctx.step(bank.charge, order["card"], tokenized["token"])
        return tokenized

    worker = sw.Worker(app, FAST)
    running = asyncio.create_task(worker.run())
    try:
        await app.submit_async(pay, {"card": sw.Secret(CARD)}, task_id="declined", reply_to="s")
        await app.submit_async(pay, {"card": sw.Secret(OTHER_CARD)}, task_id="paid", reply_to="s")
        with pytest.raises(sw.TaskFailed) as failed:
            await app.result_async("declined", timeout=20)
        paid = await app.result_async("paid", timeout=20)
        messages = [m async for m in app.watch("declined")] + [m async for m in app.watch("paid")]
        await asyncio.wait_for(alerted.wait(), 20)
    finally:
        worker.stop.set()
        await asyncio.wait_for(running, 30)
        await app.aclose()
    assert paid == {"token": sw.Secret(TOKEN), "last4": "0004"}
    # The operator completes the declined charge by hand, with a secret receipt.
    skipped = await asyncio.to_thread(
        invoke,
        "--store",
        store_url,
        "skip",
        "declined",
        "--step",
        "2",
        "--result",
        f'{{"receipt": {{"$secret": "{RECEIPT}"}}}}',
    )
    assert skipped.exit_code == 0, skipped.output
    view = await asyncio.to_thread(app.show, "declined")
    app.close()
    assert view.steps[1].result == {"receipt": sw.Secret(RECEIPT)}
    assert {m.kind for m in messages} >= {"received", "step_completed", "error", "processed"}
    assert {a["task_id"] for a in alerts} == {"declined"}
    shown = [str(failed.value), repr(messages), repr(alerts), repr(view), caplog.text]
    for args in (["show"], ["show", "--json"]):
        for task_id in ("declined", "paid"):
            out = await asyncio.to_thread(invoke, "--store", store_url, *args, task_id)
            assert out.exit_code == 0, out.output
            assert "***" in out.output
            shown.append(out.output)
    for args in (["tasks"], ["tasks", "--json"]):
        out = await asyncio.to_thread(invoke, "--store", store_url, *args)
        assert out.exit_code == 0, out.output
        shown.append(out.output)
    for text in shown:
        for secret in (CARD, OTHER_CARD, TOKEN, RECEIPT):
            assert secret not in text


def test_a_secret_given_on_the_command_line_is_stored_for_its_operation_and_never_shown(
    migrated_url: str,
) -> None:
    """On the command line a secret is written as stored: {"$secret": VALUE}."""
    submitted = invoke(
        "--app",
        "tests.cli.cli_app:app",
        "--store",
        migrated_url,
        "submit",
        "process",
        f'{{"card": {{"$secret": "{CARD}"}}, "n": 1}}',
        "--task-id",
        "t",
    )
    assert (submitted.exit_code, submitted.output) == (0, "t\n")
    app = sw.App("reader", store=migrated_url)
    try:
        assert app.status("t").input == {"card": sw.Secret(CARD), "n": 1}
    finally:
        app.close()
    for args in (["show", "t"], ["show", "t", "--json"], ["tasks"], ["tasks", "--json"]):
        shown = invoke("--store", migrated_url, *args)
        assert shown.exit_code == 0, shown.output
        assert CARD not in shown.output
        assert "***" in shown.output or args[0] == "tasks"
