"""The engine's rules, each computed once, whatever the database.

The stores read the facts a rule needs in the transaction that applies it, call the rule
here, and write what it decided: where a task goes when its complete_by passes or its
scheduler ends its hold, how long it waits, which alert is raised and why, which steps must
be undone, who may hold the supervisor's lease, which queued requests may start within their
limits, what an operator's action does, which version of its workflow a new task runs and
which waiting tasks no scheduler runs, and why a task or a step waits. Nothing here touches
the database or the clock.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, CroniterError, croniter

from . import _check
from ._check import MAX_NAME
from ._text import cut
from .errors import ConfigurationError, UnknownNameError
from .records import (
    ActionOutcome,
    AgentInstance,
    EventBeyond,
    EventBounds,
    Gate,
    OperatorAction,
    OperatorVerb,
    OpLimit,
    RedrivePlan,
    SchedulerInstance,
    ScheduleSpec,
    StepFacts,
    StepPlan,
    StepRecord,
    Submission,
    Submitted,
    TaskFacts,
    TaskOutcome,
    TaskRecord,
    VersionBacklog,
    WaitOutcome,
    WaitReason,
    WaitRequest,
    idempotency_key,
)
from .retry import Backoff
from .states import (
    FINISHED_TASK_STATES,
    HELD_TASK_STATES,
    OPEN_STEP_STATES,
    OPERATOR_ACTIONS,
    OnFailure,
    StepState,
    TaskState,
)


class AlertReason(StrEnum):
    """Why an alert was raised (the `reason` of an `alert` event and outbox message)."""

    TASK_ERROR = "task_error"
    """The workflow failed (a permanent error) and its task ended in error or compensates."""
    MAX_FAILURES = "max_failures"
    """The task's complete_by passed max_failures times."""
    COMPENSATION_FAILED = "compensation_failed"
    """A compensation failed, or the compensating task expired max_failures times."""
    STEP_RETRIED = "step_retried"
    """A step was dispatched the workflow's alert_after times."""
    TASK_STUCK = "task_stuck"
    """A task did not move for its workflow's stuck_after (`App.workflow`): once per task and
    reason that holds it (its `wait_reason`)."""
    SET_ASIDE = "set_aside"
    """The engine could not apply its rule to the task (a bug, a row it cannot read): the
    task was set aside for an operator, in error or compensation_failed."""


# -- what may have taken effect -----------------------------------------------------------


def needs_compensation(
    *, state: StepState, abandoned: bool, compensation: str | None, compensates: int | None
) -> bool:
    """Whether a step is undone when its task compensates: it has a compensation (and is not
    one itself) and took effect, or may have: it completed, is still open (it is abandoned
    when the task stops holding it), or was abandoned. A step that failed on its own (a
    permanent error, a pick-up timeout) did nothing to undo. This is decided by the step's
    state and its `abandoned` flag, never by its error text."""
    if compensation is None or compensates is not None:
        return False
    return abandoned or state == StepState.COMPLETED or state in OPEN_STEP_STATES


def step_needs_compensation(step: StepRecord) -> bool:
    return needs_compensation(
        state=step.state,
        abandoned=step.abandoned,
        compensation=step.compensation,
        compensates=step.compensates,
    )


def compensable_tasks(
    steps: Sequence[Mapping[str, Any]], children: Sequence[Mapping[str, Any]] = ()
) -> set[str]:
    """Of steps read as rows (task_id, state, abandoned, compensation, compensates; a row
    whose state is null stands for no step), the tasks with at least one step to undo; and,
    of child tasks read as rows (parent_id, process_state), the parents with a child that
    has not ended: compensating the parent compensates that child (`plan_cascade`)."""
    found = {
        s["task_id"]
        for s in steps
        if s["state"] is not None
        and needs_compensation(
            state=StepState(s["state"]),
            abandoned=bool(s["abandoned"]),
            compensation=s["compensation"],
            compensates=s["compensates"],
        )
    }
    found.update(
        c["parent_id"]
        for c in children
        if TaskState(c["process_state"]) not in FINISHED_TASK_STATES
    )
    return found


MAX_ERROR = 8192
"""The longest error text stored with a task, a step, their events and alerts, in characters;
a longer one is cut, with a marker that says how long it was."""


def error_text(text: str, length: int | None = None) -> str:
    """An error as it is stored and logged: at most MAX_ERROR characters (`text` may be the
    start of an error of `length` characters)."""
    return cut(text, MAX_ERROR, length)


def describe(exc: BaseException) -> str:
    """The stored error of an exception: its type and message, at most MAX_ERROR characters."""
    return error_text(f"{type(exc).__name__}: {exc}")


def waiting_for(kind: str, name: str) -> str:
    """What a task waits for, as it is stored and shown: "timer", "event:NAME", or
    "child:ID" (a child task)."""
    return "timer" if kind == "timer" else f"{kind}:{name}"


def _place_key(position: str | None) -> tuple[int, ...]:
    """A place ("3.2.1") in the workflow's order: 3.2.1 before 3.10.1."""
    try:
        return tuple(int(p) for p in (position or "").split("."))
    except ValueError:
        return ()


def waiting_for_all(waits: Sequence[tuple[str | None, str, str]]) -> str:
    """What a task parked on several waits (position, kind, name) waits for, as it is stored
    and shown: the first of them in the workflow's order, and how many more ("child:ID +2");
    a single wait as `waiting_for` says."""
    first = min(waits, key=lambda w: _place_key(w[0]))
    what = waiting_for(first[1], first[2])
    return what if len(waits) == 1 else f"{what} +{len(waits) - 1}"


def event_beyond(bounds: EventBounds, *, kept: int, size: int) -> EventBeyond | None:
    """Which bound refuses a new event for a task that keeps `kept` events (taken by a wait
    or not), its payload `size` bytes; None when the task keeps it. (An event_id sent before
    is not new: its send is answered as sent before, whatever the bounds.)"""
    if size > bounds.payload:
        return EventBeyond(bound="max_event_payload", limit=bounds.payload, found=size)
    if kept >= bounds.events:
        return EventBeyond(bound="max_events_per_task", limit=bounds.events, found=kept)
    return None


def with_tag(tags: Mapping[str, str], key: str, value: str) -> dict[str, str] | str:
    """A task's tags once its workflow tags it `key` = `value` (`Context.tag`): the same
    tags when it has that tag already (a replay), `key` set to `value` when it has the key,
    the tag added otherwise; or, past `_check.MAX_TAGS`, why it is refused."""
    if key not in tags and len(tags) >= _check.MAX_TAGS:
        return f"a task has at most {_check.MAX_TAGS} tags: {key!r} is refused"
    return {**tags, key: value}


