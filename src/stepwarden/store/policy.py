"""What each writing store method reads, decides and writes, once for every database.

Each function is a flow (`_flow.py`): the transaction of one store method, as named queries
and the rules (`rules.py`) that decide between them. The dialects' SQL (`sql/<dialect>/`)
applies a batch set-based (PostgreSQL: arrays) or one row at a time (SQLite); both return the
same columns. A flow notes the wake-ups its commit owes in `wake`.

No flow is stopped by one row it cannot handle: the supervisor's sweep sets such a task
aside for an operator (`rules.plan_set_aside`) and goes on with the others.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from .. import _json
from .._json import loads
from ..errors import ConfigurationError, KeyringError, PermanentStoreError, TransientStoreError
from ..placement import ShardMap
from ..records import (
    ActionOutcome,
    Adopt,
    AgentBeat,
    CallStop,
    ClaimedTask,
    DispatchedStep,
    EventBeyond,
    EventBounds,
    Expired,
    LeaseTry,
    NewStep,
    OperatorAction,
    OpLimit,
    ParkRequest,
    Redispatch,
    Released,
    Request,
    RequestHandback,
    SchedulerBeat,
    ScheduleSpec,
    SendOutcome,
    StepDispatch,
    StepOutcome,
    StepRecord,
    StepSwept,
    Submission,
    Submitted,
    SweepRound,
    TaskOutcome,
    TicksMade,
    WaitOutcome,
    WaitRequest,
    Woke,
    idempotency_key,
    step_key,
)
from ..retry import Backoff
from ..rules import (
    ENGINE,
    SCAN,
    START_WAIT,
    ActionPlan,
    AlertReason,
    ExpiryPlan,
    FinishPlan,
    abandoned_error,
    action_detail,
    call_lost,
    compensable_tasks,
    compensation_wait,
    error_text,
    event_beyond,
    first_tick,
    head_start,
    holds_up_compensation,
    lease_term,
    outcome_recorded,
    pick_within_limits,
    pickup_failure,
    plan_action,
    plan_call_stopped,
    plan_cascade,
    plan_expiry,
    plan_finish,
    plan_gone_step,
    plan_set_aside,
    plan_ticks,
    release_state,
    resubmit,
    schedule_task_id,
    start_state,
    total_failure,
    waiting_for_all,
)
from ..sealing import Binding, Keyring, input_digest, same_digest
from ..states import FINISHED_TASK_STATES, StepState, TaskState
from . import _rows
from ._flow import Flow, Query, Row, Rows, Wakeups, fetch, first_of_each, together

logger = logging.getLogger("stepwarden.store")
T = TypeVar("T")


def _json_text(value: Any) -> str:
    return _json.dumps(value, what="a stored detail")


def _holds(rows: Rows) -> dict[str, float]:
    """Of `hold_facts` rows, the seconds each task's compensation waits for the steps an
    agent may still be calling (`rules.compensation_wait`)."""
    by_task: dict[str, Rows] = {}
    for r in rows:
        by_task.setdefault(r["task_id"], []).append(r)
    return {task_id: compensation_wait(steps) for task_id, steps in by_task.items()}


def _by_ord(rows: Rows, positions: Sequence[int]) -> dict[int, Row]:
    """The rows a batch query returned, by the position in the caller's list of the item
    each applies to (`positions[ord]`)."""
    return {positions[r["ord"]]: r for r in rows}


# -- the application ----------------------------------------------------------------------


def submit(
    tasks: Sequence[Submission], keys: Keyring | None, wake: Wakeups
) -> Flow[list[Submitted]]:
    """Record pending tasks; each answered created, or, under a task_id taken, the same
    submit or a conflict (`rules.resubmit`): that task is left as it is. A task_id given
    twice is created once, by its first occurrence, and the second compared with it."""
    if not tasks:
        return []
    [rows] = yield [Query("insert_tasks", each=_task_params(tasks))]
    return (yield from _answers(tasks, rows, keys, wake))


def submit_fenced(
    generation: int, tasks: Sequence[Submission], keys: Keyring | None, wake: Wakeups
) -> Flow[list[Submitted] | None]:
    """`submit` on a shard, where the shard map's newest generation is `generation` (the one
    the submitter placed the tasks by); None, and nothing written, where it is not. One
    statement: the map's read holds its table until the commit (`lock_shard_map` waits)."""
    if not tasks:
        return []
    query = Query("insert_tasks_fenced", {"generation": generation}, each=_task_params(tasks))
    [rows] = yield [query]
    found = next(int(r["generation"]) for r in rows if r["generation"] is not None)
    if found != generation:
        return None
    inserted = [r for r in rows if r["task_id"] is not None]
    return (yield from _answers(tasks, inserted, keys, wake))


def _answers(
    tasks: Sequence[Submission], rows: Rows, keys: Keyring | None, wake: Wakeups
) -> Flow[list[Submitted]]:
    """The answers to `tasks`, of which the insert's `rows` were created: those not created
    compared with the task of their id. One deleted between the insert and the read (past
    its retention) is submitted again, its id free."""
    created = _created(tasks, rows, wake)
    answers: dict[int, Submitted] = {
        i: Submitted(t.task_id, "created") for i, t in enumerate(tasks) if created[i]
    }
    for _ in range(3):
        taken = [i for i in range(len(tasks)) if i not in answers]
        if not taken:
            break
        ids = sorted({tasks[i].task_id for i in taken})
        found = {r["task_id"]: r for r in (yield from fetch("submit_found", task_ids=ids))}
        for i in taken:
            row = found.get(tasks[i].task_id)
            if row is not None:
                answers[i] = _resubmit(tasks[i], row, keys)
        gone = [tasks[i] for i in taken if i not in answers]
        if gone:
            [again] = yield [Query("insert_tasks", each=_task_params(gone))]
            made = {r["task_id"] for r in again}
            for i in taken:
                if i not in answers and tasks[i].task_id in made:
                    answers[i] = Submitted(tasks[i].task_id, "created")
                    made.discard(tasks[i].task_id)
            if any(not _delayed(t) for t in gone):
                wake.tasks()
    for i, t in enumerate(tasks):
        if i not in answers:  # taken and deleted, over and over, between the two statements
            raise TransientStoreError(f"task {t.task_id!r} was deleted while submitted again")
    return [answers[i] for i in range(len(tasks))]


