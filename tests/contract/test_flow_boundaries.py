"""A flow is one transaction, savepoints included, on each store: the flows whose batch may be
refused row by row (the supervisor's expiry sweep, `reset_tasks`; the agent sweep,
`reassign_steps` and `fail_steps`) keep what they wrote before and after a refused batch,
roll back only that batch's savepoint, and lose everything when they fail after it. On
PostgreSQL the flow's first and last statements run in the same transaction, and the lease
row, the sweep's fence, stays locked from the first statement to the commit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, replace
from typing import Any

import psycopg
import pytest

from stepwarden.records import Submission
from stepwarden.retry import Backoff
from stepwarden.states import StepState, TaskState
from stepwarden.store import Store, policy, postgres
from stepwarden.store._flow import Flow, FlowFn, Query, Wakeups
from stepwarden.supervisor import LEASE

from ..dispatching import new_step
from ..rawsql import is_sqlite, script, seconds_ago, sql
from ..support.store import beat, dispatch

HOLDER = "sup"
XID = "test_transaction_id"


@dataclass
class Case:
    """A flow with a savepoint, the rows it changes ('good' and 'refused'), and the state of
    each before and after it applies."""

    set_up: Callable[[Store, str], Awaitable[None]]
    refusal: tuple[str, str]
    """(table, state) the database refuses to write for the task 'refused'."""
    flow: Callable[[int], FlowFn[Any]]
    read: Callable[[Store, str], Awaitable[Any]]
    before: Any
    after: Any
    refused_after: Any
    """The refused row once the flow committed: set aside for an operator (a task), or as
    it was (a step)."""


async def held(store: Store, *ids: str) -> dict[str, int]:
    await store.submit(
        [Submission(task_id=i, workflow="wf", input="{}", priority=0, complete_within=30,
                 max_failures=3, on_failure="compensate") for i in ids]
    )  # fmt: skip
    return {c.task.task_id: c.task.attempt for c in await store.claim_tasks("s1", ["wf"], 9)}


async def expired_tasks(store: Store, url: str) -> None:
    await held(store, "good", "refused")
    sql(url, f"UPDATE stepwarden_tasks SET complete_by = {seconds_ago(url, 60)}")


async def steps_of_a_gone_instance(store: Store, url: str) -> None:
    attempts = await held(store, "good", "refused")
    await store.dispatch_steps([dispatch(t, a) for t, a in attempts.items()])
    await store.beat([beat("a1")], ttl=30)
    assert len(await store.claim_requests("a1", "pay", ["charge"], 9)) == 2
    await store.leave("a1", ["pay"])


async def steps_nobody_picked_up(store: Store, url: str) -> None:
    attempts = await held(store, "good", "refused")
    await store.dispatch_steps(
        [replace(new_step(dispatch(t, a)), pickup_within=1.0) for t, a in attempts.items()]
    )
    sql(url, f"UPDATE stepwarden_steps SET dispatched_at = {seconds_ago(url, 60)}")


def sweep(term: int) -> FlowFn[Any]:
    return lambda wake: policy.sweep(
        lease=LEASE, holder=HOLDER, term=term, limit=100, backoff=Backoff(), wake=wake
    )


def sweep_steps(term: int) -> FlowFn[Any]:
    return lambda wake: policy.sweep_steps(
        lease=LEASE, holder=HOLDER, term=term, limit=100, forget_after=3600, reassign=True,
        wake=wake,
    )  # fmt: skip


async def task_state(store: Store, task_id: str) -> tuple[TaskState, int]:
    task = await store.get_task(task_id)
    assert task is not None
    return task.process_state, task.failure_count


async def step_state(store: Store, task_id: str) -> StepState:
    [step] = await store.get_steps(task_id)
    return step.state


CASES = {
    "reset_tasks": Case(expired_tasks, ("stepwarden_tasks", "pending"), sweep, task_state,
                        (TaskState.PROCESSING, 0), (TaskState.PENDING, 1), (TaskState.ERROR, 0)),
    "reassign_steps": Case(steps_of_a_gone_instance, ("stepwarden_steps", "not_started"),
                           sweep_steps, step_state, StepState.RUNNING, StepState.NOT_STARTED,
                           StepState.RUNNING),
    "fail_steps": Case(steps_nobody_picked_up, ("stepwarden_steps", "failed"), sweep_steps,
                       step_state, StepState.NOT_STARTED, StepState.FAILED,
                       StepState.NOT_STARTED),
}  # fmt: skip


def refuse(url: str, table: str, state: str) -> None:
    """The database refuses to write `state` for the task 'refused' (a constraint or a trigger
    of the application's, say)."""
    column = "process_state" if table == "stepwarden_tasks" else "state"
    if is_sqlite(url):
        script(
            url,
            f"CREATE TRIGGER refuse BEFORE UPDATE OF {column} ON {table}"
            f" WHEN NEW.task_id = 'refused' AND NEW.{column} = '{state}'"
            " BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END;",
        )
    else:
        sql(url, f"ALTER TABLE {table} ADD CONSTRAINT refuse"
                 f" CHECK (task_id <> 'refused' OR {column} <> '{state}')")  # fmt: skip


def note(text: str) -> Query:
    return Query("insert_events", each=[{"task_id": None, "kind": "note", "detail": f'"{text}"'}])


def bracketed(
    inner: FlowFn[Any],
    *,
    transaction_ids: list[str] | None = None,
    between: Callable[[], None] | None = None,
    fail_after: bool = False,
) -> FlowFn[Any]:
    """`inner` with a write before it and after it, the transaction's id read at its first
    and last statement (PostgreSQL), `between` called after each round of statements (the
    refused ones included), and a failure after it all when asked."""

    def flow(wake: Wakeups) -> Flow[Any]:
        first = [Query(XID)] if transaction_ids is not None else []
        rows = yield [*first, note("before")]
        if transaction_ids is not None:
            transaction_ids.append(rows[0][0]["xid"])
        result = yield from _observed(inner(wake), between or (lambda: None))
        rows = yield [note("after"), *first]
        if transaction_ids is not None:
            transaction_ids.append(rows[1][0]["xid"])
        if fail_after:
            raise RuntimeError("the flow fails after its savepoints")
        return result

    return flow


def _observed(inner: Flow[Any], between: Callable[[], None]) -> Generator[Any, Any, Any]:
    """Run `inner` as `yield from` would, calling `between` after each round."""
    try:
        batch = next(inner)
        while True:
            try:
                rows = yield batch
            except Exception as exc:  # a refused batch, thrown in by the driver
                between()
                batch = inner.throw(exc)
            else:
                between()
                batch = inner.send(rows)
    except StopIteration as stop:
        return stop.value


@pytest.fixture
def transaction_id_query(monkeypatch: pytest.MonkeyPatch) -> None:
    """A named query of the tests' own: the id of the transaction it runs in (one is assigned
    if none was yet)."""
    monkeypatch.setitem(postgres.SQL, XID, "SELECT pg_current_xact_id()::text AS xid")


async def notes(store: Store) -> list[str]:
    return sorted(e.detail for e in await store.events(kind="note"))


@pytest.mark.parametrize("name", list(CASES))
async def test_a_refused_batch_rolls_back_only_its_savepoint(
    store: Store, store_url: str, name: str, transaction_id_query: None
) -> None:
    case = CASES[name]
    await case.set_up(store, store_url)
    refuse(store_url, *case.refusal)
    term = await store.acquire_lease(LEASE, HOLDER, 30)
    assert term is not None
    on_postgres = not is_sqlite(store_url)
    ids: list[str] | None = [] if on_postgres else None
    probe = LeaseProbe(store_url) if on_postgres else None
    try:
        await store._write(
            bracketed(case.flow(term), transaction_ids=ids, between=probe.locked if probe else None)
        )
        if probe is not None:
            assert probe.rounds >= 2  # the fence's round, the savepoints' rounds
            probe.free()  # committed: the lease row's lock is gone with the transaction
    finally:
        if probe is not None:
            probe.close()
    assert await case.read(store, "good") == case.after
    assert await case.read(store, "refused") == case.refused_after
    assert await notes(store) == ["after", "before"]
    if ids is not None:
        [first, last] = ids
        assert first is not None and first == last


@pytest.mark.parametrize("name", list(CASES))
async def test_a_failure_after_the_savepoints_rolls_back_the_whole_flow(
    store: Store, store_url: str, name: str
) -> None:
    case = CASES[name]
    await case.set_up(store, store_url)
    refuse(store_url, *case.refusal)
    term = await store.acquire_lease(LEASE, HOLDER, 30)
    assert term is not None
    with pytest.raises(RuntimeError, match="after its savepoints"):
        await store._write(bracketed(case.flow(term), fail_after=True))
    assert await case.read(store, "good") == case.before
    assert await case.read(store, "refused") == case.before
    assert await notes(store) == []
    # Without the refusal, nothing is refused and the flow commits whole.
    if name == "reset_tasks":
        assert await store.sweep(
            lease=LEASE, holder=HOLDER, term=term, limit=100, backoff=Backoff()
        )
        assert await case.read(store, "good") == case.after


class LeaseProbe:
    """Another session trying to lock the lease row without waiting."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.rounds = 0

    def _try(self) -> bool:
        try:
            self.conn.execute(
                "SELECT 1 FROM stepwarden_leases WHERE name = %s FOR UPDATE NOWAIT", (LEASE,)
            )
        except psycopg.errors.LockNotAvailable:
            return False
        return True

    def locked(self) -> None:
        self.rounds += 1
        assert not self._try(), f"the lease row was free after round {self.rounds} of the flow"

    def free(self) -> None:
        assert self._try()

    def close(self) -> None:
        self.conn.close()
