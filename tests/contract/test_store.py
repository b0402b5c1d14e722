"""The Store contract: every implementation passes the same tests, on a real database."""

from __future__ import annotations

import asyncio

import pytest

from stepwarden.errors import SchemaVersionError
from stepwarden.records import TaskOutcome
from stepwarden.retry import Backoff
from stepwarden.states import StepState, TaskState
from stepwarden.store import CHANNEL_REQUESTS, CHANNEL_RESULTS, Store, open_one

from ..support.store import claim_one, dispatch, new_task, outcome


async def test_migrate_is_idempotent_and_versions_are_checked(store: Store, store_url: str) -> None:
    version = await store.schema_version()
    assert version >= 1
    assert await store.migrate() == version
    # A database whose schema is newer than the code is refused with a clear error.
    if store.dialect == "sqlite":
        import sqlite3

        path = store_url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as db:
            db.execute("INSERT INTO stepwarden_schema VALUES (?, 'future', 0)", (version + 1,))
    else:
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as db:
            db.execute(
                "INSERT INTO stepwarden_schema (version, name) VALUES (%s, 'future')",
                (version + 1,),
            )
    other = open_one(store_url)
    with pytest.raises(SchemaVersionError, match=f"version {version + 1}"):
        await other.open()
    await other.close()


async def test_submit_same_task_id_twice_creates_one_task(store: Store) -> None:
    assert [a.outcome for a in await store.submit([new_task("t1")])] == ["created"]
    assert [a.outcome for a in await store.submit([new_task("t1", priority=9)])] == ["same"]
    task = await store.get_task("t1")
    assert task is not None
    assert task.priority == 0
    assert task.process_state == TaskState.PENDING
    assert (task.locked_by, task.complete_by, task.failure_count) == (None, None, 0)


async def test_claim_by_priority_then_age_sets_the_lock(store: Store) -> None:
    await store.submit([new_task("low")])
    await store.submit([new_task("high", priority=5)])
    await store.submit([new_task("low2")])
    await store.submit([new_task("other", workflow="unknown-here")])
    claimed = await store.claim_tasks("s1", ["wf"], 10)
    assert [c.task.task_id for c in claimed] == ["high", "low", "low2"]
    for c in claimed:
        assert c.task.process_state == TaskState.PROCESSING
        assert c.task.locked_by == "s1"
        assert c.task.attempt == 1
        assert 29 < c.remaining <= 30
    assert await store.claim_tasks("s2", ["wf"], 10) == []


async def test_concurrent_claims_never_take_the_same_task(store: Store, store_url: str) -> None:
    await store.submit([new_task(f"t{i}") for i in range(60)])
    others = [open_one(store_url) for _ in range(3)]
    for o in others:
        await o.open()
    try:

        async def claimer(s: Store, name: str) -> list[str]:
            got: list[str] = []
            while True:
                batch = await s.claim_tasks(name, ["wf"], 7)
                if not batch:
                    return got
                got += [c.task.task_id for c in batch]

        results = await asyncio.gather(*(claimer(s, f"s{i}") for i, s in enumerate(others)))
    finally:
        for o in others:
            await o.close()
    everything = [t for r in results for t in r]
    assert sorted(everything) == sorted(f"t{i}" for i in range(60))


async def test_dispatch_is_fenced_by_the_task_attempt(store: Store) -> None:
    await store.submit([new_task("t1", within=30)])
    attempt = await claim_one(store)
    stale, wrong_owner, good = await store.dispatch_steps(
        [
            dispatch("t1", attempt + 1),
            dispatch("t1", attempt, seq=2, scheduler="someone-else"),
            dispatch("t1", attempt, seq=3, within=5),
        ]
    )
    assert stale is None and wrong_owner is None
    assert good is not None and good.attempt == 1 and 4 < good.remaining <= 5
    steps = await store.get_steps("t1")
    assert [s.seq for s in steps] == [3]
    step = steps[0]
    assert step.state == StepState.NOT_STARTED
    assert step.idempotency_key == "t1/3"
    # Recording the same step again changes nothing.
    assert await store.dispatch_steps([dispatch("t1", attempt, seq=3)]) == [None]


