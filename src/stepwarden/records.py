"""The records the engine reads and writes: tasks, steps, requests, outcomes, events.

Plain values, with no behaviour beyond naming themselves: the rules that decide what
happens to them are in `rules.py`, the SQL that stores them in `store/`. Payloads travel to
the store as JSON text and come back as Python values.

Deadlines (`complete_by`, eligibility, a registry row's expiry) are computed by the store's
clock: the database's `now()` on PostgreSQL, the writing process's clock on SQLite (one
machine's). A record read with a deadline carries `remaining`, the seconds left by that
clock; the scheduler and the agents turn it into a deadline of their own monotonic clock
(`deadline.Deadline.after`). So on PostgreSQL a wrong wall clock on a worker moves no deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, TypedDict

from .states import FINISHED_TASK_STATES, StepState, TaskState


def step_key(task_id: str, seq: int) -> str:
    """A step's identity as one string (wake-up payloads, dictionary keys)."""
    return f"{task_id}\x1f{seq}"


def step_of_key(key: str) -> tuple[str, int]:
    """The (task_id, seq) of a `step_key`."""
    task_id, _, seq = key.rpartition("\x1f")
    return task_id, int(seq)


def idempotency_key(
    task_id: str, seq: int, *, keys_of: str | None = None, new_keys_from: int | None = None
) -> str:
    """The key every dispatch and retry of a step carries to the remote service:
    `task_id/seq`; for a fork (`App.fork`), `keys_of/seq`, the key of the task it was forked
    from, for the steps before its `new_keys_from` (all of them when None)."""
    if keys_of is not None and (new_keys_from is None or seq < new_keys_from):
        return f"{keys_of}/{seq}"
    return f"{task_id}/{seq}"


