"""Compensation (saga) on each store: a task that cannot succeed undoes what it did."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw

from .test_engine import running


class Saga:
    """reserve (undone by release) -> charge (undone by refund) -> ship (no undo)."""

    def __init__(
        self,
        store_url: str,
        *,
        on_failure: str = "compensate",
        max_failures: int = 2,
        within: float = 5,
        alert_after: int = 3,
    ) -> None:
        self.app = sw.App("saga", store=store_url)
        self.effects: Counter[str] = Counter()
        self.keys: dict[str, list[str | None]] = {}
        self.fail: dict[str, BaseException] = {}
        self.hang: set[str] = set()
        self.release_gate = asyncio.Event()
        self.release_gate.set()
        inventory = self.app.agent("inventory", retry=sw.Retry(max_attempts=2, initial=0.001))
        payments = self.app.agent("payments", retry=sw.Retry(max_attempts=2, initial=0.001))
        shipping = self.app.agent("shipping")

        def effect(name: str, call: sw.Call) -> None:
            if name in self.fail:
                raise self.fail[name]
            self.effects[name] += 1
            self.keys.setdefault(name, []).append(call.compensates_key)

        @inventory.operation
        async def reserve(call: sw.Call, order: dict[str, Any]) -> str:
            effect("reserve", call)
            return "reserved"

        @inventory.operation
        async def release(call: sw.Call, order: dict[str, Any]) -> str:
            await self.release_gate.wait()
            effect("release", call)
            return "released"

        @payments.operation
        async def charge(call: sw.Call, order: dict[str, Any]) -> str:
            if "charge" in self.hang:
                await asyncio.sleep(3600)  # past complete_by: the agent gives up
            effect("charge", call)
            return "charged"

        @payments.operation
        async def refund(call: sw.Call, order: dict[str, Any]) -> str:
            effect("refund", call)
            return "refunded"

        @shipping.operation
        async def ship(call: sw.Call, order: dict[str, Any]) -> str:
            effect("ship", call)
            return "shipped"

        @self.app.workflow(
            complete_within=timedelta(seconds=within),
            max_failures=max_failures,
            on_failure=on_failure,
            alert_after=alert_after,
        )
        async def order(ctx: sw.Context, order: dict[str, Any]) -> str:
            await ctx.step(inventory.reserve, order, compensate=inventory.release)
            await ctx.step(
                payments.charge,
                order,
                compensate=payments.refund,
                complete_within=timedelta(seconds=0.3),
            )
            await ctx.step(shipping.ship, order)
            return "done"

        self.order = order


async def finish(saga: Saga, task_id: str, timeout: float = 20) -> sw.TaskState:
    with pytest.raises(sw.TaskFailed) as failed:
        await saga.app.result_async(task_id, timeout=timeout)
    return sw.TaskState(failed.value.state)


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
