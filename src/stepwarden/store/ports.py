"""What each role may ask of the store: one Protocol per role, so that a role's use of a
store method outside its port is a type error, not a run-time refusal.

- `ApplicationPort`: the App's own calls (submit, the application's reads, events,
  operator actions, schedules); `ApplicationStore` adds `ReadPort`, and is what
  `App.store()` gives.
- `ReadPort`: the reads of the dashboard and the command line, which write nothing.
- `SchedulerPort`: a scheduler's and its drives' (`drive.Host.store`): claims, the writes
  of a held task, waits, the scheduler registry.
- `SupervisorPort`: the supervisor leader's sweeps and lease, with the outbox's deliveries
  that it runs (`AlertPort` for the `AlertDeliverer`, `RelayPort` for the `Relay`).
- `AgentPort`: an agent runner's (`runner.AgentRunner`): a Store, or the agent protocol of
  a stepwarden server (`remote.RemoteAgentPort`) for an agent served over HTTP.
- `WakeupPort` and `PollingPort`, in each of them that waits for work: the wake-ups, and
  whether they all come (so that polling is only a fallback).

A `Store` (`base.py`) serves every port, a `ShardedStore` (`sharded.py`) only
`ApplicationStore`: an actor given a store of shards is a type error. Each port is
structural, so a store serves a port by having its methods, without naming it. The ports
name what a role calls, and nothing else: a method a role starts to call is added to its
port here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from ..records import (
    ActionOutcome,
    Activity,
    AgentBeat,
    AgentInstance,
    CallStop,
    ClaimedTask,
    DispatchedStep,
    EventBeyond,
    EventBounds,
    EventPage,
    EventRecord,
    Expired,
    LeaseRecord,
    LeaseTry,
    OperatorAction,
    OpLimit,
    OutboxMessage,
    ParkRequest,
    Redrive,
    RelayBacklog,
    Released,
    Request,
    RequestHandback,
    SchedulerBeat,
    ScheduleRecord,
    SchedulerInstance,
    ScheduleSpec,
    SendOutcome,
    StepDispatch,
    StepFacts,
    StepOutcome,
    StepRecord,
    StepStats,
    StepSwept,
    Submission,
    Submitted,
    SweepRound,
    TaskFacts,
    TaskFilter,
    TaskOutcome,
    TaskRecord,
    TicksMade,
    VersionBacklog,
    WaitOutcome,
    WaitRecord,
    WaitRequest,
    Woke,
)
from ..retry import Backoff
from ..sealing import Keyring
from ..states import TaskState
from .base import Subscription


class WakeupPort(Protocol):
    """The in-process wake-ups of a store's channels (`base.Notifier`), which every role
    that waits for new work follows."""

    def subscribe(self, channel: str) -> Subscription: ...
    def unsubscribe(self, channel: str, sub: Subscription) -> None: ...


class PollingPort(WakeupPort, Protocol):
    """A poller's: the wake-ups, and whether they all come (`_aio.Pace`)."""

    @property
    def wakeups_live(self) -> bool:
        """Whether every wake-up of the other processes reaches this process now, so that a
        poller polls only as a fallback (`Store.wakeups_live`)."""