def _resubmit(new: Submission, row: Row, keys: Keyring | None) -> Submitted:
    return resubmit(
        new,
        workflow=row["workflow"],
        version=int(row["version"]),
        submitted_by=row["submitted_by"],
        same_input=same_input(new, row["input_digest"], keys),
    )


def same_input(new: Submission, stored: str | None, keys: Keyring | None) -> bool:
    """Whether the new submit's input has the `stored` digest (taken under the same key,
    or, after a rotation, under another: compared then with that key)."""
    if stored is None:
        return False
    if new.input_digest is not None and hmac.compare_digest(new.input_digest, stored):
        return True
    try:
        value = loads(new.input, at=Binding.input(new.task_id), keys=keys)
        return same_digest(stored, _json.plain(value), keys)
    except KeyringError:  # a comparison that cannot be made is not a match
        return False


def _task_params(tasks: Sequence[Submission]) -> list[dict[str, Any]]:
    return [
        {
            "task_id": t.task_id,
            "workflow": t.workflow,
            "input": t.input,
            "priority": t.priority,
            "complete_within": float(t.complete_within),
            "max_failures": t.max_failures,
            "on_failure": t.on_failure,
            "reply_to": t.reply_to,
            "start_at": None if t.start_at is None else t.start_at.timestamp(),
            "start_after": float(t.start_after),
            "version": t.version,
            "parent_id": t.parent_id,
            "parent_position": t.parent_position,
            "head_start": head_start(t.priority),
            "trace_context": t.trace_context,
            "submitted_by": t.submitted_by,
            "input_digest": t.input_digest,
            "process_state": str(_start(t)),
            "waiting_for": START_WAIT if _delayed(t) else None,
        }
        for t in tasks
    ]


def _created(tasks: Sequence[Submission], rows: Rows, wake: Wakeups) -> list[bool]:
    """Which of `tasks` the insert's rows say were created (a task_id given twice, by its
    first occurrence); the schedulers woken when one of them is pending now."""
    inserted = {r["task_id"] for r in rows}
    created = []
    for t in tasks:
        created.append(t.task_id in inserted)
        inserted.discard(t.task_id)
    if any(c and not _delayed(t) for c, t in zip(created, tasks, strict=True)):
        wake.tasks()
    return created


@dataclass(frozen=True, slots=True)
class MapRefused:
    """Why a shard map was not written: `changed` when another process wrote one since it
    was read (read it again), else what is wrong with the database."""

    reason: str
    changed: bool = False


def write_shard_map(
    name: str, shard_map: ShardMap, previous: int, added: bool, wake: Wakeups
) -> Flow[MapRefused | None]:
    """With the map's table locked until the commit: name this database `name` and store the
    generations of `shard_map` it lacks. Refused (nothing written) when the database is
    another shard, when its newest generation is not `previous` (the map changed since it
    was read), or when it is `added` and holds tasks."""
    yield [Query("lock_shard_map")]
    named, stored, tasks = yield [Query("shard_name"), Query("shard_map"), Query("any_task")]
    newest = max((int(r["generation"]) for r in stored), default=0)
    if newest != previous:
        reason = f"the shard map changed meanwhile (generation {newest}, read {previous})"
        return MapRefused(reason, changed=True)
    if named and named[0]["name"] != name:
        return MapRefused(f"the database is shard {named[0]['name']!r} already, not {name!r}")
    if added and tasks[0]["present"]:
        return MapRefused("the database holds tasks already: a shard added must hold none")
    writes = [Query("name_shard", {"name": name})]
    for gen in shard_map.generations:
        if gen.number > newest:
            shards, slots = gen.encoded()
            params = {"generation": gen.number, "shards": shards, "slots": slots}
            writes.append(Query("put_shard_generation", params))
    yield writes
    return None


def _delayed(task: Submission) -> bool:
    return _start(task) == TaskState.WAITING


def _start(task: Submission) -> TaskState:
    return start_state(start_at=task.start_at, start_after=float(task.start_after))


def record_events(events: Sequence[tuple[str | None, str, Any]]) -> Query:
    each = [{"task_id": t, "kind": k, "detail": _json_text(d)} for t, k, d in events]
    return Query("insert_events", each=each)


def record_delivery(
    message_id: int, delivered_to: Sequence[str], done: bool, retry_in: float
) -> Query:
    params = {
        "id": message_id,
        "delivered_to": _json_text(list(delivered_to)),
        "done": done,
        "retry_in": float(retry_in),
    }
    return Query("outbox_delivered", params)


def relay_delivered(message_ids: Sequence[int]) -> Query:
    """Status messages a broker acknowledged: delivered."""
    return Query("relay_delivered", each=[{"id": i} for i in message_ids])


def relay_failed(message_id: int, error: str, retry_in: float) -> Query:
    """A status message a broker did not take: its error, and its next try."""
    return Query("relay_failed", {"id": message_id, "error": error, "retry_in": float(retry_in)})


def relay_refused(refused: Sequence[tuple[int, str]]) -> Query:
    """Status messages the relay never sends: done, with their error."""
    return Query("relay_refused", each=[{"id": i, "error": e} for i, e in refused])


def purge(older_than: float, limit: int) -> Query:
    return Query("purge", {"older_than": float(older_than), "limit": limit})


# -- the operator -------------------------------------------------------------------------


def operate(actions: Sequence[OperatorAction], wake: Wakeups) -> Flow[list[ActionOutcome]]:
    """Each action reads its task (locking it until commit) and applies its plan
    (`rules.plan_action`), recorded as an `operator` event; in order, so that a second action
    on one task sees the first. A cancel or a compensation reaches the task's children that
    have not ended, and theirs (`rules.plan_cascade`); a task that ends wakes its parent
    (`children_ended`)."""
    reaching = sorted({a.task_id for a in actions if a.action in CASCADING})
    descendants: Rows = []
    if reaching:  # locked first, deepest first: the order in which a child's end locks
        descendants = yield from fetch("descendants", task_ids=reaching)
    outcomes: list[ActionOutcome] = []
    applied: list[ActionOutcome] = []
    for action in actions:
        outcome = yield from _operate(action)
        outcomes.append(outcome)
        if not outcome.applied:
            continue
        applied.append(outcome)
        if action.action in CASCADING and descendants:
            applied.extend(
                (yield from _cascade(action.task_id, action.action, descendants, action))
            )
    moved = {o.after for o in applied}
    if moved & {TaskState.PENDING, TaskState.COMPENSATING}:
        wake.tasks()
    wake.calls(
        [
            o.task_id
            for o in applied
            if o.after in (TaskState.CANCELLED, TaskState.COMPENSATING, TaskState.PAUSED)
        ]
    )
    ended = [o.task_id for o in applied if o.after in FINISHED_TASK_STATES]
    wake.done(ended)
    yield from children_ended(ended, wake)
    wake.results(
        [
            step_key(a.task_id, a.seq)
            for a, o in zip(actions, outcomes, strict=True)
            if o.applied and a.action == "skip" and a.seq is not None
        ]
    )
    return outcomes