def child_task_id(parent_id: str, position: str) -> str:
    """The id of a child task started at `position` of its parent's workflow without a
    task_id of its own: "PARENT:POSITION", the same on every replay. When that is longer
    than a task id may be, the parent's id is cut and a digest of it added."""
    plain = f"{parent_id}:{position}"
    if len(plain) <= MAX_NAME:
        return plain
    digest = hashlib.sha256(parent_id.encode()).hexdigest()[:16]
    keep = max(1, MAX_NAME - len(position) - len(digest) - 2)
    return f"{parent_id[:keep]}~{digest}:{position}"


def abandoned_error(state: TaskState) -> str:
    """The error of an open step closed because its task went to `state`."""
    return f"abandoned: the task is {state}"


# -- calls that no longer hold their step --------------------------------------------------

CALL_TASK_STATES = frozenset(
    {TaskState.PENDING, TaskState.PROCESSING, TaskState.COMPENSATING, TaskState.WAITING}
)
"""The states of a task in which a call of one of its running steps goes on (a pending task
was released: its next scheduler adopts the step). In any other (paused, or finished) the
call is stopped."""


START_WAIT = "start"
"""The `waiting_for` of a task waiting for its delayed start."""


def start_state(*, start_at: datetime | None, start_after: float) -> TaskState:
    """The state a new task is recorded in: waiting for its delayed start (at `start_at`, or
    `start_after` seconds from now by the store's clock), else pending."""
    return TaskState.WAITING if start_at is not None or start_after > 0 else TaskState.PENDING


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFacts:
    """A step and its task as stored, as the rules of an agent's call decide on them
    (`call_lost`, `outcome_recorded`, `plan_call_stopped`): built where the store maps its
    rows (`store._rows.call_facts`)."""

    state: StepState
    attempt: int
    locked_by: str | None
    abandoned: bool
    call_stopped: bool
    """The agent holding the call said that it has stopped (`call_stopped_at`)."""
    task_state: TaskState


def call_lost(*, attempt: int, instance: str, found: CallFacts | None) -> str | None:
    """Why the call of a step that `instance` claimed under `attempt` no longer holds it,
    from the step and its task as stored (`found`; None when the step is gone), or None
    while it holds it: the step runs under that attempt, held by that instance, for a task
    in one of the CALL_TASK_STATES."""
    if found is None:
        return "the step no longer exists"
    task_state = found.task_state
    state = found.state
    if found.attempt != attempt:
        return f"the step was dispatched again (attempt {found.attempt})"
    if state == StepState.RUNNING:
        if found.locked_by != instance:
            return "the step is held by another agent instance"
        if task_state in CALL_TASK_STATES:
            return None
        return f"the task is {task_state}"
    if state == StepState.FAILED and found.abandoned:
        if task_state in (TaskState.PROCESSING, TaskState.PENDING, TaskState.WAITING):
            return "the step was abandoned"  # past its total timeout
        return f"the task is {task_state}"  # it stopped holding its steps
    if state == StepState.NOT_STARTED:
        return "the step was handed back to the queue"
    return f"the step is no longer held by this call (it is {state})"


def outcome_recorded(
    *, state: StepState, attempt: int, instance: str, found: CallFacts | None
) -> bool:
    """Whether the outcome a call reports (`state`, under `attempt`, by `instance`), though
    refused, is the one the step holds: a try of the same write whose answer was lost. The
    step (`found`, as for `call_lost`) finished in that state under that attempt, held by
    that instance, and was not abandoned. One instance makes one call of a step's attempt,
    so the outcome recorded is that call's."""
    return (
        found is not None
        and found.attempt == attempt
        and found.locked_by == instance
        and found.state == state
        and not found.abandoned
    )


StopPlan = Literal["stopped", "requeue", "hand_back"]
"""What an agent's word that its call stopped writes on the step: `stopped` (an abandoned
step: its call_stopped_at, so that it no longer holds up the compensation); `requeue` (a
step still running for a paused task: back to not_started, past its complete_by, so that no
agent claims it and the scheduler resuming the task dispatches it again at once);
`hand_back` (a step still running for a task whose calls go on again, resumed meanwhile:
back to the queue, in time, for an agent to claim)."""


AwaitStep = Literal["wait", "note", "mark"]


def await_first(*, created_here: bool) -> Literal["read", "note"]:
    """What a waiter for a task's result does first. "note" when this process created the
    task a moment ago (`created_here`): it exists and most likely no scheduler holds it yet,
    so the read that would find that out is spared and the wait noted at once, then the task
    read as after any note (`await_next` with `noted`). "read" otherwise: a task that ended,
    or is held, needs no note (and a read of an ended one writes nothing)."""
    return "note" if created_here else "read"


def await_next(*, state: TaskState | None, held: bool, awaited: bool, noted: bool) -> AwaitStep:
    """What a waiter for a task's result does next, having read the task (`state`: None when
    there is no such task; `held`: a scheduler holds it; `awaited`: its row is marked), so
    that the task's end wakes it: an end notifies only when its row is marked awaited or a
    wait is noted beside it (an operator's or the supervisor's end notifies always).

    "mark" (held): mark the row, under its lock, where it is still held (an end after the
    mark reads it; one before it leaves the row unheld and unmarked), then read again if the
    mark was not made; "note" (not held, not ended): note the wait beside the row, whose lock
    a waiter does not take (schedulers claim unheld rows skipping locked ones), then read
    again; "wait": the end will wake the waiter (the row is marked, or it was not held when
    read after the note: its scheduler ends it only after a claim committed after that read,
    and that end reads the note), or it ended or does not exist and the waiter has what it
    read.

    This rests on a hold being taken only by a claim (`Store.claim_tasks`) committed in a
    transaction of its own, before its scheduler's writes."""
    if state is None or state in FINISHED_TASK_STATES or awaited:
        return "wait"
    if held:
        return "mark"
    return "wait" if noted else "note"


