"""The JSON API's requests and answers as typed models: its OpenAPI document (served at
/openapi.json) is generated from them and from the routes of `_api.py`, and the API checks
each request against them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    create_model,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from .._check import (
    MAX_INT,
    MAX_NAME,
    MAX_REASON,
    MAX_TAG_KEY,
    MAX_TAG_VALUE,
    MAX_TAGS,
    TAG_KEY_PATTERN,
)
from .._text import SAFE_PATTERN, TENANT_PATTERN
from ..records import WaitReason
from ..states import StepState, TaskState

TASK_ACTIONS = ("retry", "skip", "pause", "resume", "cancel", "compensate")
BULK_ACTIONS = ("retry", "pause", "resume", "cancel", "compensate")
MAX_LIST = 1000
MAX_BULK = 10_000
MAX_BULK_BATCH = 1000
"""The most tasks one request of `POST /api/bulk` acts on: a larger bulk is called again."""
MAX_BULK_PLAN = 10_000
"""The most tasks one request of `POST /api/bulk` plans: a plan of more is asked again
with `after` its `last`, until `done`."""
MAX_EVENT_ID = 2**63 - 1
API_BODY = 2 * 1024 * 1024
"""The largest body of an API request, in bytes (a skipped step's result may be 1 MiB)."""

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=SAFE_PATTERN)]
TAG_PATTERN = (
    f"^[A-Za-z0-9][A-Za-z0-9_.:/-]{{0,{MAX_TAG_KEY - 1}}}="
    f"{SAFE_PATTERN[1:-2]}{{1,{MAX_TAG_VALUE}}}$"
)
"""What one tag filter may be: KEY=VALUE, as `_check.tag` takes them."""
TagKey = Annotated[str, Field(min_length=1, max_length=MAX_TAG_KEY, pattern=TAG_KEY_PATTERN)]
TagValue = Annotated[str, Field(min_length=1, max_length=MAX_TAG_VALUE, pattern=SAFE_PATTERN)]
Tags = Annotated[
    dict[TagKey, TagValue],
    Field(
        max_length=MAX_TAGS,
        description=f"What the task is about, as keys and values (at most {MAX_TAGS}; keys "
        f"of 1 to {MAX_TAG_KEY} characters, a letter or digit then letters, digits and "
        f"_ . : / -; values of 1 to {MAX_TAG_VALUE} characters).",
    ),
]
Reason = Annotated[str, Field(max_length=MAX_REASON)]
Payload = Annotated[Any, Field(description='A JSON value; values marked secret are "***".')]


