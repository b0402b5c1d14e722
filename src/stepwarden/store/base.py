"""The Store interface: the only door to the database.

Every method is one transaction. Writes that change a task or step state are conditional
updates naming the expected state and attempt (the fencing token), and report whether they
took effect. Methods that take a sequence apply a batch in a single commit, so that many
concurrent workflows share one commit (group commit).

Payloads (inputs, results) are written as JSON text and read back as Python values.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ..states import ABANDONED, FINISHED_TASK_STATES, OPERATOR_ACTIONS, StepState, TaskState

CHANNEL_TASKS = "tasks"
"""Woken when tasks become pending."""
CHANNEL_REQUESTS = "requests"
"""Woken when step requests are queued for agents; payloads are agent names."""
CHANNEL_RESULTS = "results"
"""Woken when steps finish; payloads are step keys (see `step_key`)."""
CHANNEL_TASK_DONE = "task_done"
"""Woken when tasks finish; payloads are task ids."""
CHANNEL_OUTBOX = "outbox"
"""Woken when outbox messages are written (PostgreSQL); payloads are outbox channels."""


def step_key(task_id: str, seq: int) -> str:
    return f"{task_id}\x1f{seq}"


@dataclass(frozen=True, slots=True, kw_only=True)
class NewTask:
    task_id: str
    workflow: str
    input: str  # JSON text
    priority: int
    complete_within: float
    max_failures: int
    on_failure: str = "compensate"
    reply_to: str | None = None


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
    reassignments: int = 0
    """Times the step was handed to another agent instance (its holder gone, or its
    breaker open) without a failure counted."""
    heartbeat: Any = None
    """The details of the step's last heartbeat (`Call.heartbeat`)."""
    heartbeat_at: datetime | None = None
    limit_key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedTask:
    task: TaskRecord
    steps: list[StepRecord]
    remaining: float
    """Seconds until the task's complete_by, by the database clock at claim time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepDispatch:
    """A scheduler's request to record (and so queue) one step of a task it holds.

    `kind` is "new" for a step not yet recorded, "redispatch" for a recorded step whose
    complete_by passed (its attempt rises, the stable idempotency key stays), and "adopt" for a
    recorded step still in time that an earlier attempt of the task dispatched.
    """

    kind: Literal["new", "redispatch", "adopt"]
    task_id: str
    task_attempt: int
    scheduler: str
    seq: int
    name: str
    agent: str
    operation: str
    input: str  # JSON text; ignored unless kind == "new"
    priority: int
    complete_within: float
    expected_attempt: int = 0  # the step attempt seen; ignored for kind == "new"
    compensation: str | None = None  # "agent.operation"; only for kind == "new"
    compensation_input: str | None = None  # JSON text; only for kind == "new"
    compensates: int | None = None  # the seq undone, on a compensation step
    limit_key: str | None = None  # the key of the operation's limits; only for kind == "new"
    pickup_within: float | None = None  # only for kind == "new"
    total_within: float | None = None  # only for kind == "new"


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchedStep:
    task_id: str
    seq: int
    attempt: int
    remaining: float
    """Seconds until the step's complete_by, by the database clock."""


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
class TaskOutcome:
    """How a scheduler ends its hold of a task: processed or error (the workflow ran),
    compensated or compensation_failed (its compensations ran). An error becomes
    compensating unless the task's on_failure is "stop"."""

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Expired:
    """What one supervisor sweep did to one task."""

    task_id: str
    seq: int | None  # the expired step, or None when the task itself expired
    failure_count: int
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
class OpLimit:
    """The limits an agent instance claims one operation under: across every process
    (`concurrency`: steps running at once; `rate` starts per `per` seconds, each per limit
    key when the operation has a key), and its own room (`room`: more calls it may start)."""

    concurrency: int | None = None
    rate: int | None = None
    per: float = 1.0
    room: int | None = None

    @property
    def shared(self) -> bool:
        return self.concurrency is not None or self.rate is not None


SCAN = 1000
"""How many queued requests a claim within limits looks at, past those it may not start."""


def pickup_error(pickup_within: float) -> str:
    return f"not picked up: no agent claimed the step within {pickup_within:g}s"