def plan_call_stopped(*, attempt: int, instance: str, found: CallFacts | None) -> StopPlan | None:
    """What the word of `instance` that its call of a step (under `attempt`) has ended
    writes, from the step and its task as stored (as for `call_lost`, with call_stopped);
    None when it writes nothing: the step is another attempt's or instance's, its stop is
    already recorded, or it ended otherwise (completed, failed on its own)."""
    if found is None or found.attempt != attempt or found.locked_by != instance:
        return None
    state = found.state
    if state == StepState.RUNNING:
        in_call = found.task_state in CALL_TASK_STATES
        return "hand_back" if in_call else "requeue"
    if state == StepState.FAILED and found.abandoned and not found.call_stopped:
        return "stopped"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class GonePlan:
    """What the supervisor writes for a step running (in time) under an agent instance that
    is gone: silent for its gone-after, dead, or a zombie cut off and still calling. The
    step goes back to not_started under a new attempt either way (the idempotency key
    kept), so that whatever that instance sends late (an outcome, a heartbeat, a word that
    its call stopped) is refused, and so is its claim of the old attempt."""

    in_time: bool
    """Queued with a full complete_by of its own, for another instance to claim at once
    (its task's calls go on); else back to not_started past its complete_by, claimed by
    none, for the scheduler that resumes the task to dispatch again."""
    release_as: TaskState | None
    """The state a task held by a scheduler instance found gone (with the agent, as a
    worker of every role dies) is released into (`release_state`), failure_count
    unchanged, for a scheduler to take up again at once and adopt the step; None for a
    task no scheduler holds, left as it is, and for one an alive scheduler holds, which
    waits on for the step queued again under its own attempt (its complete_by never past
    the task's)."""


def plan_gone_step(*, task_state: TaskState, task_held: bool, holder_gone: bool) -> GonePlan:
    """Where a gone instance's running step goes, whatever the state of its task (read in
    the sweep's transaction, with whether a scheduler holds it and whether that scheduler
    is found gone): queued again in time for a task in the CALL_TASK_STATES (held,
    released, waiting: its calls go on); past its complete_by for any other (paused: no
    call runs until it is resumed), as the instance's own word that its call stopped would
    (`plan_call_stopped`); a task held by a gone scheduler released."""
    held = task_held and holder_gone and task_state in HELD_TASK_STATES
    return GonePlan(
        in_time=task_state in CALL_TASK_STATES,
        release_as=release_state(task_state) if held else None,
    )


def holds_up_compensation(*, remaining: float, call_stopped: bool) -> bool:
    """Whether a step its task stopped holding (abandoned, or about to be) still holds up
    the task's compensation: an agent may still be calling it, and apply its effect, until
    its call has stopped (the agent said so: `call_stopped_at`) or its complete_by has
    passed (`remaining`, seconds by the database clock), whichever comes first. A call whose
    agent died says nothing: its complete_by bounds it."""
    return not call_stopped and remaining > 0


def compensation_wait(steps: Sequence[Mapping[str, Any]]) -> float:
    """Seconds a compensation waits for the steps of its task that hold it up
    (`holds_up_compensation`), of steps read as rows (remaining, call_stopped); 0 when none
    does."""
    return max(
        (
            float(s["remaining"])
            for s in steps
            if holds_up_compensation(
                remaining=float(s["remaining"]), call_stopped=bool(s["call_stopped"])
            )
        ),
        default=0.0,
    )


# -- the supervisor: expired tasks --------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpiryPlan:
    """What the supervisor writes for one held task whose complete_by (or that of one of
    its open steps of the current attempt) passed."""

    state: TaskState
    failure_count: int
    """Expiries of the forward path, as stored."""
    compensation_failures: int
    """Expiries while compensating, as stored (0 when compensation starts)."""
    expiries: int
    """The expiries this one counts among (of the forward path, or of the compensation),
    this one included."""
    delay: float
    """Seconds before a scheduler may claim it again."""
    error: str | None
    """Stored as the task's error when the task is given up (with an alert)."""
    alert: AlertReason | None
    finished: bool
    abandon: bool
    """Its open steps are closed (abandoned) and it waits for their complete_by too: an
    agent still calling may yet apply its effect until then."""


def plan_expiry(
    *,
    held_as: TaskState,
    on_failure: str,
    failure_count: int,
    compensation_failures: int,
    max_failures: int,
    seq: int | None,
    compensable: bool,
    backoff: Backoff,
) -> ExpiryPlan:
    """The supervisor's rule for an expired held task, from its stored counts. Below
    max_failures the task is released (processing: back to pending; compensating: stays,
    unheld) after a backoff; at max_failures it is given up by its on_failure (compensate:
    compensating, or error when nothing is to undo; retry: pending, the backoff growing on,
    alerting once; stop: error), a compensating one to compensation_failed. A compensation
    counts its own expiries against max_failures; failure_count keeps the forward path's."""
    policy = OnFailure(on_failure)
    forward, undoing = failure_count, compensation_failures
    alert = None
    if held_as == TaskState.COMPENSATING:
        undoing += 1
        count = undoing
        state = TaskState.COMPENSATING
        if count >= max_failures:
            state, alert = TaskState.COMPENSATION_FAILED, AlertReason.COMPENSATION_FAILED
    elif held_as != TaskState.PROCESSING:
        raise ValueError(f"a task that is {held_as} is not held")
    else:
        forward += 1
        count = forward
        if count < max_failures:
            state = TaskState.PENDING
        elif policy == OnFailure.RETRY:  # wait for the fault to clear; alert once
            state = TaskState.PENDING
            alert = AlertReason.MAX_FAILURES if count == max_failures else None
        elif policy == OnFailure.COMPENSATE and compensable:
            state, undoing, alert = TaskState.COMPENSATING, 0, AlertReason.MAX_FAILURES
        else:
            state, alert = TaskState.ERROR, AlertReason.MAX_FAILURES
    where = "the task" if seq is None else f"step {seq}"
    phase = " while compensating" if held_as == TaskState.COMPENSATING else ""
    return ExpiryPlan(
        state=state,
        failure_count=forward,
        compensation_failures=undoing,
        expiries=count,
        delay=backoff.delay(count),
        error=(
            None
            if alert is None
            else f"complete_by passed {count} time(s){phase}, the last time on {where}; "
            "max_failures reached"
        ),
        alert=alert,
        finished=state in FINISHED_TASK_STATES,
        abandon=state not in (TaskState.PENDING, held_as),
    )


def release_state(held_as: TaskState) -> TaskState:
    """Where a held task goes when its scheduler is gone, or hands it back: a processing one
    back to pending, a compensating one stays compensating, unheld, for another scheduler to
    resume at once. No failure is counted: no work was judged."""
    if held_as not in HELD_TASK_STATES:
        raise ValueError(f"a task that is {held_as} is not held")
    return TaskState.PENDING if held_as == TaskState.PROCESSING else held_as


def plan_set_aside(held_as: TaskState, exc: BaseException) -> tuple[TaskState, str]:
    """A held task a rule or the database refused (a bug, a row that cannot be read): it
    waits for an operator, in error (compensation_failed if it was compensating), with the
    reason as its error and a `set_aside` alert, while the others of its batch go on."""
    state = TaskState.COMPENSATION_FAILED if held_as == TaskState.COMPENSATING else TaskState.ERROR
    return state, f"set aside for an operator: {type(exc).__name__}: {exc}"


