"""Compensation (saga) on each store: a task that cannot succeed undoes what it did."""

from __future__ import annotations

import asyncio
from collections import Counter

import stepwarden as sw

from ..support.apps import Saga, finish
from ..support.worker import running


async def test_a_permanent_error_undoes_the_completed_steps_once(store_url: str) -> None:
    saga = Saga(store_url)
    saga.fail["ship"] = sw.PermanentError("no courier")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        assert await finish(saga, "o1") == sw.TaskState.COMPENSATED
    view = await saga.app.show_async("o1")
    await saga.app.aclose()
    # Undone newest first, each once, each a recorded step naming the step it undoes.
    assert saga.effects == Counter(reserve=1, charge=1, refund=1, release=1)
    assert saga.keys["refund"] == ["o1/2"] and saga.keys["release"] == ["o1/1"]
    undo = [(s.seq, s.name, s.compensates, s.state) for s in view.steps if s.compensates]
    assert undo == [
        (4, "compensate payments.charge", 2, sw.StepState.COMPLETED),
        (5, "compensate inventory.reserve", 1, sw.StepState.COMPLETED),
    ]
    assert "no courier" in (view.task.error or "")
    assert [e.detail["reason"] for e in view.events if e.kind == "alert"] == ["task_error"]


async def test_a_step_that_failed_on_its_own_is_not_undone(store_url: str) -> None:
    saga = Saga(store_url)
    saga.fail["charge"] = sw.PermanentError("card declined")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        assert await finish(saga, "o1") == sw.TaskState.COMPENSATED
    await saga.app.aclose()
    assert saga.effects == Counter(reserve=1, release=1)


async def test_nothing_to_undo_ends_in_error(store_url: str) -> None:
    saga = Saga(store_url)
    saga.fail["reserve"] = sw.PermanentError("out of stock")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        assert await finish(saga, "o1") == sw.TaskState.ERROR
    await saga.app.aclose()
    assert saga.effects == Counter()


async def test_on_failure_stop_leaves_the_task_in_error_for_the_operator(store_url: str) -> None:
    saga = Saga(store_url, on_failure="stop")
    saga.fail["ship"] = sw.PermanentError("no courier")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        assert await finish(saga, "o1") == sw.TaskState.ERROR
    await saga.app.aclose()
    assert saga.effects == Counter(reserve=1, charge=1, ship=0)


async def test_max_failures_compensates_a_step_that_may_have_taken_effect(
    store_url: str,
) -> None:
    # The charge never answers in time: after max_failures expiries the task is undone,
    # the charge included (it may have been applied remotely).
    saga = Saga(store_url, max_failures=2)
    saga.hang.add("charge")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        assert await finish(saga, "o1") == sw.TaskState.COMPENSATED
    view = await saga.app.show_async("o1")
    await saga.app.aclose()
    assert saga.effects == Counter(reserve=1, refund=1, release=1)
    assert [e.kind for e in view.events].count("expired") == 2
    [alert] = [e for e in view.events if e.kind == "alert"]
    assert alert.detail["reason"] == "max_failures" and alert.detail["then"] == "compensating"
    charge = view.steps[1]
    assert charge.state == sw.StepState.FAILED and (charge.error or "").startswith("abandoned")


async def test_a_failed_compensation_alerts_and_stops(store_url: str) -> None:
    saga = Saga(store_url)
    saga.fail["ship"] = sw.PermanentError("no courier")
    saga.fail["refund"] = sw.PermanentError("refunds are closed")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        assert await finish(saga, "o1") == sw.TaskState.COMPENSATION_FAILED
    view = await saga.app.show_async("o1")
    await saga.app.aclose()
    # The refund failed, so the reservation (older) is not released: the operator decides.
    assert saga.effects == Counter(reserve=1, charge=1)
    reasons = [e.detail["reason"] for e in view.events if e.kind == "alert"]
    assert reasons == ["compensation_failed", "task_error"]  # newest first
    assert "refunds are closed" in (view.task.error or "")


async def test_on_failure_retry_waits_for_the_fault_to_clear(store_url: str) -> None:
    saga = Saga(store_url, on_failure="retry", max_failures=2)
    saga.hang.add("charge")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        store = await saga.app.store()
        # Wait for the alert raised when max_failures is reached; the task is pending again.
        async with asyncio.timeout(20):
            while True:
                alerts = await store.events(task_id="o1", kind="alert")
                if any(a.detail["reason"] == "max_failures" for a in alerts):
                    break
                await asyncio.sleep(0.02)
        task = await saga.app.status_async("o1")
        assert task.process_state in (sw.TaskState.PENDING, sw.TaskState.PROCESSING)
        saga.hang.clear()  # the fault clears
        assert await saga.app.result_async("o1", timeout=20) == "done"
    view = await saga.app.show_async("o1")
    await saga.app.aclose()
    assert saga.effects == Counter(reserve=1, charge=1, ship=1)
    reasons = [e.detail["reason"] for e in view.events if e.kind == "alert"]
    assert reasons.count("max_failures") == 1  # once, not at each expiry after it
    assert view.task.failure_count >= 2