CASCADING = ("cancel", "compensate")
"""The operator actions that reach a task's children (`rules.plan_cascade`)."""


def _cascade(
    parent_id: str,
    cause: str,
    descendants: Rows,
    by: OperatorAction | None = None,
) -> Flow[list[ActionOutcome]]:
    """Apply to the children of `parent_id` what `rules.plan_cascade` says for `cause`, and
    so on to theirs: the outcomes applied. `descendants` were read (and locked) at the start
    of the transaction; the children's states are read again here, as this transaction may
    have moved them since. `by`: the operator's action on the ancestor (its actor and
    identity are recorded), or None for the engine's own (a parent's failure)."""
    if not any(r["parent_id"] == parent_id for r in descendants):
        return []
    children = yield from fetch("children_states", task_id=parent_id)
    actor = ENGINE if by is None else by.actor
    identity = None if by is None else by.identity
    applied: list[ActionOutcome] = []
    for child in plan_cascade(parent_id, cause, children, actor=actor, identity=identity):
        outcome = yield from _operate(child)
        if outcome.applied:
            applied.append(outcome)
            applied.extend((yield from _cascade(child.task_id, child.action, descendants, by)))
    return applied


def _cascaded(wake: Wakeups, outcomes: Sequence[ActionOutcome]) -> None:
    """The wake-ups owed for children a parent's failure reached: schedulers (their
    compensations), and the agents calling their steps (to stop)."""
    if outcomes:
        wake.tasks()
        wake.calls([o.task_id for o in outcomes])


def children_ended(task_ids: Sequence[str], wake: Wakeups) -> Flow[list[str]]:
    """Every flow that ends tasks calls this, in its transaction, with the tasks it ended:
    the end of each one that is a child is recorded in its parent's wait for it (done with
    its result, or failed with its state and error), and the parent, if it is waiting, is
    pending again at once (a `woke` event). Returns the parents woken."""
    if not task_ids:
        return []
    rows = yield from fetch("wake_parents", task_ids=sorted(set(task_ids)))
    woken = sorted({r["parent_id"] for r in rows if r["woke"]})
    if woken:
        wake.tasks()
    return woken


def _operate(action: OperatorAction) -> Flow[ActionOutcome]:
    found = yield from fetch("op_read_task", task_id=action.task_id)
    if not found:
        return ActionOutcome.missing(action.task_id)
    before = TaskState(found[0]["process_state"])
    plan = plan_action(action, before)
    if isinstance(plan, ActionOutcome):
        return plan
    event = {"task_id": action.task_id, "kind": "operator",
             "detail": _json_text(action_detail(action, plan))}  # fmt: skip
    if action.action == "skip":
        skip = {"task_id": action.task_id, "seq": action.seq, "result": action.result}
        [skipped] = yield [Query("op_skip_step", skip)]
        if not skipped:
            why = f"task {action.task_id!r} has no step {action.seq} left to complete"
            return ActionOutcome.refused(action.task_id, before, why)
        yield [Query("insert_events", each=[event])]
    else:
        hold = 0.0
        if plan.wait_open:
            held = yield from fetch("hold_facts", task_ids=[action.task_id])
            hold = _holds(held).get(action.task_id, 0.0)
        moves = _moves(action, plan, found[0]["attempt"], hold)
        yield [*moves, Query("insert_events", each=[event])]
    return ActionOutcome(
        task_id=action.task_id, applied=True, before=before, after=plan.after, message="done"
    )


def _moves(action: OperatorAction, plan: ActionPlan, attempt: int, hold: float) -> list[Query]:
    task = {"task_id": action.task_id}
    queries = [
        Query(
            "op_move_task",
            {
                **task,
                "from": str(plan.before),
                "attempt": attempt,
                "to": str(plan.after),
                "reset_failures": plan.reset_failures,
                "reset_compensation_failures": plan.reset_compensation_failures,
                "wait_open": plan.wait_open,
                "hold": hold,
                "final": plan.final,
            },
        )
    ]
    if plan.close_open:
        queries.append(Query("close_open_steps", {**task, "error": abandoned_error(plan.after)}))
    if plan.reopen is not None:
        queries.append(Query("op_reopen_steps", {**task, "compensations": plan.reopen}))
    return queries


# -- the scheduler ------------------------------------------------------------------------


def claim_pairs(workflows: Sequence[str | tuple[str, int]]) -> dict[str, list[Any]]:
    """The (workflow, version) pairs a claim is for, as the parameters `workflows` and
    `versions` (side by side); a workflow named alone is its version 1."""
    pairs = sorted({(w, 1) if isinstance(w, str) else (w[0], int(w[1])) for w in workflows})
    return {"workflows": [w for w, _ in pairs], "versions": [v for _, v in pairs]}


def claim_tasks(scheduler: str, workflows: Sequence[str | tuple[str, int]], limit: int) -> Query:
    """Claim up to `limit` eligible tasks of these (workflow, version) pairs only: one
    statement (`claimed` makes the claimed tasks of its rows)."""
    return Query("claim_tasks", {"scheduler": scheduler, **claim_pairs(workflows), "limit": limit})


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
            "idempotency_key": idempotency_key(d.task_id, d.seq),
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


# -- the agents ---------------------------------------------------------------------------


def claim_requests(instance: str, agent: str, operations: Sequence[str], limit: int) -> Query:
    """Claim up to `limit` queued requests of these operations, in claim order (priority
    with aging, `rules.head_start`)."""
    params = {"instance": instance, "agent": agent, "operations": list(operations)}
    return Query("claim_requests", {**params, "limit": limit})


