"""What a worker logs at the default level about the ordinary course of its work: a retry of
an operation says so in one line, at most one such line a while per operation (those between
at debug, counted in the next); a task woken from a timer is not worth a line but at debug."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden import _logs, runner

from ..support.worker import running


def _lines(caplog: pytest.LogCaptureFixture, fragment: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if fragment in r.getMessage()]


async def test_a_retry_is_one_info_line_and_those_soon_after_are_at_debug(
    sqlite_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # However slow the machine, every retry of this test comes within one period.
    monkeypatch.setattr(runner, "RETRY_LOG_EVERY", 3600.0)
    caplog.set_level(logging.DEBUG, logger="stepwarden")
    app = sw.App("flaky", store=sqlite_url)
    tries: dict[str, int] = {}
    payments = app.agent("payments", retry=sw.Retry(max_attempts=5, initial=0.001, maximum=0.01))

    @payments.operation
    async def charge(call: sw.Call, order: Any) -> str:
        tries[call.task_id] = tries.get(call.task_id, 0) + 1
        if tries[call.task_id] < 3:
            raise ConnectionError("the bank did not answer")
        return "charged"

    @app.workflow
    async def pay(ctx: sw.Context, order: Any) -> Any:
        return await ctx.step(payments.charge, order)

    try:
        async with running(app):
            for task_id in ("o-1", "o-2"):
                await app.submit_async(pay, {}, task_id=task_id)
            for task_id in ("o-1", "o-2"):
                assert await app.result_async(task_id, timeout=30) == "charged"
    finally:
        await app.aclose()
    retried = _lines(caplog, "retrying in")
    assert len(retried) == 4  # two retries of each task
    [said] = [r for r in retried if r.levelno == logging.INFO]
    assert said.name == "stepwarden.agent"
    assert "payments.charge for o-" in said.getMessage()
    assert "try 1 failed (ConnectionError: the bank did not answer), retrying in" in (
        said.getMessage()
    )
    assert all(r.levelno == logging.DEBUG for r in retried if r is not said)


def test_the_line_after_a_quiet_period_counts_those_held_back() -> None:
    now = [0.0]
    quiet = _logs.Quiet(10.0, clock=lambda: now[0])
    assert quiet.admit("payments.charge") == 0
    assert quiet.admit("payments.charge") is None
    assert quiet.admit("payments.charge") is None
    assert quiet.admit("shipping.ship") == 0  # another kind has its own period
    now[0] = 10.0
    assert quiet.admit("payments.charge") == 2
    assert quiet.admit("payments.charge") is None


async def test_a_task_woken_from_its_timer_is_logged_at_debug(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="stepwarden")
    app = sw.App("naps", store=sqlite_url)

    @app.workflow
    async def nap(ctx: sw.Context, unused: None) -> str:
        await ctx.sleep(timedelta(milliseconds=50))
        return "rested"

    try:
        async with running(app):
            task_id = await app.submit_async(nap, None)
            assert await app.result_async(task_id, timeout=30) == "rested"
    finally:
        await app.aclose()
    [woke] = _lines(caplog, f"task {task_id}: woke")
    assert woke.levelno == logging.DEBUG
    assert "it waited for timer" in woke.getMessage()