# -- the scheduler: the end of a hold -----------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FinishPlan:
    """What the store writes for a scheduler's outcome of a task it holds."""

    state: TaskState
    compensation_starts: bool
    """Its compensation_failures start again at 0."""
    finished: bool
    alert: AlertReason | None


def plan_finish(outcome: TaskOutcome, *, on_failure: str, compensable: bool) -> FinishPlan:
    """A processed, compensated or compensation_failed outcome is final; an error becomes
    compensating when the task's on_failure is not "stop" and a step has something to undo
    (eligible once its open steps' complete_by has passed), else error. Alerts on error and
    compensation_failed."""
    state = TaskState(outcome.state)
    alert = {
        TaskState.ERROR: AlertReason.TASK_ERROR,
        TaskState.COMPENSATION_FAILED: AlertReason.COMPENSATION_FAILED,
    }.get(state)
    if state == TaskState.ERROR and OnFailure(on_failure) != OnFailure.STOP and compensable:
        return FinishPlan(
            state=TaskState.COMPENSATING, compensation_starts=True, finished=False, alert=alert
        )
    return FinishPlan(state=state, compensation_starts=False, finished=True, alert=alert)


# -- a step's deadline ----------------------------------------------------------------------


def step_deadline(
    now: float | None,
    complete_within: float | None,
    task_complete_by: float | None,
    give_up_by: float | None,
    not_before: float | None,
) -> float | None:
    """A step's complete_by wherever it is set (a dispatch, a dispatch again, a heartbeat, a
    reassignment): `now` + the step's complete_within, never past its task's complete_by nor
    its total timeout (give_up_by), never before `not_before` (a heartbeat does not shorten
    it); a None is no candidate. In seconds of the store's clock.

    SQLite's queries call it as the SQL function `stepwarden_step_deadline`, which the store
    registers on each connection. PostgreSQL's deadlines come from the database's clock, in
    the statement: there the rule is migration 0015's function of the same name, this rule
    in SQL, kept equal to it by a contract test over every combination of NULLs and orders
    (tests/contract/test_agents_store.py)."""
    within = None if now is None or complete_within is None else now + complete_within
    capped = [t for t in (within, task_complete_by, give_up_by) if t is not None]
    earliest = min(capped) if capped else None
    if earliest is None or not_before is None:
        return not_before if earliest is None else earliest
    return max(earliest, not_before)


# -- the supervisor: steps past their timeouts --------------------------------------------


def pickup_failure(pickup_within: float) -> tuple[str, bool]:
    """The error of a step no agent claimed within its pick-up timeout; never abandoned:
    it never ran."""
    return f"not picked up: no agent claimed the step within {pickup_within:g}s", False


def total_failure(total: float, state: StepState, attempt: int) -> tuple[str, bool]:
    """The error of a step past its total timeout, and whether it is abandoned: one that is
    running, or ran before, may have taken effect, and is compensated."""
    text = f"total timeout: not completed within {total:g}s of its first dispatch"
    ran = state == StepState.RUNNING or attempt > 1
    return ("abandoned: " + text if ran else text), ran


# -- the supervisor's lease ---------------------------------------------------------------


def lease_term(current: Mapping[str, Any] | None, holder: str) -> int | None:
    """The term under which `holder` takes or renews a lease read as (holder, term, live):
    the same while its holder renews it in time, one more when it lapsed or changed hands,
    1 the first time; None while another holds it."""
    if current is None:
        return 1
    if current["live"]:
        return int(current["term"]) if current["holder"] == holder else None
    return int(current["term"]) + 1


# -- priorities: the claim order, with aging ----------------------------------------------

PRIORITY_STEP = 1.0
"""Seconds of waiting that one priority level is worth."""
MAX_HEAD_START = 3600.0
"""The most a priority moves work ahead (or behind): priorities beyond ±3,600 count as
±3,600, so that no priority holds other work back more than two hours."""


def head_start(priority: int) -> float:
    """How many seconds ahead of its submit a task is ranked, and each of its steps ahead of
    its dispatch: `priority * PRIORITY_STEP`, within ±MAX_HEAD_START.

    Claims (a scheduler's of tasks, an agent's of requests) take the eligible work of least
    `ranked_at = submit (or dispatch) time - head_start(priority)` first. So work of priority
    p waits behind work of priority q > p only when that was submitted less than
    `head_start(q) - head_start(p)` seconds after it (q - p, for priorities within the cap):
    its effective priority rises by one level for each PRIORITY_STEP it waits, and under a
    stream of higher priorities it is delayed, never starved. Among equal priorities, the
    oldest first."""
    return max(-MAX_HEAD_START, min(MAX_HEAD_START, priority * PRIORITY_STEP))


# -- fair share across tenants -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TenantTurn:
    """A tenant with tasks waiting for a claim, as the claim reads it: its `weight` and its
    `pass` (None: no row yet, a tenant never claimed for)."""

    tenant: str
    weight: float
    pass_: float | None


@dataclass(frozen=True, slots=True)
class FairShare:
    """What one claim takes of each tenant (`counts`, by tenant), and the fair clock after
    it (`clock`: where a tenant that comes back after an idle while starts)."""

    counts: dict[str, int]
    clock: float


def claim_fairly(*, last_claimed: int | None, last_asked: int) -> bool:
    """Whether a scheduler's next claim is shared among the tenants waiting (`fair_shares`)
    or made by rank alone (one statement, no read of the tenants first). Fairly after a
    claim that took all it asked for (there may be more waiting than it takes: a backlog,
    whose share is the tenants'), and for a scheduler's first (`last_claimed` None); by
    rank after one that took fewer: it took every task there was, so the next finds only
    those submitted since, and while claims keep finding fewer than they ask, none waits for
    another's share. At most one claim in a row is made by rank once a backlog builds up."""
    return last_claimed is None or last_claimed >= last_asked


def fair_shares(turns: Sequence[TenantTurn], clock: float, limit: int) -> FairShare:
    """Stride scheduling: each claim goes, one at a time, to the tenant of least pass, whose
    pass then moves on by 1 / weight; ties by name. A tenant's pass is never below the
    clock, the least pass of the tenants with work waiting at the last claim: one that comes
    back after an idle while starts at the current minimum and hoards no credit. So under
    saturation each tenant with work waiting gets claims in proportion to its weight, and
    one of weight w gets at least one claim in every ceil(W / w) + 1 claims in a row (W: the
    weights of the tenants waiting added up). The counts assume each tenant has work enough
    (a claim takes fewer where it has not: the next claim goes on)."""
    if not turns or limit <= 0:
        return FairShare({}, clock)
    passes = {t.tenant: max(clock, t.pass_ if t.pass_ is not None else clock) for t in turns}
    weights = {t.tenant: t.weight for t in turns}
    now = min(passes.values())
    counts = {t.tenant: 0 for t in turns}
    for _ in range(limit):
        tenant = min(passes, key=lambda n: (passes[n], n))
        counts[tenant] += 1
        passes[tenant] += 1.0 / weights[tenant]
    return FairShare({n: c for n, c in counts.items() if c}, max(clock, now))