def _whole(value: Any) -> Any:
    """JSON Schema counts 3.0 as an integer: take it as 3."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _int(low: int, high: int) -> Any:
    return Annotated[int, Field(ge=low, le=high), Strict(), BeforeValidator(_whole)]


StepNumber = _int(1, MAX_INT)
BulkLimit = _int(1, MAX_BULK)
Flag = Annotated[bool, Strict()]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- requests -----------------------------------------------------------------------------


class ActionRequest(_Closed):
    reason: Reason | None = None
    by: Name | None = Field(default=None, description="Who acts (default: dashboard).")


class SkipRequest(_Closed):
    seq: StepNumber  # type: ignore[valid-type]
    result: Payload = Field(
        default=None,
        description='The step\'s result, a JSON value ({"$secret": VALUE} is a secret).',
    )
    reason: Reason | None = None
    by: Name | None = Field(default=None, description="Who acts (default: dashboard).")


class ForkRequest(_Closed):
    start: Name = Field(
        alias="from",
        description="The place of the first step that runs again (1, 2, 3.1); the steps "
        "before it keep their recorded results.",
    )
    task_id: Name | None = Field(
        default=None,
        json_schema_extra={"not": {"enum": [".", ".."]}},
        description="The new task's id (default: TASK~fork- and a random suffix).",
    )
    new_keys_from: StepNumber | None = Field(  # type: ignore[valid-type]
        default=None,
        description="The steps of this seq and after run again under new idempotency keys "
        "(NEW/seq); the others under the original's.",
    )
    plan: bool = Field(default=False, description="Answer the plan only; change nothing.")
    reason: Reason | None = None
    by: Name | None = Field(default=None, description="Who acts (default: dashboard).")


class StepPlanAnswer(_Closed):
    seq: int
    position: str | None
    name: str
    plan: Literal["kept", "same_key", "new_key", "undone"] = Field(
        description="kept (its result recorded), same_key (run again under the same "
        "idempotency key: the service deduplicates), new_key (run again under a new key), "
        "undone (its compensation runs first)."
    )
    key: str = Field(description="The idempotency key its calls carry.")


class RedriveAnswer(_Closed):
    action: Literal["retry", "fork"]
    task_id: str
    runs_as: str = Field(description="The task that runs: a fork's new id, or the task.")
    applied: bool
    steps: list[StepPlanAnswer]
    message: str
    refused: bool = Field(
        description="It cannot be done (message says why); neither applied nor refused: "
        "the plan of what would be done."
    )


class SendRequest(_Closed):
    name: Name = Field(description="The event's name (what the workflow waits for).")
    payload: Payload = Field(default=None, description="The event's JSON payload.")
    event_id: Name | None = Field(
        default=None, description="Sent once per id (default: a new one)."
    )


class SendAnswer(_Closed):
    sent: bool = Field(
        description="False when this event_id was sent before, whatever the task's state now."
    )
    woke: bool = Field(description="The task was waiting for this event and is pending again.")


class BulkRequest(_Closed):
    """The tasks named (task_ids), or a filter (state and/or workflow): one of the two."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["task_ids"],
                    "not": {"anyOf": [{"required": ["state"]}, {"required": ["workflow"]}]},
                },
                {
                    "not": {"required": ["task_ids"]},
                    "anyOf": [{"required": ["state"]}, {"required": ["workflow"]}],
                },
            ]
        },
    )

    action: Literal["retry", "pause", "resume", "cancel", "compensate"]
    # Each may be left out, but not sent as null: SkipJsonSchema keeps None out of the schema.
    task_ids: (
        SkipJsonSchema[None] | Annotated[list[Name], Field(min_length=1, max_length=MAX_BULK)]
    ) = None
    state: SkipJsonSchema[None] | TaskState = None
    workflow: SkipJsonSchema[None] | Name = None
    limit: SkipJsonSchema[None] | BulkLimit = None  # type: ignore[valid-type]
    reason: Reason | None = None
    by: Name | None = Field(default=None, description="Who acts (default: dashboard).")
    dry_run: Flag = False

    @model_validator(mode="after")
    def _tasks_or_filter(self) -> BulkRequest:
        for name in ("task_ids", "state", "workflow", "limit"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} may be left out, not null")
        named = self.task_ids is not None
        filtered = self.state is not None or self.workflow is not None
        if named == filtered:
            raise ValueError("name the tasks (task_ids), or a filter (state, workflow), not both")
        return self


class TaskFilter(_Closed):
    """Which tasks a bulk action reaches (`stepwarden.TaskFilter`, as `stepwarden bulk`
    takes it): each field given narrows them, and a task matches when it meets every one."""

    states: list[TaskState] = Field(
        default_factory=list,
        max_length=len(TaskState),
        description="Any of these states (none: any state); only those in a state the "
        "action moves are reached (retry: error, compensation_failed; resume: paused; ...).",
    )
    workflow: Name | None = None
    version: StepNumber | None = Field(  # type: ignore[valid-type]
        default=None, description="Only the tasks that run this version of their workflow."
    )
    error: Reason | None = Field(
        default=None, description="Only the tasks whose error contains this text (case-sensitive)."
    )
    created_after: AwareDatetime | None = Field(
        default=None, description="Created at or after this time (with its time zone)."
    )
    created_before: AwareDatetime | None = Field(default=None, description="Created before it.")
    finished_after: AwareDatetime | None = Field(
        default=None, description="Finished at or after this time (an unfinished task: never)."
    )
    finished_before: AwareDatetime | None = Field(default=None, description="Finished before it.")
    tenant: Annotated[str, Field(pattern=f"^({TENANT_PATTERN.pattern})?$")] | None = Field(
        default=None, description='Only the tasks of this tenant ("": those of none).'
    )
    tags: Tags | None = Field(default=None, description="Only the tasks that have every tag.")


