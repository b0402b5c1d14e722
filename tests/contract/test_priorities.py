"""Priorities age, on each store: claims take the work of least `ranked_at` (its submit or
dispatch, less its priority's head start: `rules.head_start`), so that under a saturating
stream of higher priorities a task, or a step in its agent's queue, of lower priority is
delayed by at most the difference of their head starts plus what the higher work itself
waits, never starved. Time passes by the database's clock: the rows already written are
moved back, as if submitted that much earlier."""

from __future__ import annotations

from stepwarden.records import StepDispatch, Submission
from stepwarden.rules import head_start
from stepwarden.store import Store
from tests.rawsql import is_sqlite, sql

from ..dispatching import step_dispatch

HIGH, LOW = 10, 0
BOUND = head_start(HIGH) - head_start(LOW)  # 10 s
ARRIVING, CLAIMED = 3, 2  # a round: more work of priority HIGH arrives than is claimed
ROUNDS = 60


def _task(task_id: str, priority: int) -> Submission:
    return Submission(
        task_id=task_id,
        workflow="wf",
        input="{}",
        priority=priority,
        complete_within=600,
        max_failures=3,
    )


def _earlier(store_url: str, table: str, seconds: float, where: str = "true") -> None:
    """The rows of `table` written `seconds` earlier than they were (their rank included)."""
    times = (
        ("created_at", "ranked_at")
        if table == "stepwarden_tasks"
        else ("dispatched_at", "ranked_at")
    )
    by = str(seconds) if is_sqlite(store_url) else f"make_interval(secs => {seconds})"
    moves = ", ".join(f"{c} = {c} - {by}" for c in times)
    sql(store_url, f"UPDATE {table} SET {moves} WHERE {where}")


def _delayed_within_the_bound(
    arrived: dict[str, int], before: dict[str, int], last: list[str], now: int
) -> None:
    """The low work, there from second 0, was taken at second `now` (with `last`), after
    `before`; `arrived`: the second each piece of high work came."""
    # Delayed by priority: after all the high work that came less than 10 s after it, and
    # before any that came later...
    assert {k for k, s in arrived.items() if s < BOUND} <= set(before) | set(last)
    assert all(arrived[k] < BOUND for k in before)
    # ...so within 10 s plus the longest the high work taken before it waited.
    assert now <= BOUND + max(before.values()) + 1, (now, max(before.values()))


async def test_a_low_priority_task_is_delayed_by_a_saturating_stream_never_starved(
    store: Store, store_url: str
) -> None:
    """Each round (a second of the store's clock) brings 3 tasks of priority 10 and a
    scheduler claims 2: the backlog of high work only grows. A task of priority 0 submitted
    at the start is claimed once the high tasks submitted less than 10 s after it are: within
    10 s plus the longest a high task claimed before it waited."""
    await store.submit([_task("low", LOW)])
    submitted: dict[str, int] = {}  # the second each high task was submitted at
    before: dict[str, int] = {}  # the high tasks claimed before the low one: their wait
    for now in range(ROUNDS):
        batch = [f"high-{now}-{i}" for i in range(ARRIVING)]
        await store.submit([_task(t, HIGH) for t in batch])
        submitted.update(dict.fromkeys(batch, now))
        got = [c.task.task_id for c in await store.claim_tasks("s1", ["wf"], CLAIMED)]
        assert len(got) == CLAIMED
        if "low" in got:
            break
        before.update((t, now - submitted[t]) for t in got)
        _earlier(store_url, "stepwarden_tasks", 1)  # a second passes
    else:
        raise AssertionError(f"the low task still waits after {ROUNDS} s of high ones")
    _delayed_within_the_bound(submitted, before, got, now)


async def test_a_low_priority_request_is_delayed_by_a_saturating_stream_never_starved(
    store: Store, store_url: str
) -> None:
    """The same in an agent's queue: each step's request is ranked from its dispatch, less
    its priority's head start."""
    await store.submit([_task("lo", LOW), _task("hi", HIGH)])
    claimed = {c.task.task_id: c.task.attempt for c in await store.claim_tasks("s1", ["wf"], 2)}
    seqs = iter(range(1, 10_000))

    async def dispatch(task_id: str, priority: int) -> int:
        seq = next(seqs)
        [done] = await store.dispatch_steps(
            [
                step_dispatch(
                    "new", task_id=task_id, task_attempt=claimed[task_id], scheduler="s1",
                    seq=seq, name="pay.charge", agent="pay", operation="charge", input="[]",
                    priority=priority, complete_within=300,
                )
            ]
        )  # fmt: skip
        assert done is not None
        return seq

    low = await dispatch("lo", LOW)
    dispatched: dict[str, int] = {}
    before: dict[str, int] = {}
    for now in range(ROUNDS):
        for _ in range(ARRIVING):
            dispatched[f"hi/{await dispatch('hi', HIGH)}"] = now
        claimed_now = await store.claim_requests("a1", "pay", ["charge"], CLAIMED)
        got = [f"{r.task_id}/{r.seq}" for r in claimed_now]
        assert len(got) == CLAIMED
        if f"lo/{low}" in got:
            break
        before.update((k, now - dispatched[k]) for k in got)
        _earlier(store_url, "stepwarden_steps", 1)
    else:
        raise AssertionError(f"the low request still waits after {ROUNDS} s of high ones")
    _delayed_within_the_bound(dispatched, before, got, now)


async def test_a_request_dispatched_again_keeps_its_head_start_from_its_new_dispatch(
    store: Store, store_url: str
) -> None:
    """A step dispatched again (its complete_by passed) is ranked from that dispatch, with
    its priority's head start: neither by its first dispatch nor without its priority."""
    await store.submit([_task("hi", HIGH), _task("lo", LOW)])
    held = {c.task.task_id: c.task.attempt for c in await store.claim_tasks("s1", ["wf"], 2)}

    def step(kind: str, task_id: str, seq: int, priority: int, expected: int = 0) -> StepDispatch:
        return step_dispatch(
            kind, task_id=task_id, task_attempt=held[task_id], scheduler="s1", seq=seq,
            name="pay.charge", agent="pay", operation="charge", input="[]", priority=priority,
            complete_within=300, expected_attempt=expected,
        )  # fmt: skip

    assert await store.dispatch_steps([step("new", "hi", 1, HIGH)]) != [None]
    [first] = await store.claim_requests("a1", "pay", ["charge"], 1)
    _earlier(store_url, "stepwarden_steps", 100)  # dispatched 100 s ago; its call was lost
    past = "0" if is_sqlite(store_url) else "now() - interval '1 s'"
    sql(store_url, f"UPDATE stepwarden_steps SET complete_by = {past}")
    redo = step("redispatch", "hi", 1, HIGH, first.attempt)
    assert await store.dispatch_steps([redo]) != [None]
    # Requests of priority 0 queued 11 s and 9 s before that dispatch: its 10 s of head start
    # put it between them.
    assert await store.dispatch_steps([step("new", "lo", 1, LOW), step("new", "lo", 2, LOW)])
    _earlier(store_url, "stepwarden_steps", 11, "task_id = 'lo' AND seq = 1")
    _earlier(store_url, "stepwarden_steps", 9, "task_id = 'lo' AND seq = 2")
    taken = await store.claim_requests("a1", "pay", ["charge"], 3)
    assert [(r.task_id, r.seq) for r in taken] == [("lo", 1), ("hi", 1), ("lo", 2)]
    assert taken[1].attempt == first.attempt + 1