def total_error(total: float, state: str, attempt: int) -> str:
    """A step past its total timeout; one that was running, or ran before, is abandoned: it
    may have taken effect, and is compensated like any abandoned step."""
    text = f"total timeout: not completed within {total:g}s of its first dispatch"
    return ABANDONED + text if state == StepState.RUNNING or attempt > 1 else text


def pick_within_limits(
    candidates: Sequence[tuple[str, str | None]],
    limits: Mapping[str, OpLimit],
    running: Mapping[tuple[str, str], int],
    started: Mapping[tuple[str, str], int],
    limit: int,
) -> list[int]:
    """Which of the queued requests (operation, limit key), in claim order, may start now:
    the positions of at most `limit` of them that keep each operation within its limits,
    given the steps `running` and the starts within each rate's period (`started`), both by
    (operation, key) with "" for no key. Requests of an operation with no limits all may."""
    running = dict(running)
    started = dict(started)
    room = {op: lim.room for op, lim in limits.items() if lim.room is not None}
    chosen: list[int] = []
    for i, (op, key) in enumerate(candidates):
        if len(chosen) >= limit:
            break
        lim = limits.get(op)
        if lim is not None:
            k = (op, key or "")
            if op in room and room[op] <= 0:
                continue
            if lim.concurrency is not None and running.get(k, 0) >= lim.concurrency:
                continue
            if lim.rate is not None and started.get(k, 0) >= lim.rate:
                continue
            running[k] = running.get(k, 0) + 1
            started[k] = started.get(k, 0) + 1
            if op in room:
                room[op] -= 1
        chosen.append(i)
    return chosen


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
class EventRecord:
    id: int
    task_id: str | None
    at: datetime
    kind: str
    detail: Any


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


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorAction:
    """One operator action on one task (see `states.OPERATOR_ACTIONS`)."""

    action: Literal["retry", "skip", "pause", "resume", "cancel", "compensate"]
    task_id: str
    actor: str
    reason: str | None = None
    seq: int | None = None  # skip: the step
    result: str | None = None  # skip: the step's result, JSON text


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionOutcome:
    task_id: str
    applied: bool
    before: TaskState | None  # None when there is no such task
    after: TaskState | None
    message: str


@dataclass(frozen=True, slots=True)
class ActionPlan:
    """What the store writes for one operator action on a task found in `before`."""

    before: TaskState
    after: TaskState
    reset_failures: bool
    wait_open: bool  # eligible once the open steps' complete_by has passed
    final: bool
    close_open: bool  # the open steps are closed (abandoned)
    reopen: bool | None  # retry: reopen the failed compensations (True) or forward steps


def plan_action(action: OperatorAction, before: TaskState) -> ActionPlan | str:
    """The plan for `action` on a task in `before`, or why it is refused."""
    moves = OPERATOR_ACTIONS[action.action]
    if before not in moves:
        allowed = ", ".join(sorted(moves))
        return f"cannot {action.action} a task that is {before} (only when {allowed})"
    after = moves[before]
    return ActionPlan(
        before=before,
        after=after,
        reset_failures=action.action in ("retry", "compensate"),
        wait_open=after == TaskState.COMPENSATING,
        final=after in FINISHED_TASK_STATES,
        close_open=action.action in ("cancel", "compensate"),
        reopen=(after == TaskState.COMPENSATING) if action.action == "retry" else None,
    )


def action_detail(action: OperatorAction, plan: ActionPlan) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "action": action.action,
        "by": action.actor,
        "reason": action.reason,
        "from": str(plan.before),
        "to": str(plan.after),
    }
    if action.seq is not None:
        detail["seq"] = action.seq
    return detail