def claim_within_limits(
    instance: str,
    agent: str,
    operations: Sequence[str],
    limit: int,
    limits: Mapping[str, OpLimit],
    wake: Wakeups,
) -> Flow[Rows]:
    """`claim_requests`, the operations in `limits` only within them
    (`rules.pick_within_limits`), the claims of one agent's limited operations one at a
    time."""
    params = {"instance": instance, "agent": agent, "operations": list(operations)}
    rated = [{"operation": op, "per": float(lim.per)}
             for op, lim in limits.items() if lim.rate is not None]  # fmt: skip
    _, found, running, _, started = yield [
        Query("limits_lock", params),
        Query("limited_candidates", {**params, "scan": SCAN}),
        Query("running_counts", params),
        Query("forget_starts", params, each=rated),
        Query("start_counts", params, each=rated),
    ]
    chosen = pick_within_limits(
        [(r["operation"], r["limit_key"]) for r in found],
        limits,
        {(r["operation"], r["limit_key"]): r["n"] for r in running},
        {(r["operation"], r["limit_key"]): r["n"] for r in started},
        limit,
    )
    if not chosen:
        return []
    picked = [{"task_id": found[i]["task_id"], "seq": found[i]["seq"]} for i in chosen]
    rate_limited = {**params, "rated": [r["operation"] for r in rated]}
    [rows] = yield [Query("claim_chosen", rate_limited, each=picked)]
    return rows


def requests(rows: Rows, keys: Keyring | None = None) -> list[Request]:
    """Claimed requests, in claim order (`ranked_at`: priority with aging)."""
    return [_rows.request(r, keys) for r in sorted(rows, key=lambda r: r["ranked_at"])]


def hand_back(batch: Sequence[RequestHandback], wake: Wakeups) -> Flow[list[bool]]:
    if not batch:
        return []
    each = [
        {
            "task_id": h.task_id,
            "seq": h.seq,
            "attempt": h.attempt,
            "instance": h.agent_instance,
            "reason": h.reason,
        }
        for h in batch
    ]
    [rows] = yield [Query("hand_back", each=each)]
    back = _by_ord(rows, range(len(batch)))
    wake.requests([r["agent"] for r in back.values()])
    return [i in back for i in range(len(batch))]


def note_run(task_id: str, attempt: int, scheduler: str, run_trace: str) -> Query:
    """Record the trace context of a run's span with its task, while the run holds it."""
    params = {"task_id": task_id, "attempt": attempt, "scheduler": scheduler}
    return Query("note_run", {**params, "run_trace": run_trace})


def heartbeat_step(
    task_id: str, seq: int, attempt: int, instance: str, detail: str | None
) -> Query:
    params = {"task_id": task_id, "seq": seq, "attempt": attempt, "instance": instance}
    return Query("heartbeat_step", {**params, "detail": detail})


def beat(beats: Sequence[AgentBeat], ttl: float) -> Query:
    each = [
        {
            "instance": b.instance,
            "agent": b.agent,
            "operations": _json_text(list(b.operations)),
            "capacity": b.capacity,
            "inflight": b.inflight,
            "breaker": b.breaker,
            "breaker_detail": _json_text(b.breaker_detail),
        }
        for b in beats
    ]
    return Query("agent_beat", {"ttl": float(ttl)}, each=each)


def leave(instance: str, agents: Sequence[str]) -> Query:
    return Query("agent_leave", {"instance": instance, "agents": list(agents)})


def complete_steps(
    batch: Sequence[StepOutcome], wake: Wakeups, *, notify: bool = True
) -> Flow[list[bool]]:
    """Record results, each only while the step is running under the given attempt, held by
    the given instance, before its complete_by; True also for one the step holds already
    (`recorded_already`). `notify`: wake the schedulers waiting for them (not when the
    scheduler writing them is the one that waits)."""
    done = yield from _complete_steps(batch, wake, notify=notify)
    return (yield from recorded_already(batch, done))


def recorded_already(batch: Sequence[StepOutcome], done: list[bool]) -> Flow[list[bool]]:
    """`done`, with True for each outcome refused that its step holds already: a try of the
    same write whose answer was lost (`rules.outcome_recorded`). One more read, only when
    one was refused."""
    missed = [i for i, ok in enumerate(done) if not ok]
    if not missed:
        return done
    calls = [(batch[i].task_id, batch[i].seq, batch[i].attempt) for i in missed]
    [rows] = yield [call_facts(calls)]
    found = {(r["task_id"], r["seq"]): _rows.call_facts(r) for r in rows}
    out = list(done)
    for i in missed:
        o = batch[i]
        out[i] = outcome_recorded(
            state=o.state,
            attempt=o.attempt,
            instance=o.agent_instance,
            found=found.get((o.task_id, o.seq)),
        )
    return out


def _complete_steps(
    batch: Sequence[StepOutcome], wake: Wakeups, *, notify: bool = True
) -> Flow[list[bool]]:
    """`complete_steps` in one round: what the write applied."""
    if not batch:
        return []
    keep = first_of_each(batch, lambda o: (o.task_id, o.seq, o.attempt, o.agent_instance))
    each = [
        {
            "task_id": o.task_id,
            "seq": o.seq,
            "attempt": o.attempt,
            "instance": o.agent_instance,
            "state": str(o.state),
            "result": o.result,
            "error": None if o.error is None else error_text(o.error),
            "tries": o.tries,
        }
        for o in (batch[i] for i in keep)
    ]
    [rows] = yield [Query("complete_steps", each=each)]
    applied = _by_ord(rows, keep)
    if notify:
        wake.results([step_key(batch[i].task_id, batch[i].seq) for i in sorted(applied)])
    return [i in applied for i in range(len(batch))]


def advance_alone(
    outcomes: Sequence[StepOutcome],
    dispatches: Sequence[StepDispatch],
    finishes: Sequence[TaskOutcome],
) -> bool:
    """Whether a scheduler's group commit is one statement that owes no wake-up, so that it
    may run alone (`Store._write_alone`): new steps only, each taken at once by an agent
    instance of the scheduler's process (no request queued), as a task's first step called
    where its workflow runs; `dispatch_steps` of them is one query."""
    return (
        not outcomes
        and not finishes
        and bool(dispatches)
        and all(isinstance(d, NewStep) and d.claimed_by for d in dispatches)
    )


