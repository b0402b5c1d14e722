"""The supervisor's flows (`store.policy`): the lease, the sweeps of expired tasks and of
gone agents' steps, and the round that makes them at rest in one transaction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ...errors import PermanentStoreError
from ...records import (
    Expired,
    LeaseTry,
    Released,
    StepSwept,
    SweepRound,
    step_key,
)
from ...retry import Backoff
from ...rules import (
    AlertReason,
    ExpiryPlan,
    abandoned_error,
    compensable_tasks,
    lease_term,
    pickup_failure,
    plan_expiry,
    plan_gone_step,
    plan_set_aside,
    total_failure,
)
from ...sealing import Keyring
from ...states import FINISHED_TASK_STATES, StepState, TaskState
from .. import _rows
from .._flow import Flow, Query, Row, Rows, Wakeups, fetch
from ._shared import _holds, lease_fence, logger
from .application import purge
from .operator import _cascade, _cascaded, children_ended
from .schedulers import release_gone_schedulers
from .schedules import create_ticks
from .waits import wake_due


def acquire_lease(name: str, holder: str, ttl: float, wake: Wakeups) -> Flow[int | None]:
    """Take or renew the lease under the term `rules.lease_term` gives; None while another
    holds it (or took it first)."""
    tried = yield from try_lease(name, holder, ttl, None, wake)
    return tried[0].term


def try_lease(
    name: str, holder: str, ttl: float, first: Query | None, wake: Wakeups
) -> Flow[tuple[LeaseTry, Rows]]:
    """`acquire_lease`, with when the lease another holds lapses; `first` (the dialect's
    end of stalled sessions, whose locks would hold the lease row) is run before, in the
    same transaction, and its rows returned."""
    batch = [Query("lock_lease_row", {"name": name})]
    if first is not None:
        batch.insert(0, first)
    *before, found = yield batch
    ended = before[0] if before else []
    row = found[0] if found else None
    term = lease_term(row, holder)
    if term is None:
        lapses = None if row is None else max(0.0, float(row["lapses_in"]))
        return LeaseTry(None, lapses), ended
    seen = row["term"] if row else None
    rows = yield from fetch(
        "put_lease", name=name, holder=holder, term=term, seen=seen, ttl=float(ttl)
    )
    return LeaseTry(term if rows else None, None), ended


def look_lease(name: str) -> Query:
    """A standby's look at the lease: read, not locked, not taken (`lease_lapses`)."""
    return Query("look_lease", {"name": name})


def lease_lapses(rows: Rows, holder: str) -> float | None:
    """From a look at the lease (`look_lease`): the seconds until the lease another holds
    lapses; None when `holder` may take or renew it now (free, lapsed, or its own)."""
    row = rows[0] if rows else None
    if row is None or lease_term(row, holder) is not None:
        return None
    return max(0.0, float(row["lapses_in"]))


def release_lease(name: str, holder: str) -> Query:
    return Query("release_lease", {"name": name, "holder": holder})


def sweep(
    *, lease: str, holder: str, term: int, limit: int, backoff: Backoff, wake: Wakeups
) -> Flow[list[Expired]]:
    """Under the lease: held tasks whose complete_by passed, and held tasks with an open step
    of the current attempt whose complete_by passed, go where `rules.plan_expiry` says. A
    task the rule or the database refuses is set aside for an operator; the others go on."""
    if limit <= 0:
        return []
    held, steps, tasks = yield [
        lease_fence(lease, holder, term),
        Query("expired_steps", {"limit": limit}),
        Query("expired_tasks", {"limit": limit}),
    ]
    if not held:
        return []
    found: dict[str, Row] = {}
    for r in [*steps, *tasks]:
        found.setdefault(r["task_id"], r)
    rows = list(found.values())[:limit]
    if not rows:
        return []
    ids = [r["task_id"] for r in rows]
    # Their children are locked first: the order in which a child's end locks its parent.
    descendants, facts = yield [
        Query("descendants", {"task_ids": ids}),
        Query("compensation_facts", {"task_ids": ids}),
    ]
    compensable = compensable_tasks(facts, descendants)
    plans: list[tuple[Row, ExpiryPlan]] = []
    aside: list[tuple[Row, BaseException]] = []
    for r in rows:
        try:
            plans.append((r, _plan_expiry(r, r["task_id"] in compensable, backoff)))
        except Exception as exc:
            aside.append((r, exc))
    abandoning = sorted({r["task_id"] for r, p in plans if p.abandon})
    holds = _holds((yield from fetch("hold_facts", task_ids=abandoning))) if abandoning else {}
    by = {"holder": holder, "term": term}
    applied, refused = yield from _apply_each(
        "reset_tasks", by, [_reset_params(r, p, holds) for r, p in plans]
    )
    aside.extend((plans[i][0], exc) for i, exc in refused)
    alerts = {r["task_id"]: p.alert for r, p in plans if p.alert is not None}
    expired = [_rows.expired(r) for r in applied]
    expired = [replace(e, alert=str(alerts[e.task_id])) if e.task_id in alerts else e
               for e in expired]  # fmt: skip
    if aside:
        expired.extend((yield from _set_aside(aside, by)))
    if any(e.process_state in (TaskState.PENDING, TaskState.COMPENSATING) for e in expired):
        wake.tasks()
    ended = [e.task_id for e in expired if e.process_state in FINISHED_TASK_STATES]
    wake.done(ended)
    wake.calls([e.task_id for e in expired if e.task_id in abandoning or e.set_aside])
    yield from children_ended(ended, wake)
    held_as = {r["task_id"]: r["process_state"] for r in rows}
    for e in expired:  # given up and compensated: its children are compensated too
        if (
            e.process_state == TaskState.COMPENSATING
            and held_as.get(e.task_id) == TaskState.PROCESSING
            and descendants
        ):
            _cascaded(wake, (yield from _cascade(e.task_id, "failed", descendants)))
    return expired