# -- tasks --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Submission:
    """A task to create, as every entry point builds it: `App.submit`, `submit_async`,
    `TaskTransaction.submit` and `App.new_task`, the application API's `POST /api/v1/tasks`,
    `stepwarden submit`, a schedule's tick and `ctx.child`. The submit's options are its
    fields from `task_id` to `tags`, with their defaults (`App.submit` takes them as
    keywords: `task_id=None` there makes a new id).

    A submit under a task_id taken already creates nothing: it is the same submit
    (`Submitted.outcome` "same") when the task was submitted with the same workflow, version
    and input (compared by `input_digest`) by the same client, and a conflict otherwise. A
    same re-submit's other options (priority, reply_to, start_at, start_after, tags) are ignored:
    the task keeps those of its first submit."""

    workflow: str
    input: str
    """The task's input as JSON text (its secrets sealed)."""
    task_id: str
    priority: int = 0
    """Higher runs first among the tasks waiting for a scheduler (`rules.head_start`)."""
    reply_to: str | None = None
    """The channel, or broker destination, of the task's status messages; None: it has
    none."""
    start_at: datetime | None = None
    """Start no sooner than this (the task waits until then, `waiting_for` "start")."""
    start_after: float = 0.0
    """Start no sooner than this many seconds after the submit, by the store's clock."""
    version: int = 1
    """The version of the workflow the task runs, from its first claim to its end."""
    tenant: str | None = None
    """Who the task belongs to (None: no tenant, the App's own in Python). Over the
    application API a client's tasks are its own unless it names another tenant its tokens
    entry grants, and it sees only the tasks of the tenants it may (`_tokens.Client.may_see`).
    A child task has its parent's; a schedule's tasks have the schedule's."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """What the task is about, as key and value (`{"customer": "c-42"}`): shown with it,
    and what `App.tasks`, `stepwarden tasks --tag` and the dashboard find it by. At most
    `_check.MAX_TAGS`, each key of at most `_check.MAX_TAG_KEY` characters, each value of at
    most `_check.MAX_TAG_VALUE`; its workflow may add more (`Context.tag`)."""
    complete_within: float
    """Seconds each claim of the task may hold it (its workflow's `complete_within`)."""
    max_failures: int
    on_failure: str = "compensate"
    parent_id: str | None = None
    """A child task's parent: the task whose workflow started it (`Context.child`)."""
    parent_position: str | None = None
    """A child task's place in its parent's workflow (where the parent waits for it)."""
    trace_context: str | None = None
    """The W3C trace context (JSON text) of the task's submit span, the parent of its runs'
    spans (`tracing`); None when tracing is off."""
    submitted_by: str | None = None
    """The application API's client that submitted the task (None: the App, in Python, a
    child or a schedule's tick)."""
    input_digest: str | None = None
    """A keyed digest of the task's canonical input (`sealing.input_digest`): what a
    re-submit under its id is compared by."""


SUBMIT_OPTIONS = (
    "task_id",
    "priority",
    "reply_to",
    "start_at",
    "start_after",
    "version",
    "tenant",
    "tags",
)
"""The fields of a `Submission` that a submit's caller chooses (`App.submit`'s keywords)."""

SubmitOutcome = Literal["created", "same", "conflict"]


@dataclass(frozen=True, slots=True)
class Submitted:
    """The store's answer to one submit: `created`; `same`, a task of this id was submitted
    before with the same workflow, version and input by the same client (it is left as it
    is); or `conflict`, a task of this id exists that another submit made. `differs`, on a
    conflict, what differs, of "client", "workflow", "version" and "input" (only "client"
    when another client submitted it: nothing else of that task is compared); and then,
    when the same client submitted it, the `workflow` and `version` it runs."""

    task_id: str
    outcome: SubmitOutcome
    differs: tuple[str, ...] = ()
    workflow: str | None = None
    version: int | None = None

    @property
    def created(self) -> bool:
        return self.outcome == "created"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRecord:
    task_id: str
    workflow: str
    input: Any
    process_state: TaskState
    locked_by: str | None
    complete_by: datetime | None
    failure_count: int
    max_failures: int
    attempt: int
    priority: int
    complete_within: float
    result: Any
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    on_failure: str = "compensate"
    reply_to: str | None = None
    compensation_failures: int = 0
    """Expiries while compensating (failure_count keeps those of the forward path)."""
    wake_at: datetime | None = None
    """A waiting task's: when its timer fires, its wait times out or its delayed start comes."""
    waiting_for: str | None = None
    """A waiting task's: what it waits for ("timer", "event:NAME", "child:ID", "start"; the
    first of several waits with how many more, `rules.waiting_for_all`)."""
    version: int = 1
    """The version of its workflow the task runs (recorded at submit; 1 for tasks stored
    before versions existed): only a scheduler that has that version claims it."""
    parent_id: str | None = None
    """A child task's parent: the task whose workflow started it (`Context.child`)."""
    parent_position: str | None = None
    """A child task's place in its parent's workflow."""
    trace_context: str | None = None
    """The W3C trace context (JSON text) of the task's submit span, the parent of its runs'
    spans (`tracing`); None when tracing is off."""
    run_trace: str | None = None
    """The W3C trace context (JSON text) of the span of the task's latest run that recorded
    it, which the next run's span links to (`tracing`)."""
    submitted_by: str | None = None
    """The application API's client that submitted the task (None: the App, in Python, a
    child or a schedule's tick)."""
    input_digest: str | None = None
    """A keyed digest of the task's canonical input (`sealing.input_digest`)."""
    tenant: str | None = None
    """Who the task belongs to (`Submission.tenant`; None: no tenant)."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """What the task is about: the tags of its submit and those its workflow added
    (`Context.tag`)."""
    keys_of: str | None = None
    """A fork's (`App.fork`): the task whose idempotency keys its steps carry (None: its
    own), for the steps before `new_keys_from` (all, when None)."""
    new_keys_from: int | None = None
    forked_from: str | None = None
    """A fork's: the task it was forked from."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStatus:
    """A task's status, as `App.task_status` returns it and the application API answers it
    (`GET /api/v1/tasks/{task_id}`, field for field): its state and what it waits for."""

    task_id: str
    workflow: str
    version: int
    """The version of its workflow the task runs."""
    state: TaskState
    finished: bool
    """The task is in a finished state (processed, error, compensated, compensation_failed,
    cancelled): `App.result` answers at once."""
    priority: int
    reply_to: str | None
    parent_id: str | None
    """A child task's parent."""
    tenant: str | None
    """Who the task belongs to (None: no tenant)."""
    error: str | None
    waiting_for: str | None
    """A waiting task's: "timer", "event:NAME", "child:ID" or "start"."""
    wake_at: datetime | None
    """A waiting task's: when its timer fires, its wait times out or it starts."""
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