def advance(
    outcomes: Sequence[StepOutcome],
    dispatches: Sequence[StepDispatch],
    finishes: Sequence[TaskOutcome],
    wake: Wakeups,
) -> Flow[tuple[list[bool], list[DispatchedStep | None], list[bool]]]:
    """A scheduler's writes of one group commit, in one transaction: the outcomes of the
    steps its own agent instances called (its workflows went on with their results), then
    the steps and task outcomes those workflows wrote next. A dispatch or a task outcome of a
    task one of whose outcomes here is refused is not applied: it was decided on a result
    that is not recorded. This is the one home of that rule: a task's drive carries an
    outcome refused once with each of its later writes (`drive.TaskDrive`), so that none of
    them is applied either.

    The outcomes and what depends on them are sent together, what depends on them behind a
    savepoint: an outcome is seldom refused, and then the savepoint is rolled back and the
    others' writes made again without the refused task's."""
    if not outcomes:
        done: list[bool] = []
        both = yield from together(dispatch_steps(dispatches, wake), finish_tasks(finishes, wake))
        return done, *both
    inner = Wakeups()
    recording = _complete_steps(outcomes, wake, notify=False)
    depending = together(dispatch_steps(dispatches, inner), finish_tasks(finishes, inner))
    first = next(recording)
    try:
        then = next(depending)
    except StopIteration:  # nothing depends on them
        alone = yield first
        return (yield from recorded_already(outcomes, _returned(recording, alone))), [], []
    rows = yield [*first, Query("savepoint_dependents"), *then]
    done = yield from recorded_already(outcomes, _returned(recording, rows[: len(first)]))
    refused = {o.task_id for o, ok in zip(outcomes, done, strict=True) if not ok}
    if not refused & {w.task_id for w in (*dispatches, *finishes)}:
        later = rows[len(first) + 1 :]
        dispatched, finished = yield from _resumed(depending, later)
        wake.add(inner)
        return done, dispatched, finished
    depending.close()
    yield [Query("rollback_dependents")]
    go = [i for i, d in enumerate(dispatches) if d.task_id not in refused]
    end = [i for i, f in enumerate(finishes) if f.task_id not in refused]
    got, ok = yield from together(
        dispatch_steps([dispatches[i] for i in go], wake),
        finish_tasks([finishes[i] for i in end], wake),
    )
    dispatched_: list[DispatchedStep | None] = [None] * len(dispatches)
    finished_ = [False] * len(finishes)
    for i, g in zip(go, got, strict=True):
        dispatched_[i] = g
    for i, f in zip(end, ok, strict=True):
        finished_[i] = f
    return done, dispatched_, finished_


def _returned(flow: Flow[T], rows: list[Rows]) -> T:
    """The result of a flow of one round, sent its rows."""
    try:
        flow.send(rows)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    raise RuntimeError("a flow of one round asked for more")


def _resumed(flow: Flow[T], rows: list[Rows]) -> Flow[T]:
    """Go on with a flow whose first round was sent, from its rows."""
    try:
        batch = flow.send(rows)
        while True:
            batch = flow.send((yield batch))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def call_facts(calls: Sequence[tuple[str, int, int]]) -> Query:
    """The facts of the steps of these calls (task_id, seq, attempt), for `lost`: a batch
    (SQLite: a lookup by key each; PostgreSQL: one statement)."""
    return Query("call_facts", each=[{"task_id": t, "seq": q} for t, q, _ in calls])


def lost(
    rows: Rows, calls: Sequence[tuple[str, int, int]], instance: str
) -> dict[tuple[str, int, int], str]:
    """Of the calls (task_id, seq, attempt) `instance` makes, those that no longer hold
    their step, with why (`rules.call_lost`), from `call_facts` rows."""
    found = {(r["task_id"], r["seq"]): _rows.call_facts(r) for r in rows}
    out: dict[tuple[str, int, int], str] = {}
    for task_id, seq, attempt in calls:
        why = call_lost(attempt=attempt, instance=instance, found=found.get((task_id, seq)))
        if why is not None:
            out[(task_id, seq, attempt)] = why
    return out


def held(rows: Rows, instance: str, keys: Keyring | None = None) -> list[Request]:
    """Of the steps `held_steps` found running and locked by `instance`, those its call
    holds (`rules.call_lost`), as requests in claim order."""
    return requests(
        [
            r
            for r in rows
            if call_lost(attempt=r["attempt"], instance=instance, found=_rows.call_facts(r)) is None
        ],
        keys,
    )


def stop_calls(batch: Sequence[CallStop], wake: Wakeups) -> Flow[list[bool]]:
    """Agents' word that their calls of steps they no longer hold have ended, each written
    as `rules.plan_call_stopped` says, fenced by the attempt, instance and state read (the
    tasks locked first). A compensating task no scheduler holds whose abandoned steps no
    longer hold it up (`rules.holds_up_compensation`) becomes eligible now, never before
    the end of its backoff, and the schedulers are woken."""
    if not batch:
        return []
    keep = first_of_each(batch, lambda c: (c.task_id, c.seq, c.attempt, c.agent_instance))
    calls = [(batch[i].task_id, batch[i].seq, batch[i].attempt) for i in keep]
    _, rows = yield [
        Query("lock_tasks", {"task_ids": sorted({c[0] for c in calls})}),
        call_facts(calls),
    ]
    found = {(r["task_id"], r["seq"]): r for r in rows}
    each, positions, freed = [], [], {}
    for i in keep:
        c = batch[i]
        f = found.get((c.task_id, c.seq))
        facts = None if f is None else _rows.call_facts(f)
        plan = plan_call_stopped(attempt=c.attempt, instance=c.agent_instance, found=facts)
        if plan is None or f is None:
            continue
        each.append(
            {"task_id": c.task_id, "seq": c.seq, "attempt": c.attempt,
             "instance": c.agent_instance, "state": f["state"], "plan": plan,
             "reason": c.reason}
        )  # fmt: skip
        positions.append(i)
        held_up = holds_up_compensation(remaining=float(f["remaining"]), call_stopped=False)
        if (
            plan == "stopped"
            and held_up
            and f["process_state"] == TaskState.COMPENSATING
            and f["task_locked_by"] is None
        ):
            freed[c.task_id] = f["task_attempt"]
    if not each:
        return [False] * len(batch)
    [stopped] = yield [Query("stop_calls", each=each)]
    applied = _by_ord(stopped, positions)
    handed = [i for i, e in zip(positions, each, strict=True) if e["plan"] == "hand_back"]
    wake.requests(
        [found[(batch[i].task_id, batch[i].seq)]["agent"] for i in handed if i in applied]
    )
    ids = sorted({batch[i].task_id for i in applied} & set(freed))
    if ids:
        holds = _holds((yield from fetch("hold_facts", task_ids=ids)))
        sooner = [{"task_id": t, "attempt": freed[t], "hold": holds.get(t, 0.0)} for t in ids]
        [moved] = yield [Query("compensate_sooner", each=sooner)]
        if any(r["due"] for r in moved):
            wake.tasks()
    return [i in applied for i in range(len(batch))]


