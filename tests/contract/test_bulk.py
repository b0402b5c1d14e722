"""Bulk actions by filter, on each store: the plan counts the tasks a filter matches (per
workflow and version, per move, the steps of a retry) and names the first by id, changing
nothing; the action reaches the matching tasks only, each through the per-task rules with
its history entry; and a bulk stopped part way (at a limit) and run again finishes the rest
without acting on any task twice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

import stepwarden as sw
from stepwarden.states import TaskState
from tests.support.worker import running

WITHIN = timedelta(seconds=30)


@pytest.fixture
async def shop(store_url: str) -> AsyncIterator[sw.App]:
    app = sw.App("bulk", store=store_url)
    pay = app.agent("pay", retry=sw.Retry(max_attempts=1))

    @pay.operation
    async def reserve(call: sw.Call, why: str) -> str:
        return "reserved"

    @pay.operation
    async def charge(call: sw.Call, why: str) -> str:
        if why:
            raise sw.PermanentError(why)
        return "charged"

    @app.workflow(complete_within=WITHIN)
    async def order(ctx: sw.Context, why: str) -> str:
        await ctx.step(reserve, why)
        return await ctx.step(charge, why)

    @app.workflow(complete_within=WITHIN)
    async def refund(ctx: sw.Context, why: str) -> str:
        return await ctx.step(charge, why)

    async with app:
        yield app


async def _states(app: sw.App) -> dict[str, TaskState]:
    return {t.task_id: t.process_state for t in await app.tasks_async(limit=1000)}


async def _operator_actions(app: sw.App, task_id: str) -> list[str]:
    view = await app.show_async(task_id)
    assert view is not None
    return [e.detail["action"] for e in view.events if e.kind == "operator"]


async def _failed_orders(app: sw.App) -> None:
    """o-1, o-2, o-4: declined (error); o-3: the bank timed out (error); o-5: processed;
    r-1: a refund declined (error)."""
    failing = {"o-1": "card declined", "o-2": "card declined", "o-3": "bank timed out"}
    for task_id, why in {**failing, "o-4": "card declined", "o-5": ""}.items():
        await app.submit_async("order", why, task_id=task_id)
    await app.submit_async("refund", "card declined", task_id="r-1")
    async with running(app):
        for task_id in ("o-1", "o-2", "o-3", "o-4", "r-1"):
            with pytest.raises(sw.TaskFailed):
                await app.result_async(task_id, timeout=20)
        assert await app.result_async("o-5", timeout=20) == "charged"


DECLINED = sw.TaskFilter(states=frozenset({TaskState.ERROR}), workflow="order", error="declined")


async def test_a_bulk_retry_s_plan_counts_the_matching_tasks_and_changes_nothing(
    shop: sw.App,
) -> None:
    app = shop
    await _failed_orders(app)
    before = await _states(app)
    plan = await app.bulk_plan_async(DECLINED, "retry")
    assert plan == sw.BulkPlan(
        action="retry",
        matched=3,
        by_workflow={("order", 1): 3},
        moves={"error -> pending": 3},
        steps={"kept": 3, "same_key": 3},  # reserve kept, charge run again under its key
        sample=("o-1", "o-2", "o-4"),
        last="o-4",
        done=True,
    )
    assert await _states(app) == before
    # A filter of states the action does not move matches nothing.
    processed = sw.TaskFilter(states=frozenset({TaskState.PROCESSED}))
    assert (await app.bulk_plan_async(processed, "retry")).matched == 0
    # Without a state, the action's own: every task in error (or compensation_failed).
    anywhere = await app.bulk_plan_async(sw.TaskFilter(error="declined"), "retry")
    assert anywhere.matched == 4
    assert anywhere.by_workflow == {("order", 1): 3, ("refund", 1): 1}
    assert anywhere.sample == ("o-1", "o-2", "o-4", "r-1")


async def test_a_plan_with_a_limit_plans_that_many_and_goes_on_after_its_last(
    shop: sw.App,
) -> None:
    """A plan of the first `limit` tasks by id only (the dashboard's `POST /api/bulk` plans
    at most 10,000 a request): it says where it stopped, and the next plan goes on after it,
    until done; the pages add up to the whole plan."""
    app = shop
    await _failed_orders(app)
    anywhere = sw.TaskFilter(error="declined")
    pages = []
    after = ""
    while True:
        page = await app.bulk_plan_async(anywhere, "retry", after=after, limit=3)
        pages.append((page.matched, page.last, page.done))
        if page.done:
            break
        assert page.last is not None
        after = page.last
    assert pages == [(3, "o-4", False), (1, "r-1", True)]
    with pytest.raises(sw.ConfigurationError):
        await app.bulk_plan_async(anywhere, "retry", limit=0)


async def test_a_bulk_retry_stopped_at_a_limit_then_run_again_acts_on_each_task_once(
    shop: sw.App,
) -> None:
    app = shop
    await _failed_orders(app)
    seen: list[sw.BulkProgress] = []
    first = await app.bulk_async(
        DECLINED, "retry", batch=1, limit=2, by="ops", reason="bank fixed", progress=seen.append
    )
    assert (first.acted, first.refused, first.last, first.done) == (2, 0, "o-2", False)
    assert [(p.acted, p.last) for p in seen] == [(1, "o-1"), (2, "o-2")]
    states = await _states(app)
    assert (states["o-1"], states["o-2"], states["o-4"]) == (TaskState.PENDING,) * 2 + (
        TaskState.ERROR,
    )
    # The same bulk again: the tasks retried no longer match; it goes on with the rest.
    second = await app.bulk_async(DECLINED, "retry", batch=1, by="ops")
    assert (second.acted, second.refused, second.last, second.done) == (1, 0, "o-4", True)
    states = await _states(app)
    assert {t for t, s in states.items() if s == TaskState.PENDING} == {"o-1", "o-2", "o-4"}
    assert (states["o-3"], states["o-5"], states["r-1"]) == (
        TaskState.ERROR,
        TaskState.PROCESSED,
        TaskState.ERROR,
    )
    for task_id in ("o-1", "o-2", "o-4"):
        assert await _operator_actions(app, task_id) == ["retry"]
    for task_id in ("o-3", "r-1"):
        assert await _operator_actions(app, task_id) == []
    nothing = await app.bulk_async(DECLINED, "retry")
    assert (nothing.acted, nothing.refused, nothing.last, nothing.done) == (0, 0, None, True)
    # The retried ones run again, their failed step under the same key, and finish.
    async with running(app):
        for task_id in ("o-1", "o-2", "o-4"):
            with pytest.raises(sw.TaskFailed, match="declined"):  # the card is declined again
                await app.result_async(task_id, timeout=20)


async def test_bulk_pause_resume_and_cancel_reach_the_tasks_of_a_tag_and_a_time(
    shop: sw.App,
) -> None:
    app = shop
    for n in (1, 2, 3):
        tags = {"customer": "c-42"} if n != 2 else {"customer": "c-7"}
        await app.submit_async("order", "", task_id=f"p-{n}", tags=tags)
    mark = datetime.now(UTC)
    await app.submit_async("order", "", task_id="p-4", tags={"customer": "c-42"})
    c42 = sw.TaskFilter(tags={"customer": "c-42"})
    plan = await app.bulk_plan_async(c42, "pause")
    assert (plan.matched, dict(plan.moves), plan.sample) == (
        3,
        {"pending -> paused": 3},
        ("p-1", "p-3", "p-4"),
    )
    assert plan.steps == {}
    paused = await app.bulk_async(c42, "pause", by="ops")
    assert (paused.acted, paused.done) == (3, True)
    states = await _states(app)
    assert [states[f"p-{n}"] for n in (1, 2, 3, 4)] == [
        TaskState.PAUSED,
        TaskState.PENDING,
        TaskState.PAUSED,
        TaskState.PAUSED,
    ]
    later = sw.TaskFilter(tags={"customer": "c-42"}, created_after=mark)
    assert (await app.bulk_plan_async(later, "resume")).sample == ("p-4",)
    assert (await app.bulk_async(later, "resume")).acted == 1
    earlier = sw.TaskFilter(workflow="order", created_before=mark)
    cancelled = await app.bulk_async(earlier, "cancel", batch=2)
    assert (cancelled.acted, cancelled.last) == (3, "p-3")
    states = await _states(app)
    assert [states[f"p-{n}"] for n in (1, 2, 3, 4)] == [
        TaskState.CANCELLED,
        TaskState.CANCELLED,
        TaskState.CANCELLED,
        TaskState.PENDING,
    ]
    assert await _operator_actions(app, "p-1") == ["cancel", "pause"]  # newest first
    assert await _operator_actions(app, "p-4") == ["resume", "pause"]
    with pytest.raises(sw.ConfigurationError, match="unknown bulk action"):
        await app.bulk_plan_async(c42, "skip")


async def test_a_bulk_fork_forks_each_matching_task_once_and_leaves_its_forks_alone(
    shop: sw.App,
) -> None:
    app = shop
    await _failed_orders(app)
    fork = sw.BulkFork(start="2", name="fix", new_keys_from=2)
    declined = sw.TaskFilter(workflow="order", error="declined")
    plan = await app.bulk_plan_async(declined, "fork", fork=fork)
    assert plan == sw.BulkPlan(
        action="fork",
        matched=3,
        by_workflow={("order", 1): 3},
        moves={"error -> fork": 3},
        steps={"kept": 3, "new_key": 3},
        sample=("o-1", "o-2", "o-4"),
        last="o-4",
    )
    assert len(await _states(app)) == 6  # nothing made
    first = await app.bulk_async(declined, "fork", fork=fork, limit=2, by="ops")
    assert (first.acted, first.skipped, first.last, first.done) == (2, 0, "o-2", False)
    again = await app.bulk_async(declined, "fork", fork=fork, by="ops")
    assert (again.acted, again.skipped, again.refused, again.done) == (1, 2, 0, True)
    states = await _states(app)
    assert {t for t in states if "~" in t} == {"o-1~fix", "o-2~fix", "o-4~fix"}
    for task_id in ("o-1", "o-2", "o-4"):
        assert await _operator_actions(app, task_id) == ["fork"]
    # The forks run the failed step under a new key; once they fail too, a bulk fork of the
    # same name matches them, and forks none of them again.
    async with running(app):
        for task_id in ("o-1~fix", "o-2~fix", "o-4~fix"):
            with pytest.raises(sw.TaskFailed, match="declined"):
                await app.result_async(task_id, timeout=20)
    last = await app.bulk_plan_async(declined, "fork", fork=fork)
    assert (last.matched, last.skipped, dict(last.moves)) == (3, 3, {})
    with pytest.raises(sw.ConfigurationError, match="BulkFork"):
        await app.bulk_plan_async(declined, "fork")