def status_of(task: TaskRecord) -> TaskStatus:
    """The status of a task read."""
    return TaskStatus(
        task_id=task.task_id,
        workflow=task.workflow,
        version=task.version,
        state=task.process_state,
        finished=task.process_state in FINISHED_TASK_STATES,
        priority=task.priority,
        reply_to=task.reply_to,
        parent_id=task.parent_id,
        tenant=task.tenant,
        error=task.error,
        waiting_for=task.waiting_for,
        wake_at=task.wake_at,
        created_at=task.created_at,
        updated_at=task.updated_at,
        finished_at=task.finished_at,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    task_id: str
    seq: int
    name: str
    agent: str
    operation: str
    state: StepState
    attempt: int
    task_attempt: int
    complete_by: datetime
    idempotency_key: str
    input: Any
    result: Any
    error: str | None
    locked_by: str | None
    tries: int
    created_at: datetime
    claimed_at: datetime | None
    finished_at: datetime | None
    compensation: str | None = None
    """The operation ("agent.operation") that undoes this step, recorded with it."""
    compensation_input: Any = None
    compensates: int | None = None
    """On a compensation step: the seq of the step it undoes."""
    abandoned: bool = False
    """Closed (failed) while it was open because its task stopped holding it, or past its
    total timeout after it ran: it may have taken effect, so it is compensated."""
    reassignments: int = 0
    """Times the step was handed to another agent instance (its holder gone, or its
    breaker open) without a failure counted."""
    heartbeat: Any = None
    """The details of the step's last heartbeat (`Call.heartbeat`)."""
    heartbeat_at: datetime | None = None
    limit_key: str | None = None
    complete_within: float | None = None
    """Seconds each dispatch of the step may take (its complete_by from the dispatch)."""
    position: str | None = None
    """Its place in the workflow, which a replay matches it by ("3", "3.2.1": see
    `Context.gather`); None on a compensation."""
    call_stopped_at: datetime | None = None
    """When the agent instance that held the step (`locked_by`, under `attempt`) reported its
    call ended after the step was taken from it (abandoned): from then on the step no longer
    holds up its task's compensation."""
    trace_context: str | None = None
    """The W3C trace context (JSON text) of the span of the step's latest dispatch, the
    parent of its agent's call span (`tracing`); None when tracing is off."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedTask:
    task: TaskRecord
    steps: list[StepRecord]
    remaining: float
    """Seconds until the task's complete_by, by the database clock at claim time."""
    waits: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    """The recorded waits by position, with their seq, kind and name."""


@dataclass(frozen=True, slots=True)
class Held:
    """A task a scheduler holds under one attempt: the fencing token of its writes."""

    task_id: str
    attempt: int
    workflow: str
    priority: int
    version: int = 1
    tenant: str | None = None
    """The task's tenant, which its children inherit."""


# -- what a scheduler writes --------------------------------------------------------------


class Fence(TypedDict):
    """What fences a write of the scheduler that holds a task: the task, the attempt of its
    hold, the scheduler instance. Every record a workflow's context writes through its drive
    (a new step, a dispatch again, an adoption, a wait, a park) carries it; the store's write
    changes nothing unless the task is still held so."""

    task_id: str
    task_attempt: int
    scheduler: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NewStep:
    """Record a step not yet recorded, and so queue its request for its agent."""

    task_id: str
    task_attempt: int
    scheduler: str
    seq: int
    name: str
    agent: str
    operation: str
    input: str  # JSON text
    priority: int
    complete_within: float
    compensation: str | None = None  # "agent.operation"
    compensation_input: str | None = None  # JSON text
    compensates: int | None = None  # on a compensation step: the seq it undoes
    limit_key: str | None = None  # the key of the operation's limits
    pickup_within: float | None = None
    total_within: float | None = None
    position: str | None = None
    """Its place in the workflow (`StepRecord.position`); None on a compensation."""
    idempotency_key: str | None = None
    """The key its calls carry, set by its task's drive (`records.idempotency_key` of the
    task's keys); None: `task_id/seq`."""
    claimed_by: str | None = None
    """An agent instance of the scheduler's own process with room for it: the step is
    recorded running, held by that instance, which calls it at once (no queue, no wake-up)."""
    trace_context: str | None = None
    """The W3C trace context (JSON text) of the span of the step's dispatch, the
    parent of its agent's call span (`tracing`); None when tracing is off."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Redispatch:
    """Queue a recorded step whose complete_by passed again: its attempt rises, its
    idempotency key stays."""

    task_id: str
    task_attempt: int
    scheduler: str
    seq: int
    agent: str
    expected_attempt: int  # the step attempt seen
    complete_within: float
    trace_context: str | None = None
    """The W3C trace context (JSON text) of the span of the step's dispatch, the
    parent of its agent's call span (`tracing`); None when tracing is off."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Adopt:
    """Take over a recorded step that an earlier attempt of the task dispatched, while its
    complete_by has not passed."""

    task_id: str
    task_attempt: int
    scheduler: str
    seq: int
    expected_attempt: int  # the step attempt seen
    trace_context: str | None = None
    """The trace context of this dispatch's span, recorded with the step while it waits in
    the queue (a step running keeps the one its call was made under); None: unchanged."""


StepDispatch = NewStep | Redispatch | Adopt
"""A scheduler's write of one step of a task it holds, fenced by the task's attempt."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchedStep:
    task_id: str
    seq: int
    attempt: int
    remaining: float
    """Seconds until the step's complete_by, by the database clock."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskOutcome:
    """How a scheduler ends its hold of a task: processed or error (the workflow ran),
    compensated or compensation_failed (its compensations ran). An error becomes
    compensating unless the task's on_failure is "stop" (`rules.plan_finish`)."""

    task_id: str
    attempt: int
    scheduler: str
    state: Literal[
        TaskState.PROCESSED,
        TaskState.ERROR,
        TaskState.COMPENSATED,
        TaskState.COMPENSATION_FAILED,
    ]
    result: str | None  # JSON text
    error: str | None

    @property
    def held_as(self) -> TaskState:
        """The state the task must be in for this outcome to apply."""
        if self.state in (TaskState.PROCESSED, TaskState.ERROR):
            return TaskState.PROCESSING
        return TaskState.COMPENSATING


# -- what agents read and write -----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """A step claimed by an agent instance: what the remote call needs."""

    task_id: str
    seq: int
    attempt: int
    agent: str
    operation: str
    input: Any
    idempotency_key: str
    complete_by: datetime
    remaining: float
    """Seconds until complete_by, by the database clock at claim time."""
    compensates: int | None = None
    queued: float | None = None
    """Seconds from its dispatch to this claim, by the database clock (None: not claimed
    from the queue: handed over in process, or taken up again)."""
    workflow: str | None = None
    """The workflow of its task, for the log (None when not read: taken up again)."""
    trace_context: str | None = None
    """The W3C trace context (JSON text) of the span of the step's latest dispatch, the
    parent of its agent's call span (`tracing`); None when tracing is off."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    task_id: str
    seq: int
    attempt: int
    agent_instance: str
    state: Literal[StepState.COMPLETED, StepState.FAILED]
    result: str | None  # JSON text
    error: str | None
    tries: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestHandback:
    """An agent instance giving a claimed request back to the queue, untried or to be tried
    elsewhere (its breaker is open): running -> not_started, fenced like an outcome."""

    task_id: str
    seq: int
    attempt: int
    agent_instance: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CallStop:
    """An agent instance's word that its call of a step it no longer holds (its task
    cancelled, paused or compensating, the step abandoned) has ended: fenced by the attempt
    and instance that held the step (`rules.plan_call_stopped` says what it writes)."""

    task_id: str
    seq: int
    attempt: int
    agent_instance: str
    reason: str
    """Why the call was stopped (`rules.call_lost`), for the task's history."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentBeat:
    """One agent instance's heartbeat: who it is, what it serves and how it is doing."""

    instance: str
    agent: str
    operations: tuple[str, ...]
    capacity: int
    inflight: int
    breaker: str
    breaker_detail: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentInstance(AgentBeat):
    """An agent instance as the registry knows it (its last beat); `alive` while its
    heartbeats arrive."""

    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    alive: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerBeat:
    """One scheduler instance's heartbeat: the workflows it runs, how many it drives at once
    (`capacity`) and how many tasks it holds; `versions`, each (workflow, version) it runs
    (the tasks it may claim)."""

    instance: str
    workflows: tuple[str, ...]
    capacity: int
    held: int
    versions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerInstance(SchedulerBeat):
    """A scheduler instance as the registry knows it; `alive` while its heartbeats arrive."""

    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    alive: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class OpLimit:
    """The limits an agent instance claims one operation under: across every process
    (`concurrency`: steps running at once; `rate` starts per `per` seconds, each per limit
    key when the operation has a key), and its own room (`room`: more calls it may start)."""

    concurrency: int | None = None
    rate: int | None = None
    per: float = 1.0
    room: int | None = None


