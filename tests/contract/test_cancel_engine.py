"""Cancellation that reaches the call, end to end in one process, on each store: an async
operation whose task is cancelled, paused or compensated gets CancelledError, with
`call.cancelled` saying why; a sync one sees `call.cancelled` and stops; nothing is reported
for the call, and a compensation waits for it to stop (not for its complete_by).

Each runs in one worker with every role, and in two (`workers`): the scheduler and the
supervisor in one, the agent in another that serves it over HTTP, which hears of the cancel
from the server's wake-up stream (or its next poll), asks the server which calls lost their
step, and says there that they stopped."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw

from ..agentserver import Workers


async def until(condition: Callable[[], Any], what: str, timeout: float = 20) -> None:
    """Wait for `condition()` to be true, checking every 10 ms, for at most `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


class Cancellable:
    """A workflow of one long step (60 s to complete), async or sync, undone by `undo`;
    what each call saw, in order."""

    def __init__(self, store_url: str) -> None:
        self.app = sw.App("cancellable", store=store_url)
        self.seen: list[tuple[str, Any]] = []
        self.swallow = False
        self.lock = threading.Lock()
        svc = self.app.agent("svc", retry=sw.Retry(max_attempts=1))

        def note(what: str, detail: Any = None) -> None:
            with self.lock:
                self.seen.append((what, detail))

        self.note = note

        @svc.operation
        async def wait_long(call: sw.Call, spec: dict[str, Any]) -> str:
            note("started", call.attempt)
            if call.attempt > 1:
                return "second attempt"
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                note("cancelled", call.cancelled)
                if self.swallow:
                    return "returned anyway"  # discarded: the call no longer holds its step
                raise
            note("not cancelled")
            return "slept"

        @svc.operation
        def loop_long(call: sw.Call, spec: dict[str, Any]) -> str:
            note("started", call.attempt)
            end = time.monotonic() + 60
            while call.cancelled is None and time.monotonic() < end:
                time.sleep(0.005)
            note("saw cancelled", call.cancelled)
            try:
                call.heartbeat_sync({"still": "here"})
            except sw.StepLost as exc:
                note("heartbeat refused", str(exc))
            note("ended")
            return "stopped early"

        @svc.operation
        def undo(call: sw.Call, spec: dict[str, Any]) -> str:
            note("undo", call.compensates_key)
            return "undone"

        @self.app.workflow(complete_within=timedelta(seconds=120))
        async def long(ctx: sw.Context, spec: dict[str, Any]) -> Any:
            op = loop_long if spec.get("sync") else wait_long
            return await ctx.step(op, spec, complete_within=timedelta(seconds=60), compensate=undo)

        self.workflow = long

    def kinds(self) -> list[str]:
        with self.lock:
            return [k for k, _ in self.seen]

    def detail(self, kind: str) -> Any:
        with self.lock:
            return next(d for k, d in self.seen if k == kind)


async def test_cancel_raises_cancelled_error_in_an_async_operation(
    store_url: str, workers: Workers
) -> None:
    c = Cancellable(store_url)
    async with workers(c.app):
        await c.app.submit_async(c.workflow, {}, task_id="t1")
        await until(lambda: "started" in c.kinds(), "the call to start")
        assert await c.app.cancel_async("t1", reason="not needed") == sw.TaskState.CANCELLED
        await until(lambda: "cancelled" in c.kinds(), "the call to be cancelled")
        store = await c.app.store()
        await until_stopped(store, "t1")
    view = await c.app.show_async("t1")
    await c.app.aclose()
    assert c.detail("cancelled") == "the task is cancelled"
    assert "not cancelled" not in c.kinds()
    [step] = view.steps
    # Nothing was reported for the call (no outcome, no failure), and the store knows it
    # stopped; the step names the instance that held it.
    assert (step.state, step.abandoned, step.tries, step.result) == (
        sw.StepState.FAILED,
        True,
        0,
        None,
    )
    assert step.call_stopped_at is not None and step.locked_by is not None
    assert view.task.process_state == sw.TaskState.CANCELLED
    assert not [e for e in view.events if e.kind == "step_failed"]
    [stopped] = [e for e in view.events if e.kind == "call_stopped"]
    assert stopped.detail["reason"] == "the task is cancelled"


async def until_stopped(store: Any, task_id: str) -> None:
    async def stopped() -> bool:
        return any(s.call_stopped_at is not None for s in await store.get_steps(task_id))

    deadline = time.monotonic() + 20
    while not await stopped():
        assert time.monotonic() < deadline, "the call's stop was never recorded"
        await asyncio.sleep(0.01)


async def test_a_result_returned_after_the_cancel_is_discarded_and_a_pause_lets_it_run_again(
    store_url: str, workers: Workers
) -> None:
    """The operation catches CancelledError and returns anyway: its result is discarded. The
    task was paused: the step waits, and runs again (a new attempt, the same key) when the
    task is resumed."""
    c = Cancellable(store_url)
    c.swallow = True
    async with workers(c.app):
        await c.app.submit_async(c.workflow, {}, task_id="t1")
        await until(lambda: "started" in c.kinds(), "the call to start")
        assert await c.app.pause_async("t1") == sw.TaskState.PAUSED
        await until(lambda: "cancelled" in c.kinds(), "the call to be cancelled")
        store = await c.app.store()

        async def requeued() -> bool:
            [step] = await store.get_steps("t1")
            return step.state == sw.StepState.NOT_STARTED

        deadline = time.monotonic() + 20
        while not await requeued():
            assert time.monotonic() < deadline, "the stopped call's step was not requeued"
            await asyncio.sleep(0.01)
        [step] = await store.get_steps("t1")
        assert (step.attempt, step.result, step.tries) == (1, None, 0)
        assert await c.app.resume_async("t1") == sw.TaskState.PENDING
        assert await c.app.result_async("t1", timeout=20) == "second attempt"
    view = await c.app.show_async("t1")
    await c.app.aclose()
    assert c.detail("cancelled") == "the task is paused"
    [step] = view.steps
    assert (step.state, step.attempt, step.idempotency_key) == (
        sw.StepState.COMPLETED,
        2,
        "t1/1",
    )
    assert view.task.failure_count == 0


@pytest.mark.parametrize("sync", [False, True])
async def test_a_compensation_starts_once_the_cancelled_call_has_stopped(
    store_url: str, sync: bool, workers: Workers
) -> None:
    """cancel --compensate of a task whose step is mid-call (60 s to complete): the call is
    stopped (a sync one sees call.cancelled, and its heartbeats are refused), then the step
    is undone, once, long before its complete_by."""
    c = Cancellable(store_url)
    async with workers(c.app):
        await c.app.submit_async(c.workflow, {"sync": sync}, task_id="t1")
        await until(lambda: "started" in c.kinds(), "the call to start")
        asked = time.monotonic()
        state = await c.app.cancel_async("t1", compensate=True)
        assert state == sw.TaskState.COMPENSATING
        with pytest.raises(sw.TaskFailed) as failed:
            await c.app.result_async("t1", timeout=30)
        assert failed.value.state == sw.TaskState.COMPENSATED
        took = time.monotonic() - asked
    view = await c.app.show_async("t1")
    await c.app.aclose()
    kinds = c.kinds()
    if sync:
        assert c.detail("saw cancelled") == "the task is compensating"
        assert "the task is compensating" in c.detail("heartbeat refused")
        assert kinds == ["started", "saw cancelled", "heartbeat refused", "ended", "undo"]
    else:
        assert c.detail("cancelled") == "the task is compensating"
        assert kinds == ["started", "cancelled", "undo"]
    assert c.detail("undo") == "t1/1"
    print(f"cancel --compensate to compensated: {took:.2f}s")
    forward, undo = view.steps
    assert forward.call_stopped_at is not None and forward.abandoned
    assert undo.compensates == 1 and undo.state == sw.StepState.COMPLETED
    # The undo began after the call stopped, and long before the step's complete_by (60 s).
    assert forward.call_stopped_at <= undo.created_at < forward.complete_by