class ReadPort(Protocol):
    """The reads of the dashboard and the command line: no write."""

    async def schema_version(self) -> int: ...
    async def sealing_keys(self) -> list[str]: ...
    async def get_task(self, task_id: str) -> TaskRecord | None: ...
    async def get_steps(self, task_id: str) -> list[StepRecord]: ...
    async def waits(self, task_id: str) -> list[WaitRecord]: ...
    async def children(self, task_id: str, *, limit: int = 1000) -> list[TaskRecord]: ...
    async def history(
        self, task_id: str, *, limit: int = 100, before: int | None = None
    ) -> EventPage: ...
    async def events(
        self, *, task_id: str | None = None, kind: str | None = None, limit: int = 1000
    ) -> list[EventRecord]: ...
    async def outbox(
        self,
        *,
        task_id: str,
        channel: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[OutboxMessage]: ...
    async def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        workflow: str | None = None,
        limit: int = 100,
        version: int | None = None,
        tenant: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> list[TaskRecord]: ...
    async def select_tasks(
        self, match: TaskFilter, *, after: str = "", limit: int = 100
    ) -> list[TaskRecord]: ...
    async def list_matching(
        self,
        match: TaskFilter,
        *,
        after: str | None = None,
        limit: int = 100,
        after_at: datetime | None = None,
    ) -> list[TaskRecord]: ...
    async def count_tasks(self) -> dict[TaskState, int]: ...
    async def client_unfinished(self, client: str) -> int: ...
    async def find_tasks(
        self,
        *,
        state: TaskState | None = None,
        workflow: str | None = None,
        search: str | None = None,
        limit: int = 100,
        version: int | None = None,
        tenant: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> list[TaskRecord]: ...
    async def workflow_names(self) -> list[str]: ...
    async def newest_outbox(self, *, channel: str, limit: int) -> list[OutboxMessage]: ...
    async def oldest_pending_age(self) -> float | None: ...
    async def read_lease(self, name: str) -> LeaseRecord | None: ...
    async def activity(self, *, window: float, bucket: float) -> Activity: ...
    async def step_stats(self) -> list[StepStats]: ...
    async def count_events(self, kind: str) -> int: ...
    async def list_agents(self) -> list[AgentInstance]: ...
    async def list_schedulers(self) -> list[SchedulerInstance]: ...
    async def version_backlog(
        self, workflows: Sequence[str] | None = None
    ) -> list[VersionBacklog]: ...
    async def schedules(self) -> list[ScheduleRecord]: ...
    async def relay_backlog(self) -> list[RelayBacklog]: ...
    async def why_facts(
        self, task_id: str, limits: Mapping[tuple[str, str], OpLimit] | None = None
    ) -> tuple[TaskFacts, list[StepFacts]] | None: ...


class ApplicationPort(WakeupPort, Protocol):
    """The App's own calls (`app.App`): it opens and closes its store, submits, reads what
    its users ask for, sends events, acts as an operator and keeps its schedules."""

    default_poll_interval: float

    async def open(self, *, migrate: bool = True) -> None: ...

    async def listen(self) -> None: ...
    async def submit(self, tasks: Sequence[Submission]) -> list[Submitted]: ...
    async def get_task(self, task_id: str) -> TaskRecord | None: ...
    async def await_task(
        self, task_id: str, *, created_here: bool = False
    ) -> TaskRecord | None: ...
    async def get_steps(self, task_id: str) -> list[StepRecord]: ...
    async def children(self, task_id: str, *, limit: int = 1000) -> list[TaskRecord]: ...
    async def history(
        self, task_id: str, *, limit: int = 100, before: int | None = None
    ) -> EventPage: ...
    async def outbox(
        self,
        *,
        task_id: str,
        channel: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[OutboxMessage]: ...
    async def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        workflow: str | None = None,
        limit: int = 100,
        version: int | None = None,
        tenant: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> list[TaskRecord]: ...
    async def select_tasks(
        self, match: TaskFilter, *, after: str = "", limit: int = 100
    ) -> list[TaskRecord]: ...
    async def list_matching(
        self,
        match: TaskFilter,
        *,
        after: str | None = None,
        limit: int = 100,
        after_at: datetime | None = None,
    ) -> list[TaskRecord]: ...
    async def list_agents(self) -> list[AgentInstance]: ...
    async def list_schedulers(self) -> list[SchedulerInstance]: ...
    async def fork(
        self,
        task_id: str,
        new: Submission,
        start: str,
        new_keys_from: int | None,
        detail: dict[str, Any],
        *,
        apply: bool,
    ) -> Redrive: ...
    async def send_event(
        self,
        task_id: str,
        name: str,
        payload: str,
        event_id: str,
        bounds: EventBounds | None = None,
    ) -> SendOutcome | TaskState | EventBeyond | None: ...
    async def operate(self, actions: Sequence[OperatorAction]) -> list[ActionOutcome]: ...
    async def schedules(self) -> list[ScheduleRecord]: ...
    async def pause_schedule(self, name: str, paused: bool) -> bool: ...


class ApplicationStore(ApplicationPort, ReadPort, Protocol):
    """What `App.store()` gives: the application's calls and the reads."""


class SchedulerPort(PollingPort, Protocol):
    """A scheduler's (`scheduler.Scheduler`) and its drives' (`drive.TaskDrive`, through
    `drive.Host.store`): its registry, claims of tasks, the writes of a held task (group
    committed: `advance`), its waits, and the hand-back of what it holds but does not drive."""

    default_poll_interval: float
    claim_gather: float
    keys: Keyring | None
    """The keyring that seals what a workflow hands on."""

    async def beat_schedulers(self, beats: Sequence[SchedulerBeat], ttl: float) -> None: ...
    async def leave_scheduler(self, instance: str) -> None: ...
    async def held_tasks(self, scheduler: str) -> list[tuple[str, int]]: ...
    async def release_held(
        self, scheduler: str, only: Collection[tuple[str, int]] | None = None
    ) -> list[Released]: ...
    async def version_backlog(
        self, workflows: Sequence[str] | None = None
    ) -> list[VersionBacklog]: ...
    async def agent_room(self) -> int | None: ...
    async def claim_tasks(
        self,
        scheduler: str,
        workflows: Sequence[str | tuple[str, int]],
        limit: int,
        *,
        fairly: bool = True,
    ) -> list[ClaimedTask]: ...
    async def advance(
        self,
        outcomes: Sequence[StepOutcome],
        dispatches: Sequence[StepDispatch],
        finishes: Sequence[TaskOutcome],
    ) -> tuple[list[bool], list[DispatchedStep | None], list[bool]]: ...
    async def finished_steps(self, keys: Sequence[tuple[str, int]]) -> list[StepRecord]: ...
    async def read_step(self, task_id: str, seq: int) -> tuple[StepRecord, float] | None: ...
    async def read_held_step(
        self, task_id: str, seq: int, attempt: int, scheduler: str
    ) -> tuple[StepRecord, float, bool] | None: ...
    async def note_run(
        self, task_id: str, attempt: int, scheduler: str, run_trace: str
    ) -> bool: ...
    async def tag_task(
        self, task_id: str, attempt: int, scheduler: str, key: str, value: str
    ) -> bool | str: ...
    async def wait(self, request: WaitRequest) -> WaitOutcome: ...
    async def park(self, request: ParkRequest) -> WaitOutcome: ...
    async def record_events(self, events: Sequence[tuple[str | None, str, Any]]) -> None: ...
    async def wait_to_retry(self, seconds: float, stop: asyncio.Event | None = None) -> None: ...


class AlertPort(PollingPort, Protocol):
    """The alert deliverer's (`alerts.AlertDeliverer`): the outbox's due alerts, and each
    sink's delivery recorded."""

    async def due_alerts(self, limit: int) -> list[OutboxMessage]: ...
    async def record_delivery(
        self, message_id: int, delivered_to: Sequence[str], *, done: bool, retry_in: float
    ) -> None: ...


class RelayPort(PollingPort, Protocol):
    """The relay's (`relay.Relay`): the status messages due to the application's brokers,
    and each one's delivery, failure or refusal recorded."""

    async def relay_fence(self, safe: int) -> tuple[int, int | None]: ...
    async def relay_passed(self, fence: int) -> bool: ...
    async def relay_due(self, *, upto: int, tasks: int, limit: int) -> list[OutboxMessage]: ...
    async def relay_delivered(self, message_ids: Sequence[int]) -> None: ...
    async def relay_failed(self, message_id: int, error: str, retry_in: float) -> None: ...
    async def relay_refused(self, refused: Sequence[tuple[int, str]]) -> None: ...


class SupervisorPort(AlertPort, RelayPort, Protocol):
    """The supervisor's (`supervisor.Supervisor`): the lease and its term, the sweeps its
    leader runs, retention, its schedules; and, while it leads, the outbox's deliveries
    (`AlertPort`, `RelayPort`)."""

    lost_at: float
    """When (monotonic) this process last lost the server."""

    async def try_lease(self, name: str, holder: str, ttl: float) -> LeaseTry: ...
    async def stale_tasks(self, workflow: str, after: float, limit: int) -> list[str]: ...
    async def stuck_alerted(self, task_id: str, wait_reason: str) -> bool: ...
    async def why_facts(
        self, task_id: str, limits: Mapping[tuple[str, str], OpLimit] | None = None
    ) -> tuple[TaskFacts, list[StepFacts]] | None: ...
    async def record_events(self, events: Sequence[tuple[str | None, str, Any]]) -> None: ...
    async def look_lease(self, name: str, holder: str) -> float | None: ...
    async def sweep_round(
        self,
        *,
        lease: str,
        holder: str,
        term: int,
        limit: int,
        backoff: Backoff,
        forget_after: float,
        release: bool,
        purge_after: float | None,
        purge_limit: int,
    ) -> SweepRound: ...
    async def release_lease(self, name: str, holder: str) -> None: ...
    async def wake_due(self, *, lease: str, holder: str, term: int, limit: int) -> list[Woke]: ...
    async def store_schedules(self, specs: Sequence[ScheduleSpec]) -> dict[str, str]: ...
    async def create_ticks(
        self, *, lease: str, holder: str, term: int, limit: int
    ) -> TicksMade: ...
    async def release_gone_schedulers(
        self, *, lease: str, holder: str, term: int, limit: int, forget_after: float
    ) -> list[Released]: ...
    async def sweep(
        self, *, lease: str, holder: str, term: int, limit: int, backoff: Backoff
    ) -> list[Expired]: ...
    async def sweep_steps(
        self,
        *,
        lease: str,
        holder: str,
        term: int,
        limit: int,
        forget_after: float,
        reassign: bool = True,
    ) -> list[StepSwept]: ...


class AgentPort(PollingPort, Protocol):
    """What an agent runner asks of the store (`runner.AgentRunner`): a Store, or the agent
    protocol of a stepwarden server (`remote.RemoteAgentPort`) for an agent served over HTTP."""

    default_poll_interval: float

    keys: Keyring | None
    """The keyring that seals the results the runner reports (None: it reports them plain,
    for a server that seals them: the agent protocol's)."""

    async def beat(self, beats: Sequence[AgentBeat], ttl: float) -> None: ...
    async def leave(self, instance: str, agents: Sequence[str]) -> None: ...
    async def record_events(self, events: Sequence[tuple[str | None, str, Any]]) -> None: ...
    async def claim_requests(
        self,
        instance: str,
        agent: str,
        operations: Sequence[str],
        limit: int,
        limits: Mapping[str, OpLimit] | None = None,
        *,
        fairly: bool = True,
    ) -> list[Request]: ...
    async def held_steps(self, instance: str, agent: str) -> list[Request]: ...
    async def lost_calls(
        self, instance: str, calls: Sequence[tuple[str, int, int]]
    ) -> dict[tuple[str, int, int], str]: ...
    async def heartbeat_step(
        self, task_id: str, seq: int, attempt: int, instance: str, detail: str | None
    ) -> float | None: ...
    async def complete_steps(self, batch: Sequence[StepOutcome]) -> list[bool]: ...
    async def stop_calls(self, batch: Sequence[CallStop]) -> list[bool]: ...
    async def hand_back(self, batch: Sequence[RequestHandback]) -> list[bool]: ...
    async def wait_to_retry(self, seconds: float, stop: asyncio.Event | None = None) -> None: ...


__all__ = [
    "AgentPort",
    "AlertPort",
    "ApplicationPort",
    "ApplicationStore",
    "PollingPort",
    "ReadPort",
    "RelayPort",
    "SchedulerPort",
    "SupervisorPort",
    "WakeupPort",
]