class BulkFork(_Closed):
    """A bulk fork's: each task forked from `from` under the id TASK~`as` (the same `as`
    again forks no task twice), as `POST /api/tasks/{id}/fork` does."""

    start: Name = Field(alias="from", description="The place of the first step that runs again.")
    name: Name = Field(alias="as", description="Each fork's id is TASK~NAME.")
    new_keys_from: StepNumber | None = Field(  # type: ignore[valid-type]
        default=None, description="The steps of this seq and after run under new keys."
    )


class BulkFilterRequest(_Closed):
    """A bulk action by filter, as `stepwarden bulk ACTION` does it: with plan, what it would
    do (the same plan as `stepwarden bulk --plan`), changing nothing; otherwise at most
    `batch` tasks by task id, each as the action on one task would (its rules, its history
    entry). Resumable: the tasks acted on no longer match, so the same request again goes
    on with the rest (with `after`: after that task id only)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {"properties": {"action": {"const": "fork"}}, "required": ["fork"]},
                {
                    "properties": {"action": {"enum": list(BULK_ACTIONS)}},
                    "not": {"required": ["fork"]},
                },
            ]
        },
    )

    action: Literal["retry", "cancel", "compensate", "pause", "resume", "fork"]
    filter: TaskFilter = Field(default_factory=TaskFilter)
    plan: Flag = Field(default=False, description="Answer the plan only; change nothing.")
    batch: _int(1, MAX_BULK_BATCH) = Field(  # type: ignore[valid-type]
        default=100, description=f"Tasks acted on in this request, at most (1 to {MAX_BULK_BATCH})."
    )
    after: Annotated[str, Field(max_length=MAX_NAME)] = Field(
        default="", description="Only the tasks whose id comes after this one (a cursor: last)."
    )
    # Left out, not sent as null: SkipJsonSchema keeps None out of the schema.
    fork: SkipJsonSchema[None] | BulkFork = Field(
        default=None, description="A fork's, and a fork's only."
    )
    reason: Reason | None = None
    by: Name | None = Field(default=None, description="Who acts (default: dashboard).")

    @model_validator(mode="after")
    def _fork_alone(self) -> BulkFilterRequest:
        if "fork" in self.model_fields_set and self.fork is None:
            raise ValueError("fork may be left out, not null")
        if (self.action == "fork") != (self.fork is not None):
            raise ValueError("a bulk fork, and it alone, takes fork (from, as)")
        return self


# -- answers ------------------------------------------------------------------------------


class Outcome(_Closed):
    task_id: str
    applied: bool
    before: TaskState | None
    after: TaskState | None
    message: str


class Error(_Closed):
    error: str
    outcome: Outcome | None = None


class OutcomeAnswer(_Closed):
    outcome: Outcome


class BulkAnswer(_Closed):
    dry_run: bool
    applied: int = Field(description="Tasks changed (in a dry run: that would be).")
    refused: int
    outcomes: list[Outcome]


class WorkflowCount(_Closed):
    workflow: str
    version: int
    tasks: int


class BulkPlanAnswer(_Closed):
    """What the bulk action would do, changing nothing (`stepwarden.BulkPlan`)."""

    matched: int = Field(description="The tasks that match, in a state the action moves.")
    by_workflow: list[WorkflowCount] = Field(description="By workflow, then version.")
    moves: dict[str, int] = Field(
        description='Per move: "error -> pending"; a fork\'s "processed -> fork", or '
        '"refused" for a task the fork refuses.'
    )
    steps: dict[Literal["kept", "same_key", "new_key", "undone"], int] = Field(
        description="A retry's or a fork's: the recorded steps of them all, per plan."
    )
    sample: list[str] = Field(description="The first 5 task ids, by id.")
    skipped: int = Field(description="A bulk fork's: the tasks forked so before.")
    last: str | None = Field(description="The last task id planned; after it, the rest.")
    done: bool = Field(
        description=f"False: more than {MAX_BULK_PLAN:,} tasks were left to plan; ask again "
        "with after=last for the plan of the next ones."
    )


class BulkProgressAnswer(_Closed):
    """What this request did (`stepwarden.BulkProgress`)."""

    acted: int
    refused: int = Field(description="Moved meanwhile: left as they are.")
    skipped: int = Field(description="A bulk fork's: the tasks forked so before.")
    last: str | None = Field(description="The last task id reached; after it, the rest.")
    done: bool = Field(
        description="None was left to reach; false: call again (with after=last) for more."
    )


class BulkFilterAnswer(_Closed):
    action: str
    plan: BulkPlanAnswer | None = Field(description="With plan: what it would do.")
    progress: BulkProgressAnswer | None = Field(description="Without plan: what it did.")


class TaskSummary(_Closed):
    task_id: str
    workflow: str
    version: int = Field(
        ge=1, description="The version of its workflow the task runs, from start to end."
    )
    tenant: str | None = Field(description="Who the task belongs to (null: none).")
    process_state: TaskState
    failure_count: int
    compensation_failures: int
    max_failures: int
    attempt: int
    priority: int
    locked_by: str | None
    complete_by: datetime | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    error: str | None
    wake_at: datetime | None = Field(
        description="A waiting task's: when its timer fires, its wait times out or it starts."
    )
    waiting_for: str | None = Field(
        description='A waiting task\'s: "timer", "event:NAME", "child:ID" or "start" (the '
        'first of several waits, and how many more: "child:ID +2").'
    )


class Task(TaskSummary):
    input: Payload = None
    result: Payload = None
    complete_within: float
    on_failure: str
    reply_to: str | None
    parent_id: str | None = Field(
        description="A child task's parent: the task whose workflow started it (ctx.child)."
    )
    parent_position: str | None = Field(
        description="A child task's place in its parent's workflow."
    )
    tags: dict[str, str] = Field(
        description="What the task is about: the tags of its submit and those its workflow "
        "added (ctx.tag)."
    )


class Child(_Closed):
    """A task the workflow started (ctx.child)."""

    task_id: str
    workflow: str
    process_state: TaskState
    position: str | None = Field(description="Its place in its parent's workflow.")
    created_at: datetime
    finished_at: datetime | None
    error: str | None


class Step(_Closed):
    seq: int
    name: str
    agent: str
    operation: str
    state: StepState
    attempt: int = Field(description="Dispatches of the step.")
    task_attempt: int
    tries: int = Field(description="Calls made by the agent.")
    reassignments: int = Field(
        description="Times handed to another agent instance, no failure counted."
    )
    heartbeat_at: datetime | None
    idempotency_key: str
    locked_by: str | None
    complete_by: datetime
    created_at: datetime
    claimed_at: datetime | None
    finished_at: datetime | None
    missed_deadline: bool = Field(description="The step finished after its complete_by.")
    input: Payload = None
    result: Payload = None
    error: str | None
    compensation: str | None
    compensates: int | None
    position: str | None = Field(
        description="Its place in the workflow (3, or 3.2.1: the first step of the second "
        "branch of a gather at 3); none on a compensation."
    )


class Event(_Closed):
    id: int
    at: datetime
    kind: str
    detail: Payload = None


class TaskAnswer(_Closed):
    """The task; `more_events` when older events exist, and the `events_before` that asks
    for them."""

    task: Task
    children: list[Child] = Field(
        description="The tasks its workflow started (ctx.child), oldest first."
    )
    steps: list[Step]
    events: list[Event] = Field(description="A page of the history, newest first.")
    more_events: bool
    events_before: int | None


class TasksAnswer(_Closed):
    tasks: list[TaskSummary]
    workflows: list[str] = Field(description="Every workflow name (for filters).")


class Alert(_Closed):
    id: int
    task_id: str | None
    kind: str
    detail: Payload = None
    at: datetime
    attempts: int
    delivered_to: list[str]


class AlertsAnswer(_Closed):
    alerts: list[Alert]


class Leader(_Closed):
    holder: str
    term: int
    expires_at: datetime
    remaining: float
    last_sweep: float | None = Field(
        description="Seconds since the leader last renewed its lease, which it does before "
        "each sweep."
    )
    live: bool
    released: bool = Field(description="Let go by a supervisor that stopped.")


class Bucket(_Closed):
    start: datetime
    processed: int
    failed: int


class Activity(_Closed):
    now: datetime
    bucket: float
    window: float
    buckets: list[Bucket]


Counts: type[BaseModel] = create_model(
    "Counts",
    __config__=ConfigDict(extra="forbid"),
    **{str(s): (Annotated[int, Field(ge=0)], ...) for s in TaskState},  # type: ignore[call-overload]
)
"""Tasks in each state."""


class UnrunnableVersion(_Closed):
    """Tasks of one workflow at one version waiting for a scheduler, which no alive
    scheduler runs: they wait until one with that version starts."""

    workflow: str
    version: int = Field(ge=1)
    pending: int = Field(ge=0)
    compensating: int = Field(ge=0, description="Compensating, held by no scheduler.")
    oldest_created_at: datetime = Field(description="When the oldest of them was submitted.")


class RelayDestination(_Closed):
    """Status messages for one broker destination that the relay has yet to deliver."""

    destination: str = Field(description="The reply_to: amqp://, nats:// or redis://.")
    pending: int = Field(ge=0)
    lag: float = Field(ge=0, description="Seconds since the oldest of them was written.")
    failing: int = Field(ge=0, description="Tried and failed; their tasks' later ones wait.")
    attempts: int = Field(ge=0, description="The most tries of one.")
    retry_in: Annotated[float, Field(ge=0)] | None
    error: str | None = Field(description="The newest error, without credentials.")


class WaitFact(_Closed):
    position: str | None = Field(description="Its place in the workflow.")
    kind: Literal["timer", "event", "child"]
    name: str = Field(description="The event's name, the child's task id ('' for a timer).")
    wake_at: datetime | None = Field(description="A timer's end, an event's timeout.")


class ChildFact(_Closed):
    task_id: str
    state: TaskState


class Gate(_Closed):
    """What holds a task or a step now: its `reason`, and the facts that reason fills in (the
    others are null or empty; the reason's description says which)."""

    reason: WaitReason
    until: datetime | None = Field(
        description="When it ends: a timer, an event's timeout, a delayed start, a backoff, a "
        "breaker's next try, a rate's period; for held work, when the supervisor takes it "
        "back at the latest."
    )
    since: datetime | None = Field(
        description="Since when: the task ended, was set aside or paused; the last beat of a "
        "scheduler or agent instance that could run it (none alive)."
    )
    state: TaskState | None
    error: str | None
    alert: str | None = Field(description="The reason of the task's newest alert.")
    by: str | None = Field(description="Who paused the task, as they said.")
    authenticated: str | None = Field(description="How they proved it (api-token, session).")
    note: str | None = Field(description="The reason they gave.")
    event: str | None = Field(description="The event waited for.")
    waits: list[WaitFact]
    children: list[ChildFact]
    workflow: str | None
    version: int | None
    schedulers: list[str] = Field(description="The alive schedulers that run the task's version.")
    ahead: int | None = Field(description="Tasks (or requests of the agent) before it.")
    rank: int | None = Field(description="Its place in the claim order (ahead + 1).")
    tenant: str | None = Field(description='A pending task\'s tenant ("": none), for its share.')
    tenant_ahead: int | None = Field(description="Of its own tenant's tasks, those before it.")
    share: float | None = Field(
        description="The part of the claims its tenant gets while every tenant with tasks of "
        "its (workflow, version) waiting has work: its weight over theirs added up.",
    )
    holder: str | None = Field(description="The instance that holds it.")
    holder_alive: bool | None
    beat_age: float | None = Field(description="Seconds since the holder's last beat.")
    agent: str | None
    operation: str | None
    instances: list[str] = Field(description="The agent instances the reason is about.")
    limit: int | None = Field(description="The operation's concurrency or rate limit.")
    per: float | None = Field(description="The rate's period, in seconds.")
    in_use: int | None = Field(description="Steps running, or starts within the period.")
    held_by: list[str] = Field(description="The tasks whose running steps hold the limit.")


class StepWhy(_Closed):
    seq: int
    name: str
    agent: str
    operation: str
    state: StepState
    gate: Gate


class WhyAnswer(_Closed):
    """Why a task waits: its own gate, each open step's, and what holds it in the end."""

    task_id: str
    workflow: str
    version: int
    state: TaskState
    gate: Gate
    steps: list[StepWhy] = Field(description="Its open steps, by seq.")
    holding: Gate = Field(
        description="What holds the task in the end: a held task's first open step's gate, "
        "else its own."
    )


class WaitingReason(_Closed):
    reason: WaitReason
    workflow: str
    agent: str | None = Field(description="The agent of the step whose gate it is.")
    tasks: int = Field(ge=1)
    since: datetime | None = Field(description="The earliest since of these tasks.")
    until: datetime | None = Field(description="The earliest until of these tasks.")
    example: str = Field(description="One of these tasks.")


class Waiting(_Closed):
    looked_at: int = Field(
        ge=0,
        description="The tasks looked at: the newest of each unfinished state (counted "
        "again every 10 s).",
    )
    reasons: list[WaitingReason] = Field(description="Most tasks first.")


class Overview(_Closed):
    counts: Counts  # type: ignore[valid-type]
    oldest_pending_age: Annotated[float, Field(ge=0)] | None
    leader: Leader | None
    activity: Activity
    failed_tasks: list[TaskSummary]
    alerts: list[Alert]
    unrunnable: list[UnrunnableVersion] = Field(
        description="The tasks waiting for a scheduler, by workflow and version, that no "
        "alive scheduler runs (none alive: every one waiting)."
    )
    relay: list[RelayDestination] = Field(
        default_factory=list,
        description="Per broker destination, the status messages not yet delivered "
        "(none listed: all delivered).",
    )
    waiting: Waiting = Field(
        description="What holds the unfinished tasks (`WhyAnswer.holding`), by reason, "
        "workflow and agent."
    )


class AgentInstance(_Closed):
    instance: str
    agent: str
    operations: list[str]
    capacity: int
    inflight: int
    breaker: Literal["closed", "open", "half_open"]
    breaker_detail: dict[str, Any]
    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    alive: bool


class OperationStats(_Closed):
    agent: str
    operation: str
    started: int
    completed: int
    failed: int
    reassignments: int


class Schedule(_Closed):
    name: str
    workflow: str
    cron: str | None
    every: float | None = Field(description="Seconds between ticks, when not a cron schedule.")
    timezone: str
    catch_up: Literal["skip", "all", "latest"]
    paused: bool
    next_at: datetime = Field(description="The next tick a task is created for.")
    last_tick: datetime | None
    input: Payload = None


class SchedulesAnswer(_Closed):
    schedules: list[Schedule]


class ScheduleAnswer(_Closed):
    name: str
    paused: bool | None = Field(description="After a pause or a resume.")
    task_id: str | None = Field(description="After a trigger: the task created.")


class AgentsAnswer(_Closed):
    instances: list[AgentInstance]
    operations: list[OperationStats]
