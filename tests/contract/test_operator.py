"""Operator control on each store: resubmit, skip, pause, resume, cancel, compensate."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import stepwarden as sw

from ..support.apps import Saga, finish
from ..support.worker import running


async def test_retry_after_the_fault_is_fixed_keeps_the_completed_steps(store_url: str) -> None:
    saga = Saga(store_url, on_failure="stop")
    saga.fail["charge"] = sw.PermanentError("card declined")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        assert await finish(saga, "o1") == sw.TaskState.ERROR
        del saga.fail["charge"]  # the operator fixes the cause
        state = await saga.app.retry_async("o1", reason="card replaced")
        assert state == sw.TaskState.PENDING
        assert await saga.app.result_async("o1", timeout=20) == "done"
    view = await saga.app.show_async("o1")
    await saga.app.aclose()
    assert saga.effects == Counter(reserve=1, charge=1, ship=1)  # reserve not run again
    charge = view.steps[1]
    assert (charge.state, charge.attempt, charge.idempotency_key) == (
        sw.StepState.COMPLETED,
        2,
        "o1/2",
    )
    assert view.task.failure_count == 0
    [op] = [e for e in view.events if e.kind == "operator"]
    assert op.detail["action"] == "retry" and op.detail["reason"] == "card replaced"
    assert (op.detail["from"], op.detail["to"]) == ("error", "pending")
    assert op.detail["by"]


async def test_a_refused_action_changes_nothing(store_url: str) -> None:
    saga = Saga(store_url)
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        assert await saga.app.result_async("o1", timeout=20) == "done"
    with pytest.raises(sw.ActionRefused, match="cannot retry a task that is processed"):
        await saga.app.retry_async("o1")
    with pytest.raises(sw.TaskNotFound):
        await saga.app.pause_async("nope")
    with pytest.raises(sw.ConfigurationError, match="unknown action"):
        await saga.app.operate_async("explode", ["o1"])
    view = await saga.app.show_async("o1")
    await saga.app.aclose()
    assert view.task.process_state == sw.TaskState.PROCESSED
    assert [e for e in view.events if e.kind == "operator"] == []


async def test_a_paused_task_waits_until_resumed(store_url: str) -> None:
    saga = Saga(store_url)
    await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
    assert await saga.app.pause_async("o1", reason="fraud check") == sw.TaskState.PAUSED
    async with running(saga.app):
        # The worker runs a task submitted later and leaves the paused one alone...
        await saga.app.submit_async(saga.order, {"id": 2}, task_id="o2")
        assert await saga.app.result_async("o2", timeout=20) == "done"
        assert (await saga.app.status_async("o1")).process_state == sw.TaskState.PAUSED
        assert saga.effects == Counter(reserve=1, charge=1, ship=1)
        # ...until the operator resumes it.
        assert await saga.app.resume_async("o1") == sw.TaskState.PENDING
        assert await saga.app.result_async("o1", timeout=20) == "done"
    await saga.app.aclose()


async def test_skip_completes_a_stuck_step_with_the_operators_result(store_url: str) -> None:
    saga = Saga(store_url, within=30)
    saga.hang.add("charge")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        store = await saga.app.store()
        async with asyncio.timeout(20):
            while True:
                steps = await store.get_steps("o1")
                if len(steps) == 2:
                    break
                await asyncio.sleep(0.02)
        await saga.app.skip_async("o1", 2, "charged by phone", reason="gateway down")
        assert await saga.app.result_async("o1", timeout=20) == "done"
    view = await saga.app.show_async("o1")
    await saga.app.aclose()
    assert view.steps[1].result == "charged by phone"
    assert saga.effects == Counter(reserve=1, ship=1)


async def test_cancel_and_cancel_with_compensation(store_url: str) -> None:
    saga = Saga(store_url)
    saga.fail["ship"] = sw.PermanentError("no courier")
    await saga.app.submit_async(saga.order, {"id": 1}, task_id="pending")
    assert await saga.app.cancel_async("pending") == sw.TaskState.CANCELLED
    saga_stop = Saga(store_url, on_failure="stop")
    saga_stop.fail["ship"] = sw.PermanentError("no courier")
    async with running(saga_stop.app):
        await saga_stop.app.submit_async(saga_stop.order, {"id": 2}, task_id="failed")
        assert await finish(saga_stop, "failed") == sw.TaskState.ERROR
        # The operator decides to undo it after all.
        state = await saga_stop.app.cancel_async("failed", compensate=True, reason="refund")
        assert state == sw.TaskState.COMPENSATING
        assert await finish(saga_stop, "failed") == sw.TaskState.COMPENSATED
    await saga_stop.app.aclose()
    assert saga_stop.effects == Counter(reserve=1, charge=1, refund=1, release=1)
    with pytest.raises(sw.TaskFailed, match="cancelled"):
        await saga.app.result_async("pending", timeout=1)
    await saga.app.aclose()


async def test_retry_a_failed_compensation(store_url: str) -> None:
    saga = Saga(store_url)
    saga.fail["ship"] = sw.PermanentError("no courier")
    saga.fail["refund"] = sw.PermanentError("refunds are closed")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        assert await finish(saga, "o1") == sw.TaskState.COMPENSATION_FAILED
        del saga.fail["refund"]
        assert await saga.app.retry_async("o1") == sw.TaskState.COMPENSATING
        assert await finish(saga, "o1") == sw.TaskState.COMPENSATED
    await saga.app.aclose()
    assert saga.effects == Counter(reserve=1, charge=1, refund=1, release=1)


async def test_bulk_by_filter_with_a_dry_run_first(store_url: str) -> None:
    saga = Saga(store_url, on_failure="stop")
    saga.fail["charge"] = sw.PermanentError("card declined")
    async with running(saga.app):
        for i in range(3):
            await saga.app.submit_async(saga.order, {"id": i}, task_id=f"o{i}")
        for i in range(3):
            assert await finish(saga, f"o{i}") == sw.TaskState.ERROR
        preview = await saga.app.operate_async(
            "retry", state="error", workflow="order", dry_run=True
        )
        assert [(o.task_id, o.applied, o.after) for o in preview] == [
            (f"o{i}", False, sw.TaskState.PENDING) for i in range(3)
        ]
        assert {t.process_state for t in await saga.app.tasks_async()} == {sw.TaskState.ERROR}
        del saga.fail["charge"]
        done = await saga.app.operate_async("retry", state="error", reason="gateway fixed")
        assert [o.applied for o in done] == [True, True, True]
        for i in range(3):
            assert await saga.app.result_async(f"o{i}", timeout=20) == "done"
    await saga.app.aclose()


async def test_skip_on_a_task_in_error_leaves_it_in_error_until_retry(store_url: str) -> None:
    """docs/howto/operating.md: `skip` marks the step completed with the operator's result
    and leaves the task where it is; a task in error stays in error until `retry`, which
    then goes on past the skipped step."""
    saga = Saga(store_url, on_failure="stop")
    saga.fail["charge"] = sw.PermanentError("card declined")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        assert await finish(saga, "o1") == sw.TaskState.ERROR
        state = await saga.app.skip_async("o1", 2, "charged by phone", reason="paid by phone")
        assert state == sw.TaskState.ERROR
        view = await saga.app.show_async("o1")
        assert view.task.process_state == sw.TaskState.ERROR
        assert (view.steps[1].state, view.steps[1].result) == (
            sw.StepState.COMPLETED,
            "charged by phone",
        )
        assert await saga.app.retry_async("o1") == sw.TaskState.PENDING
        assert await saga.app.result_async("o1", timeout=20) == "done"
    await saga.app.aclose()
    assert saga.effects == Counter(reserve=1, ship=1)  # the charge is not run again
