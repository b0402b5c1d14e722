"""Redrives with a plan, on each store: the plan of a retry and of a fork says per step what
then happens (kept, run again under the same idempotency key, run again under a new key),
and a flaky service sees exactly that: the same keys where the plan says so, a new key where
the operator asked for one, no call for a step kept. A plan writes nothing; the history of
both tasks records who asked for a fork."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest

import stepwarden as sw
from stepwarden.states import TaskState
from tests.support.worker import running

WITHIN = timedelta(seconds=30)


@dataclass
class Service:
    """A remote service that fails `failing` calls of an operation (permanently), and
    notes every call with its idempotency key."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    failing: dict[str, int] = field(default_factory=dict)

    def call(self, operation: str, key: str) -> None:
        self.calls.append((operation, key))
        if self.failing.get(operation, 0) > 0:
            self.failing[operation] -= 1
            raise sw.PermanentError(f"{operation} declined")

    def since(self, mark: int) -> list[tuple[str, str]]:
        return self.calls[mark:]


@pytest.fixture
async def shop(store_url: str) -> AsyncIterator[tuple[sw.App, Service]]:
    app = sw.App("redrive", store=store_url)
    service = Service()
    pay = app.agent("pay")

    @pay.operation
    async def reserve(call: sw.Call, n: int) -> str:
        service.call("reserve", call.idempotency_key)
        return f"r-{n}"

    @pay.operation
    async def charge(call: sw.Call, n: int) -> str:
        service.call("charge", call.idempotency_key)
        return f"c-{n}"

    @pay.operation
    async def ship(call: sw.Call, n: int) -> str:
        service.call("ship", call.idempotency_key)
        return f"s-{n}"

    @pay.operation
    async def refund(call: sw.Call, n: int) -> str:
        service.call("refund", call.idempotency_key)
        return f"refunded-{n}"

    @app.workflow(complete_within=WITHIN)
    async def order(ctx: sw.Context, n: int) -> list[str]:
        return [await ctx.step(reserve, n), await ctx.step(charge, n), await ctx.step(ship, n)]

    @app.workflow(complete_within=WITHIN, max_failures=1)
    async def refunded(ctx: sw.Context, n: int) -> list[str]:
        """A charge undone by a refund when the shipment fails."""
        return [
            await ctx.step(reserve, n),
            await ctx.step(charge, n, compensate=refund),
            await ctx.step(ship, n),
        ]

    async with app:
        yield app, service


def _planned(redrive: sw.Redrive) -> list[tuple[int, str, str, str]]:
    return [(p.seq, p.name, p.plan, p.key) for p in redrive.steps]


def _seen(plan: sw.Redrive) -> list[tuple[str, str]]:
    """The calls the plan says the service then sees: one per step run again, with its key."""
    return [(p.name.split(".")[1], p.key) for p in plan.steps if p.plan != "kept"]


async def test_a_retry_s_plan_is_what_the_service_then_sees(
    shop: tuple[sw.App, Service],
) -> None:
    app, service = shop
    service.failing["charge"] = 1
    await app.submit_async("order", 1, task_id="o-1")
    async with running(app):
        with pytest.raises(sw.TaskFailed, match="charge declined"):
            await app.result_async("o-1", timeout=20)
    plan = await app.retry_plan_async("o-1")
    assert _planned(plan) == [
        (1, "pay.reserve", "kept", "o-1/1"),
        (2, "pay.charge", "same_key", "o-1/2"),
    ]
    assert (plan.applied, plan.message) == (False, "would retry: error -> pending")
    assert (await app.status_async("o-1")).process_state == TaskState.ERROR  # nothing written
    mark = len(service.calls)
    [done] = await app.operate_async("retry", ["o-1"], by="ops")
    assert done.applied
    async with running(app):
        assert await app.result_async("o-1", timeout=20) == ["r-1", "c-1", "s-1"]
    # The planned calls, then the step the retry reached for the first time.
    assert service.since(mark) == [*_seen(plan), ("ship", "o-1/3")]
    refused = await app.retry_plan_async("o-1")
    assert refused.refused and not refused.applied
    assert refused.message.startswith("cannot retry a task that is processed")