# -- what the supervisor does -------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Expired:
    """What one supervisor sweep did to one task: released or given up after its
    complete_by passed, or set aside (`set_aside`: the sweep could not recover it, so it
    waits for an operator with the reason as its error)."""

    task_id: str
    seq: int | None  # the expired step, or None when the task itself expired
    failure_count: int
    process_state: TaskState
    set_aside: bool = False
    alert: str | None = None
    """The reason of the alert the sweep raised for it (`rules.AlertReason`), if any."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Released:
    """A held task given back by the supervisor because its scheduler instance is gone (or by
    a scheduler that drains): unheld, pending (or compensating) at once, failure_count
    unchanged, for another scheduler to resume by replay."""

    task_id: str
    attempt: int
    scheduler: str
    process_state: TaskState


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSwept:
    """What one supervisor sweep did to one open step, besides expiries: `reassigned` (its
    agent instance is gone: queued again, attempt + 1, failure_count unchanged), `pickup`
    (no agent claimed it within its pick-up timeout: failed) or `total` (not completed within
    its total timeout: failed)."""

    task_id: str
    seq: int
    kind: Literal["reassigned", "pickup", "total"]
    agent: str
    instance: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRecord:
    name: str
    holder: str
    term: int
    expires_at: datetime
    remaining: float
    """Seconds until the lease lapses, by the database clock (negative once lapsed)."""
    since_renewed: float | None = None
    """Seconds since it was last taken or renewed: the supervisor renews it before each
    sweep, so this is the age of the leader's last sweep."""


# -- history, messages and the operator ---------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    id: int
    task_id: str | None
    at: datetime
    kind: str
    detail: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class EventPage:
    """A page of a task's history, newest first. `more`: older events exist; the next page
    is the one before the last event's id."""

    events: list[EventRecord]
    more: bool

    @property
    def next_before(self) -> int | None:
        """The `before` that asks for the next (older) page, or None when there is none."""
        return self.events[-1].id if self.more and self.events else None


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxMessage:
    """An alert (channel "alerts") or a status message for an application's reply channel.
    `id` is unique and rises with time: a message delivered twice carries the same id."""

    id: int
    channel: str
    task_id: str | None
    kind: str
    detail: Any
    at: datetime
    attempts: int = 0
    delivered_to: tuple[str, ...] = ()


