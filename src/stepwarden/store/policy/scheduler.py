"""The scheduler's flows (`store.policy`): claims, the replay's reads, step dispatches and
a hold's end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._json import tags_of, tags_text
from ...records import (
    Adopt,
    ClaimedTask,
    DispatchedStep,
    NewStep,
    Redispatch,
    StepDispatch,
    StepRecord,
    TaskOutcome,
    idempotency_key,
)
from ...rules import (
    AlertReason,
    FinishPlan,
    TenantWork,
    abandoned_error,
    compensable_tasks,
    error_text,
    fair_shares,
    head_start,
    least_pass,
    plan_finish,
    plan_set_aside,
    with_tag,
)
from ...sealing import Keyring
from ...states import FINISHED_TASK_STATES, TaskState
from .. import _rows
from .._flow import Flow, Query, Rows, Wakeups, fetch, first_of_each
from ._shared import _by_ord, _holds, logger
from .operator import _cascade, _cascaded, children_ended


def claim_pairs(workflows: Sequence[str | tuple[str, int]]) -> dict[str, list[Any]]:
    """The (workflow, version) pairs a claim is for, as the parameters `workflows` and
    `versions` (side by side); a workflow named alone is its version 1."""
    pairs = sorted({(w, 1) if isinstance(w, str) else (w[0], int(w[1])) for w in workflows})
    return {"workflows": [w for w, _ in pairs], "versions": [v for _, v in pairs]}


def claim_tasks(scheduler: str, workflows: Sequence[str | tuple[str, int]], limit: int) -> Query:
    """Claim up to `limit` eligible tasks of these (workflow, version) pairs only: one
    statement (`claimed` makes the claimed tasks of its rows)."""
    return Query("claim_tasks", {"scheduler": scheduler, **claim_pairs(workflows), "limit": limit})


def claim_fair_tasks(
    scheduler: str, workflows: Sequence[str | tuple[str, int]], limit: int, fairly: bool = True
) -> Flow[Rows]:
    """`claim_tasks`, shared fairly among the tenants with pending tasks of these pairs
    (`rules.fair_shares`: each tenant in proportion to its weight, by rank within it). With
    one tenant waiting, or none, or not `fairly` (`rules.claim_fairly`), the claim is
    `claim_tasks` itself and writes no pass. It reads only the tenants of least pass it may
    serve (`rules.least_pass`, from the table of the tenants with work waiting, migration
    0023). The passes of the tenants served move on by what they got; the rows of that table
    found behind are moved up, and those found with no pending task are deleted."""
    if not fairly:
        [rows] = yield [claim_tasks(scheduler, workflows, limit)]
        return rows
    pairs = claim_pairs(workflows)
    count = max(limit, 2)
    scan = count + FAIR_SCAN_MARGIN
    while True:
        found = yield from fetch("fair_tenants", **pairs, scan=scan)
        read = [
            TenantWork(
                r["tenant"],
                (r["workflow"], int(r["version"])),
                float(r["key"]),
                bool(r["live"]),
                float(r["weight"]),
                None if r["pass"] is None else float(r["pass"]),
            )
            for r in found
        ]
        clock = float(found[0]["clock"]) if found else 0.0
        turns = least_pass(read, clock, count, scan)
        if turns is not None:
            break
        scan *= 2
    idle = sorted({(w.tenant, w.pair) for w in read if not w.live})
    if len(turns) <= 1:
        [rows] = yield [claim_tasks(scheduler, workflows, limit)]
        yield from _drop_idle(idle)
        return rows
    share = fair_shares(turns, clock, limit)
    tenants = sorted(share.counts)
    [rows] = yield [
        Query(
            "claim_fair",
            {
                "scheduler": scheduler,
                **pairs,
                "limit": limit,
                "tenants": tenants,
                "counts": [share.counts[t] for t in tenants],
            },
        )
    ]
    got: dict[str, int] = {}
    for r in rows:
        if r["process_state"] == str(TaskState.PROCESSING):  # a pending task claimed
            got[r["tenant"]] = got.get(r["tenant"], 0) + 1
    weights = {t.tenant: t.weight for t in turns}
    served = [{"tenant": t, "delta": n / weights[t]} for t, n in sorted(got.items())]
    writes = [Query("advance_fair_clock", {"clock": share.clock})]
    if served:
        writes.append(Query("advance_tenants", {"floor": share.clock}, each=served))
    behind = {
        w.tenant
        for w in read
        if w.live and w.key < max(clock, clock if w.pass_ is None else w.pass_)
    }
    lift = sorted(set(got) | behind)
    if lift:
        writes.append(Query("lift_tenant_work", {"tenants": lift}))
    yield writes
    yield from _drop_idle(idle)
    return rows


FAIR_SCAN_MARGIN = 8
"""How many rows of each pair a fair claim reads past the tenants it may serve, at first
(those of tenants whose tasks have all gone, deleted as it reads them); twice as many each
time that was not enough (`rules.least_pass`)."""


def _drop_idle(idle: Sequence[tuple[str, tuple[str, int]]]) -> Flow[None]:
    """Delete the rows of the tenants with work waiting that a claim found no pending task
    behind: first held (never one a submit holds), then deleted if still without one."""
    if not idle:
        return
    held = yield from fetch(
        "hold_idle_tenant_work",
        tenant=[t for t, _ in idle],
        workflow=[w for _, (w, _) in idle],
        version=[v for _, (_, v) in idle],
    )
    if held:
        yield [
            Query(
                "drop_idle_tenant_work",
                {
                    "tenant": [r["tenant"] for r in held],
                    "workflow": [r["workflow"] for r in held],
                    "version": [int(r["version"]) for r in held],
                },
            )
        ]


def replayed(rows: Rows) -> list[str]:
    """Of the tasks a claim took, those whose workflow may have recorded steps and waits
    (read next): not a task claimed for the first time (attempt 1), which has recorded
    nothing."""
    return [r["task_id"] for r in rows if r["attempt"] > 1]


def recorded(task_ids: Sequence[str]) -> list[Query]:
    return [
        Query("steps_of_tasks", {"task_ids": list(task_ids)}),
        Query("waits_of_tasks", {"task_ids": list(task_ids)}),
    ]


def claimed(
    rows: Rows, step_rows: Rows, wait_rows: Rows, keys: Keyring | None = None
) -> list[ClaimedTask]:
    """The claimed tasks, with what their workflows recorded, in claim order (`ranked_at`:
    priority with aging)."""
    steps: dict[str, list[StepRecord]] = {}
    for s in step_rows:
        steps.setdefault(s["task_id"], []).append(_rows.step_record(s, keys))
    waits: dict[str, dict[str, tuple[int, str, str]]] = {}
    for w in wait_rows:
        place = w["position"] or str(w["seq"])
        waits.setdefault(w["task_id"], {})[place] = (w["seq"], w["kind"], w["name"])
    return [
        ClaimedTask(
            task=_rows.task_record(r, keys),
            steps=steps.get(r["task_id"], []),
            remaining=float(r["remaining"]),
            waits=waits.get(r["task_id"], {}),
        )
        for r in sorted(rows, key=lambda r: r["ranked_at"])
    ]


def dispatch_steps(
    batch: Sequence[StepDispatch], wake: Wakeups
) -> Flow[list[DispatchedStep | None]]:
    """New steps are recorded, recorded ones re-dispatched or adopted, each only while its
    task is held under the given attempt and scheduler (and the step under the attempt
    seen). Of identical dispatches in one batch, the first."""
    if not batch:
        return []
    out: list[DispatchedStep | None] = [None] * len(batch)
    keep = first_of_each(batch, lambda d: (type(d), d.task_id, d.seq, d.task_attempt, d.scheduler))
    groups: dict[str, list[int]] = {"dispatch_new": [], "dispatch_again": [], "dispatch_adopt": []}
    for i in keep:
        d = batch[i]
        name = (
            "dispatch_new"
            if isinstance(d, NewStep)
            else "dispatch_again"
            if isinstance(d, Redispatch)
            else "dispatch_adopt"
        )
        groups[name].append(i)
    queries, positions = [], []
    for name, where in groups.items():
        if where:
            queries.append(Query(name, each=[_dispatch_params(batch[i]) for i in where]))
            positions.append(where)
    results = yield queries
    for rows, where in zip(results, positions, strict=True):
        for i, r in _by_ord(rows, where).items():
            out[i] = DispatchedStep(
                task_id=batch[i].task_id,
                seq=batch[i].seq,
                attempt=r["attempt"],
                remaining=float(r["remaining"]),
            )
    wake.requests(
        [
            d.agent
            for d, o in zip(batch, out, strict=True)
            if o and not isinstance(d, Adopt) and not (isinstance(d, NewStep) and d.claimed_by)
        ]
    )
    return out


def _dispatch_params(d: StepDispatch) -> dict[str, Any]:
    fence = {
        "task_id": d.task_id,
        "seq": d.seq,
        "task_attempt": d.task_attempt,
        "scheduler": d.scheduler,
    }
    if isinstance(d, NewStep):
        return {
            **fence,
            "name": d.name,
            "agent": d.agent,
            "operation": d.operation,
            "priority": d.priority,
            "complete_within": float(d.complete_within),
            "idempotency_key": d.idempotency_key or idempotency_key(d.task_id, d.seq),
            "input": d.input,
            "compensation": d.compensation,
            "compensation_input": d.compensation_input,
            "compensates": d.compensates,
            "pickup_within": d.pickup_within,
            "total_within": d.total_within,
            "limit_key": d.limit_key,
            "position": d.position,
            "claimed_by": d.claimed_by,
            "head_start": head_start(d.priority),
            "trace_context": d.trace_context,
        }
    if isinstance(d, Redispatch):
        return {
            **fence,
            "expected_attempt": d.expected_attempt,
            "complete_within": float(d.complete_within),
            "trace_context": d.trace_context,
        }
    return {**fence, "expected_attempt": d.expected_attempt, "trace_context": d.trace_context}


def finish_tasks(batch: Sequence[TaskOutcome], wake: Wakeups) -> Flow[list[bool]]:
    """End the hold of each task still held (`TaskOutcome.held_as`) under the given attempt
    and scheduler, as `rules.plan_finish` says; its open steps are closed (abandoned)."""
    if not batch:
        return []
    keep = first_of_each(batch, lambda o: (o.task_id, o.attempt, o.scheduler))
    errors = sorted({batch[i].task_id for i in keep if batch[i].state == TaskState.ERROR})
    policies: dict[str, str] = {}
    compensable: set[str] = set()
    holds: dict[str, float] = {}
    descendants: Rows = []
    if errors:  # their children are locked first: the order in which a child's end locks
        descendants, facts, held = yield [
            Query("descendants", {"task_ids": errors}),
            Query("compensation_facts", {"task_ids": errors}),
            Query("hold_facts", {"task_ids": errors}),
        ]
        policies = {f["task_id"]: f["on_failure"] for f in facts}
        compensable = compensable_tasks(facts, descendants)
        holds = _holds(held)
    each = []
    for i in keep:
        o = batch[i]
        error = o.error
        try:
            plan = plan_finish(
                o, on_failure=policies.get(o.task_id, "stop"), compensable=o.task_id in compensable
            )
        except Exception as exc:  # a row the rule cannot read: the task waits for an operator
            state, why = plan_set_aside(o.held_as, exc)
            logger.error("task %s: set aside: %s", o.task_id, why, exc_info=exc)
            plan = FinishPlan(
                state=state, compensation_starts=False, finished=True, alert=AlertReason.SET_ASIDE
            )
            error = why if error is None else f"{error}; then {why}"
        each.append(
            {
                "task_id": o.task_id,
                "attempt": o.attempt,
                "scheduler": o.scheduler,
                "held_as": str(o.held_as),
                "state": str(plan.state),
                "compensation_starts": plan.compensation_starts,
                "finished": plan.finished,
                "result": o.result,
                "error": None if error is None else error_text(error),
                "alert": None if plan.alert is None else str(plan.alert),
                "abandoned_error": abandoned_error(plan.state),
                "hold": (
                    holds.get(o.task_id, 0.0) if plan.state == TaskState.COMPENSATING else 0.0
                ),
            }
        )
    [rows] = yield [Query("finish_tasks", each=each)]
    applied = _by_ord(rows, keep)
    # Whoever waits for a result marked the task or noted its wait (rules.await_next): an end
    # nobody waits for wakes nobody (a notification costs every listening session a read).
    wake.done([batch[i].task_id for i, r in sorted(applied.items()) if r["awaited"]])
    wake.calls(
        [r["task_id"] for r in applied.values() if r["process_state"] != TaskState.PROCESSED]
    )
    if any(r["process_state"] == TaskState.COMPENSATING for r in applied.values()):
        wake.tasks()
    ended = [
        r["task_id"]
        for r in applied.values()
        if r["process_state"] in FINISHED_TASK_STATES and r["parent_id"] is not None
    ]  # only a child's end has a parent to wake
    yield from children_ended(ended, wake)
    for r in applied.values():  # a failure that compensates the task compensates its children
        if r["process_state"] == TaskState.COMPENSATING and descendants:
            _cascaded(wake, (yield from _cascade(r["task_id"], "failed", descendants)))
    return [i in applied for i in range(len(batch))]


def tag_task(
    task_id: str, attempt: int, scheduler: str, key: str, value: str, wake: Wakeups
) -> Flow[bool | str]:
    """Tag a task while `scheduler` holds it under `attempt` (`Context.tag`): True when it
    has the tag now (nothing written when it had it already: a replay), False when it is not
    held so (nothing written), or why the tag is refused (`rules.with_tag`)."""
    held = {"task_id": task_id, "attempt": attempt, "scheduler": scheduler}
    rows = yield from fetch("held_tags", **held)
    if not rows:
        return False
    tags = tags_of(rows[0]["tags"])
    tagged = with_tag(tags, key, value)
    if isinstance(tagged, str):
        return tagged
    if tagged == tags:
        return True
    [written] = yield [Query("set_tags", {**held, "tags": tags_text(tagged)})]
    return bool(written)