@dataclass(frozen=True, slots=True)
class TenantWork:
    """A row of the tenants with work waiting for one (workflow, version) `pair`, as a claim
    reads it (`fair_tenants`): its `key`, the pass it is ordered by (never above the
    tenant's pass as `fair_shares` takes it, max(clock, pass)); whether the tenant has
    pending tasks of the pair (`live`), its `weight` and `pass_` (None: no row)."""

    tenant: str
    pair: tuple[str, int]
    key: float
    live: bool
    weight: float
    pass_: float | None


def least_pass(
    rows: Sequence[TenantWork], clock: float, count: int, scan: int
) -> list[TenantTurn] | None:
    """The `count` tenants of least pass (max(clock, pass), ties by name) with pending tasks,
    from the first `scan` rows of each pair by (key, tenant). `fair_shares` of a claim of
    `limit` gives claims only to the `limit` tenants of least pass (one after them gets a
    claim only once each of them has had one), and the fair clock is the least of them: so
    these `count` (at least the limit) make the claim exactly as every tenant waiting would.
    None when the rows read may not hold them: a pair has rows unread (its `scan` all read)
    that may come before the last of these, or there are fewer than `count`; a larger
    `scan` then reads on. A row's key is never above its tenant's pass, so a row unread comes
    after the last one read of its pair, and after the clock."""
    turns: dict[str, TenantTurn] = {}
    last: dict[tuple[str, int], tuple[float, str]] = {}
    read: dict[tuple[str, int], int] = {}
    for r in rows:
        read[r.pair] = read.get(r.pair, 0) + 1
        last[r.pair] = max(last.get(r.pair, (r.key, r.tenant)), (r.key, r.tenant))
        if r.live:
            turns[r.tenant] = TenantTurn(r.tenant, r.weight, r.pass_)

    def order(t: TenantTurn) -> tuple[float, str]:
        return (max(clock, t.pass_ if t.pass_ is not None else clock), t.tenant)

    least = sorted(turns.values(), key=order)[:count]
    unread = [max(last[p], (clock, "")) for p, n in read.items() if n >= scan]
    if unread and (len(least) < count or order(least[-1]) >= min(unread)):
        return None
    return least


# -- agents: claims within limits ---------------------------------------------------------

SCAN = 1000
"""How many queued requests a claim within limits looks at, past those it may not start."""


def pick_within_limits(
    candidates: Sequence[tuple[str, str | None]],
    limits: Mapping[str, OpLimit],
    running: Mapping[tuple[str, str], int],
    started: Mapping[tuple[str, str], int],
    limit: int,
    *,
    tenants: Sequence[str] | None = None,
    shares: Mapping[str, int] | None = None,
) -> list[int]:
    """Which of the queued requests (operation, limit key), in claim order, may start now:
    the positions of at most `limit` of them that keep each operation within its limits,
    given the steps `running` and the starts within each rate's period (`started`), both by
    (operation, key) with "" for no key. Requests of an operation with no limits all may.

    With `shares` (a fair claim's counts by tenant, `fair_shares`; `tenants` the tenant of
    each candidate), each tenant's share is picked first, of its own requests in claim order;
    what the limits leave of the claim then goes to the others in claim order, whoever's they
    are: a limit binds before a share (a tenant's share it holds back goes to a tenant it does
    not), and the claim takes as much as the limits allow."""
    running = dict(running)
    started = dict(started)
    room = {op: lim.room for op, lim in limits.items() if lim.room is not None}
    chosen: set[int] = set()

    def fits(op: str, key: str | None) -> bool:
        lim = limits.get(op)
        if lim is None:
            return True
        k = (op, key or "")
        if op in room and room[op] <= 0:
            return False
        if lim.concurrency is not None and running.get(k, 0) >= lim.concurrency:
            return False
        if lim.rate is not None and started.get(k, 0) >= lim.rate:
            return False
        running[k] = running.get(k, 0) + 1
        started[k] = started.get(k, 0) + 1
        if op in room:
            room[op] -= 1
        return True

    if shares is not None and tenants is not None:
        left = dict(shares)
        for i, (op, key) in enumerate(candidates):
            if len(chosen) >= limit:
                break
            if left.get(tenants[i], 0) > 0 and fits(op, key):
                left[tenants[i]] -= 1
                chosen.add(i)
    for i, (op, key) in enumerate(candidates):
        if len(chosen) >= limit:
            break
        if i not in chosen and fits(op, key):
            chosen.add(i)
    return sorted(chosen)


# -- the operator -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ActionPlan:
    """What the store writes for one operator action on a task found in `before`."""

    before: TaskState
    after: TaskState
    reset_failures: bool  # failure_count starts again at 0 (the forward path is resubmitted)
    reset_compensation_failures: bool  # compensation_failures start again at 0
    wait_open: bool  # eligible once the open steps' complete_by has passed
    final: bool
    close_open: bool  # the open steps are closed (abandoned)
    reopen: bool | None  # retry: reopen the failed compensations (True) or forward steps


def plan_action(action: OperatorAction, before: TaskState) -> ActionPlan | ActionOutcome:
    """The plan for `action` on a task in `before`, or the outcome that refuses it."""
    moves = OPERATOR_ACTIONS[action.action]
    if before not in moves:
        allowed = ", ".join(sorted(moves))
        why = f"cannot {action.action} a task that is {before} (only when {allowed})"
        return ActionOutcome.refused(action.task_id, before, why)
    after = moves[before]
    return ActionPlan(
        before=before,
        after=after,
        reset_failures=action.action == "retry" and after == TaskState.PENDING,
        reset_compensation_failures=after == TaskState.COMPENSATING,
        wait_open=after == TaskState.COMPENSATING,
        final=after in FINISHED_TASK_STATES,
        close_open=action.action in ("cancel", "compensate"),
        reopen=(after == TaskState.COMPENSATING) if action.action == "retry" else None,
    )


def action_detail(action: OperatorAction, plan: ActionPlan) -> dict[str, Any]:
    """The `operator` event of an applied action: who, why, from, to (and the step)."""
    detail: dict[str, Any] = {
        "action": action.action,
        "by": action.actor,
        "reason": action.reason,
        "from": str(plan.before),
        "to": str(plan.after),
    }
    if action.seq is not None:
        detail["seq"] = action.seq
    if action.identity is not None:
        detail["authenticated"] = action.identity
    if action.parent is not None:
        detail["parent"] = action.parent
    return detail


