"""The operator's flows (`store.policy`): an action on tasks and what it reaches of their
children."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._json import Seal, dumps
from ...records import (
    ActionOutcome,
    OperatorAction,
    Redrive,
    StepPlan,
    Submission,
    step_key,
)
from ...rules import (
    ENGINE,
    ActionPlan,
    abandoned_error,
    action_detail,
    plan_action,
    plan_cascade,
    plan_fork,
)
from ...sealing import Binding, Keyring
from ...states import FINISHED_TASK_STATES, TaskState
from .. import _rows
from .._flow import Flow, Query, Rows, Wakeups, fetch
from ._shared import _holds, _json_text
from .application import _task_params, record_events


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


def fork(
    task_id: str,
    new: Submission,
    start: str,
    new_keys_from: int | None,
    detail: dict[str, Any],
    apply: bool,
    keys: Keyring | None,
    wake: Wakeups,
) -> Flow[Redrive]:
    """Fork the task `task_id` as `new` (its workflow, version and input) from the place
    `start` (`rules.plan_fork`): the forward steps before it recorded in the fork, completed,
    with their results and keys; those from it left to run again, under the keys the plan
    gives (`records.idempotency_key` of the fork's `keys_of` and `new_keys_from`). With
    `apply` False, the plan only. Both tasks' history records who asked (`detail`)."""
    rows, steps, waits = yield [
        Query("get_task", {"task_id": task_id}),
        Query("get_steps", {"task_id": task_id}),
        Query("waits_of_tasks", {"task_ids": [task_id]}),
    ]
    if not rows:
        return _refused(task_id, new.task_id, (), f"no task {task_id!r}")
    task = _rows.task_record(rows[0], keys)
    recorded = [_rows.step_record(r, keys) for r in steps]
    places = [w["position"] for w in waits if w["position"] is not None]
    planned = plan_fork(task, recorded, new.task_id, start, new_keys_from, places)
    if isinstance(planned, str):
        return _refused(task_id, new.task_id, (), planned)
    plans, keys_of, keys_until = planned
    if not apply:
        return _forked(task_id, new.task_id, False, plans, "would fork")
    [created] = yield [Query("insert_tasks", each=_task_params([new]))]
    if not created:
        return _refused(task_id, new.task_id, plans, f"task {new.task_id!r} exists")
    kept = {p.seq for p in plans if p.plan == "kept"}
    copies = []
    for s in recorded:
        if s.seq not in kept:
            continue
        here = Seal(keys, Binding.step(new.task_id, s.seq))
        copies.append(
            {
                "task_id": task_id,
                "seq": s.seq,
                "new_id": new.task_id,
                "input": dumps(s.input, what="a step's input", seal=here),
                "result": dumps(s.result, what="a step's result", seal=here),
                "compensation_input": None
                if s.compensation_input is None
                else dumps(s.compensation_input, what="a compensation input", seal=here),
            }
        )
    fork_params = {"task_id": new.task_id, "forked_from": task_id, "keys_of": keys_of,
                   "new_keys_from": keys_until}  # fmt: skip
    events = [
        (new.task_id, "operator", {**detail, "forked_from": task_id}),
        (task_id, "operator", {**detail, "forked_to": new.task_id}),
    ]
    writes = [Query("set_fork", fork_params), record_events(events)]
    if copies:
        writes.append(Query("insert_forked_steps", each=copies))
    yield writes
    wake.tasks()
    return _forked(task_id, new.task_id, True, plans, f"forked as {new.task_id}")


def _forked(
    task_id: str, new_id: str, applied: bool, plans: Sequence[StepPlan], message: str
) -> Redrive:
    return Redrive(action="fork", task_id=task_id, runs_as=new_id, applied=applied,
                   steps=tuple(plans), message=message)  # fmt: skip


def _refused(task_id: str, new_id: str, plans: Sequence[StepPlan], why: str) -> Redrive:
    return Redrive(action="fork", task_id=task_id, runs_as=new_id, applied=False,
                   steps=tuple(plans), message=why, refused=True)  # fmt: skip
