"""A task's end wakes whoever waits for its result, and nobody else (on PostgreSQL a
notification costs every listening session a read). A waiter marks the row of a task that
is held or waiting, and notes its wait beside a pending one (whose row schedulers claim
skipping locked rows, so a waiter does not lock it); an end reads both."""

from __future__ import annotations

import psycopg
import pytest

from stepwarden.records import TaskOutcome
from stepwarden.states import TaskState
from stepwarden.store import CHANNEL_TASK_DONE, Store
from stepwarden.store.postgres import SQL, PostgresStore

from .test_local_calls import app_task


def processed(task_id: str, attempt: int, scheduler: str = "s1") -> TaskOutcome:
    return TaskOutcome(
        task_id=task_id,
        attempt=attempt,
        scheduler=scheduler,
        state=TaskState.PROCESSED,
        result='"r"',
        error=None,
    )


async def test_only_the_end_of_a_task_someone_waits_for_wakes(store: Store) -> None:
    """One waiter came while its task was pending, one while it was held, none for the
    third: the ends of the first two wake the waiters, the third's nobody. Noting a wait
    hides no pending task from a claim."""
    await store.submit([app_task("noted"), app_task("marked"), app_task("alone")])
    done = store.subscribe(CHANNEL_TASK_DONE)
    noted = await store.await_task("noted")
    assert noted is not None and noted.process_state == TaskState.PENDING
    claimed = {c.task.task_id: c.task.attempt for c in await store.claim_tasks("s1", ["wf"], 3)}
    assert sorted(claimed) == ["alone", "marked", "noted"]
    marked = await store.await_task("marked")
    assert marked is not None and marked.process_state == TaskState.PROCESSING
    assert await store.finish_tasks([processed("alone", claimed["alone"])]) == [True]
    both = [processed(t, claimed[t]) for t in ("noted", "marked")]
    assert await store.finish_tasks(both) == [True, True]
    # The first wake is the second write's: the end of "alone" woke nobody.
    assert sorted(await done.wait(5) or []) == ["marked", "noted"]


async def test_a_waiter_for_an_ended_or_unknown_task_reads_it(store: Store) -> None:
    await store.submit([app_task("t")])
    [c] = await store.claim_tasks("s1", ["wf"], 1)
    assert await store.finish_tasks([processed("t", c.task.attempt)]) == [True]
    ended = await store.await_task("t")
    assert ended is not None and ended.process_state == TaskState.PROCESSED
    assert ended.result == "r"
    assert await store.await_task("nobody") is None


async def test_a_wait_survives_a_release_and_a_second_claim(store: Store) -> None:
    """A task marked while held, given back (pending again) and claimed by another
    scheduler: its end still wakes the waiter."""
    await store.submit([app_task("t")])
    [c] = await store.claim_tasks("s1", ["wf"], 1)
    assert await store.await_task("t") is not None
    assert len(await store.release_held("s1")) == 1
    done = store.subscribe(CHANNEL_TASK_DONE)
    [again] = await store.claim_tasks("s2", ["wf"], 1)
    assert again.task.attempt > c.task.attempt
    assert await store.finish_tasks([processed("t", again.task.attempt, "s2")]) == [True]
    assert await done.wait(5) == ["t"]


@pytest.mark.parametrize("when", ["pending", "held"])
async def test_on_postgresql_the_end_wakes_a_waiter_in_another_process(
    pg_url: str, when: str
) -> None:
    """The waiter's store listens; another store (another process) ends the task: the
    notification reaches the waiter, whether it came while the task was pending (its wait
    noted) or held (its row marked)."""
    waiter, worker = PostgresStore(pg_url), PostgresStore(pg_url)
    await waiter.open()
    await worker.open()
    try:
        await waiter.listen()
        done = waiter.subscribe(CHANNEL_TASK_DONE)
        await worker.submit([app_task("other"), app_task("t")])
        if when == "pending":
            assert await waiter.await_task("t") is not None
        claimed = {
            c.task.task_id: c.task.attempt for c in await worker.claim_tasks("s1", ["wf"], 2)
        }
        if when == "held":
            assert await waiter.await_task("t") is not None
        assert await worker.finish_tasks([processed("other", claimed["other"])]) == [True]
        assert await worker.finish_tasks([processed("t", claimed["t"])]) == [True]
        assert await done.wait(5) == ["t"]
    finally:
        await waiter.close()
        await worker.close()


async def test_on_postgresql_a_wait_being_noted_hides_no_task_from_a_claim(
    pg_url: str,
) -> None:
    """A note in a transaction not yet committed locks nothing a claim would skip: the
    pending task is claimed meanwhile."""
    store = PostgresStore(pg_url)
    await store.open()
    try:
        await store.submit([app_task("t")])
        async with await psycopg.AsyncConnection.connect(pg_url) as db:
            await db.execute(SQL["note_awaited"], {"task_id": "t"})
            claimed = await store.claim_tasks("s1", ["wf"], 1)
            assert [c.task.task_id for c in claimed] == ["t"]
            await db.commit()
        done = store.subscribe(CHANNEL_TASK_DONE)
        assert await store.finish_tasks([processed("t", claimed[0].task.attempt)]) == [True]
        assert await done.wait(5) == ["t"]
    finally:
        await store.close()