ENGINE = "stepwarden"
"""The actor named in the history of an action the engine takes itself (a child compensated
because its parent failed)."""


def plan_cascade(
    parent_id: str,
    cause: str,
    children: Sequence[Mapping[str, Any]],
    *,
    actor: str = ENGINE,
    identity: str | None = None,
) -> list[OperatorAction]:
    """Which children an action on a parent reaches, and what it does to them.

    `cause` is what happened to the parent: "cancel" (an operator cancelled it),
    "compensate" (an operator compensates it: `compensate`, `cancel --compensate`) or
    "failed" (its own failure sent it to compensating). Of its children, read as rows
    (task_id, process_state, created_at), those that have not ended (not in
    FINISHED_TASK_STATES) are reached, newest first: each is cancelled ("cancel") or
    compensated (the other two), as an operator action by `actor` whose reason and `parent`
    name the parent; a child the action does not apply to (a compensating one) is left as
    it is. The store applies each action like the operator's, and so on to the children's
    own children."""
    reasons = {
        "cancel": f"its parent {parent_id!r} was cancelled",
        "compensate": f"its parent {parent_id!r} is compensated",
        "failed": f"its parent {parent_id!r} failed and is compensated",
    }
    if cause not in reasons:
        raise ValueError(f"no cascade for {cause!r}")
    why = reasons[cause]
    verb: OperatorVerb = "cancel" if cause == "cancel" else "compensate"
    moves = OPERATOR_ACTIONS[verb]
    live = [
        c
        for c in children
        if TaskState(c["process_state"]) not in FINISHED_TASK_STATES
        and TaskState(c["process_state"]) in moves
    ]
    live.sort(key=lambda c: (c["created_at"], c["task_id"]), reverse=True)
    return [
        OperatorAction(
            action=verb,
            task_id=c["task_id"],
            actor=actor,
            reason=why,
            identity=identity,
            parent=parent_id,
        )
        for c in live
    ]


# -- schedules ------------------------------------------------------------------------------

CATCH_UP = ("skip", "all", "latest")
SKIP_GRACE = 60.0
"""Seconds late a tick may be and still run under catch_up="skip"."""
MAX_TICKS = 1000
"""Ticks created for one schedule at one pass (catch_up="all" after a long stop)."""


def next_tick(spec: ScheduleSpec, after: float) -> float:
    """The first tick of the schedule strictly after `after` (epochs). ConfigurationError
    for a cron expression that never fires (`0 0 30 2 *`) or cannot be read."""
    if spec.every is not None:
        return after + spec.every
    return _cron_tick(spec, after, forward=True)


def _cron_tick(spec: ScheduleSpec, at: float, *, forward: bool) -> float:
    """The cron schedule's first tick after `at`, or its last before (`forward=False`)."""
    assert spec.cron is not None
    try:
        cron = croniter(spec.cron, datetime.fromtimestamp(at, tz=ZoneInfo(spec.timezone)))
        tick: datetime = cron.get_next(datetime) if forward else cron.get_prev(datetime)
    except CroniterBadDateError:
        raise ConfigurationError(
            f"schedule {spec.name!r}: cron {_check.shown(spec.cron)} never fires"
        ) from None
    except (CroniterError, ValueError, LookupError) as exc:  # stored by an older check
        raise ConfigurationError(
            f"schedule {spec.name!r}: cron {_check.shown(spec.cron)} in"
            f" {_check.shown(spec.timezone)} cannot be read: {exc}"
        ) from None
    return tick.timestamp()


def first_tick(spec: ScheduleSpec, now: float) -> float:
    """Where a new (or changed, or resumed) schedule starts: its first tick after now (the
    ticks of a pause are never made). An `every` schedule ticks at the multiples of its period
    since the epoch (every hour: on the hour, UTC), so that its ticks are the same whoever
    stores it, and when."""
    if spec.every is not None:
        return (math.floor(now / spec.every) + 1) * spec.every
    return next_tick(spec, now)


def _tick_from(spec: ScheduleSpec, next_at: float, start: float) -> float:
    """The schedule's first tick at or after `start` (`next_at` is one of its ticks)."""
    if start <= next_at:
        return next_at
    if spec.every is not None:
        return next_at + math.ceil((start - next_at) / spec.every) * spec.every
    return next_tick(spec, start - 1e-6)


def plan_ticks(spec: ScheduleSpec, next_at: float, now: float) -> tuple[list[float], float]:
    """The ticks to create now (epochs), oldest first, and the schedule's next tick after
    them, from `next_at` (the first tick not created yet): with catch_up "all", every tick due
    (up to MAX_TICKS a pass, the rest at the next); "latest", the newest due; "skip", those no
    more than SKIP_GRACE seconds late."""
    if next_at > now:
        return [], next_at
    if spec.catch_up == "latest":
        start = now if spec.every is None else now - spec.every + 1e-6
        newest = _tick_from(spec, next_at, max(next_at, start))
        if newest > now:  # a cron tick: the newest at or before now is found going back
            newest = max(next_at, _cron_tick(spec, now, forward=False))
        return [newest], next_tick(spec, newest)
    tick = _tick_from(spec, next_at, now - SKIP_GRACE) if spec.catch_up == "skip" else next_at
    due: list[float] = []
    while tick <= now and len(due) < MAX_TICKS:
        due.append(tick)
        tick = next_tick(spec, tick)
    return due, tick


def schedule_task_id(name: str, tick: float) -> str:
    """The id of the task of a schedule's tick: the same in every supervisor, so that a tick
    creates one task however many race for it."""
    at = datetime.fromtimestamp(tick, tz=UTC).isoformat()
    return f"{name}@{at}"


# -- submits ------------------------------------------------------------------------------


def resubmit(
    new: Submission,
    *,
    workflow: str,
    version: int,
    submitted_by: str | None,
    same_input: bool,
    tenant: str | None = None,
) -> Submitted:
    """A submit under a task id taken by a task of `workflow` at `version` and `tenant`,
    submitted by `submitted_by` (None: in Python), whose input is the new one's or not
    (`same_input`, compared by digest): the same submit, or a conflict naming what differs.
    Of a task another client submitted, nothing else is compared, nor told: its client
    differs (so a submit under an id another tenant holds is a conflict, which tells only
    that the id is taken)."""
    if submitted_by != new.submitted_by:
        return Submitted(new.task_id, "conflict", ("client",))
    differs = tuple(
        name
        for name, same in (
            ("workflow", workflow == new.workflow),
            ("version", version == new.version),
            ("tenant", (tenant or None) == (new.tenant or None)),
            ("input", same_input),
        )
        if not same
    )
    if not differs:
        return Submitted(new.task_id, "same", workflow=workflow, version=version)
    return Submitted(new.task_id, "conflict", differs, workflow=workflow, version=version)