def _plan_expiry(r: Row, compensable: bool, backoff: Backoff) -> ExpiryPlan:
    return plan_expiry(
        held_as=TaskState(r["process_state"]),
        on_failure=r["on_failure"],
        failure_count=r["failure_count"],
        compensation_failures=r["compensation_failures"],
        max_failures=r["max_failures"],
        seq=r["seq"],
        compensable=compensable,
        backoff=backoff,
    )


def _reset_params(r: Row, p: ExpiryPlan, holds: Mapping[str, float]) -> dict[str, Any]:
    return {
        "task_id": r["task_id"],
        "attempt": r["attempt"],
        "seq": r["seq"],
        "held_as": r["process_state"],
        "state": str(p.state),
        "failure_count": p.failure_count,
        "compensation_failures": p.compensation_failures,
        "expiries": p.expiries,
        "error": p.error,
        "delay": p.delay,
        "finished": p.finished,
        "abandon": p.abandon,
        "hold": holds.get(r["task_id"], 0.0) if p.abandon else 0.0,
        "alert": None if p.alert is None else str(p.alert),
        "abandoned_error": abandoned_error(p.state),
    }


def _apply_each(
    name: str, params: Mapping[str, Any], each: list[dict[str, Any]]
) -> Flow[tuple[Rows, list[tuple[int, PermanentStoreError]]]]:
    """A batch query that the database may refuse for one of its rows: tried whole in a
    savepoint, then, if refused, one row at a time. The rows applied, and the positions of
    those refused with why."""
    if not each:
        return [], []
    try:
        [rows] = yield [Query(name, params, each=each, savepoint=True)]
        return rows, []
    except PermanentStoreError:
        pass
    applied: Rows = []
    refused: list[tuple[int, PermanentStoreError]] = []
    for i, one in enumerate(each):
        try:
            [rows] = yield [Query(name, params, each=[one], savepoint=True)]
            applied.extend(rows)
        except PermanentStoreError as exc:
            refused.append((i, exc))
    return applied, refused


def _set_aside(
    aside: list[tuple[Row, BaseException]], by: Mapping[str, Any]
) -> Flow[list[Expired]]:
    each = []
    for r, exc in aside:
        held_as = TaskState(r["process_state"])
        state, error = plan_set_aside(held_as, exc)
        logger.error("task %s: set aside: %s", r["task_id"], error, exc_info=exc)
        each.append(
            {
                "task_id": r["task_id"],
                "attempt": r["attempt"],
                "held_as": str(held_as),
                "state": str(state),
                "error": error,
                "alert": str(AlertReason.SET_ASIDE),
                "abandoned_error": abandoned_error(state),
            }
        )
    [rows] = yield [Query("set_aside", by, each=each)]
    return [_rows.expired(r, set_aside=True) for r in rows]