async def test_a_retry_s_plan_undoes_first_what_a_failed_compensation_left_done(
    shop: tuple[sw.App, Service],
) -> None:
    """The shipment fails for good, so the charge is undone by a refund, which fails too:
    the task ends compensation_failed. The retry's plan says the charge is undone first
    (the steps without a compensation are kept); the retry then calls the refund again
    under its key, and nothing else."""
    app, service = shop
    service.failing.update(ship=1, refund=1)
    await app.submit_async("refunded", 2, task_id="o-2")
    async with running(app):
        with pytest.raises(sw.TaskFailed):
            await app.result_async("o-2", timeout=20)
    assert (await app.status_async("o-2")).process_state == TaskState.COMPENSATION_FAILED
    [first_refund] = [key for op, key in service.calls if op == "refund"]
    plan = await app.retry_plan_async("o-2")
    assert _planned(plan) == [
        (1, "pay.reserve", "kept", "o-2/1"),
        (2, "pay.charge", "undone", "o-2/2"),
        (3, "pay.ship", "kept", "o-2/3"),
    ]
    assert not plan.refused and not plan.applied
    assert (await app.status_async("o-2")).process_state == TaskState.COMPENSATION_FAILED
    mark = len(service.calls)
    [done] = await app.operate_async("retry", ["o-2"], by="ops")
    assert done.applied
    async with running(app):
        with pytest.raises(sw.TaskFailed):
            await app.result_async("o-2", timeout=20)
    assert (await app.status_async("o-2")).process_state == TaskState.COMPENSATED
    # The step planned undone had its compensation called again, under the same key.
    assert service.since(mark) == [("refund", first_refund)]


async def test_a_fork_s_plan_is_what_the_service_then_sees(
    shop: tuple[sw.App, Service],
) -> None:
    app, service = shop
    await app.submit_async("order", 1, task_id="o-1")
    async with running(app):
        await app.result_async("o-1", timeout=20)
        same = await app.fork_async("o-1", start="2", new_task_id="f-1", plan=True)
        assert _planned(same) == [
            (1, "pay.reserve", "kept", "o-1/1"),
            (2, "pay.charge", "same_key", "o-1/2"),
            (3, "pay.ship", "same_key", "o-1/3"),
        ]
        assert not same.applied and await app.tasks_async() == [await app.status_async("o-1")]
        mark = len(service.calls)
        done = await app.fork_async("o-1", start="2", new_task_id="f-1", by="ops", reason="bug")
        assert (done.applied, done.runs_as, done.message) == (True, "f-1", "forked as f-1")
        assert done.steps == same.steps
        assert await app.result_async("f-1", timeout=20) == ["r-1", "c-1", "s-1"]
        assert service.since(mark) == _seen(same)

        fresh = await app.fork_async(
            "o-1", start="2", new_task_id="f-2", new_keys_from=3, plan=True
        )
        assert _planned(fresh)[1:] == [
            (2, "pay.charge", "same_key", "o-1/2"),
            (3, "pay.ship", "new_key", "f-2/3"),
        ]
        mark = len(service.calls)
        await app.fork_async("o-1", start="2", new_task_id="f-2", new_keys_from=3, by="ops")
        assert await app.result_async("f-2", timeout=20) == ["r-1", "c-1", "s-1"]
        assert service.since(mark) == _seen(fresh) == [("charge", "o-1/2"), ("ship", "f-2/3")]

        # A fork of a fork carries the first one's keys.
        again = await app.fork_async("f-2", start="1", new_task_id="f-3", plan=True)
        assert [p.key for p in again.steps] == ["o-1/1", "o-1/2", "f-3/3"]
    view = await app.show_async("f-1")
    assert [s.idempotency_key for s in view.steps] == ["o-1/1", "o-1/2", "o-1/3"]
    assert view.steps[0].result == "r-1" and view.task.forked_from == "o-1"
    [told] = [e.detail for e in view.events if e.kind == "operator"]
    assert (told["action"], told["by"], told["reason"], told["forked_from"]) == (
        "fork",
        "ops",
        "bug",
        "o-1",
    )
    original = await app.show_async("o-1", events=100)
    assert {e.detail["forked_to"] for e in original.events if e.kind == "operator"} == {
        "f-1",
        "f-2",
    }


async def test_a_fork_is_refused_where_its_plan_cannot_hold(
    shop: tuple[sw.App, Service],
) -> None:
    app, _ = shop
    await app.submit_async("order", 1, task_id="o-1")
    early = await app.fork_async("o-1", start="1", new_task_id="f-1")
    assert not early.applied and "fork a finished task" in early.message
    async with running(app):
        await app.result_async("o-1", timeout=20)
    for start, said in (("9", "has no step at 9"), ("x", "must be a step's place")):
        refused = await app.fork_async("o-1", start=start, new_task_id="f-1")
        assert not refused.applied and said in refused.message
    taken = await app.fork_async("o-1", start="1", new_task_id="o-1")
    assert not taken.applied and "exists" in taken.message
    with pytest.raises(sw.TaskNotFound):
        await app.fork_async("nope", start="1")
    assert [t.task_id for t in await app.tasks_async()] == ["o-1"]
