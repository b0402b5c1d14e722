"""The engine end to end in one process, on each store: what a user of the App relies on.

What an agent's calls come to (one call per step, tries under one key, a permanent error
recorded, tries run out leaving the step to the supervisor) is also run with the agents in a
second worker served over HTTP (`workers`); the rest is the scheduler's and the
supervisor's, or needs the agents in the scheduler's process, and runs in one worker."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden.records import NewStep, StepOutcome
from tests.stores import app_store

from ..agentserver import Workers
from ..support.poll import until
from ..support.worker import running

"""For a worker that takes up tasks another worker of the test left: what that one's agents
and scheduler held is given back once they have been silent for a second, not five."""


class Shop:
    """A small App: reserve (async) -> charge (sync, may fail) -> ship (async)."""

    def __init__(self, store_url: str, *, within: float = 5, max_failures: int = 3) -> None:
        self.app = sw.App("shop", store=store_url)
        self.calls: Counter[str] = Counter()
        self.keys: dict[str, set[str]] = {}
        self.charge_failures: dict[str, list[BaseException]] = {}
        inventory = self.app.agent("inventory")
        payments = self.app.agent(
            "payments",
            retry=sw.Retry(max_attempts=5, initial=0.001, maximum=0.01, permanent=(ValueError,)),
        )
        shipping = self.app.agent("shipping")

        @inventory.operation
        async def reserve(call: sw.Call, order: dict[str, Any]) -> dict[str, Any]:
            self.calls["reserve"] += 1
            return {"reserved": order["id"]}

        @payments.operation
        def charge(call: sw.Call, order: dict[str, Any]) -> dict[str, Any]:
            self.calls["charge"] += 1
            self.keys.setdefault(call.task_id, set()).add(call.idempotency_key)
            failures = self.charge_failures.get(call.task_id)
            if failures:
                raise failures.pop(0)
            return {"receipt": f"r-{call.idempotency_key}", "attempt": call.attempt}

        @shipping.operation
        async def ship(call: sw.Call, order: dict[str, Any]) -> str:
            self.calls["ship"] += 1
            return f"track-{order['id']}"

        @self.app.workflow(complete_within=timedelta(seconds=within), max_failures=max_failures)
        async def process_order(ctx: sw.Context, order: dict[str, Any]) -> dict[str, Any]:
            await ctx.step(inventory.reserve, order)
            receipt = await ctx.step(
                payments.charge, order, complete_within=timedelta(seconds=within / 2)
            )
            tracking = await ctx.step(shipping.ship, order)
            return {"receipt": receipt, "tracking": tracking}

        self.process_order = process_order


@pytest.fixture
async def shop(store_url: str) -> AsyncIterator[Shop]:
    s = Shop(store_url)
    yield s
    await s.app.aclose()


async def test_an_order_runs_its_three_steps_once(shop: Shop, workers: Workers) -> None:
    async with workers(shop.app):
        task_id = await shop.app.submit_async(shop.process_order, {"id": 7}, task_id="order-7")
        result = await shop.app.result_async(task_id, timeout=20)
    assert result == {"receipt": {"receipt": "r-order-7/2", "attempt": 1}, "tracking": "track-7"}
    view = await shop.app.show_async("order-7")
    assert view.task.process_state == sw.TaskState.PROCESSED
    assert view.task.locked_by is None and view.task.failure_count == 0
    assert [(s.seq, s.name, s.state, s.attempt) for s in view.steps] == [
        (1, "inventory.reserve", sw.StepState.COMPLETED, 1),
        (2, "payments.charge", sw.StepState.COMPLETED, 1),
        (3, "shipping.ship", sw.StepState.COMPLETED, 1),
    ]
    assert all(s.complete_by is not None and s.finished_at is not None for s in view.steps)
    assert shop.calls == Counter(reserve=1, charge=1, ship=1)


async def test_submitting_the_same_task_id_twice_creates_one_task(shop: Shop) -> None:
    first = await shop.app.submit_async(shop.process_order, {"id": 1}, task_id="order-1")
    second = await shop.app.submit_async(shop.process_order, {"id": 1}, task_id="order-1")
    assert first == second == "order-1"
    with pytest.raises(sw.SubmitConflict, match=r"task 'order-1' .* another input"):
        await shop.app.submit_async(shop.process_order, {"id": 999}, task_id="order-1")
    tasks = await shop.app.tasks_async()
    assert [(t.task_id, t.input) for t in tasks] == [("order-1", {"id": 1})]


async def test_many_orders_all_complete(store_url: str) -> None:
    # 150 orders at once on a busy machine: deadlines long enough that none expires, so that
    # each step is called once (an expired one is dispatched again, and called again).
    shop = Shop(store_url, within=60)
    async with running(shop.app):
        ids = [
            await shop.app.submit_async(shop.process_order, {"id": i}, task_id=f"o{i}")
            for i in range(150)
        ]
        results = await asyncio.gather(*(shop.app.result_async(i, timeout=60) for i in ids))
    await shop.app.aclose()
    assert [r["tracking"] for r in results] == [f"track-{i}" for i in range(150)]
    assert shop.calls == Counter(reserve=150, charge=150, ship=150)


async def test_transient_errors_are_retried_with_the_same_key(shop: Shop, workers: Workers) -> None:
    shop.charge_failures["order-1"] = [ConnectionError("flaky"), TimeoutError("slow")]
    async with workers(shop.app):
        await shop.app.submit_async(shop.process_order, {"id": 1}, task_id="order-1")
        await shop.app.result_async("order-1", timeout=20)
    charge = (await shop.app.show_async("order-1")).steps[1]
    assert charge.tries == 3 and charge.attempt == 1
    assert shop.keys["order-1"] == {"order-1/2"}


async def test_a_permanent_error_sets_error_and_alerts(shop: Shop, workers: Workers) -> None:
    shop.charge_failures["order-1"] = [ValueError("card declined")]
    async with workers(shop.app):
        await shop.app.submit_async(shop.process_order, {"id": 1}, task_id="order-1")
        with pytest.raises(sw.TaskFailed, match="card declined"):
            await shop.app.result_async("order-1", timeout=20)
    view = await shop.app.show_async("order-1")
    assert view.task.process_state == sw.TaskState.ERROR
    assert [s.state for s in view.steps] == [sw.StepState.COMPLETED, sw.StepState.FAILED]
    assert shop.calls["ship"] == 0 and shop.calls["charge"] == 1
    assert {e.kind for e in view.events} == {"step_failed", "alert"}


async def test_permanent_error_class_is_permanent(shop: Shop) -> None:
    shop.charge_failures["order-1"] = [sw.PermanentError("no such card")]
    async with running(shop.app):
        await shop.app.submit_async(shop.process_order, {"id": 1}, task_id="order-1")
        with pytest.raises(sw.TaskFailed, match="no such card"):
            await shop.app.result_async("order-1", timeout=20)
    assert shop.calls["charge"] == 1


async def test_exhausted_retries_leave_the_step_to_the_supervisor(
    store_url: str, workers: Workers
) -> None:
    # The reserve step has 2 s (a busy machine, or an agent over HTTP, never takes them);
    # the charge 1 s, which its five quick tries never fill: the supervisor's is the retry.
    shop = Shop(store_url, within=2.0, max_failures=2)
    shop.charge_failures["order-1"] = [ConnectionError("down")] * 100
    try:
        async with workers(shop.app):
            await shop.app.submit_async(shop.process_order, {"id": 1}, task_id="order-1")
            with pytest.raises(sw.TaskFailed, match="max_failures"):
                await shop.app.result_async("order-1", timeout=20)
        view = await shop.app.show_async("order-1")
        assert view.task.failure_count == 2
        assert [e.kind for e in view.events] == ["alert", "expired", "expired"]  # newest first
        # Dispatched twice under one key, at most five calls per dispatch (a dispatch an
        # agent over HTTP claims late on a busy machine gets fewer: its complete_by bounds it).
        assert view.steps[1].attempt == 2 and shop.keys["order-1"] == {"order-1/2"}
        assert 1 <= shop.calls["charge"] <= 10 and shop.calls["reserve"] == 1
    finally:
        await shop.app.aclose()


async def _record_first_step(shop: Shop, task_id: str, *, complete: bool) -> None:
    """Act as a scheduler (and agent) that recorded step 1 and then died."""
    store = await app_store(shop.app)
    [claimed] = await store.claim_tasks("dead-scheduler", ["process_order"], 1)
    await store.dispatch_steps(
        [
            NewStep(
                task_id=task_id,
                task_attempt=claimed.task.attempt,
                scheduler="dead-scheduler",
                seq=1,
                name="inventory.reserve",
                agent="inventory",
                operation="reserve",
                input='[{"id": 1}]',
                priority=0,
                complete_within=0.2,
                position="1",
            )
        ]
    )
    if complete:
        [req] = await store.claim_requests("dead-agent", "inventory", ["reserve"], 1)
        assert await store.complete_steps(
            [
                StepOutcome(
                    task_id=task_id,
                    seq=1,
                    attempt=req.attempt,
                    agent_instance="dead-agent",
                    state=sw.StepState.COMPLETED,
                    result='{"reserved": "earlier"}',
                    error=None,
                    tries=1,
                )
            ]
        ) == [True]


async def test_a_resumed_task_does_not_rerun_completed_steps(store_url: str) -> None:
    shop = Shop(store_url, within=0.3)
    try:
        await shop.app.submit_async(shop.process_order, {"id": 1}, task_id="order-1")
        await _record_first_step(shop, "order-1", complete=True)
        async with running(shop.app):  # its supervisor finds the dead scheduler's task
            await shop.app.result_async("order-1", timeout=20)
        view = await shop.app.show_async("order-1")
        assert shop.calls == Counter(charge=1, ship=1)
        assert view.steps[0].result == {"reserved": "earlier"}
        assert view.task.failure_count == 1 and view.task.attempt == 2
    finally:
        await shop.app.aclose()


async def test_an_open_step_of_a_dead_scheduler_is_dispatched_again(store_url: str) -> None:
    shop = Shop(store_url)
    try:
        await shop.app.submit_async(shop.process_order, {"id": 1}, task_id="order-1")
        await _record_first_step(shop, "order-1", complete=False)
        store = await app_store(shop.app)

        async def step_past_complete_by() -> bool:  # by the store's clock, no agent up
            read = await store.read_step("order-1", 1)
            return read is not None and read[1] <= 0

        await until(step_past_complete_by)
        async with running(shop.app):
            await shop.app.result_async("order-1", timeout=20)
        view = await shop.app.show_async("order-1")
        assert view.steps[0].attempt == 2 and view.steps[0].idempotency_key == "order-1/1"
        assert shop.calls == Counter(reserve=1, charge=1, ship=1)
    finally:
        await shop.app.aclose()


async def test_a_workflow_that_changed_its_steps_fails_clearly(store_url: str) -> None:
    shop = Shop(store_url, within=0.3)
    try:
        await shop.app.submit_async(shop.process_order, {"id": 1}, task_id="order-1")
        store = await app_store(shop.app)
        [claimed] = await store.claim_tasks("old-code", ["process_order"], 1)
        await store.dispatch_steps(
            [
                NewStep(
                    task_id="order-1",
                    task_attempt=claimed.task.attempt,
                    scheduler="old-code",
                    seq=1,
                    name="payments.charge",
                    agent="payments",
                    operation="charge",
                    input="[]",
                    priority=0,
                    complete_within=0.2,
                    position="1",
                )
            ]
        )
        async with running(shop.app):
            with pytest.raises(sw.TaskFailed) as failed:
                await shop.app.result_async("order-1", timeout=20)
        message = str(failed.value)
        assert "inventory.reserve" in message and "payments.charge" in message
        assert shop.calls == Counter()
    finally:
        await shop.app.aclose()


async def test_bad_input_is_refused_and_writes_nothing(shop: Shop) -> None:
    with pytest.raises(sw.UnknownNameError, match="nope"):
        await shop.app.submit_async("nope", {})
    with pytest.raises(sw.PayloadError, match="not JSON"):
        await shop.app.submit_async(shop.process_order, {"when": object()})
    with pytest.raises(sw.PayloadError, match="not JSON"):
        await shop.app.submit_async(shop.process_order, {1: "non-string key"})  # type: ignore[arg-type]
    with pytest.raises(sw.ConfigurationError, match="task_id"):
        await shop.app.submit_async(shop.process_order, {}, task_id="")
    with pytest.raises(sw.ConfigurationError, match="priority"):
        await shop.app.submit_async(shop.process_order, {}, priority="high")  # type: ignore[call-overload]
    assert await shop.app.tasks_async() == []
    with pytest.raises(sw.TaskNotFound):
        await shop.app.status_async("missing")


async def test_a_step_input_that_is_not_json_fails_the_task(store_url: str) -> None:
    app = sw.App("bad", store=store_url)
    agent = app.agent("a")

    @agent.operation
    async def op(call: sw.Call, value: Any) -> None:
        raise AssertionError("never called")

    @app.workflow
    async def wf(ctx: sw.Context, _: Any) -> None:
        await ctx.step(agent.op, {1, 2})

    try:
        async with running(app):
            await app.submit_async(wf, None, task_id="t")
            with pytest.raises(sw.TaskFailed, match="not JSON"):
                await app.result_async("t", timeout=20)
        assert (await app.show_async("t")).steps == []
    finally:
        await app.aclose()


async def test_result_times_out_when_nothing_runs(shop: Shop) -> None:
    await shop.app.submit_async(shop.process_order, {"id": 1}, task_id="order-1")
    with pytest.raises(sw.ResultTimeout):
        await shop.app.result_async("order-1", timeout=0.2)


def test_invalid_store_urls_are_refused() -> None:
    for url in ["", "mysql://x/y", "sqlite://host/x.db", "sqlite:///x.db?bogus=1"]:
        with pytest.raises(sw.ConfigurationError):
            sw.App("x", store=url)


def test_the_blocking_api_works_outside_an_event_loop(sqlite_url: str) -> None:
    shop = Shop(sqlite_url)
    try:
        assert shop.app.submit(shop.process_order, {"id": 3}, task_id="order-3") == "order-3"
        assert shop.app.status("order-3").process_state == sw.TaskState.PENDING
        with pytest.raises(sw.ResultTimeout):
            shop.app.result("order-3", timeout=0.1)
    finally:
        shop.app.close()