class Subscription:
    """Wake-ups for one channel. Payloads pile up between waits; `wait` drains them."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._payloads: list[str] = []

    def push(self, payloads: Sequence[str]) -> None:
        self._payloads.extend(payloads)
        self._event.set()

    async def wait(self, timeout: float) -> list[str] | None:
        """Payloads received since the last call, or None when `timeout` passed first."""
        if not self._event.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._event.wait()
            except TimeoutError:
                return None
        self._event.clear()
        payloads, self._payloads = self._payloads, []
        return payloads


class Notifier:
    """In-process fan-out of wake-ups; stores feed it after each commit."""

    def __init__(self) -> None:
        self._subscribers: dict[str, list[Subscription]] = {}

    def subscribe(self, channel: str) -> Subscription:
        sub = Subscription()
        self._subscribers.setdefault(channel, []).append(sub)
        return sub

    def unsubscribe(self, channel: str, sub: Subscription) -> None:
        subs = self._subscribers.get(channel, [])
        if sub in subs:
            subs.remove(sub)

    def publish(self, channel: str, payloads: Sequence[str]) -> None:
        for sub in self._subscribers.get(channel, ()):
            sub.push(payloads)


class Transaction(abc.ABC):
    """An open transaction in which the application writes its own rows and submits tasks,
    so that both commit together or neither does."""

    @abc.abstractmethod
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one SQL statement of the application's own, in the driver's parameter style
        (`?` for SQLite, `%s` for PostgreSQL)."""

    @abc.abstractmethod
    async def submit(self, tasks: Sequence[NewTask]) -> list[bool]:
        """Record tasks in this transaction; True for each task that was created."""