# -- workflow versions ---------------------------------------------------------------------


def submit_version(workflow: str, declared: Collection[int], asked: object = None) -> int:
    """The version of `workflow` a new task runs to its end: the newest of the versions the
    submitting App declares, or `asked` when it is one of them."""
    if asked is None:
        return max(declared)
    version = _check.integer("version", asked, 1)
    if version not in declared:
        known = ", ".join(str(v) for v in sorted(declared))
        raise UnknownNameError(
            f"workflow {workflow!r} has no version {version} in this App (declared: {known})"
        )
    return version


def unrunnable(
    backlog: Iterable[VersionBacklog], runnable: Collection[tuple[str, int]]
) -> list[VersionBacklog]:
    """The tasks waiting for a scheduler, by (workflow, version), that no scheduler running
    `runnable` (its (workflow, version) pairs) may claim: they wait until one with that
    version starts. By workflow, then version."""
    return sorted(
        (b for b in backlog if (b.workflow, b.version) not in runnable),
        key=lambda b: (b.workflow, b.version),
    )


# -- redrives: a retry or a fork, and their plans ----------------------------------------


def place_of(position: str) -> tuple[int, ...]:
    """A step's place (`"3"`, `"3.2.1"`) as numbers, in the workflow's order."""
    return tuple(int(p) for p in position.split("."))


def plan_retry(task_id: str, state: TaskState, steps: Sequence[StepRecord]) -> list[StepPlan]:
    """What `retry` does with each step of a task in `state` (error, compensation_failed):
    from error, a completed step is kept and a failed one runs again under its key; from
    compensation_failed, a step that needs compensation is undone (its compensation runs
    again), the others are kept. Compensation steps are planned through the step each
    undoes."""
    plans = []
    for s in steps:
        if s.compensates is not None:
            continue
        if state == TaskState.COMPENSATION_FAILED:
            kind: RedrivePlan = "undone" if step_needs_compensation(s) else "kept"
        elif s.state == StepState.COMPLETED:
            kind = "kept"
        else:
            kind = "same_key"
        plans.append(StepPlan(seq=s.seq, position=s.position, name=s.name, plan=kind,
                              key=s.idempotency_key))  # fmt: skip
    return plans


BULK_ACTIONS = ("retry", "cancel", "compensate", "pause", "resume", "fork")
"""The operator actions a bulk action by filter may apply (`App.bulk`): every one but skip,
which names a step, and fork."""


def bulk_states(action: str, states: frozenset[TaskState]) -> frozenset[TaskState]:
    """The states a bulk `action` reaches among those a filter asks for (empty: any): those
    the action moves a task out of (`OPERATOR_ACTIONS`); for a fork, the finished ones. A
    task acted on is then in a state the action does not move, so it no longer matches: a
    bulk run again with the same filter goes on with the tasks the first did not reach (but
    for a task that came back meanwhile, say retried, failed again). A forked task stays as
    it was: its fork's id (`bulk_fork_id`) is taken, which refuses a second fork."""
    if action not in BULK_ACTIONS:
        known = ", ".join(BULK_ACTIONS)
        raise ValueError(f"a bulk action is one of {known}, not {action!r}")
    moves = FINISHED_TASK_STATES if action == "fork" else frozenset(OPERATOR_ACTIONS[action])
    return moves & states if states else moves


def bulk_fork_id(task_id: str, name: str) -> str | None:
    """The id of a bulk fork's task for `task_id` (`TASK~NAME`); None for a task that is
    itself such a fork (of the same NAME), which a bulk fork leaves alone."""
    suffix = f"~{name}"
    return None if task_id.endswith(suffix) else task_id + suffix


def plan_fork(
    task: TaskRecord,
    steps: Sequence[StepRecord],
    new_id: str,
    start: str,
    new_keys_from: int | None,
    waits: Sequence[str] = (),
) -> tuple[list[StepPlan], str, int | None] | str:
    """A fork of `task` as `new_id` from the place `start`: each forward step before it is
    kept (its result recorded in the fork), each from it runs again, under the key it had
    unless `new_keys_from` gives it a new one (`seq >= new_keys_from`: `new_id/seq`); and
    the fork's keys (`keys_of`, `new_keys_from`: those of `task`'s own keys, for a fork of a
    fork). Or why it is refused: a step before `start` that did not complete, a wait before
    it (a fork copies steps only), or no step at `start`."""
    try:
        first = place_of(start)
    except ValueError:
        return f"--from must be a step's place (1, 2, 3.1, ...), not {start!r}"
    earlier = sorted((w for w in waits if place_of(w) < first), key=place_of)
    if earlier:
        return (
            f"task {task.task_id!r} recorded a wait at {earlier[0]}, before {start}: a fork "
            "keeps steps only (fork from a place before its first wait)"
        )
    keys_of = task.keys_of or task.task_id
    bound = [n for n in (new_keys_from, task.new_keys_from) if n is not None]
    keys_until = min(bound) if bound else None
    plans = []
    found = False
    for s in steps:
        if s.compensates is not None or s.position is None:
            continue
        if place_of(s.position) < first:
            if s.state != StepState.COMPLETED:
                return f"step {s.seq} at {s.position}, before {start}, did not complete ({s.state})"
            plans.append(StepPlan(seq=s.seq, position=s.position, name=s.name, plan="kept",
                                  key=s.idempotency_key))  # fmt: skip
            continue
        found = found or s.position == start or place_of(s.position)[: len(first)] == first
        key = idempotency_key(new_id, s.seq, keys_of=keys_of, new_keys_from=keys_until)
        kind: RedrivePlan = "same_key" if key == s.idempotency_key else "new_key"
        plans.append(StepPlan(seq=s.seq, position=s.position, name=s.name, plan=kind, key=key))
    if not found:
        return f"task {task.task_id!r} has no step at {start}"
    return plans, keys_of, keys_until


def wait_mismatch(
    req: WaitRequest, kind: str, name: str, child_workflow: str | None = None
) -> WaitOutcome | None:
    """Whether the wait a replay asks for (`req`) is another than the one recorded at its
    seq (`kind`, `name`; for a child, the workflow its task runs, when it exists): the
    "mismatch" the workflow's Context words as a divergence, or None when it is the same.
    Asked by the store's wait (`store/policy.wait`) and by `stepwarden check-upgrade`."""
    if (kind, name) != (req.kind, req.name):
        return WaitOutcome(state="mismatch", recorded=(kind, name))
    if (
        req.kind == "child"
        and req.child is not None
        and child_workflow is not None
        and child_workflow != req.child.workflow
    ):
        return WaitOutcome(
            state="mismatch",
            recorded=(kind, name),
            reason=f"the child task {req.name!r} recorded at position {req.position} runs "
            f"workflow {child_workflow!r}, the workflow asked for {req.child.workflow!r}",
        )
    return None