async def test_step_deadline_never_passes_the_task_deadline(store: Store) -> None:
    await store.submit([new_task("t1", within=2)])
    attempt = await claim_one(store)
    [got] = await store.dispatch_steps([dispatch("t1", attempt, within=60)])
    assert got is not None and got.remaining <= 2
    task, [step] = await store.get_task("t1"), await store.get_steps("t1")
    assert task is not None and step.complete_by <= task.complete_by  # type: ignore[operator]


async def test_agents_claim_only_their_requests_and_results_are_fenced(store: Store) -> None:
    await store.submit([new_task("t1")])
    attempt = await claim_one(store)
    sub = store.subscribe(CHANNEL_REQUESTS)
    await store.dispatch_steps([dispatch("t1", attempt), dispatch("t1", attempt, 2, agent="ship")])
    assert set(await sub.wait(1) or []) == {"pay", "ship"}
    assert await store.claim_requests("a1", "pay", ["refund"], 10) == []
    [req] = await store.claim_requests("a1", "pay", ["charge"], 10)
    assert (req.task_id, req.seq, req.attempt, req.idempotency_key) == ("t1", 1, 1, "t1/1")
    assert req.input == [{"amount": 5}]
    assert await store.claim_requests("a2", "pay", ["charge"], 10) == []
    results = store.subscribe(CHANNEL_RESULTS)
    # Another instance, or another attempt, cannot complete it; its holder can, once: the
    # same outcome again (a try whose answer was lost) is taken as recorded, another is not.
    assert await store.complete_steps([outcome("t1", 1, instance="a2")]) == [False]
    assert await store.complete_steps([outcome("t1", 2)]) == [False]
    assert await store.complete_steps([outcome("t1", 1)]) == [True]
    assert await store.complete_steps([outcome("t1", 1)]) == [True]
    assert await store.complete_steps([outcome("t1", 1, state=StepState.FAILED)]) == [False]
    assert await store.complete_steps([outcome("t1", 1, instance="a2")]) == [False]
    assert await results.wait(1) == ["t1\x1f1"]
    [done] = await store.finished_steps([("t1", 1), ("t1", 2)])
    assert done.state == StepState.COMPLETED and done.result == {"ok": True}
    assert done.locked_by == "a1" and done.finished_at is not None


async def test_a_result_after_complete_by_changes_nothing(store: Store) -> None:
    await store.submit([new_task("t1")])
    attempt = await claim_one(store)
    [got] = await store.dispatch_steps([dispatch("t1", attempt, within=0.2)])
    assert got is not None
    [req] = await store.claim_requests("a1", "pay", ["charge"], 1)
    await asyncio.sleep(got.remaining + 0.1)  # the deadline itself is what is tested
    assert await store.complete_steps([outcome("t1", req.attempt)]) == [False]
    [step] = await store.get_steps("t1")
    assert step.state == StepState.RUNNING and step.result is None


async def test_redispatch_keeps_the_key_and_fences_the_old_attempt(store: Store) -> None:
    await store.submit([new_task("t1", within=0.3)])
    first = await claim_one(store)
    await store.dispatch_steps([dispatch("t1", first, within=0.2)])
    [old] = await store.claim_requests("a-old", "pay", ["charge"], 1)
    await asyncio.sleep(0.45)  # both deadlines pass
    term = await store.acquire_lease("supervisor", "sup", 5)
    assert term is not None
    [expired] = await store.sweep(
        lease="supervisor",
        holder="sup",
        term=term,
        limit=10,
        backoff=Backoff(initial=0.0, maximum=0.0),
    )
    assert expired.task_id == "t1" and expired.process_state == TaskState.PENDING
    second = await claim_one(store, "s2")
    assert second == first + 1
    # Adopting fails (its complete_by passed); re-dispatching gives attempt 2, same key.
    [adopted] = await store.dispatch_steps(
        [dispatch("t1", second, scheduler="s2", kind="adopt", expected=1)]
    )
    assert adopted is None
    [again] = await store.dispatch_steps(
        [dispatch("t1", second, scheduler="s2", kind="redispatch", expected=1)]
    )
    assert again is not None and again.attempt == 2
    [new] = await store.claim_requests("a-new", "pay", ["charge"], 1)
    assert new.attempt == 2 and new.idempotency_key == old.idempotency_key
    # The zombie's late answer is discarded, the current one is kept.
    assert await store.complete_steps([outcome("t1", 1, instance="a-old")]) == [False]
    assert await store.complete_steps([outcome("t1", 2, instance="a-new")]) == [True]