class Store(abc.ABC):
    """The durable state store."""

    dialect: str
    default_poll_interval: float

    def __init__(self) -> None:
        self.notifier = Notifier()

    # -- lifecycle ------------------------------------------------------------------------
    @abc.abstractmethod
    async def open(self, *, migrate: bool = True) -> None:
        """Connect; apply pending migrations when `migrate`; check the schema version."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def migrate(self) -> int:
        """Apply pending migrations; return the schema version now in place."""

    @abc.abstractmethod
    async def schema_version(self) -> int:
        """The version of the schema in the database, 0 when none."""

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the application ------------------------------------------------------------------
    @abc.abstractmethod
    async def submit(self, tasks: Sequence[NewTask]) -> list[bool]:
        """Record pending tasks; a task_id already present is left as it is (False)."""

    @abc.abstractmethod
    def transaction(self) -> Any:
        """An async context manager yielding a `Transaction`."""

    @abc.abstractmethod
    async def get_task(self, task_id: str) -> TaskRecord | None: ...

    @abc.abstractmethod
    async def get_steps(self, task_id: str) -> list[StepRecord]: ...

    @abc.abstractmethod
    async def list_tasks(
        self, *, state: TaskState | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[TaskRecord]: ...

    @abc.abstractmethod
    async def count_tasks(self) -> dict[TaskState, int]: ...

    @abc.abstractmethod
    async def record_events(self, events: Sequence[tuple[str | None, str, Any]]) -> None:
        """Record (task_id, kind, detail) events; an `alert` also goes to the outbox."""

    @abc.abstractmethod
    async def events(
        self, *, task_id: str | None = None, kind: str | None = None, limit: int = 1000
    ) -> list[EventRecord]: ...

    # -- the outbox -----------------------------------------------------------------------
    @abc.abstractmethod
    async def outbox(
        self,
        *,
        channel: str | None = None,
        task_id: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[OutboxMessage]:
        """Messages of a channel and/or a task whose id is above `after`, oldest first."""

    @abc.abstractmethod
    async def due_alerts(self, limit: int) -> list[OutboxMessage]:
        """Alerts not yet delivered to every sink whose next try is due, oldest first."""

    @abc.abstractmethod
    async def record_delivery(
        self, message_id: int, delivered_to: Sequence[str], *, done: bool, retry_in: float
    ) -> None:
        """After a delivery round: the sinks reached so far; done, or due again in
        `retry_in` seconds."""

    # -- retention ------------------------------------------------------------------------
    @abc.abstractmethod
    async def purge(self, older_than: float, limit: int) -> int:
        """Delete up to `limit` finished tasks (processed, compensated, cancelled) that
        finished more than `older_than` seconds ago, with their steps, events and delivered
        outbox messages; the number deleted. Tasks awaiting an operator are kept."""

    # -- the operator ---------------------------------------------------------------------
    @abc.abstractmethod
    async def operate(self, actions: Sequence[OperatorAction]) -> list[ActionOutcome]:
        """Apply operator actions in one transaction, each a conditional update from the
        state and attempt it reads, recorded as an `operator` event (who, why, from, to)."""

    # -- the scheduler --------------------------------------------------------------------
    @abc.abstractmethod
    async def claim_tasks(
        self, scheduler: str, workflows: Sequence[str], limit: int
    ) -> list[ClaimedTask]:
        """Claim up to `limit` eligible tasks, by priority then age, exclusively: pending ones
        become processing, compensating ones not held stay compensating; each gets locked_by,
        a new attempt and complete_by = now + complete_within."""

    @abc.abstractmethod
    async def dispatch_steps(self, batch: Sequence[StepDispatch]) -> list[DispatchedStep | None]:
        """Record and queue steps, each only if its task is still processing under the
        given attempt (and, for re-dispatch and adoption, the step under the expected one).
        None for each dispatch that was fenced out."""

    @abc.abstractmethod
    async def finished_steps(self, keys: Sequence[tuple[str, int]]) -> list[StepRecord]:
        """Of the given (task_id, seq), the steps that are completed or failed."""

    @abc.abstractmethod
    async def finish_tasks(self, batch: Sequence[TaskOutcome]) -> list[bool]:
        """End the hold of each task, only if it is still held (`TaskOutcome.held_as`) under
        the given attempt and scheduler: processed; error, with an alert event, which becomes
        compensating (eligible once its open steps' complete_by has passed) unless its
        on_failure is "stop"; compensated; compensation_failed, with an alert event. The
        task's open steps are closed (failed, abandoned)."""

    @abc.abstractmethod
    async def read_step(self, task_id: str, seq: int) -> tuple[StepRecord, float] | None:
        """The step and the seconds until its complete_by (by the database clock; negative
        once passed), or None when there is no such step."""

    # -- the agents -----------------------------------------------------------------------
    @abc.abstractmethod
    async def claim_requests(
        self,
        instance: str,
        agent: str,
        operations: Sequence[str],
        limit: int,
        limits: Mapping[str, OpLimit] | None = None,
    ) -> list[Request]:
        """Claim up to `limit` queued requests in time for these operations, by priority
        then age: the steps go from not_started to running, locked_by the agent instance.
        An operation in `limits` is claimed only within them: its concurrency and rate
        across every process (per limit key; claims of one agent's limited operations are
        serialised), and its `room` in this instance."""

    @abc.abstractmethod
    async def hand_back(self, batch: Sequence[RequestHandback]) -> list[bool]:
        """Put claimed requests back in the queue for another instance (running ->
        not_started, the same attempt, reassignments + 1), each only if still running under
        the given attempt and instance."""

    @abc.abstractmethod
    async def heartbeat_step(
        self, task_id: str, seq: int, attempt: int, instance: str, detail: str | None
    ) -> float | None:
        """Record a running step's heartbeat (`detail`: JSON text) and extend its
        complete_by to now + its complete_within, never past its task's complete_by nor its
        total timeout; the seconds now left, or None when the step is no longer running
        under this attempt and instance, or its complete_by has passed."""

    @abc.abstractmethod
    async def beat(self, beats: Sequence[AgentBeat], ttl: float) -> None:
        """Register or refresh agent instances; each is gone `ttl` seconds after its last
        beat (by the database clock)."""

    @abc.abstractmethod
    async def leave(self, instance: str, agents: Sequence[str]) -> None:
        """An instance stopping: its registry rows expire now (its running steps are
        reassigned by the next sweep)."""

    @abc.abstractmethod
    async def list_agents(self) -> list[AgentInstance]:
        """The registry: every agent instance, alive or gone, by agent then start."""

    @abc.abstractmethod
    async def agent_room(self) -> int | None:
        """How many more tasks the agents have room for: the capacity of the alive agent
        instances less the held tasks or the steps queued or running (in time), whichever are
        more; None when no agent instance is alive."""

    @abc.abstractmethod
    async def complete_steps(self, batch: Sequence[StepOutcome]) -> list[bool]:
        """Record results, each only if the step is still running under the given attempt,
        locked by the given instance, and its complete_by has not passed."""

    # -- the supervisor -------------------------------------------------------------------
    @abc.abstractmethod
    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        """Take or renew the lease `name`; its term when held, None when another holds it.
        The term rises whenever the lease changes hands or lapses; it never falls."""

    @abc.abstractmethod
    async def release_lease(self, name: str, holder: str) -> None: ...

    async def end_stalled_sessions(self) -> int:
        """End the store sessions of other processes that stopped talking in the middle of a
        transaction (frozen, or stalled), so that their locks do not outlive the freeze; how
        many were ended. A store whose server does this by itself does nothing here."""
        return 0

    @abc.abstractmethod
    async def sweep(
        self,
        *,
        lease: str,
        holder: str,
        term: int,
        limit: int,
        backoff_initial: float,
        backoff_maximum: float,
    ) -> list[Expired]:
        """Under the lease (holder, term), find held tasks whose complete_by passed and open
        steps of the current attempt whose complete_by passed; increment failure_count and
        release each task (processing: back to pending after a backoff; compensating: stays
        compensating after a backoff). At max_failures, with an alert: a processing task goes
        by its on_failure (compensate: compensating; retry: pending, the backoff growing on;
        stop: error), a compensating one to compensation_failed. Nothing is written when the
        lease is no longer held at `term`."""

    @abc.abstractmethod
    async def sweep_steps(
        self, *, lease: str, holder: str, term: int, limit: int, forget_after: float
    ) -> list[StepSwept]:
        """Under the lease (holder, term): reassign the running steps of gone agent
        instances (not_started, attempt + 1, reassignments + 1, a full complete_by) and
        release their tasks (pending, or compensating unheld; failure_count unchanged) for a
        scheduler to take up again at once, since the task's own scheduler may be gone with
        the agent; fail the steps no agent claimed within their pick-up
        timeout and the open steps past their total timeout (an open one as abandoned: it
        may have taken effect), and forget instances gone for `forget_after` seconds. Nothing
        is written when the lease is no longer held at `term`."""

    # -- wake-ups -------------------------------------------------------------------------
    def subscribe(self, channel: str) -> Subscription:
        return self.notifier.subscribe(channel)

    def unsubscribe(self, channel: str, sub: Subscription) -> None:
        self.notifier.unsubscribe(channel, sub)

    async def listen(self) -> None:  # noqa: B027 - a store without cross-process wake-ups
        """Start receiving wake-ups from other processes, where the database offers them."""

    # -- helpers for callers --------------------------------------------------------------
    async def watch_states(self, task_id: str, poll: float) -> AsyncIterator[TaskRecord]:
        """Yield the task each time it is read, waking on task completions."""
        sub = self.subscribe(CHANNEL_TASK_DONE)
        try:
            while True:
                task = await self.get_task(task_id)
                if task is not None:
                    yield task
                await sub.wait(poll)
        finally:
            self.unsubscribe(CHANNEL_TASK_DONE, sub)

    # -- the dashboard --------------------------------------------------------------------
    # Read-only queries of the operator's dashboard and its metrics (stepwarden.dashboard).

    @abc.abstractmethod
    async def find_tasks(
        self,
        *,
        state: TaskState | None = None,
        workflow: str | None = None,
        search: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        """Tasks newest first, optionally of one state and one workflow, and whose id
        contains `search`."""

    @abc.abstractmethod
    async def workflow_names(self) -> list[str]:
        """The workflows the stored tasks belong to, sorted."""

    @abc.abstractmethod
    async def newest_outbox(self, *, channel: str, limit: int) -> list[OutboxMessage]:
        """The newest messages of a channel, newest first."""

    @abc.abstractmethod
    async def oldest_pending_age(self) -> float | None:
        """Seconds since the oldest pending task was submitted (by the database clock), or
        None when no task is pending."""

    @abc.abstractmethod
    async def read_lease(self, name: str) -> LeaseRecord | None:
        """The lease `name` as it stands, or None when it was never taken."""

    @abc.abstractmethod
    async def activity(self, *, window: float, bucket: float) -> Activity:
        """Tasks processed and step failures (events `step_failed` and `expired`) per
        `bucket` seconds over the last `window` seconds."""

    @abc.abstractmethod
    async def step_stats(self) -> list[StepStats]:
        """For each agent and operation of the stored steps: how many were started
        (claimed), completed, failed and reassigned, and how long the completed ones took."""

    @abc.abstractmethod
    async def count_events(self, kind: str) -> int:
        """The number of stored events of `kind`."""


# -- the dashboard ------------------------------------------------------------------------

DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Upper bounds (seconds) of the step duration histogram; `step_stats` in each dialect's
queries.sql counts one column per bound (b0 ... b12)."""


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