# -- the supervisor -----------------------------------------------------------------------


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


def release_lease(name: str, holder: str) -> Query:
    return Query("release_lease", {"name": name, "holder": holder})


def _held(lease: str, holder: str, term: int) -> Query:
    """The sweep's fence: the lease row, locked until commit (PostgreSQL), if held at `term`."""
    return Query("lock_lease", {"name": lease, "holder": holder, "term": term})


def sweep(
    *, lease: str, holder: str, term: int, limit: int, backoff: Backoff, wake: Wakeups
) -> Flow[list[Expired]]:
    """Under the lease: held tasks whose complete_by passed, and held tasks with an open step
    of the current attempt whose complete_by passed, go where `rules.plan_expiry` says. A
    task the rule or the database refuses is set aside for an operator; the others go on."""
    if limit <= 0:
        return []
    held, steps, tasks = yield [
        _held(lease, holder, term),
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
        _held(lease, holder, term),
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


# -- schedulers: the registry, and the release of what a gone or draining one held --------


def scheduler_beat(beats: Sequence[SchedulerBeat], ttl: float) -> Query:
    each = [
        {
            "instance": b.instance,
            "workflows": _json_text(list(b.workflows)),
            "versions": _json_text([list(p) for p in b.versions]),
            "capacity": b.capacity,
            "held": b.held,
        }
        for b in beats
    ]
    return Query("scheduler_beat", {"ttl": float(ttl)}, each=each)


def scheduler_leave(instance: str) -> Query:
    return Query("scheduler_leave", {"instance": instance})


def release_held(
    scheduler: str, only: Collection[tuple[str, int]] | None, wake: Wakeups
) -> Flow[list[Released]]:
    """A scheduler gives back the tasks it holds (those of `only`, by task_id and attempt,
    when given: tasks it holds but does not drive), at once: each where
    `rules.release_state` says, fenced by the attempt read and its own hold."""
    held = yield from fetch("held_by", scheduler=scheduler)
    if only is not None:
        held = [r for r in held if (r["task_id"], r["attempt"]) in only]
    reason = "drained" if only is None else "held but not driven"
    by = {"by": scheduler, "term": None, "reason": reason}
    return (yield from _release(held, by, wake))


def held_in_time(rows: Rows) -> list[tuple[str, int]]:
    """Of a scheduler's tasks (`held_by`), those whose complete_by is still to come: past it,
    the supervisor expires the task and counts a failure."""
    return [(r["task_id"], int(r["attempt"])) for r in rows if r["in_time"]]


def release_gone_schedulers(
    *, lease: str, holder: str, term: int, limit: int, forget_after: float, wake: Wakeups
) -> Flow[list[Released]]:
    """Under the lease: the tasks held by scheduler instances gone silent are given back
    (`rules.release_state`; no failure counted), for another scheduler to resume by replay
    at once; instances gone for `forget_after` seconds are forgotten."""
    if limit <= 0:
        return []
    held, gone = yield [_held(lease, holder, term), Query("gone_scheduler_tasks", {"limit": limit})]
    if not held:
        return []
    by = {"by": holder, "term": term, "reason": "scheduler gone"}
    released = yield from _release(gone, by, wake)
    yield [Query("forget_schedulers", {"forget_after": float(forget_after)})]
    return released


def _release(rows: Rows, by: Mapping[str, Any], wake: Wakeups) -> Flow[list[Released]]:
    each = [
        {
            "task_id": r["task_id"],
            "attempt": r["attempt"],
            "scheduler": r["locked_by"],
            "held_as": r["process_state"],
            "state": str(release_state(TaskState(r["process_state"]))),
        }
        for r in rows
    ]
    if not each:
        return []
    [released] = yield [Query("release_tasks", by, each=each)]
    if released:
        wake.tasks()
    return [_rows.released(r) for r in released]


# -- waits: durable timers and events from outside -------------------------------------------


def wait(req: WaitRequest, keys: Keyring | None, wake: Wakeups) -> Flow[WaitOutcome]:
    """The wait at `req.seq`: recorded the first time (its wake_at by the database clock; a
    child wait creates its child task with it); done when its timer has fired, an event of
    its name is there to take (the oldest; once timed out, only one sent before the
    timeout) or its child ended processed; child_failed when the child ended otherwise;
    timed_out past its wake_at; otherwise the task is parked (waiting, released, no deadline
    running) until its wake_at, an event or its child's end, or, when the request says not
    to park, the wait is "blocked" (`park` parks it later). All in one transaction with the
    task's row locked, fenced by the hold and the attempt."""
    if not (yield from _held_by(req.task_id, req.task_attempt, req.scheduler)):
        return WaitOutcome(state="fenced")
    key = {"task_id": req.task_id, "seq": req.seq}
    found = yield from fetch("read_wait", **key)
    replayed = bool(found)
    if not found:
        if req.kind == "child":
            refused = yield from _start_child(req, keys, wake)
            if refused is not None:
                return WaitOutcome(state="refused", reason=refused)
        until = None if req.until is None else req.until.timestamp()
        delay = None if req.kind == "child" else float(req.delay)  # a child's has no wake_at
        new = {"kind": req.kind, "name": req.name, "until": until, "delay": delay,
               "position": req.position}  # fmt: skip
        found = yield from fetch("insert_wait", **key, **new)
    [w] = found
    if (w["kind"], w["name"]) != (req.kind, req.name):
        return WaitOutcome(state="mismatch", recorded=(w["kind"], w["name"]))
    if replayed and req.kind == "child" and req.child is not None:
        child = yield from fetch("child_read", task_id=req.name)
        if child and child[0]["workflow"] != req.child.workflow:
            return WaitOutcome(
                state="mismatch",
                recorded=(w["kind"], w["name"]),
                reason=f"the child task {req.name!r} recorded at position {req.position} runs "
                f"workflow {child[0]['workflow']!r}, the workflow asked for "
                f"{req.child.workflow!r}",
            )
    if w["state"] == "done":
        return WaitOutcome(state="done", payload=_rows.wait_payload(w, keys))
    if w["state"] == "failed":
        return WaitOutcome(state="child_failed", payload=_rows.wait_payload(w, keys))
    if w["state"] == "timed_out":
        return WaitOutcome(state="timed_out")
    if req.kind == "patch":  # a marker: recorded, nothing to wait for
        yield [Query("end_wait", {**key, "state": "done", "event_id": None, "payload": None})]
        return WaitOutcome(state="done")
    due = bool(w["due"])
    if req.kind == "timer" and due:
        yield [Query("end_wait", {**key, "state": "done", "event_id": None, "payload": None})]
        return WaitOutcome(state="done", now=True)
    if req.kind == "event":
        taken = yield from fetch("take_event", **key, name=req.name, timed_out=due)
        if taken:
            [event] = taken
            ended = {**key, "state": "done", "event_id": event["event_id"]}
            yield [Query("end_wait", {**ended, "payload": event["payload"]})]
            payload = loads(
                event["payload"], at=Binding.event(req.task_id, event["event_id"]), keys=keys
            )
            return WaitOutcome(state="done", payload=payload, now=True)
        if due:
            ended = {**key, "state": "timed_out", "event_id": None, "payload": None}
            yield [Query("end_wait", ended)]
            return WaitOutcome(state="timed_out", now=True)
    if not req.park:
        return WaitOutcome(state="blocked")
    seqs = (req.seq,)
    return (yield from _park(req.task_id, req.task_attempt, req.scheduler, seqs,
                             [(req.position, req.kind, req.name)]))  # fmt: skip


def _start_child(req: WaitRequest, keys: Keyring | None, wake: Wakeups) -> Flow[str | None]:
    """Create the child task of a child wait recorded now; why not, when its task id is
    taken by another task (nothing is written then)."""
    child = req.child
    if child is None or child.task_id != req.name:
        raise ValueError("a child wait names the child task it creates")
    found = yield from fetch("child_read", task_id=child.task_id)
    if not found:
        [answer] = yield from submit([child], keys, wake)
        if answer.created:
            detail = {"child": child.task_id, "workflow": child.workflow, "seq": req.seq,
                      "position": req.position}  # fmt: skip
            yield [record_events([(req.task_id, "child_started", detail)])]
            return None
        found = yield from fetch("child_read", task_id=child.task_id)
    r = found[0]
    if (r["parent_id"], r["parent_position"]) == (req.task_id, req.position):
        return None  # this wait's own child (its wait was not recorded: never the case)
    if r["parent_id"] == req.task_id:
        whose = f"the child this task started at position {r['parent_position']}"
    else:
        whose = (
            "not a child of this task"
            if r["parent_id"] is None
            else (f"the child of task {r['parent_id']!r}")
        )
    return (
        f"ctx.child at position {req.position}: task {child.task_id!r} exists and is "
        f"{whose}; give the child another task_id"
    )


def _held_by(task_id: str, attempt: int, scheduler: str) -> Flow[bool]:
    """Whether the scheduler holds the task, processing, under this attempt (its row locked
    until commit): the fence of a wait and of a park."""
    task = yield from fetch("wait_read_task", task_id=task_id)
    return bool(task) and (task[0]["process_state"], task[0]["attempt"], task[0]["locked_by"]) == (
        str(TaskState.PROCESSING),
        attempt,
        scheduler,
    )


def park(req: ParkRequest, wake: Wakeups) -> Flow[WaitOutcome]:
    """A task whose workflow waits in every branch, on the waits at `req.seqs` (recorded
    and open): with its row locked, fenced by the hold and the attempt, each wait is checked
    (its timer due or its wait timed out, an event kept for its name, its child ended); if
    one can end now the task is not parked ("ready": the workflow takes its waits up
    again), else it is parked until the earliest of their wake_at, an event or a child's
    end."""
    if not (yield from _held_by(req.task_id, req.task_attempt, req.scheduler)):
        return WaitOutcome(state="fenced")
    if not req.seqs:
        raise ValueError("a park names the waits it parks on")
    waits = yield from fetch("park_waits", task_id=req.task_id, seqs=list(req.seqs))
    if len(waits) != len(set(req.seqs)):
        raise ValueError(f"task {req.task_id!r}: a park names waits that are not recorded")
    if any(w["state"] != "open" or w["due"] or w["kept"] for w in waits):
        return WaitOutcome(state="ready")
    places = [(w["position"], w["kind"], w["name"]) for w in waits]
    return (yield from _park(req.task_id, req.task_attempt, req.scheduler, req.seqs, places))


def _park(
    task_id: str,
    attempt: int,
    scheduler: str,
    seqs: Sequence[int],
    waits: Sequence[tuple[str | None, str, str]],
) -> Flow[WaitOutcome]:
    """Park the held task on its open waits at `seqs` (none of which can end now): waiting,
    released, until the earliest of their wake_at; a `waiting` event."""
    what = waiting_for_all(waits)
    parked = yield from fetch(
        "park_task",
        task_id=task_id,
        attempt=attempt,
        scheduler=scheduler,
        seqs=list(seqs),
        waiting_for=what,
    )
    if not parked:
        return WaitOutcome(state="fenced")
    until = parked[0]["wake_at"]
    detail: dict[str, Any] = {"seq": min(seqs), "for": what,
                              "until": None if until is None else str(until)}  # fmt: skip
    if len(seqs) > 1:
        detail["seqs"] = sorted(seqs)
    yield [record_events([(task_id, "waiting", detail)])]
    return WaitOutcome(state="parked")


def send_event(
    task_id: str, name: str, payload: str, event_id: str, bounds: EventBounds, wake: Wakeups
) -> Flow[SendOutcome | TaskState | EventBeyond | None]:
    """An event for a task, kept in its inbox until a wait of its workflow takes it; a task
    waiting with an open wait for it becomes pending at once, in the same transaction.
    Returns the outcome (not sent, when the task took this event_id before, whatever its
    state now: a sender whose answer was lost is told it was taken, even once the event has
    finished the task), or the state of a task that takes no new event (finished), or the
    bound a new event is beyond (`rules.event_beyond`: the events the task keeps are counted
    with its row locked, so that concurrent sends cannot pass the bound), or None when there
    is no task."""
    task = yield from fetch("send_read_task", task_id=task_id)
    if not task:
        return None
    state = TaskState(task[0]["process_state"])
    [kept] = yield from fetch("inbox_kept", task_id=task_id, event_id=event_id)
    if kept["sent_before"]:
        return SendOutcome(task_id=task_id, sent=False, woke=False)
    if state in FINISHED_TASK_STATES:
        return state
    beyond = event_beyond(bounds, kept=int(kept["kept"]), size=len(payload.encode()))
    if beyond is not None:
        return beyond
    new = {"task_id": task_id, "event_id": event_id, "name": name, "payload": payload}
    sent = yield from fetch("insert_inbox", **new)
    woke = False
    if sent and state == TaskState.WAITING:
        woken = yield from fetch("wake_task", task_id=task_id, name=name)
        woke = bool(woken)
    if sent:
        detail = {"name": name, "event_id": event_id, "woke": woke}
        yield [record_events([(task_id, "event_received", detail)])]
    if woke:
        wake.tasks()
    return SendOutcome(task_id=task_id, sent=bool(sent), woke=woke)


def wake_due(*, lease: str, holder: str, term: int, limit: int, wake: Wakeups) -> Flow[list[Woke]]:
    """Under the lease: waiting tasks whose wake_at has come (a timer, a wait's timeout, a
    delayed start) are pending again, each with a `woke` event."""
    if limit <= 0:
        return []
    held, due = yield [_held(lease, holder, term), Query("due_waiting", {"limit": limit})]
    if not held or not due:
        return []
    by = {"by": holder, "term": term}
    each = [{"task_id": r["task_id"], "waiting_for": r["waiting_for"]} for r in due]
    [woken] = yield [Query("wake_due", by, each=each)]
    if woken:
        wake.tasks()
    return [_rows.woke(r) for r in woken]


# -- schedules -------------------------------------------------------------------------------


def _tick_input(spec: ScheduleSpec, task_id: str, keys: Keyring | None) -> tuple[str, str]:
    """The input of a schedule's tick task, its secrets sealed for that task (they are
    sealed for the schedule where it is stored), and its digest."""
    value = loads(spec.input, at=Binding.schedule(spec.name), keys=keys)
    digest = input_digest(_json.plain(value), keys)
    if not _json.holds_secret(spec.input):
        return spec.input, digest
    seal = _json.Seal(keys, Binding.input(task_id))
    return _json.dumps(value, what=f"the input of schedule {spec.name!r}", seal=seal), digest


def store_schedules(specs: Sequence[ScheduleSpec], wake: Wakeups) -> Flow[dict[str, str]]:
    """The application's schedules as declared: new ones start at their first tick after
    now (the database's clock); one whose timing changed starts again from there. A schedule
    whose first tick cannot be worked out is not stored, and the others are: returns those
    refused, by name, with why."""
    if not specs:
        return {}
    [[clock]] = yield [Query("db_now")]
    now = float(clock["now"])
    firsts: dict[str, float] = {}
    refused: dict[str, str] = {}
    for s in specs:
        try:
            firsts[s.name] = first_tick(s, now)
        except ConfigurationError as exc:
            refused[s.name] = str(exc)
    each = [
        {
            "name": s.name,
            "workflow": s.workflow,
            "cron": s.cron,
            "every": s.every,
            "input": s.input,
            "timezone": s.timezone,
            "catch_up": s.catch_up,
            "complete_within": s.complete_within,
            "max_failures": s.max_failures,
            "on_failure": s.on_failure,
            "next_at": firsts[s.name],
            "version": s.version,
        }
        for s in specs
        if s.name in firsts
    ]
    if each:
        yield [Query("upsert_schedules", each=each)]
    return refused


def create_ticks(
    *, lease: str, holder: str, term: int, limit: int, keys: Keyring | None, wake: Wakeups
) -> Flow[TicksMade]:
    """Under the lease: for each schedule whose next tick has come, the tasks of its due
    ticks (`rules.plan_ticks`), each id derived from the schedule and the tick so that a tick
    makes one task however many supervisors race; the schedule moves on past them. A
    schedule whose ticks cannot be worked out, or whose sealed input `keys` cannot seal
    again for its tasks, is set aside (paused), and the others go on."""
    held, due = yield [_held(lease, holder, term), Query("due_schedules", {"limit": limit})]
    if not held or not due:
        return TicksMade([], {})
    tasks: list[Submission] = []
    moves = []
    set_aside: dict[str, str] = {}
    for row in due:
        spec = _rows.schedule_spec(row)
        try:
            ticks, after = plan_ticks(spec, float(row["next_at"]), float(row["now"]))
            inputs = [_tick_input(spec, schedule_task_id(spec.name, t), keys) for t in ticks]
        except ConfigurationError as exc:
            set_aside[spec.name] = str(exc)
            continue
        tasks.extend(
            Submission(
                task_id=schedule_task_id(spec.name, tick),
                workflow=spec.workflow,
                input=text,
                priority=0,
                complete_within=spec.complete_within,
                max_failures=spec.max_failures,
                on_failure=spec.on_failure,
                version=spec.version,
                input_digest=digest,
            )
            for tick, (text, digest) in zip(ticks, inputs, strict=True)
        )
        last = ticks[-1] if ticks else None
        moves.append({"name": spec.name, "next_at": after, "last_tick": last})
    if moves:
        yield [Query("advance_schedules", each=moves)]
    if set_aside:
        yield [Query("set_aside_schedules", each=[{"name": n} for n in set_aside])]
    if not tasks:
        return TicksMade([], set_aside)
    answers = yield from submit(tasks, keys, wake)
    return TicksMade([a.task_id for a in answers if a.created], set_aside)


def pause_schedule(name: str, paused: bool, wake: Wakeups) -> Flow[bool]:
    """An operator pauses or resumes a schedule (False: there is none of that name). The
    ticks that come while it is paused are never made: resumed, it goes on from its first
    tick after now (`rules.first_tick`, by the database's clock), and catch_up covers only
    the ticks missed while no supervisor ran."""
    found = yield from fetch("lock_schedule", name=name)
    if not found:
        return False
    [row] = found
    next_at = float(row["next_at"])
    if row["paused"] and not paused:
        next_at = first_tick(_rows.schedule_spec(row), float(row["now"]))
    yield [Query("pause_schedule", {"name": name, "paused": paused, "next_at": next_at})]
    return True


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
