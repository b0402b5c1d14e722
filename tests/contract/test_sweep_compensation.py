"""The supervisor's sweep sending a task to compensating at max_failures, on each store
(found by the model test, tests/model)."""

from __future__ import annotations

import asyncio

from stepwarden.records import OperatorAction, TaskOutcome
from stepwarden.retry import Backoff
from stepwarden.states import StepState, TaskState
from stepwarden.store import Store

from ..support.store import claim_one, compensating, dispatch, new_task, outcome, undoable


async def sweep(store: Store) -> list[tuple[str, TaskState, int]]:
    term = await store.acquire_lease("supervisor", "sup", 30)
    assert term is not None
    swept = await store.sweep(
        lease="supervisor", holder="sup", term=term, limit=10, backoff=Backoff(initial=0, maximum=0)
    )
    return sorted((e.task_id, e.process_state, e.failure_count) for e in swept)


async def test_a_compensation_after_expiry_waits_for_the_abandoned_steps(store: Store) -> None:
    # Two tasks, each with a step that expires and an undoable one: "open" has its undoable
    # step still running with time left when the sweep gives up on the task, "done" has it
    # completed. Both go to compensating; the compensation of "open" waits until the running
    # step's complete_by has passed (its agent may still apply the effect until then), as it
    # does when a scheduler ends the task in error.
    await store.submit([new_task("open", max_failures=1), new_task("done", max_failures=1)])
    claimed = await store.claim_tasks("s1", ["wf"], 2)
    attempts = {c.task.task_id: c.task.attempt for c in claimed}
    await store.dispatch_steps(
        [
            undoable(dispatch("open", attempts["open"], seq=1, within=30)),
            undoable(dispatch("done", attempts["done"], seq=1, within=30)),
        ]
    )
    assert len(await store.claim_requests("a1", "pay", ["charge"], 10)) == 2
    assert await store.complete_steps([outcome("done", 1)]) == [True]
    await store.dispatch_steps(
        [
            dispatch("open", attempts["open"], seq=2, within=0.05),
            dispatch("done", attempts["done"], seq=2, within=0.05),
        ]
    )
    await asyncio.sleep(0.1)  # the steps 2 are past their complete_by

    assert await sweep(store) == [
        ("done", TaskState.COMPENSATING, 1),
        ("open", TaskState.COMPENSATING, 1),
    ]
    steps = await store.get_steps("open")
    assert [s.state for s in steps] == [StepState.FAILED, StepState.FAILED]  # abandoned
    [claimed_again] = await store.claim_tasks("s2", ["wf"], 10)
    assert claimed_again.task.task_id == "done"
    assert await store.claim_tasks("s2", ["wf"], 10) == []


async def test_the_failure_count_is_kept_when_compensation_starts(store: Store) -> None:
    # At max_failures the task compensates: its failure_count keeps the expiries of the
    # forward path (as its error says), and its compensation counts its own from 0.
    await store.submit([new_task("t1", max_failures=1)])
    attempt = await claim_one(store)
    await store.dispatch_steps([undoable(dispatch("t1", attempt, within=30))])
    assert len(await store.claim_requests("a1", "pay", ["charge"], 10)) == 1
    assert await store.complete_steps([outcome("t1", 1)]) == [True]
    await store.dispatch_steps([dispatch("t1", attempt, seq=2, within=0.05)])
    await asyncio.sleep(0.1)  # step 2 is past its complete_by

    assert await sweep(store) == [("t1", TaskState.COMPENSATING, 1)]
    task = await store.get_task("t1")
    assert task is not None and (task.failure_count, task.compensation_failures) == (1, 0)
    assert "complete_by passed 1 time(s), the last time on step 2" in (task.error or "")
    [expired] = await store.events(task_id="t1", kind="expired")
    assert expired.detail["failure_count"] == 1


async def test_a_compensating_task_released_by_the_sweep_is_not_swept_again(
    store: Store,
) -> None:
    # The undo step expires: the sweep releases the task (still compensating, its step open
    # for the next scheduler to adopt or re-dispatch). Until a scheduler holds the task
    # again, later sweeps leave it alone: nobody held it past a deadline.
    await compensating(store, within=0.05)
    await asyncio.sleep(0.1)  # the undo step is past its complete_by
    assert await sweep(store) == [("t1", TaskState.COMPENSATING, 1)]
    assert await sweep(store) == []
    assert await sweep(store) == []
    task = await store.get_task("t1")
    assert task is not None
    assert (task.process_state, task.locked_by) == (TaskState.COMPENSATING, None)
    assert (task.failure_count, task.compensation_failures) == (0, 1)


async def test_a_compensation_retried_by_the_operator_is_not_swept_before_it_is_claimed(
    store: Store,
) -> None:
    # The operator's retry reopens the failed undo step already past its complete_by, for the
    # scheduler that takes the task up to re-dispatch: no supervisor counts that as an expiry.
    attempt = await compensating(store, within=30)
    assert len(await store.claim_requests("a1", "pay", ["refund"], 10)) == 1
    failed = outcome("t1", 1, seq=2, state=StepState.FAILED)
    assert await store.complete_steps([failed]) == [True]
    gave_up = TaskOutcome(
        task_id="t1",
        attempt=attempt,
        scheduler="s2",
        state=TaskState.COMPENSATION_FAILED,
        result=None,
        error="refund refused",
    )
    assert await store.finish_tasks([gave_up]) == [True]
    [retried] = await store.operate([OperatorAction(action="retry", task_id="t1", actor="ops")])
    assert retried.after == TaskState.COMPENSATING
    assert await sweep(store) == []
    task = await store.get_task("t1")
    assert task is not None and (task.process_state, task.compensation_failures) == (
        TaskState.COMPENSATING,
        0,
    )