async def test_finish_is_fenced_and_an_error_raises_an_alert(store: Store) -> None:
    await store.submit([new_task("ok"), new_task("bad")])
    claimed = await store.claim_tasks("s1", ["wf"], 2)
    att = {c.task.task_id: c.task.attempt for c in claimed}
    done = await store.finish_tasks(
        [
            TaskOutcome(
                task_id="ok",
                attempt=att["ok"] + 1,
                scheduler="s1",
                state=TaskState.PROCESSED,
                result="1",
                error=None,
            ),
            TaskOutcome(
                task_id="ok",
                attempt=att["ok"],
                scheduler="s2",
                state=TaskState.PROCESSED,
                result="1",
                error=None,
            ),
            TaskOutcome(
                task_id="ok",
                attempt=att["ok"],
                scheduler="s1",
                state=TaskState.PROCESSED,
                result='{"r": 1}',
                error=None,
            ),
            TaskOutcome(
                task_id="bad",
                attempt=att["bad"],
                scheduler="s1",
                state=TaskState.ERROR,
                result=None,
                error="card declined",
            ),
        ]
    )
    assert done == [False, False, True, True]
    ok, bad = await store.get_task("ok"), await store.get_task("bad")
    assert ok is not None and ok.process_state == TaskState.PROCESSED and ok.result == {"r": 1}
    assert ok.locked_by is None and ok.finished_at is not None
    assert bad is not None and bad.process_state == TaskState.ERROR
    [alert] = await store.events(task_id="bad", kind="alert")
    assert alert.detail["error"] == "card declined"
    assert await store.events(task_id="ok", kind="alert") == []
    counts = await store.count_tasks()
    assert counts[TaskState.PROCESSED] == 1 and counts[TaskState.ERROR] == 1


async def test_lease_terms_only_rise(store: Store) -> None:
    t1 = await store.acquire_lease("supervisor", "a", 0.3)
    assert t1 is not None
    assert await store.acquire_lease("supervisor", "b", 0.3) is None
    assert await store.acquire_lease("supervisor", "a", 0.3) == t1
    await asyncio.sleep(0.4)  # a's lease lapses
    t2 = await store.acquire_lease("supervisor", "b", 5)
    assert t2 is not None and t2 > t1
    # a, paused past its lease, comes back: it holds nothing and its sweep writes nothing.
    assert await store.acquire_lease("supervisor", "a", 5) is None
    await store.submit([new_task("t1", within=0.05)])
    await claim_one(store)
    await asyncio.sleep(0.15)
    stale = await store.sweep(
        lease="supervisor", holder="a", term=t1, limit=10, backoff=Backoff(initial=0, maximum=0)
    )
    assert stale == []
    task = await store.get_task("t1")
    assert task is not None and task.process_state == TaskState.PROCESSING
    assert task.failure_count == 0
    await store.release_lease("supervisor", "b")
    t3 = await store.acquire_lease("supervisor", "a", 5)
    assert t3 is not None and t3 > t2


