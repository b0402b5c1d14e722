"""A task's end by its scheduler wakes whoever waits for its result, and nobody else (on
PostgreSQL a notification costs every listening session a read); an operator's end wakes
always. A waiter marks the row of a task a scheduler holds, and notes its wait beside the
row of one no scheduler holds (pending, waiting, paused: schedulers claim those rows
skipping locked ones, so a waiter does not lock them); an end reads both."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from stepwarden.records import OperatorAction, TaskOutcome
from stepwarden.states import TaskState
from stepwarden.store import CHANNEL_TASK_DONE, Store
from stepwarden.store.postgres import SQL, PostgresStore

from ..support.apps import app_task
from ..support.poll import until


async def row_awaited(store: Store, task_id: str) -> bool:
    [row] = await store._read_one("get_task", task_id=task_id)
    return bool(row["awaited"])


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
    # The held task's row is marked; the pending one's is not (its wait is noted beside it).
    assert await row_awaited(store, "marked") and not await row_awaited(store, "noted")
    assert await store.finish_tasks([processed("alone", claimed["alone"])]) == [True]
    both = [processed(t, claimed[t]) for t in ("noted", "marked")]
    assert await store.finish_tasks(both) == [True, True]
    # Everything received so far: the end of "alone" woke nobody.
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


async def test_an_operators_end_wakes_whether_or_not_anyone_waits(store: Store) -> None:
    await store.submit([app_task("t")])
    done = store.subscribe(CHANNEL_TASK_DONE)
    [out] = await store.operate([OperatorAction(action="cancel", task_id="t", actor="ops")])
    assert out.applied
    assert await done.wait(5) == ["t"]
    assert not await row_awaited(store, "t")


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


async def test_on_postgresql_a_mark_that_waits_for_an_end_reads_the_end(pg_url: str) -> None:
    """A waiter marks a held task while its end is being written (the row locked, not yet
    committed): the mark waits for the row, finds it no longer held, and the waiter reads
    the end rather than waiting for a wake-up that will not come."""
    store = PostgresStore(pg_url)
    await store.open()
    try:
        await store.submit([app_task("t")])
        await store.claim_tasks("s1", ["wf"], 1)
        async with await psycopg.AsyncConnection.connect(pg_url) as db:
            await db.execute(
                "UPDATE stepwarden_tasks SET process_state = 'processed', locked_by = NULL,"
                " complete_by = NULL, result = '\"r\"', finished_at = now()"
                " WHERE task_id = 't'"
            )
            waiter = asyncio.create_task(store.await_task("t"))

            async def mark_waits() -> bool:
                # (pg_stat_activity is read once per transaction: a connection of its own.)
                async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as c:
                    cur = await c.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                        " AND query LIKE '%awaited = true%'"
                    )
                    row = await cur.fetchone()
                return bool(row and row[0])

            await until(mark_waits)
            await db.commit()
        ended = await waiter
        assert ended is not None and ended.process_state == TaskState.PROCESSED
        assert ended.result == "r"
        assert not await row_awaited(store, "t")
    finally:
        await store.close()


@pytest.mark.parametrize("then", ["pending", "held", "ended", "unknown"])
async def test_a_wait_for_a_task_created_here_notes_itself_before_it_reads(
    store: Store, then: str
) -> None:
    """An App that has just created a task notes its wait before reading it: one read fewer
    while no scheduler holds the task (the case right after a submit), and whatever the
    task became in between (held, ended, never stored), its end still wakes the waiter and
    what is read is the task as it is."""
    reads: list[str] = []
    read_one = store._read_one

    async def counted(name: str, **params: Any) -> list[dict[str, Any]]:
        reads.append(name)
        return await read_one(name, **params)

    if then != "unknown":
        await store.submit([app_task("t")])
    attempt = None
    if then in ("held", "ended"):
        [c] = await store.claim_tasks("s1", ["wf"], 1)
        attempt = c.task.attempt
        if then == "ended":
            assert await store.finish_tasks([processed("t", attempt)]) == [True]
    done = store.subscribe(CHANNEL_TASK_DONE)
    store._read_one = counted  # type: ignore[method-assign,assignment]
    try:
        task = await store.await_task("t", created_here=True)
    finally:
        store._read_one = read_one  # type: ignore[method-assign]
    assert reads == ["get_task"]  # the note first, then one read (and a mark when held)
    if then == "unknown":
        assert task is None
        return
    assert task is not None
    expected = {
        "pending": TaskState.PENDING,
        "held": TaskState.PROCESSING,
        "ended": TaskState.PROCESSED,
    }
    assert task.process_state == expected[then]
    if then == "held":
        assert await row_awaited(store, "t")
    if then == "ended":
        return
    if then == "pending":
        [c] = await store.claim_tasks("s1", ["wf"], 1)
        attempt = c.task.attempt
    assert attempt is not None
    assert await store.finish_tasks([processed("t", attempt)]) == [True]
    assert await done.wait(5) == ["t"]