# -- why a task waits ---------------------------------------------------------------------

BREAKER_OPEN = "open"
"""An agent instance's breaker that lets no call through (`breaker.OPEN`)."""
WAIT_KINDS = {"timer": WaitReason.TIMER, "event": WaitReason.EVENT, "child": WaitReason.CHILDREN}


def _holder(
    reason: WaitReason,
    holder: str,
    instances: Sequence[AgentInstance | SchedulerInstance],
    complete_by: datetime | None,
    now: datetime,
) -> Gate:
    """Held by `holder`: how long since its last beat, and when the supervisor takes the work
    back at the latest: its complete_by, or once the holder's registry row has expired."""
    found = next((i for i in instances if i.instance == holder), None)
    ends = [t for t in (complete_by, None if found is None else found.expires_at) if t is not None]
    return Gate(
        reason=reason,
        holder=holder,
        holder_alive=found is not None and found.alive,
        beat_age=None if found is None else max(0.0, (now - found.heartbeat_at).total_seconds()),
        until=min(ends) if ends else None,
    )


def _last_beat(gone: Iterable[AgentInstance | SchedulerInstance]) -> datetime | None:
    return max((i.heartbeat_at for i in gone), default=None)


def task_gate(f: TaskFacts) -> Gate:
    """What holds a task now, from its facts: its end, an operator (set aside, paused), its
    waits (a delayed start, a timer, an event, children), its scheduler's hold, a retry's
    backoff, no scheduler alive for its (workflow, version), or its rank in the claim order."""
    t = f.task
    state = t.process_state
    if state in (TaskState.ERROR, TaskState.COMPENSATION_FAILED):
        return Gate(
            reason=WaitReason.SET_ASIDE,
            state=state,
            error=t.error,
            alert=f.alert,
            since=t.finished_at or t.updated_at,
        )
    if state in FINISHED_TASK_STATES:
        return Gate(reason=WaitReason.FINISHED, state=state, since=t.finished_at or t.updated_at)
    if state == TaskState.PAUSED:
        p = f.paused
        return Gate(
            reason=WaitReason.PAUSED,
            by=None if p is None else p.by,
            authenticated=None if p is None else p.authenticated,
            note=None if p is None else p.note,
            since=t.updated_at if p is None else p.at,
        )
    if state == TaskState.WAITING:
        waits = tuple(sorted(f.waits, key=lambda w: _place_key(w.position)))
        if not waits:  # a delayed start: no wait recorded
            return Gate(reason=WaitReason.START, until=t.wake_at)
        first = waits[0]
        reason = WAIT_KINDS[first.kind]
        if reason == WaitReason.CHILDREN:
            named = {w.name for w in waits if w.kind == "child"}
            children = tuple(c for c in f.children if c.task_id in named)
            return Gate(reason=reason, children=children, waits=waits)
        return Gate(
            reason=reason,
            until=first.wake_at,
            event=first.name if reason == WaitReason.EVENT else None,
            waits=waits,
        )
    if t.locked_by is not None:
        return _holder(WaitReason.HELD, t.locked_by, f.schedulers, t.complete_by, f.now)
    if f.eligible_at > f.now:
        return Gate(reason=WaitReason.BACKOFF, until=f.eligible_at)
    pair = (t.workflow, t.version)
    running = [s for s in f.schedulers if pair in s.versions]
    alive = tuple(s.instance for s in running if s.alive)
    if not alive:
        return Gate(
            reason=WaitReason.NO_SCHEDULER,
            workflow=t.workflow,
            version=t.version,
            since=_last_beat(running),
        )
    if state != TaskState.PENDING:  # a compensating task is claimed by rank alone
        return Gate(reason=WaitReason.RANKED, schedulers=alive, ahead=f.ahead, rank=f.ahead + 1)
    return Gate(
        reason=WaitReason.RANKED,
        schedulers=alive,
        ahead=f.ahead,
        rank=f.ahead + 1,
        tenant=t.tenant or "",
        tenant_ahead=f.tenant_ahead,
        share=f.share,
    )


def step_gate(f: StepFacts) -> Gate:
    """What holds an open step now, from its facts: the agent instance running it, or, queued:
    no alive instance of its agent serving its operation, every one's breaker open, its
    operation's concurrency or rate limit reached, every slot busy, or its rank in the
    queue."""
    s = f.step
    if s.state == StepState.RUNNING and s.locked_by is not None:
        return _holder(WaitReason.HELD, s.locked_by, f.instances, s.complete_by, f.now)
    serving = [i for i in f.instances if s.operation in i.operations]
    alive = [i for i in serving if i.alive]
    if not alive:
        return Gate(
            reason=WaitReason.NO_AGENT,
            agent=s.agent,
            operation=s.operation,
            since=_last_beat(serving),
        )
    names = tuple(i.instance for i in alive)
    closed = [i for i in alive if i.breaker != BREAKER_OPEN]
    if not closed:
        reopens = [
            i.heartbeat_at + timedelta(seconds=float(i.breaker_detail["half_open_in"]))
            for i in alive
            if isinstance(i.breaker_detail.get("half_open_in"), int | float)
        ]
        return Gate(
            reason=WaitReason.BREAKER_OPEN, instances=names, until=min(reopens, default=None)
        )
    lim = f.limit
    if lim is not None and lim.concurrency is not None and f.running >= lim.concurrency:
        return Gate(
            reason=WaitReason.CONCURRENCY_FULL,
            limit=lim.concurrency,
            in_use=f.running,
            held_by=f.running_tasks,
        )
    if lim is not None and lim.rate is not None and f.started >= lim.rate:
        until = None if f.oldest_start is None else f.oldest_start + timedelta(seconds=lim.per)
        return Gate(
            reason=WaitReason.RATE_FULL, limit=lim.rate, per=lim.per, in_use=f.started, until=until
        )
    if all(i.inflight >= i.capacity for i in closed):
        return Gate(reason=WaitReason.NO_CAPACITY, instances=tuple(i.instance for i in closed))
    return Gate(
        reason=WaitReason.QUEUED,
        instances=tuple(i.instance for i in closed),
        ahead=f.ahead,
        rank=f.ahead + 1,
    )


def holding_gate(task: Gate, steps: Sequence[Gate]) -> Gate:
    """What holds a task in the end: a held task waits for its first open step (whose gate
    says why), any other for its own gate."""
    if task.reason == WaitReason.HELD and steps:
        return steps[0]
    return task