async def test_sweep_resets_with_backoff_then_sets_error_at_max_failures(store: Store) -> None:
    await store.submit([new_task("t1", within=0.05, max_failures=2)])
    term = await store.acquire_lease("supervisor", "sup", 30)
    assert term is not None

    async def expire_once() -> list[TaskState]:
        await claim_one(store)
        await asyncio.sleep(0.1)
        swept = await store.sweep(
            lease="supervisor",
            holder="sup",
            term=term,
            limit=10,
            backoff=Backoff(initial=0.3, maximum=0.3),
        )
        return [e.process_state for e in swept]

    assert await expire_once() == [TaskState.PENDING]
    task = await store.get_task("t1")
    assert task is not None and task.failure_count == 1 and task.locked_by is None
    # The backoff keeps it from being claimed at once.
    assert await store.claim_tasks("s1", ["wf"], 1) == []
    await asyncio.sleep(0.35)
    assert await expire_once() == [TaskState.ERROR]
    task = await store.get_task("t1")
    assert task is not None and task.process_state == TaskState.ERROR
    assert task.failure_count == 2 and "max_failures" in (task.error or "")
    events = await store.events(task_id="t1")
    assert [e.kind for e in events] == ["expired", "expired", "alert"]
    # Each sweep names who swept, under which lease term.
    assert {(e.detail["by"], e.detail["term"]) for e in events[:2]} == {("sup", term)}


async def test_sweep_finds_expired_steps_of_the_current_attempt_only(store: Store) -> None:
    await store.submit([new_task("t1", within=30)])
    attempt = await claim_one(store)
    await store.dispatch_steps([dispatch("t1", attempt, within=0.05)])
    term = await store.acquire_lease("supervisor", "sup", 30)
    assert term is not None
    await asyncio.sleep(0.1)
    [e] = await store.sweep(
        lease="supervisor", holder="sup", term=term, limit=10, backoff=Backoff(initial=0, maximum=0)
    )
    assert (e.task_id, e.seq, e.failure_count) == ("t1", 1, 1)
    # Claimed again, the old step is not counted a second time before it is re-dispatched.
    await claim_one(store, "s2")
    assert (
        await store.sweep(
            lease="supervisor",
            holder="sup",
            term=term,
            limit=10,
            backoff=Backoff(initial=0, maximum=0),
        )
        == []
    )


async def test_a_finished_task_leaves_no_request_behind(store: Store) -> None:
    # Two tasks with two open steps each: one finished in error by its scheduler, one set to
    # error by the supervisor at max_failures. No agent may claim or complete their steps.
    await store.submit([new_task("by-scheduler"), new_task("by-supervisor", max_failures=1)])
    claimed = await store.claim_tasks("s1", ["wf"], 2)
    att = {c.task.task_id: c.task.attempt for c in claimed}
    for task_id in att:
        await store.dispatch_steps(
            [dispatch(task_id, att[task_id], seq=1), dispatch(task_id, att[task_id], seq=2)]
        )
    claimed_requests = await store.claim_requests("a1", "pay", ["charge"], 10)
    assert len(claimed_requests) == 4  # all running now, under agent instance a1
    running = next(r for r in claimed_requests if (r.task_id, r.seq) == ("by-scheduler", 1))
    error = TaskOutcome(
        task_id="by-scheduler",
        attempt=att["by-scheduler"],
        scheduler="s1",
        state=TaskState.ERROR,
        result=None,
        error="card declined",
    )
    assert await store.finish_tasks([error]) == [True]
    # The other task's step 1 expires (the step's own deadline) while step 2 still has time.
    await store.dispatch_steps(
        [dispatch("by-supervisor", att["by-supervisor"], seq=3, within=0.05)]
    )
    term = await store.acquire_lease("supervisor", "sup", 30)
    assert term is not None
    await asyncio.sleep(0.1)
    [swept] = await store.sweep(
        lease="supervisor", holder="sup", term=term, limit=10, backoff=Backoff(initial=0, maximum=0)
    )
    assert (swept.task_id, swept.process_state) == ("by-supervisor", TaskState.ERROR)

    for task_id in att:
        steps = await store.get_steps(task_id)
        assert [s.state for s in steps] == [StepState.FAILED] * len(steps)
        assert all("abandoned" in (s.error or "") for s in steps)
    assert await store.claim_requests("a2", "pay", ["charge"], 10) == []
    # The answer of the step that was running when its task finished changes nothing.
    assert await store.complete_steps([outcome("by-scheduler", running.attempt)]) == [False]