def sweep_steps(
    *,
    lease: str,
    holder: str,
    term: int,
    limit: int,
    forget_after: float,
    reassign: bool,
    wake: Wakeups,
) -> Flow[list[StepSwept]]:
    """Under the lease: the running steps (in time) of gone agent instances go back to
    not_started under a new attempt named after the task's, whatever the state of their
    task, as `rules.plan_gone_step` says: queued again with a full complete_by while the
    task's calls go on (held, released, waiting), past its complete_by for a paused one; a
    task held by a scheduler found gone is released (failure_count unchanged), one held by
    an alive scheduler kept (it waits on for the step). Steps no agent claimed within
    their pick-up timeout, and open steps past their total timeout, fail
    (`rules.pickup_failure`, `rules.total_failure`); instances gone for `forget_after`
    seconds are forgotten."""
    if limit <= 0:
        return []
    held, gone, pickup, total = yield [
        lease_fence(lease, holder, term),
        Query("gone_holders", {"limit": limit if reassign else 0}),
        Query("pickup_expired", {"limit": limit}),
        Query("total_expired", {"limit": limit}),
    ]
    if not held:
        return []
    by = {"holder": holder, "term": term}
    timed_out: list[tuple[Row, str, tuple[str, bool]]] = [
        (r, "pickup", pickup_failure(r["pickup_within"])) for r in pickup
    ]
    failing = {(r["task_id"], r["seq"]) for r in pickup}
    timed_out += [
        (r, "total", total_failure(r["total"], StepState(r["state"]), r["attempt"]))
        for r in total
        if (r["task_id"], r["seq"]) not in failing
    ]
    moves = []
    for r in gone:
        plan = plan_gone_step(
            task_state=TaskState(r["task_state"]),
            task_held=r["task_locked_by"] is not None,
            holder_gone=bool(r["task_holder_gone"]),
        )
        released_as = None if plan.release_as is None else str(plan.release_as)
        moves.append(
            {"task_id": r["task_id"], "seq": r["seq"], "attempt": r["attempt"],
             "instance": r["locked_by"], "in_time": plan.in_time,
             "task_attempt": r["task_attempt"], "held_as": r["task_state"],
             "released_as": released_as}
        )  # fmt: skip
    fail = [
        {"task_id": r["task_id"], "seq": r["seq"], "attempt": r["attempt"],
         "state": r["state"], "error": error, "abandoned": abandoned}
        for r, _, (error, abandoned) in timed_out
    ]  # fmt: skip
    reassigned, _ = yield from _apply_each("reassign_steps", by, moves)
    failed, _ = yield from _apply_each("fail_steps", by, fail)
    yield [Query("forget_agents", {"forget_after": float(forget_after)})]
    read = {(r["task_id"], r["seq"]): (r, "reassigned") for r in gone}
    read.update({(r["task_id"], r["seq"]): (r, kind) for r, kind, _ in timed_out})
    swept = []
    for r in [*reassigned, *failed]:
        seen, kind = read[(r["task_id"], r["seq"])]
        swept.append(
            StepSwept(
                task_id=r["task_id"],
                seq=r["seq"],
                kind=kind,  # type: ignore[arg-type]
                agent=seen["agent"],
                instance=seen["locked_by"],
            )
        )
    agents = [s.agent for s in swept if s.kind == "reassigned"]
    if agents:
        wake.requests(agents)
        wake.tasks()
    wake.results([step_key(s.task_id, s.seq) for s in swept if s.kind != "reassigned"])
    return swept


def sweep_round(
    *,
    lease: str,
    holder: str,
    term: int,
    limit: int,
    backoff: Backoff,
    forget_after: float,
    release: bool,
    keys: Keyring | None,
    purge_after: float | None,
    purge_limit: int,
    wake: Wakeups,
) -> Flow[SweepRound]:
    """One supervisor round under the lease, in one transaction: the first batch of each
    sweep in the order the supervisor runs them (the tasks of gone schedulers given back
    when `release`, waiting tasks woken, schedules' ticks, steps swept, expired tasks
    recovered), the finished tasks past `purge_after` purged, then the seconds until the
    next expiry (`next_expiry`). Idle, that is one transaction where each apart was one."""
    released: list[Released] = []
    if release:
        released = yield from release_gone_schedulers(
            lease=lease, holder=holder, term=term, limit=limit, forget_after=forget_after,
            wake=wake,
        )  # fmt: skip
    woke = yield from wake_due(lease=lease, holder=holder, term=term, limit=limit, wake=wake)
    ticks = yield from create_ticks(
        lease=lease, holder=holder, term=term, limit=limit, keys=keys, wake=wake
    )
    swept = yield from sweep_steps(
        lease=lease, holder=holder, term=term, limit=limit, forget_after=forget_after,
        reassign=release, wake=wake,
    )  # fmt: skip
    expired = yield from sweep(
        lease=lease, holder=holder, term=term, limit=limit, backoff=backoff, wake=wake
    )
    purged = 0
    if purge_after is not None:
        [rows] = yield [purge(purge_after, purge_limit)]
        purged = len(rows)
    [soon] = yield [Query("next_expiry", {"name": lease, "holder": holder})]
    seconds = soon[0]["seconds"] if soon else None
    return SweepRound(
        released=released,
        woke=woke,
        ticks=ticks,
        swept=swept,
        expired=expired,
        purged=purged,
        next_expiry=None if seconds is None else float(seconds),
    )