@dataclass(frozen=True)
class RelayBacklog:
    """The status messages of one broker destination not yet delivered by the relay: how
    many, the oldest one's age (the delivery lag, seconds), how many were tried and failed,
    the most tries of one, when the next try comes (seconds, None when none failed) and the
    newest error (without credentials)."""

    destination: str
    pending: int
    lag: float
    failing: int
    attempts: int
    retry_in: float | None
    error: str | None


OperatorVerb = Literal["retry", "skip", "pause", "resume", "cancel", "compensate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorAction:
    """One operator action on one task (see `states.OPERATOR_ACTIONS`)."""

    action: OperatorVerb
    task_id: str
    actor: str
    reason: str | None = None
    seq: int | None = None  # skip: the step
    result: str | None = None  # skip: the step's result, JSON text
    identity: str | None = None
    """How the caller proved who it is (the dashboard: "api-token" or "session"), recorded
    beside `actor`, which is only what the caller says."""
    parent: str | None = None
    """An action reaching a child from an action on (or the failure of) its parent: the
    parent's task id (`rules.plan_cascade`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionOutcome:
    task_id: str
    applied: bool
    before: TaskState | None  # None when there is no such task
    after: TaskState | None
    message: str

    @classmethod
    def missing(cls, task_id: str) -> ActionOutcome:
        return cls(task_id=task_id, applied=False, before=None, after=None,
                   message=f"no task {task_id!r}")  # fmt: skip

    @classmethod
    def refused(cls, task_id: str, state: TaskState, why: str) -> ActionOutcome:
        return cls(task_id=task_id, applied=False, before=state, after=state, message=why)


# -- the dashboard ------------------------------------------------------------------------

DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Upper bounds (seconds) of the step duration histogram; `step_stats` in each dialect's
queries.sql counts one column per bound (b0 ... b12)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivityBucket:
    start: datetime
    processed: int
    failed: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Activity:
    now: datetime
    """The database clock when read."""
    bucket: float
    buckets: list[ActivityBucket]
    """Only the buckets in which something happened, oldest first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepStats:
    agent: str
    operation: str
    started: int
    completed: int
    failed: int
    reassignments: int
    """Times steps were handed to another agent instance (theirs gone, or its breaker open)."""
    retried: int = 0
    """Steps dispatched more than once (their complete_by passed, or their agent was gone)."""
    duration_buckets: tuple[int, ...]
    """Completed steps that took at most each of DURATION_BUCKETS (cumulative)."""
    duration_sum: float


# -- waits: durable timers and events from outside -------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitRequest:
    """A workflow's wait at its position (`seq`, numbered with its steps), by the scheduler
    holding the task: a timer (`kind` "timer", firing at `until` or `delay` seconds from
    now by the store's clock), a wait for the event `name` (timing out then), or a wait for
    the child task `name` (`kind` "child": `child` is the task, created with the wait)."""

    task_id: str
    task_attempt: int
    scheduler: str
    seq: int
    kind: str
    name: str
    delay: float = 0.0
    until: datetime | None = None
    position: str | None = None
    """Its place in the workflow, which a replay matches it by (`StepRecord.position`)."""
    park: bool = True
    """Park the task when the wait cannot end at once; otherwise answer "blocked" and leave
    the park to `ParkRequest`, once every branch of the workflow waits."""
    child: Submission | None = None
    """A child wait's task, created (once) with the wait."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkRequest:
    """Park a task whose workflow waits in every branch: the waits at `seqs`, recorded and
    open. Fenced by the hold and the attempt like a wait."""

    task_id: str
    task_attempt: int
    scheduler: str
    seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitOutcome:
    """How a wait stands: "done" (the timer fired; the event taken, or the child's result,
    in `payload`), "timed_out", "child_failed" (the child ended otherwise than processed:
    `payload` has its state and error), "blocked" (recorded, open, the task not parked: the
    request said not to), "parked" (the task now waits, released), "ready" (a park found a
    wait that can end: not parked), "fenced" (the task is no longer held under that
    attempt), "mismatch" (another kind or name is recorded at that position: `recorded`),
    or "refused" (a child's task id is taken by another task: `reason`; nothing written)."""

    state: str
    payload: Any = None
    recorded: tuple[str, str] | None = None
    reason: str | None = None
    now: bool = False
    """The wait ended in this call (its timer fired, its event taken, or it timed out), not
    found ended before (a replay)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SendOutcome:
    """A send of an event: `sent` (False when its event_id was sent before), `woke` (the
    task was waiting for it and is pending again)."""

    task_id: str
    sent: bool
    woke: bool


DEFAULT_MAX_EVENTS_PER_TASK = 1000
DEFAULT_MAX_EVENT_PAYLOAD = 256 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class EventBounds:
    """What a task keeps of the events sent to it (`App(max_events_per_task=...,
    max_event_payload=...)`): `events` at most, taken by a wait or not, each with a payload
    of `payload` bytes at most (its JSON text, UTF-8)."""

    events: int = DEFAULT_MAX_EVENTS_PER_TASK
    payload: int = DEFAULT_MAX_EVENT_PAYLOAD


@dataclass(frozen=True, slots=True, kw_only=True)
class EventBeyond:
    """An event refused by a bound (`rules.event_beyond`): which (`max_events_per_task`,
    `max_event_payload`), its value, and what was found (the events the task keeps, the
    payload's bytes)."""

    bound: Literal["max_events_per_task", "max_event_payload"]
    limit: int
    found: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitRecord:
    task_id: str
    seq: int
    kind: str
    name: str
    wake_at: datetime | None
    state: str
    event_id: str | None
    payload: Any
    created_at: datetime
    finished_at: datetime | None
    position: str | None = None
    """States: open, done, timed_out, or failed (a child that ended otherwise than
    processed; `payload` has its state and error). A child wait has no `wake_at`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Woke:
    """A waiting task made pending by the supervisor: its timer fired, its wait timed out,
    or its delayed start came."""

    task_id: str
    waited_for: str | None


# -- schedules -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """A schedule as the application declares it (`App.schedule`): a task of `workflow`
    with `input` (JSON text) at each tick of `cron` (in `timezone`) or every `every`
    seconds; missed ticks by `catch_up` ("skip", "all", "latest")."""

    name: str
    workflow: str
    input: str
    complete_within: float
    max_failures: int
    on_failure: str
    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    catch_up: str = "skip"
    version: int = 1
    """The version of the workflow its tasks run (the newest the declaring App has)."""
    tenant: str | None = None
    """The tenant of its tasks (None: none)."""


@dataclass(frozen=True, slots=True)
class TenantWeight:
    """A tenant's row in the fair share of claims: its `weight` (1 unless set) and its
    `pass` (how far its claims have gone, `rules.fair_shares`), beside the fair clock."""

    tenant: str
    weight: float
    pass_: float
    clock: float


@dataclass(frozen=True, slots=True)
class LeaseTry:
    """A supervisor's try of the lease: its term when it holds it (None while another
    does), and the seconds until the lease another holds lapses (None when none does)."""

    term: int | None
    lapses_in: float | None


@dataclass(frozen=True, slots=True)
class SweepRound:
    """What one supervisor round found and did, in one transaction (`Store.sweep_round`):
    each sweep's first batch, the finished tasks purged, and the seconds until the soonest
    registry row or other's lease expires (`Store.next_expiry`)."""

    released: list[Released]
    woke: list[Woke]
    ticks: TicksMade
    swept: list[StepSwept]
    expired: list[Expired]
    purged: int
    next_expiry: float | None


@dataclass(frozen=True, slots=True)
class TicksMade:
    """A supervisor's pass over the due schedules: the ids of the tasks it created, and the
    schedules it set aside (paused), by name, with why: their ticks cannot be worked out (a
    cron expression that never fires, stored before such a one was refused)."""

    created: list[str]
    set_aside: dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRecord:
    name: str
    workflow: str
    cron: str | None
    every: float | None
    input: Any
    timezone: str
    catch_up: str
    paused: bool
    next_at: datetime
    last_tick: datetime | None
    """The last tick a task was created for."""
    complete_within: float
    max_failures: int
    on_failure: str
    version: int = 1
    """The version of the workflow its ticks' tasks run."""
    tenant: str | None = None
    """The tenant of its ticks' tasks (None: none)."""


# -- workflow versions -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionBacklog:
    """The tasks of one workflow at one version that wait for a scheduler: `pending`, and
    `compensating` with no scheduler holding them; `oldest`, when the oldest of them was
    submitted."""

    workflow: str
    version: int
    pending: int
    compensating: int
    oldest: datetime

    @property
    def tasks(self) -> int:
        return self.pending + self.compensating


RedrivePlan = Literal["kept", "same_key", "new_key", "undone"]
"""What a redrive (a retry, a fork) does with one recorded step: keeps its result; runs it
again under the same idempotency key (the service deduplicates); runs it again under a new
key (the operator asked for it); or undoes it first (its compensation runs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepPlan:
    """A redrive's plan for one step of the task as recorded (`rules.plan_retry`,
    `rules.plan_fork`): its `seq`, place and name, what happens to it, and the idempotency
    key its calls will carry (for one undone: the key the step was called with)."""

    seq: int
    position: str | None
    name: str
    plan: RedrivePlan
    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Redrive:
    """A redrive of a task, planned or done: the task it acts on, the task that runs (a
    fork's new id; the same task for a retry), whether it was applied, the plan per step,
    and what the store said (a refusal's reason). `refused`: it cannot be done (no such
    task, one not finished, no step there, a new id taken: `message` says which); neither
    applied nor refused, it is a plan of what would be done."""

    action: Literal["retry", "fork"]
    task_id: str
    runs_as: str
    applied: bool
    steps: tuple[StepPlan, ...]
    message: str
    refused: bool = False


# -- bulk actions by filter ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFilter:
    """Which tasks a bulk action (`App.bulk`) reaches: each field given narrows them, and a
    task matches when it meets every one. `states`: any of them (empty: any state);
    `workflow`, `version`, `tenant` ("": the tasks of none): equal; `error`: the task's error
    contains this text (case-sensitive); `created_after` / `created_before` and
    `finished_after` / `finished_before`: the time is at or after the first, and before the
    second (a task not finished has no finished time, and matches neither); `tags`: the task
    has every one of them."""

    states: frozenset[TaskState] = frozenset()
    workflow: str | None = None
    version: int | None = None
    error: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    tenant: str | None = None
    tags: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkFork:
    """What a bulk fork (`App.bulk(..., "fork", fork=...)`) makes of each task: a fork from
    the place `start`, as `App.fork` does, under the id `TASK~NAME` (`name`: one per bulk
    run, which makes it resumable), with new keys from `new_keys_from`."""

    start: str
    name: str
    new_keys_from: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkPlan:
    """What a bulk action would do (`App.bulk_plan`), changing nothing: how many tasks match
    (`matched`: those in a state the action moves, `rules.bulk_states`), how many per
    (workflow, version) and per move (`"error -> pending"`; a fork's: `"processed -> fork"`,
    or `"refused"` for a task the fork refuses), for a retry or a fork the recorded steps of
    them all per plan (`rules.plan_retry`, `rules.plan_fork`: kept, same_key, new_key,
    undone), and the first task ids by id (`sample`, at most 5)."""

    action: str
    matched: int
    by_workflow: Mapping[tuple[str, int], int]
    moves: Mapping[str, int]
    steps: Mapping[str, int]
    sample: tuple[str, ...]
    skipped: int = 0
    """A bulk fork's: the tasks whose fork is there already (counted in `matched`, and in no
    move)."""
    last: str | None = None
    """The last task id the plan read (None: it read none); with a limit, the next plan goes
    on after it."""
    done: bool = True
    """False when a limit stopped the plan before the tasks that match ran out."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkProgress:
    """Where a bulk action stands (`App.bulk`), after each batch: the tasks it acted on,
    those the store refused (a task that moved meanwhile), and the last task id it reached:
    the tasks after it by id are still to do (`after` resumes from there); `done` when none
    was left to reach (False after a `limit`)."""

    action: str
    acted: int
    refused: int
    last: str | None
    done: bool
    skipped: int = 0
    """A bulk fork's: the tasks whose fork was there already (made by a run before)."""


# -- why a task waits ------------------------------------------------------------------------


class WaitReason(StrEnum):
    """What holds a task, or one of its open steps, now (`rules.task_gate`,
    `rules.step_gate`): the reason of a `Gate`, and the facts of the gate each one fills in.

    - `finished`: The task ended (processed, compensated, cancelled): nothing holds it. Facts:
      `state`, `since` (when it ended).
    - `set_aside`: The task waits for an operator (error, compensation_failed): its workflow
      failed, or the sweep set it aside. Facts: `state`, `error`, `alert` (the reason of its
      last alert), `since`.
    - `paused`: An operator paused the task. Facts: `by`, `note` (their reason), `since`.
    - `start`: A delayed start (`start_after`, `start_at`) has not come. Facts: `until`.
    - `timer`: The workflow sleeps (`ctx.sleep`). Facts: `until`, `waits`.
    - `event`: The workflow waits for an event (`ctx.wait_for_event`). Facts: `event`, `until`
      (its timeout), `waits`.
    - `children`: The workflow waits for child tasks (`ctx.child`). Facts: `children` (each with
      its state), `waits`.
    - `backoff`: Pending (or compensating), but not eligible before a retry's backoff ends.
      Facts: `until`.
    - `no_scheduler`: Pending, and no alive scheduler runs its (workflow, version). Facts:
      `workflow`, `version`, `since` (the last beat of one that ran it; None when the registry
      holds none).
    - `ranked`: Pending, for the alive schedulers named in `schedulers`, behind `ahead` others
      of its (workflow, version) in the claim order (`rank` = ahead + 1). A pending task's
      also: its `tenant` ("" for none), `tenant_ahead` (those of its own tenant ahead of it:
      a claim shared among tenants takes each tenant's by rank), and `share`, the part of the
      claims its tenant gets while the tenants with tasks of that (workflow, version) waiting
      now all have work (its weight over theirs added up, `rules.fair_shares`; 1.0 alone).
    - `held`: A scheduler instance (the task) or an agent instance (a running step) holds it.
      Facts: `holder`, `holder_alive`, `beat_age` (seconds since its last beat), `until` (when
      the supervisor takes it back at the latest: its complete_by, or sooner once the holder's
      registry row expires).
    - `no_agent`: A queued step, and no alive instance of its agent serves its operation. Facts:
      `agent`, `operation`, `since` (the last beat of one that did; None when the registry holds
      none).
    - `breaker_open`: A queued step, and every alive instance of its agent has its breaker open.
      Facts: `instances`, `until` (the soonest a breaker lets a call through).
    - `concurrency_full`: A queued step whose operation's `Limit.concurrency` is reached (for
      its limit key). Facts: `limit`, `in_use`, `held_by` (the tasks whose running steps hold
      it).
    - `rate_full`: A queued step whose operation's `Limit.rate` is reached for its period.
      Facts: `limit`, `per`, `in_use` (the starts within the period), `until` (when the oldest
      of them leaves it).
    - `no_capacity`: A queued step, and every alive instance of its agent has all its slots
      busy. Facts: `instances`.
    - `queued`: A queued step an alive instance may claim, behind `ahead` requests of its agent
      (`rank` = ahead + 1). Facts: `instances`.
    """

    FINISHED = "finished"
    SET_ASIDE = "set_aside"
    PAUSED = "paused"
    START = "start"
    TIMER = "timer"
    EVENT = "event"
    CHILDREN = "children"
    BACKOFF = "backoff"
    NO_SCHEDULER = "no_scheduler"
    RANKED = "ranked"
    HELD = "held"
    NO_AGENT = "no_agent"
    BREAKER_OPEN = "breaker_open"
    CONCURRENCY_FULL = "concurrency_full"
    RATE_FULL = "rate_full"
    NO_CAPACITY = "no_capacity"
    QUEUED = "queued"


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitFact:
    """One open wait of a waiting task: its place, kind ("timer", "event", "child"), name
    (the event's, the child's id) and wake_at (a timer's end, an event's timeout)."""

    position: str | None
    kind: str
    name: str
    wake_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildFact:
    task_id: str
    state: TaskState


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseFact:
    """The operator action that paused a task: who (`by`, and how they proved it), why,
    when."""

    by: str
    authenticated: str | None
    note: str | None
    at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Gate:
    """What holds a task or a step now: a reason and its facts (the fields a reason does
    not name are None or empty; `WaitReason` says which each one carries)."""

    reason: WaitReason
    until: datetime | None = None
    since: datetime | None = None
    state: TaskState | None = None
    error: str | None = None
    alert: str | None = None
    by: str | None = None
    authenticated: str | None = None
    note: str | None = None
    event: str | None = None
    waits: tuple[WaitFact, ...] = ()
    children: tuple[ChildFact, ...] = ()
    workflow: str | None = None
    version: int | None = None
    schedulers: tuple[str, ...] = ()
    ahead: int | None = None
    rank: int | None = None
    tenant: str | None = None
    tenant_ahead: int | None = None
    share: float | None = None
    holder: str | None = None
    holder_alive: bool | None = None
    beat_age: float | None = None
    agent: str | None = None
    operation: str | None = None
    instances: tuple[str, ...] = ()
    limit: int | None = None
    per: float | None = None
    in_use: int | None = None
    held_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFacts:
    """What `rules.task_gate` decides a task's gate from, read in one go by the store
    (`Store.why_facts`): the task, the store's clock, when it is eligible, how many tasks of
    its (workflow, version) are ahead of it in the claim order, its open waits and the
    children they name, the operator action that paused it, its last alert's reason, and
    the scheduler registry (gone instances included)."""

    task: TaskRecord
    now: datetime
    eligible_at: datetime
    ahead: int
    waits: tuple[WaitFact, ...]
    children: tuple[ChildFact, ...]
    paused: PauseFact | None
    tenant_ahead: int = 0
    """Of its own tenant's pending tasks, those ahead of it."""
    share: float = 1.0
    """Its tenant's weight over the weights of the tenants with pending tasks of its
    (workflow, version) eligible now, its own among them."""
    alert: str | None
    schedulers: tuple[SchedulerInstance, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFacts:
    """What `rules.step_gate` decides an open step's gate from: the step, the store's clock,
    the registry's instances of its agent (gone ones included), how many requests of its
    agent are ahead of it, its operation's limit as the App declares it (None: none, or
    unknown), the tasks whose running steps of its operation (and limit key) hold the
    concurrency, and the starts within the rate's period, with the oldest of them."""

    step: StepRecord
    now: datetime
    instances: tuple[AgentInstance, ...]
    ahead: int
    limit: OpLimit | None
    running: int
    running_tasks: tuple[str, ...]
    started: int
    oldest_start: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepWhy:
    seq: int
    name: str
    agent: str
    operation: str
    state: StepState
    gate: Gate


@dataclass(frozen=True, slots=True, kw_only=True)
class Why:
    """Why a task waits (`App.why`): its gate, and each open step's."""

    task_id: str
    workflow: str
    version: int
    state: TaskState
    gate: Gate
    steps: tuple[StepWhy, ...]
    holding: Gate
    """What holds the task in the end (`rules.holding_gate`): a held task's first open
    step's gate, else its own."""
