"""The App: where workflows and agents are declared, and tasks are submitted and followed.

Every call comes in two forms: a blocking one (`submit`, `status`, `result`, ...) for ordinary
code, and a coroutine (`submit_async`, ...) for code already running in an event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import getpass
import os
import threading
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar, Unpack, overload
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from . import _check, _json, rules, tracing
from ._batch import Batcher
from .agent import Agent
from .alerts import AlertSink, LogSink
from .breaker import Breaker
from .destinations import Destinations, is_destination
from .errors import (
    ActionRefused,
    ConfigurationError,
    EventRefused,
    ResultTimeout,
    StoreError,
    SubmitConflict,
    TaskFailed,
    TaskNotFound,
    TransientStoreError,
    UnknownNameError,
)
from .records import (
    DEFAULT_MAX_EVENT_PAYLOAD,
    DEFAULT_MAX_EVENTS_PER_TASK,
    SUBMIT_OPTIONS,
    ActionOutcome,
    AgentInstance,
    BulkFork,
    BulkPlan,
    BulkProgress,
    EventBeyond,
    EventBounds,
    EventRecord,
    OperatorAction,
    OpLimit,
    OutboxMessage,
    Redrive,
    ScheduleRecord,
    SchedulerInstance,
    ScheduleSpec,
    SendOutcome,
    StepPlan,
    StepRecord,
    StepWhy,
    Submission,
    Submitted,
    TaskFilter,
    TaskRecord,
    TaskStatus,
    Why,
    status_of,
)
from .retry import Retry
from .rules import (
    BULK_ACTIONS,
    CATCH_UP,
    bulk_fork_id,
    bulk_states,
    holding_gate,
    plan_action,
    plan_retry,
    step_gate,
    submit_version,
    task_gate,
)
from .sealing import Binding, Keyring, input_digest
from .secret import public_name
from .states import FINISHED_TASK_STATES, OPERATOR_ACTIONS, OnFailure, TaskState
from .store import CHANNEL_OUTBOX, CHANNEL_TASK_DONE, ShardedStore, Store, Transaction, open_store
from .store.ports import ApplicationPort, ApplicationStore
from .workflow import MAX_WAIT, Context, Workflow, WorkflowFn, as_within, workflow_name

if TYPE_CHECKING:
    from opentelemetry.trace import Span

T = TypeVar("T")
W = TypeVar("W", bound=WorkflowFn)
R = TypeVar("R")
In = TypeVar("In")
Id = TypeVar("Id", bound=str)
"""A task id of `result`'s plain-str overload: generic so that a `TaskId[dict[str, Any]]`,
which matches both overloads, is not taken by mypy as ambiguous (and its result as Any)."""
if TYPE_CHECKING:  # a default (PEP 696) for the type checker alone: a bare TaskId is TaskId[Any]
    from typing_extensions import TypeVar as TypeVarWithDefault

    R_co = TypeVarWithDefault("R_co", covariant=True, default=Any)
else:
    R_co = TypeVar("R_co", covariant=True)
MAX_EVENT_PAGE = 1000
CREATED_KEPT = 10_000
"""The ids of the tasks an App created that it keeps, for a wait on one's result to note
itself at once (`rules.await_first`)."""
"""The most events of a task's history read at once."""
FOLLOW_SETTLE = 5.0
"""Seconds after which an outbox message is taken as committed in id order."""


@dataclass(frozen=True, slots=True)
class TaskView:
    """A task with its steps and its history, as `show` prints it: the newest events first;
    `more_events` when older ones exist (`show_async(..., events_before=...)` pages on);
    `children`: the tasks its workflow started (`ctx.child`), oldest first (the task's
    parent, if it is a child, is `task.parent_id`)."""

    task: TaskRecord
    steps: list[StepRecord]
    events: list[EventRecord]
    more_events: bool = False
    children: list[TaskRecord] = field(default_factory=list)


class TaskId(str, Generic[R_co]):
    """A task's id as `submit` returns it: a `str`, equal to, hashed, serialised and stored as
    the plain string, that carries for the type checker the type of its workflow's result
    (`TaskId[dict[str, Any]]`), which `result` and `result_async` return. A plain `str`, or
    `TaskId(s)`, names a task as well: its result is `Any`; `TaskId[Receipt](s)` types it
    (an id kept as text and read back, say)."""

    __slots__ = ()


class SubmitOptions(TypedDict, total=False):
    """The keyword options of a submit (`App.submit`) for the type checker: the option
    fields of `Submission` (`records.SUBMIT_OPTIONS`), where their meaning and defaults are
    written (a unit test keeps both the same). None for any of them: its default (for
    `task_id`, a new id; for `version`, the newest the App declares). `start_after` is a
    `timedelta` or a number of seconds."""

    task_id: str | None
    priority: int
    reply_to: str | None
    start_at: datetime | None
    start_after: timedelta | float | None
    version: int | None
    tenant: str | None
    tags: Mapping[str, str] | None


class App:
    """Declares workflows and agents, and talks to the state store on the application's
    behalf. `store` is `sqlite:///path.db` (the embedded default) or `postgresql://...`.

    Close it when done, or use it as a context manager (`with app:`, `async with app:`),
    which closes what it opened (the store's connections and tasks, the blocking calls'
    event loop thread) on leaving the block."""

    def __init__(
        self,
        name: str,
        *,
        store: str,
        auto_migrate: bool = True,
        max_events_per_task: int = DEFAULT_MAX_EVENTS_PER_TASK,
        max_event_payload: int = DEFAULT_MAX_EVENT_PAYLOAD,
        keys: Keyring | None = None,
        destinations: str | os.PathLike[str] | Destinations | None = None,
    ) -> None:
        self.name = _check.name("the App's name", name)
        self.store_url = store
        open_store(store)  # validate the URL now, not at first use
        if keys is not None and not isinstance(keys, Keyring):
            raise ConfigurationError(f"keys must be a stepwarden.Keyring, not {_check.shown(keys)}")
        self.keys = keys if keys is not None else Keyring.from_env()
        """The keyring that seals the secrets this App stores and opens those it reads
        (`stepwarden.sealing`): `keys`, or the environment's (STEPWARDEN_KEYRING,
        STEPWARDEN_KEYS); None: secrets are stored plain."""
        self.auto_migrate = auto_migrate
        self.event_bounds = EventBounds(
            events=_check.integer("max_events_per_task", max_events_per_task, 1),
            payload=_check.integer(
                "max_event_payload", max_event_payload, 1, _json.MAX_PAYLOAD_BYTES
            ),
        )
        """What a task keeps of the events sent through this App: `max_events_per_task`
        events at most (taken by a wait or not), each payload `max_event_payload` bytes at
        most; a send beyond either raises EventRefused."""
        self.destinations = (
            destinations
            if isinstance(destinations, Destinations)
            else Destinations.from_env()
            if destinations is None
            else Destinations.from_file(destinations)
        )
        """The broker destinations a task's `reply_to` may name (`destinations.py`): the
        destinations file `destinations` (a path, or the entries), or by default the one
        `STEPWARDEN_DESTINATIONS` names; without one, none. The relay of this App's workers
        sends only to those. Plain channels (a name without `://`) are not listed: any may
        be named."""
        self._workflows: dict[tuple[str, int], Workflow] = {}
        self.agents: dict[str, Agent] = {}
        self._stores: dict[asyncio.AbstractEventLoop, Store | ShardedStore] = {}
        self._opening: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        """Held while a loop's store opens: callers at once share the one store it opens."""
        self._submits: dict[asyncio.AbstractEventLoop, Batcher[Submission, Submitted]] = {}
        self._created: collections.OrderedDict[str, bool] = collections.OrderedDict()
        """The ids of the tasks this App created last (CREATED_KEPT at most), newest last: a
        wait for one's result notes itself before its first read (rules.await_first)."""
        """Per event loop, the group commit of `submit_async`: the submits of concurrent
        callers share a transaction."""
        self._portal: _Portal | None = None
        self.schedule_specs: dict[str, ScheduleSpec] = {}
        """The schedules declared with `schedule`, by name."""
        self.alert_sinks: list[AlertSink] = [LogSink()]
        """Where the supervisor delivers alerts (by default, the log)."""

    def schedule(
        self,
        name: str,
        workflow: str | WorkflowFn,
        *,
        cron: str | None = None,
        every: _check.Duration | None = None,
        input: Any = None,
        timezone: str = "UTC",
        catch_up: str = "skip",
        tenant: str | None = None,
    ) -> ScheduleSpec:
        """Run `workflow` with `input` at each tick of `cron` (a cron expression, read in
        `timezone`) or `every` (a timedelta or seconds): the supervisor leader stores the
        schedule and creates exactly one task per tick, whose id is the schedule's name and the tick
        (`NAME@2026-11-24T02:00:00+00:00`). Ticks missed while no supervisor ran: "skip"
        (those over a minute late are skipped), "all" (each gets its task), "latest" (only the
        newest does); the ticks that come while it is paused are never made. Its tasks run the
        newest version of the workflow this App declares, under `tenant` (None: none).
        ConfigurationError for a bad declaration, a cron expression that never fires
        (`0 0 30 2 *`) included."""
        _check.name("the schedule's name", name)
        if "@" in name:
            raise ConfigurationError(f"a schedule's name cannot hold '@': {_check.shown(name)}")
        wf = self.find_workflow(workflow)
        if (cron is None) == (every is None):
            raise ConfigurationError(f"schedule {name!r}: give cron or every, one of the two")
        if cron is not None and (not isinstance(cron, str) or not croniter.is_valid(cron)):
            raise ConfigurationError(
                f"schedule {name!r}: not a cron expression: {_check.shown(cron)}"
            )
        if every is not None:
            every = _check.seconds(f"schedule {name!r}: every", every, 1, MAX_WAIT.total_seconds())
        try:
            ZoneInfo(timezone)
        except (ValueError, TypeError, ZoneInfoNotFoundError):
            raise ConfigurationError(
                f"schedule {name!r}: unknown time zone {_check.shown(timezone)}"
            ) from None
        if catch_up not in CATCH_UP:
            raise ConfigurationError(
                f"schedule {name!r}: catch_up must be one of {', '.join(CATCH_UP)}, not "
                f"{_check.shown(catch_up)}"
            )
        if name in self.schedule_specs:
            raise ConfigurationError(f"schedule {name!r} is declared twice")
        if tenant is not None:
            _check.tenant(tenant)
        spec = ScheduleSpec(
            name=name,
            workflow=wf.name,
            input=_json.dumps(
                input,
                what=f"the input of schedule {name!r}",
                seal=self._seal(Binding.schedule(name)),
            ),
            complete_within=wf.complete_within.total_seconds(),
            max_failures=wf.max_failures,
            on_failure=str(wf.on_failure),
            cron=cron,
            every=None if every is None else float(every),
            timezone=timezone,
            catch_up=catch_up,
            version=wf.version,
            tenant=tenant,
        )
        rules.first_tick(spec, time.time())  # a cron expression that never fires is refused here
        self.schedule_specs[name] = spec
        return spec

    async def schedules_async(self) -> list[ScheduleRecord]:
        """The schedules stored (by a supervisor leader), with their next tick."""
        return await (await self.store()).schedules()

    async def pause_schedule_async(self, name: str, *, paused: bool = True) -> None:
        """Pause a schedule (no task is created for its ticks until it is resumed), or resume
        it (`paused=False`). Raises UnknownNameError for a schedule not stored."""
        _check.name("the schedule's name", name)
        if not await (await self.store()).pause_schedule(name, paused):
            raise UnknownNameError(f"no schedule {name!r} is stored (a supervisor stores them)")

    async def trigger_schedule_async(self, name: str) -> str:
        """Run a stored schedule's workflow now, once, apart from its ticks; the task's id."""
        _check.name("the schedule's name", name)
        found = [s for s in await (await self.store()).schedules() if s.name == name]
        if not found:
            raise UnknownNameError(f"no schedule {name!r} is stored (a supervisor stores them)")
        s = found[0]
        task_id = f"{name}@now-{uuid.uuid4().hex[:12]}"
        task = Submission(
            task_id=task_id,
            workflow=s.workflow,
            input=_json.dumps(
                s.input,
                what=f"the input of schedule {name!r}",
                seal=self._seal(Binding.input(task_id)),
            ),
            input_digest=input_digest(_json.plain(s.input), self.keys),
            priority=0,
            complete_within=s.complete_within,
            max_failures=s.max_failures,
            on_failure=s.on_failure,
            version=s.version,
            tenant=s.tenant,
        )
        [answer] = await (await self.store()).submit([task])
        refuse_conflict(task, answer)
        return task.task_id

    def schedules(self) -> list[ScheduleRecord]:
        """The blocking form of `schedules_async`."""
        return self._call(self.schedules_async())

    def pause_schedule(self, name: str, *, paused: bool = True) -> None:
        """The blocking form of `pause_schedule_async`."""
        self._call(self.pause_schedule_async(name, paused=paused))

    def trigger_schedule(self, name: str) -> str:
        """The blocking form of `trigger_schedule_async`."""
        return self._call(self.trigger_schedule_async(name))

    def add_alert_sink(self, sink: AlertSink) -> None:
        """Deliver alerts to `sink` too (a WebhookSink, a CallableSink, or your own)."""
        if not isinstance(getattr(sink, "name", None), str) or not callable(
            getattr(sink, "send", None)
        ):
            raise ConfigurationError(
                f"an alert sink needs a name and a send(alert) method, not {_check.shown(sink)}"
            )
        if any(s.name == sink.name for s in self.alert_sinks):
            shown = public_name(sink.name)
            raise ConfigurationError(f"an alert sink named {shown!r} is already added")
        self.alert_sinks.append(sink)

    # -- declarations ---------------------------------------------------------------------
    def agent(
        self, name: str, *, retry: Retry | None = None, breaker: Breaker | None = None
    ) -> Agent:
        """Declare an agent: the operations that call one remote service. `breaker` gives
        each instance of it a circuit breaker (`stepwarden.Breaker`)."""
        if name in self.agents:
            raise ConfigurationError(f"agent {name!r} is already declared")
        agent = Agent(name, retry=retry, breaker=breaker)
        self.agents[name] = agent
        return agent

    @overload
    def workflow(
        self,
        fn: W,
        *,
        name: str | None = None,
        complete_within: _check.Duration = ...,
        max_failures: int = 3,
        on_failure: OnFailure | str = OnFailure.COMPENSATE,
        alert_after: int = 3,
        version: int = 1,
        stuck_after: _check.Duration | None = None,
    ) -> W: ...

    @overload
    def workflow(
        self,
        fn: None = None,
        *,
        name: str | None = None,
        complete_within: _check.Duration = ...,
        max_failures: int = 3,
        on_failure: OnFailure | str = OnFailure.COMPENSATE,
        alert_after: int = 3,
        version: int = 1,
        stuck_after: _check.Duration | None = None,
    ) -> Callable[[W], W]: ...

    def workflow(
        self,
        fn: W | None = None,
        *,
        name: str | None = None,
        complete_within: _check.Duration = timedelta(seconds=30),
        max_failures: int = 3,
        on_failure: OnFailure | str = OnFailure.COMPENSATE,
        alert_after: int = 3,
        version: int = 1,
        stuck_after: _check.Duration | None = None,
    ) -> W | Callable[[W], W]:
        """Declare a workflow: an async function `(ctx, input) -> result`.

        `complete_within` (a timedelta or seconds) bounds each claim of the task (its
        complete_by) and is the default
        deadline of each step; `max_failures` is how many expiries the supervisor tolerates
        before the task is given up. `on_failure` says what a task that cannot succeed
        does: "compensate" (undo its completed steps, the default), "retry" (at
        max_failures, wait for the fault to clear with a growing backoff) or "stop" (Error,
        for the operator). `alert_after` raises an alert when a step is dispatched that many
        times (its complete_by passed again and again).

        `version` (an integer, 1 by default) declares one version of the workflow `name`
        beside the others: a task runs to its end on the version it was submitted with
        (the newest the submitting App declares, unless `submit(..., version=N)`), and a
        scheduler claims only the tasks of the versions its App declares.

        `stuck_after` (a duration; None, the default, turns it off) raises one alert
        `task_stuck` for a task of this workflow that has not moved for that long, with what
        holds it (`App.why`): once per task and reason (see docs/howto/why.md).
        """
        stuck = None if stuck_after is None else _check.seconds("stuck_after", stuck_after, 1e-3)
        try:
            policy = OnFailure(on_failure)
        except ValueError:
            choices = ", ".join(p.value for p in OnFailure)
            raise ConfigurationError(
                f"on_failure must be one of {choices}, not {on_failure!r}"
            ) from None

        def register(fn: W) -> W:
            declared: object = fn  # checked apart: the check would narrow fn's type
            if not asyncio.iscoroutinefunction(declared):
                what = getattr(fn, "__name__", None) or _check.shown(fn)
                raise ConfigurationError(f"workflow {what!r} must be an async function")
            wf_name = _check.name("the workflow's name", fn.__name__ if name is None else name)
            wf = Workflow(
                wf_name,
                fn,
                as_within(f"workflow {wf_name!r}", complete_within),
                max_failures,
                on_failure=policy,
                alert_after=alert_after,
                version=version,
                stuck_after=stuck,
            )
            if wf.key in self._workflows:
                raise ConfigurationError(
                    f"workflow {wf_name!r} version {version} is already declared"
                )
            self._workflows[wf.key] = wf
            if self.workflows[wf_name] is wf:  # the newest: the schedules of it run it now
                for spec in list(self.schedule_specs.values()):
                    if spec.workflow == wf_name:
                        self.schedule_specs[spec.name] = _for_version(spec, wf)
            fn.__stepwarden_workflow__ = wf_name  # type: ignore[attr-defined]
            return fn

        return register(fn) if fn is not None else register

    @property
    def workflows(self) -> dict[str, Workflow]:
        """The newest version of each declared workflow, by name: what a submit runs unless
        it names a version."""
        newest: dict[str, Workflow] = {}
        for _, wf in sorted(self._workflows.items()):
            newest[wf.name] = wf
        return newest

    @property
    def workflow_versions(self) -> dict[tuple[str, int], Workflow]:
        """Every declared workflow, by (name, version): what this App's schedulers run."""
        return dict(sorted(self._workflows.items()))

    def find_workflow(self, workflow: str | WorkflowFn, version: int | None = None) -> Workflow:
        """The workflow named (by its name, or by the function of any of its versions) at
        `version`, or at its newest version when None (`rules.submit_version`)."""
        wf_name = workflow_name(workflow)
        versions = {v: wf for (n, v), wf in self._workflows.items() if n == wf_name}
        if not versions:
            known = ", ".join(sorted(self.workflows)) or "none"
            raise UnknownNameError(f"unknown workflow {wf_name!r} (declared: {known})")
        return versions[submit_version(wf_name, versions, version)]

    # -- the store, per event loop --------------------------------------------------------
    async def store(self) -> ApplicationStore:
        """The store opened for the running event loop (opened on first use), as the
        application may use it (`store.ports.ApplicationStore`): what the App itself asks
        (submit, the task's reads, events, operator actions, schedules, the wake-ups) and the
        dashboard's reads (`ReadPort`). The actors' calls (claims, sweeps, the agents'
        writes) are outside it: a worker runs them on a store of its own."""
        loop = asyncio.get_running_loop()
        store = self._stores.get(loop)
        if store is not None:
            return store
        async with self._opening.setdefault(loop, asyncio.Lock()):
            store = self._stores.get(loop)
            if store is None:
                store = open_store(self.store_url, keys=self.keys)
                await store.open(migrate=self.auto_migrate)
                self._stores[loop] = store
        return store

    async def _one_database(self, what: str, why: str) -> Store:
        """The store, when it is one database: what only one database serves (a transaction
        of the application's, a channel's messages from an id on) is refused on a store of
        shards, saying why."""
        store = await self.store()
        if not isinstance(store, Store):
            raise ConfigurationError(f"{what} is not served by a sharded store: {why}")
        return store

    async def _listening(self) -> ApplicationStore:
        """The store, listening for other processes' wake-ups (from the first caller that
        follows something on: a process that only submits does not listen, and so costs the
        database no work at each wake-up)."""
        store = await self.store()
        with contextlib.suppress(StoreError):  # unreachable: it polls, and listens next time
            await store.listen()
        return store

    async def aclose(self) -> None:
        """Close what the App opened for the running event loop: its submits are written,
        its store closed (connections, the pool's and the listener's tasks). The App may be
        used again after: it opens them anew."""
        submits = self._submits.pop(asyncio.get_running_loop(), None)
        if submits is not None:
            await submits.drain()
        store = self._stores.pop(asyncio.get_running_loop(), None)
        self._opening.pop(asyncio.get_running_loop(), None)
        if store is not None:
            await store.close()

    def close(self) -> None:
        """Close what the blocking calls opened: their store, and the thread their event
        loop runs in."""
        if self._portal is not None:
            self._portal.call(self.aclose())
            self._portal.stop()
            self._portal = None

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> App:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
        if self._portal is not None:  # blocking calls made inside the block, from a thread
            await asyncio.to_thread(self.close)

    def _seal(self, at: Binding) -> _json.Seal:
        """Where a write of this App's secrets goes: sealed there with its keyring."""
        return _json.Seal(self.keys, at)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._portal is None:
            self._portal = _Portal()
        return self._portal.call(coro)

    # -- submitting -----------------------------------------------------------------------
    def new_task(
        self,
        workflow: str | WorkflowFn,
        input: Any = None,
        *,
        submitted_by: str | None = None,
        **options: Unpack[SubmitOptions],
    ) -> Submission:
        """Validate a submit and build its `Submission`, without writing anything: what
        every submit writes (`submit`, `submit_many`, `TaskTransaction.submit`, the
        application API, `stepwarden submit`). The task runs the newest version of the
        workflow this App declares, or `version`. `submitted_by`: the application API's
        client that submits it (recorded with it, and compared at a re-submit)."""
        unknown = sorted(set(options) - set(SUBMIT_OPTIONS))
        if unknown:
            raise TypeError(f"unknown submit options: {', '.join(unknown)}")
        asked: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        wf = self.find_workflow(workflow, asked.pop("version", None))
        if "start_at" in asked and "start_after" in asked:
            raise ConfigurationError("give start_at or start_after, not both")
        start_at = asked.get("start_at")
        if start_at is not None and (not isinstance(start_at, datetime) or not start_at.tzinfo):
            raise ConfigurationError(
                f"start_at must be a datetime with its time zone, not {_check.shown(start_at)}"
            )
        if "start_after" in asked:
            asked["start_after"] = _check.seconds(
                "start_after", asked["start_after"], 0, MAX_WAIT.total_seconds()
            )
        task_id = asked.pop("task_id") if "task_id" in asked else uuid.uuid4().hex
        _check.new_task_id(task_id)
        if "priority" in asked:
            _check.integer("priority", asked["priority"], -_check.MAX_INT - 1)
        reply_to = asked.get("reply_to")
        if reply_to is not None and not _check.name("reply_to", reply_to).strip():
            raise ConfigurationError("reply_to must be a non-empty channel name")
        if reply_to is not None and is_destination(reply_to):
            self.destinations.check(reply_to)  # listed, never with credentials
        if "tenant" in asked:
            _check.tenant(asked["tenant"])
        if "tags" in asked:
            asked["tags"] = _check.tags(asked["tags"])
        text = _json.dumps(input, what="the task input", seal=self._seal(Binding.input(task_id)))
        return Submission(
            workflow=wf.name,
            input=text,
            task_id=task_id,
            version=wf.version,
            complete_within=wf.complete_within.total_seconds(),
            max_failures=wf.max_failures,
            on_failure=str(wf.on_failure),
            submitted_by=submitted_by,
            input_digest=input_digest(_json.plain(input), self.keys),
            **asked,
        )

    @overload
    async def submit_async(
        self,
        workflow: Callable[[Context, In], Awaitable[R]],
        input: In,
        **options: Unpack[SubmitOptions],
    ) -> TaskId[R]: ...

    @overload
    async def submit_async(
        self,
        workflow: Callable[[Context, None], Awaitable[R]],
        input: None = None,
        **options: Unpack[SubmitOptions],
    ) -> TaskId[R]: ...

    @overload
    async def submit_async(
        self, workflow: str, input: Any = None, **options: Unpack[SubmitOptions]
    ) -> TaskId[Any]: ...

    async def submit_async(
        self, workflow: str | WorkflowFn, input: Any = None, **options: Unpack[SubmitOptions]
    ) -> TaskId[Any]:
        """Submit a task; returns its id. The options are the fields of
        `stepwarden.Submission` (`task_id`, `priority`, `reply_to`, `start_at`,
        `start_after`, `version`, `tags`). With `tags` (`{"customer": "c-42"}`: at most 16,
        keys of at most 64 characters, values of at most 256; ConfigurationError beyond),
        the task is found by them (`tasks(tags=...)`). With `reply_to`, the task's status
        messages (received, step_completed, processed, error, compensating, compensated,
        ...) are published on that channel: follow them with `watch(task_id)` or
        `subscribe(channel)`. With `start_at` (a datetime with its time zone) or
        `start_after` (a timedelta or seconds, by the store's clock), the task waits
        (`waiting`, for "start") until then. The task runs to its end on the newest version
        of the workflow this App declares, or on `version` (one it declares).

        A `task_id` submitted before creates nothing: the same submit (the same workflow,
        version and input, from Python) returns the id, its other options ignored; another
        raises SubmitConflict, naming what differs."""
        return await self._submit(self.new_task(workflow, input, **options))

    async def _submit(self, task: Submission) -> TaskId[Any]:
        refuse_conflict(task, await self.submit_one_async(task))
        return TaskId(task.task_id)

    async def submit_one_async(self, task: Submission) -> Submitted:
        """Submit a task built with `new_task`, in the group commit that `submit_async`'s
        callers share: the store's answer, created, the same submit as the task of its id
        (left as it is), or a conflict with it (nothing written; not raised here)."""
        loop = asyncio.get_running_loop()
        submits = self._submits.get(loop)
        if submits is None:
            submits = self._submits[loop] = Batcher((await self.store()).submit)
        if not tracing.active():
            answer = await submits.submit(task)
        else:
            with _submit_span(task.workflow, [task]) as span:
                task = dataclasses.replace(task, trace_context=tracing.stored(span))
                answer = await submits.submit(task)
                _answered(span, answer)
        if answer.created:
            self._created[task.task_id] = True
            if len(self._created) > CREATED_KEPT:
                self._created.popitem(last=False)
        return answer

    @overload
    def submit(
        self,
        workflow: Callable[[Context, In], Awaitable[R]],
        input: In,
        **options: Unpack[SubmitOptions],
    ) -> TaskId[R]: ...

    @overload
    def submit(
        self,
        workflow: Callable[[Context, None], Awaitable[R]],
        input: None = None,
        **options: Unpack[SubmitOptions],
    ) -> TaskId[R]: ...

    @overload
    def submit(
        self, workflow: str, input: Any = None, **options: Unpack[SubmitOptions]
    ) -> TaskId[Any]: ...

    def submit(
        self, workflow: str | WorkflowFn, input: Any = None, **options: Unpack[SubmitOptions]
    ) -> TaskId[Any]:
        """The blocking form of `submit_async`."""
        return self._call(self._submit(self.new_task(workflow, input, **options)))

    # -- events from outside ----------------------------------------------------------------
    async def send_event_async(
        self, task_id: str, name: str, payload: Any = None, *, event_id: str | None = None
    ) -> SendOutcome:
        """Send the event `name` with its JSON `payload` to a task: kept until its workflow
        waits for that name (`ctx.wait_for_event`), and waking the task at once if it waits
        for it now, in one transaction. `event_id` makes the send idempotent: an event_id sent
        before is not sent again (`SendOutcome.sent` is False, whatever the task's state now:
        also once that event has finished the task). Raises TaskNotFound, or EventRefused when
        the task is finished (for an event_id it never took) or the event is beyond a bound
        (`max_events_per_task`, `max_event_payload`)."""
        event = self._event(task_id, name, payload, event_id)
        got = await (await self.store()).send_event(*event, self.event_bounds)
        return _sent(task_id, name, got)

    def send_event(
        self, task_id: str, name: str, payload: Any = None, *, event_id: str | None = None
    ) -> SendOutcome:
        """The blocking form of `send_event_async`."""
        return self._call(self.send_event_async(task_id, name, payload, event_id=event_id))

    def _event(
        self, task_id: str, name: str, payload: Any, event_id: str | None
    ) -> tuple[str, str, str, str]:
        _check.name("task_id", task_id)
        _check.name("the event's name", name)
        if event_id is None:
            event_id = uuid.uuid4().hex
        _check.name("event_id", event_id)
        seal = self._seal(Binding.event(task_id, event_id))
        return task_id, name, _json.dumps(payload, what="the event's payload", seal=seal), event_id

    async def submit_many_async(self, tasks: Sequence[Submission]) -> list[Submitted]:
        """Submit tasks built with `new_task` in one transaction: the store's answer to
        each, created, the same submit as the task of its id, or a conflict with it
        (nothing raised: a conflict creates nothing, and the others are written). Traced,
        they share one submit span (the parent of their runs)."""
        store = await self.store()
        if not tracing.active() or not tasks:
            return await store.submit(tasks)
        with _submit_span(tasks[0].workflow, tasks) as span:
            context = tracing.stored(span)
            answers = await store.submit(
                [
                    t if t.trace_context else dataclasses.replace(t, trace_context=context)
                    for t in tasks
                ]
            )
            span.set_attributes(tracing.attributes(created=sum(a.created for a in answers)))
            return answers

    def submit_many(self, tasks: Sequence[Submission]) -> list[Submitted]:
        """The blocking form of `submit_many_async`."""
        return self._call(self.submit_many_async(tasks))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[TaskTransaction]:
        """A transaction in which the application writes its own rows and submits tasks, so
        that both commit together or neither does (the pattern's order submission)."""
        store = await self._one_database(
            "a transaction of the application's",
            "its writes and its submits would commit on one database, and a submit made in it "
            "would not be placed by the shard map",
        )
        async with store.transaction() as tx:
            yield TaskTransaction(self, tx)

    # -- following ------------------------------------------------------------------------
    async def status_async(self, task_id: str) -> TaskRecord:
        _check.name("task_id", task_id)
        task = await (await self.store()).get_task(task_id)
        if task is None:
            raise TaskNotFound(f"no task {task_id!r}")
        return task

    def status(self, task_id: str) -> TaskRecord:
        return self._call(self.status_async(task_id))

    async def task_status_async(self, task_id: str) -> TaskStatus:
        """The task's status (`stepwarden.TaskStatus`): its state and what it waits for, as
        the application API answers it (`GET /api/v1/tasks/{task_id}`). TaskNotFound for an
        unknown task."""
        return status_of(await self.status_async(task_id))

    def task_status(self, task_id: str) -> TaskStatus:
        """The blocking form of `task_status_async`."""
        return self._call(self.task_status_async(task_id))

    @overload
    async def result_async(
        self, task_id: TaskId[R], *, timeout: _check.Duration | None = None
    ) -> R: ...

    @overload
    async def result_async(self, task_id: Id, *, timeout: _check.Duration | None = None) -> Any: ...

    async def result_async(self, task_id: str, *, timeout: _check.Duration | None = None) -> Any:
        """Wait until the task finishes: its result when processed; TaskFailed when it ended
        otherwise (error, compensated, compensation_failed, cancelled); ResultTimeout when
        `timeout` (a timedelta or seconds) passes first; TaskNotFound for an unknown task.
        While the store is unreachable it goes on waiting, within `timeout`. Given a
        `TaskId[R]` (what `submit` returns), the result is typed `R`."""
        _check.name("task_id", task_id)
        timeout = _check.timeout(timeout)
        store = await self._listening()
        sub = store.subscribe(CHANNEL_TASK_DONE)
        awaited = False  # once the store knows of this wait, the task's end wakes `sub`
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        if awaited:
                            task = await store.get_task(task_id)
                        else:
                            task = await store.await_task(
                                task_id, created_here=self._created.pop(task_id, False)
                            )
                            awaited = True
                    except TransientStoreError:  # wait for the store as for the task
                        await sub.wait(store.default_poll_interval)
                        continue
                    if task is None:
                        raise TaskNotFound(f"no task {task_id!r}")
                    if task.process_state in FINISHED_TASK_STATES:
                        if task.process_state != TaskState.PROCESSED:
                            raise TaskFailed(task_id, task.error, str(task.process_state))
                        return task.result
                    await sub.wait(store.default_poll_interval)
        except TimeoutError:
            raise ResultTimeout(f"task {task_id!r} did not finish within {timeout:g}s") from None
        finally:
            store.unsubscribe(CHANNEL_TASK_DONE, sub)

    @overload
    def result(self, task_id: TaskId[R], *, timeout: _check.Duration | None = None) -> R: ...

    @overload
    def result(self, task_id: Id, *, timeout: _check.Duration | None = None) -> Any: ...

    def result(self, task_id: str, *, timeout: _check.Duration | None = None) -> Any:
        """The blocking form of `result_async`."""
        return self._call(self.result_async(task_id, timeout=timeout))

    async def show_async(
        self, task_id: str, *, events: int = 100, events_before: int | None = None
    ) -> TaskView:
        """The task, its steps and a page of its history: the newest `events` events, or
        those before the event id `events_before`."""
        _check.name("task_id", task_id)
        _check.integer("events", events, 1, MAX_EVENT_PAGE)
        if events_before is not None:
            _check.integer("events_before", events_before, 1, _check.MAX_BIGINT)
        store = await self.store()
        task = await store.get_task(task_id)
        if task is None:
            raise TaskNotFound(f"no task {task_id!r}")
        page = await store.history(task_id, limit=events, before=events_before)
        steps = await store.get_steps(task_id)
        children = await store.children(task_id)
        return TaskView(task, steps, page.events, page.more, children)

    def show(
        self, task_id: str, *, events: int = 100, events_before: int | None = None
    ) -> TaskView:
        return self._call(self.show_async(task_id, events=events, events_before=events_before))

    def operation_limits(self) -> dict[tuple[str, str], OpLimit]:
        """The limits of the declared operations, by (agent, operation), as the store
        judges them (concurrency and rate across every process)."""
        return {
            (agent.name, name): OpLimit(
                concurrency=op.limit.concurrency, rate=op.limit.rate, per=float(op.limit.per)
            )
            for agent in self.agents.values()
            for name, op in agent.operations.items()
            if op.limit is not None
        }

    async def why_async(self, task_id: str) -> Why:
        """Why the task waits: what holds it now, and each of its open steps, as data
        (`Gate`: a `WaitReason` and its facts), decided by `rules.task_gate` and
        `rules.step_gate` from what the store holds, with this App's operation limits."""
        _check.name("task_id", task_id)
        found = await (await self.store()).why_facts(task_id, self.operation_limits())
        if found is None:
            raise TaskNotFound(f"no task {task_id!r}")
        facts, steps = found
        t = facts.task
        gate = task_gate(facts)
        open_steps = tuple(
            StepWhy(
                seq=f.step.seq,
                name=f.step.name,
                agent=f.step.agent,
                operation=f.step.operation,
                state=f.step.state,
                gate=step_gate(f),
            )
            for f in steps
        )
        return Why(
            task_id=t.task_id,
            workflow=t.workflow,
            version=t.version,
            state=t.process_state,
            gate=gate,
            steps=open_steps,
            holding=holding_gate(gate, [s.gate for s in open_steps]),
        )

    def why(self, task_id: str) -> Why:
        return self._call(self.why_async(task_id))

    async def tasks_async(
        self,
        *,
        state: TaskState | str | None = None,
        workflow: str | None = None,
        limit: int = 100,
        version: int | None = None,
        tenant: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> list[TaskRecord]:
        """Tasks, oldest first, optionally of one state, one workflow, one version and one
        tenant ("": the tasks of none), and having every tag of `tags` (`{"customer":
        "c-42"}`), read through the tags' index."""
        wanted = _check.state(state)
        if workflow is not None:
            _check.name("workflow", workflow)
        if version is not None:
            _check.integer("version", version, 1)
        if tenant:
            _check.tenant(tenant)
        _check.integer("limit", limit, 1)
        tagged = None if tags is None else _check.tags(tags)
        return await (await self.store()).list_tasks(
            state=wanted,
            workflow=workflow,
            version=version,
            limit=limit,
            tenant=tenant,
            tags=tagged,
        )

    def tasks(
        self,
        *,
        state: TaskState | str | None = None,
        workflow: str | None = None,
        limit: int = 100,
        version: int | None = None,
        tenant: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> list[TaskRecord]:
        """The blocking form of `tasks_async`."""
        return self._call(
            self.tasks_async(
                state=state,
                workflow=workflow,
                limit=limit,
                version=version,
                tenant=tenant,
                tags=tags,
            )
        )

    async def agent_instances_async(self) -> list[AgentInstance]:
        """The agent registry: every instance, alive or gone (for an hour), with its
        operations, capacity, calls in flight and circuit breaker."""
        return await (await self.store()).list_agents()

    def agent_instances(self) -> list[AgentInstance]:
        return self._call(self.agent_instances_async())

    async def scheduler_instances_async(self) -> list[SchedulerInstance]:
        """The scheduler registry: every instance, alive or gone (for an hour), with the
        tasks it holds and how many it drives at once."""
        return await (await self.store()).list_schedulers()

    def scheduler_instances(self) -> list[SchedulerInstance]:
        return self._call(self.scheduler_instances_async())

    # -- status messages ------------------------------------------------------------------
    async def watch(self, task_id: str, *, after: int = 0) -> AsyncIterator[OutboxMessage]:
        """Every status message of a task submitted with `reply_to`, in order, from the
        first ("received"), or those after the message id `after` (the last one handled);
        the iteration ends after the message of a finished state, or at once when the task
        had finished and no message comes after `after`."""
        _check.integer("after", after, 0, _check.MAX_BIGINT)
        task = await self.status_async(task_id)
        if task.reply_to is None:
            raise ConfigurationError(
                f"task {task_id!r} was submitted without reply_to: it has no status messages"
            )
        if task.process_state in FINISHED_TASK_STATES:
            # Its messages are written with its states, in their transactions: all are kept.
            store = await self.store()
            while True:
                batch = await store.outbox(
                    channel=task.reply_to, task_id=task_id, after=after, limit=500
                )
                for message in batch:
                    yield message
                    after = message.id
                if len(batch) < 500:
                    return
        async for message in self._follow(channel=task.reply_to, task_id=task_id, after=after):
            yield message
            if message.kind in FINISHED_TASK_STATES:
                return

    async def subscribe(self, channel: str, *, after: int = 0) -> AsyncIterator[OutboxMessage]:
        """The status messages published on `channel`, for as long as the caller iterates:
        those already kept (after the message id `after`; keep the last id you handled to
        resume from it), then each new one, at least once and each once per iterator."""
        _check.name("channel", channel)
        _check.integer("after", after, 0, 2**63 - 1)
        async for message in self._follow(channel=channel, after=after):
            yield message

    async def _follow(
        self, *, channel: str | None = None, task_id: str | None = None, after: int = 0
    ) -> AsyncIterator[OutboxMessage]:
        # Ids are given at insert and commits may land out of id order (PostgreSQL), so the
        # read starts again from the newest id seen more than FOLLOW_SETTLE seconds earlier
        # (by the database clock), and ids already yielded are skipped.
        store = await self._listening()
        if task_id is None:
            channel_store = await self._one_database(
                "a channel's status messages", "message ids are each shard's: follow one task's"
            )
        sub = store.subscribe(CHANNEL_OUTBOX)
        low = after
        seen: dict[int, datetime] = {}
        try:
            while True:
                try:
                    if task_id is not None:
                        batch = await store.outbox(
                            task_id=task_id, channel=channel, after=low, limit=500
                        )
                    else:  # a channel's ids are one database's
                        batch = await channel_store.outbox(channel=channel, after=low, limit=500)
                except TransientStoreError:  # the store is away: wait for it, as for news
                    await sub.wait(store.default_poll_interval * 4)
                    continue
                for message in batch:
                    if message.id not in seen:
                        seen[message.id] = message.at
                        yield message
                if seen:
                    newest = max(seen.values())
                    settled = [
                        i for i, at in seen.items() if (newest - at).total_seconds() > FOLLOW_SETTLE
                    ]
                    if settled:
                        low = max(low, max(settled))
                        seen = {i: at for i, at in seen.items() if i > low}
                if len(batch) == 500:
                    continue
                await sub.wait(store.default_poll_interval * 4)
        finally:
            store.unsubscribe(CHANNEL_OUTBOX, sub)

    # -- the operator ---------------------------------------------------------------------
    async def operate_async(
        self,
        action: str,
        task_ids: Sequence[str] | None = None,
        *,
        state: TaskState | str | None = None,
        workflow: str | None = None,
        limit: int = 10_000,
        reason: str | None = None,
        by: str | None = None,
        dry_run: bool = False,
        seq: int | None = None,
        result: Any = None,
        identity: str | None = None,
    ) -> list[ActionOutcome]:
        """Apply an operator action (retry, skip, pause, resume, cancel, compensate) to the
        tasks named, or to those matching `state` and `workflow` (bulk). Each action is
        recorded in the task's history with `by` (default: the user running this) and
        `reason`, and `identity` (how the caller was authenticated, as `authenticated`) when
        given. With `dry_run`, nothing is written: each outcome says what would happen."""
        if not isinstance(action, str) or action not in OPERATOR_ACTIONS:
            known = ", ".join(OPERATOR_ACTIONS)
            raise ConfigurationError(f"unknown action {_check.shown(action)} (known: {known})")
        if action == "skip" and (seq is None or task_ids is None):
            raise ConfigurationError("skip needs the task and the step (seq)")
        if task_ids is None and state is None and workflow is None:
            raise ConfigurationError("name the tasks, or a filter (state, workflow)")
        if task_ids is not None:
            task_ids = _check.task_ids(task_ids)
        wanted = _check.state(state)
        if workflow is not None:
            _check.name("workflow", workflow)
        _check.integer("limit", limit, 1)
        _check.text("reason", reason)
        if by is not None:
            _check.name("by", by)
        if identity is not None:
            _check.name("identity", identity)
        _check.flag("dry_run", dry_run)
        if seq is not None:
            _check.integer("seq", seq, 1)
        if action == "skip":
            _json.dumps(result, what="the step result")  # refused now, before anything is read
        store = await self.store()
        if task_ids is None:
            found = await store.list_tasks(state=wanted, workflow=workflow, limit=limit)
            task_ids = [t.task_id for t in found]
        actions = [
            OperatorAction(
                action=action,  # type: ignore[arg-type]
                task_id=task_id,
                actor=by or _operator_name(),
                reason=reason,
                seq=seq,
                result=None
                if action != "skip" or seq is None
                else _json.dumps(
                    result, what="the step result", seal=self._seal(Binding.step(task_id, seq))
                ),
                identity=identity,
            )
            for task_id in task_ids
        ]
        if dry_run:
            return [await self._preview(store, a) for a in actions]
        outcomes: list[ActionOutcome] = []
        for i in range(0, len(actions), 500):
            outcomes.extend(await store.operate(actions[i : i + 500]))
        return outcomes

    def operate(
        self, action: str, task_ids: Sequence[str] | None = None, **kwargs: Any
    ) -> list[ActionOutcome]:
        """The blocking form of `operate_async`."""
        return self._call(self.operate_async(action, task_ids, **kwargs))

    # -- redrives with a plan ---------------------------------------------------------------
    async def retry_plan_async(self, task_id: str) -> Redrive:
        """What `operate_async("retry", [task_id])` would do to each recorded step of the task
        (`rules.plan_retry`), changing nothing: from error, a completed step is kept and a
        failed one runs again under the same idempotency key; from compensation_failed, a
        step to undo is undone (its compensation runs again). `applied` is False; `message`
        says the move, or why a retry is refused."""
        _check.name("task_id", task_id)
        store = await self.store()
        task = await store.get_task(task_id)
        if task is None:
            raise TaskNotFound(f"no task {task_id!r}")
        steps = await store.get_steps(task_id)
        outcome = self._retry_move(task.process_state)
        return Redrive(
            action="retry",
            task_id=task_id,
            runs_as=task_id,
            applied=False,
            steps=tuple(plan_retry(task_id, task.process_state, steps)),
            message=outcome,
            refused=task.process_state not in OPERATOR_ACTIONS["retry"],
        )

    def retry_plan(self, task_id: str) -> Redrive:
        """The blocking form of `retry_plan_async`."""
        return self._call(self.retry_plan_async(task_id))

    @staticmethod
    def _retry_move(state: TaskState) -> str:
        moves = OPERATOR_ACTIONS["retry"]
        if state not in moves:
            return f"cannot retry a task that is {state} (only when {', '.join(sorted(moves))})"
        return f"would retry: {state} -> {moves[state]}"

    async def fork_async(
        self,
        task_id: str,
        *,
        start: str,
        new_task_id: str | None = None,
        new_keys_from: int | None = None,
        plan: bool = False,
        by: str | None = None,
        reason: str | None = None,
        identity: str | None = None,
    ) -> Redrive:
        """A new task of the same workflow, version, input, priority, bounds and tags as
        `task_id` (no `reply_to`: the App need not declare its workflow), whose
        steps before the place `start` ("3", "2.1") keep their recorded results and whose
        steps from there on run again (DBOS's fork_workflow, Temporal's reset). The steps
        that run again carry the original's idempotency keys (`task_id/seq`: the service
        deduplicates), but for those of seq `new_keys_from` and after, which carry the
        fork's (`NEW/seq`). The fork keeps steps only: a wait recorded before `start` (a
        timer, an event, a child, a patch marker) refuses it. `new_task_id` defaults to
        `TASK~fork-` and a random suffix. With `plan`, nothing is written: the answer says
        what each step would do. Both tasks' history records the fork, `by` (default: the
        user running this), `reason` and `identity`. Refused (`applied` False, `message`
        why) for a task that is not finished or has no step at `start`; raises TaskNotFound
        for an unknown task."""
        _check.name("task_id", task_id)
        _check.name("start", start)
        if new_keys_from is not None:
            _check.integer("new_keys_from", new_keys_from, 1)
        for what, value in (("by", by), ("identity", identity)):
            if value is not None:
                _check.name(what, value)
        _check.text("reason", reason)
        _check.flag("plan", plan)
        store = await self.store()
        task = await store.get_task(task_id)
        if task is None:
            raise TaskNotFound(f"no task {task_id!r}")
        new_id = (
            new_task_id if new_task_id is not None else f"{task_id}~fork-{uuid.uuid4().hex[:8]}"
        )
        _check.new_task_id(new_id)
        text = _json.dumps(
            task.input, what="the task input", seal=self._seal(Binding.input(new_id))
        )
        new = Submission(
            workflow=task.workflow,
            input=text,
            task_id=new_id,
            priority=task.priority,
            version=task.version,
            tags=task.tags,
            complete_within=task.complete_within,
            max_failures=task.max_failures,
            on_failure=task.on_failure,
            input_digest=input_digest(_json.plain(task.input), self.keys),
        )
        if task.process_state not in FINISHED_TASK_STATES:
            why = f"task {task_id!r} is {task.process_state}: fork a finished task"
            return Redrive(action="fork", task_id=task_id, runs_as=new_id, applied=False,
                           steps=(), message=why, refused=True)  # fmt: skip
        detail: dict[str, Any] = {"action": "fork", "by": by or _operator_name(),
                                  "reason": reason, "from_position": start,
                                  "new_keys_from": new_keys_from}  # fmt: skip
        if identity is not None:
            detail["authenticated"] = identity
        return await store.fork(task_id, new, start, new_keys_from, detail, apply=not plan)

    def fork(self, task_id: str, **kwargs: Any) -> Redrive:
        """The blocking form of `fork_async`."""
        return self._call(self.fork_async(task_id, **kwargs))

    # -- bulk actions by filter ------------------------------------------------------------
    @staticmethod
    def check_filter(match: TaskFilter) -> TaskFilter:
        """`match` checked as every read and bulk action by filter checks it (each name, the
        tenant, the times with their zone, the tags), its tags as the store keeps them;
        ConfigurationError names the first field that is wrong."""
        if not isinstance(match, TaskFilter):
            raise ConfigurationError(f"a filter is a TaskFilter, not {_check.shown(match)}")
        for s in match.states:
            _check.state(s)
        if match.workflow is not None:
            _check.name("workflow", match.workflow)
        if match.version is not None:
            _check.integer("version", match.version, 1)
        if match.tenant:
            _check.tenant(match.tenant)
        _check.text("error", match.error)
        for what in ("created_after", "created_before", "finished_after", "finished_before"):
            at = getattr(match, what)
            if at is not None and (not isinstance(at, datetime) or at.tzinfo is None):
                raise ConfigurationError(f"{what} must be a datetime with its time zone")
        tags = None if match.tags is None else _check.tags(match.tags)
        states = frozenset(TaskState(s) for s in match.states)
        return dataclasses.replace(match, states=states, tags=tags)

    @classmethod
    def _bulk_filter(cls, match: TaskFilter, action: str) -> TaskFilter | None:
        """`match` checked, narrowed to the states `action` moves (`rules.bulk_states`); None
        when it leaves none."""
        if not isinstance(match, TaskFilter):
            raise ConfigurationError(f"a bulk action takes a TaskFilter, not {_check.shown(match)}")
        if not isinstance(action, str) or action not in BULK_ACTIONS:
            known = ", ".join(BULK_ACTIONS)
            raise ConfigurationError(f"unknown bulk action {_check.shown(action)} (known: {known})")
        checked = cls.check_filter(match)
        states = bulk_states(action, checked.states)
        if not states:
            return None
        return dataclasses.replace(checked, states=states)

    async def tasks_matching_async(
        self, match: TaskFilter, *, after: str | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        """The tasks `match` matches (a `TaskFilter`, as `bulk_async` takes), oldest first
        (by created time, then task id), at most `limit`; with `after`, those after that task
        only (the last of the page before: TaskNotFound when no task has that id)."""
        checked = self.check_filter(match)
        _check.integer("limit", limit, 1)
        if after is not None:
            _check.text("after", after)
        return await (await self.store()).list_matching(checked, after=after, limit=limit)

    def tasks_matching(self, match: TaskFilter, **kwargs: Any) -> list[TaskRecord]:
        """The blocking form of `tasks_matching_async`."""
        return self._call(self.tasks_matching_async(match, **kwargs))

    @staticmethod
    def _bulk_fork(action: str, fork: BulkFork | None) -> BulkFork | None:
        if (action == "fork") != (fork is not None):
            raise ConfigurationError("a bulk fork, and it alone, takes a BulkFork (fork=...)")
        if fork is not None:
            if not isinstance(fork, BulkFork):
                raise ConfigurationError(f"fork must be a BulkFork, not {_check.shown(fork)}")
            _check.name("start", fork.start)
            _check.name("name", fork.name)
            if fork.new_keys_from is not None:
                _check.integer("new_keys_from", fork.new_keys_from, 1)
        return fork

    async def bulk_plan_async(
        self,
        match: TaskFilter,
        action: str,
        *,
        after: str = "",
        fork: BulkFork | None = None,
        limit: int | None = None,
    ) -> BulkPlan:
        """What `bulk_async(match, action)` would do, changing nothing: the tasks `match`
        matches in a state `action` moves (a filter of other states alone matches none), their
        count per (workflow, version) and per move, for a retry or a fork the plan of their
        recorded steps summed (`retry_plan`, `fork(plan=True)`), and the first 5 task ids;
        with `after`, of the tasks whose id comes after it only (as `bulk_async`). With
        `limit`, of the first `limit` of them by id only: the plan's `last` is the last id
        it read, and `done` False when there may be more (`after=last` plans the next ones)."""
        _check.text("after", after)
        if limit is not None:
            _check.integer("limit", limit, 1)
        narrowed = self._bulk_filter(match, action)
        forking = self._bulk_fork(action, fork)
        store = await self.store()
        matched = skipped = skipped_forks = 0
        by_workflow: dict[tuple[str, int], int] = {}
        moves: dict[str, int] = {}
        steps: dict[str, int] = {}
        sample: list[str] = []
        last: str | None = None
        done = True
        while narrowed is not None:
            page = 500 if limit is None else min(500, limit - matched - skipped_forks)
            found = await store.select_tasks(narrowed, after=after, limit=page)
            for t in found:
                last = t.task_id
                planned: Sequence[StepPlan] = ()
                if forking is not None:
                    new_id = bulk_fork_id(t.task_id, forking.name)
                    if new_id is None:
                        skipped_forks += 1
                        continue  # a fork this bulk made
                    if await store.get_task(new_id) is not None:
                        move = None
                        skipped += 1
                    else:
                        redrive = await self.fork_async(
                            t.task_id, start=forking.start, new_task_id=new_id,
                            new_keys_from=forking.new_keys_from, plan=True,
                        )  # fmt: skip
                        fine = not redrive.refused
                        move = f"{t.process_state} -> fork" if fine else "refused"
                        planned = redrive.steps if fine else ()
                else:
                    move = f"{t.process_state} -> {OPERATOR_ACTIONS[action][t.process_state]}"
                    if action == "retry":
                        recorded = await store.get_steps(t.task_id)
                        planned = plan_retry(t.task_id, t.process_state, recorded)
                matched += 1
                pair = (t.workflow, t.version)
                by_workflow[pair] = by_workflow.get(pair, 0) + 1
                if move is not None:
                    moves[move] = moves.get(move, 0) + 1
                if len(sample) < 5:
                    sample.append(t.task_id)
                for p in planned:
                    steps[p.plan] = steps.get(p.plan, 0) + 1
            if len(found) < page:
                break
            after = found[-1].task_id
            if limit is not None and matched + skipped_forks >= limit:
                done = False
                break
        return BulkPlan(action=action, matched=matched, by_workflow=by_workflow, moves=moves,
                        steps=steps, sample=tuple(sample), skipped=skipped, last=last,
                        done=done)  # fmt: skip

    def bulk_plan(
        self,
        match: TaskFilter,
        action: str,
        *,
        after: str = "",
        fork: BulkFork | None = None,
        limit: int | None = None,
    ) -> BulkPlan:
        """The blocking form of `bulk_plan_async`."""
        return self._call(self.bulk_plan_async(match, action, after=after, fork=fork, limit=limit))

    async def bulk_async(
        self,
        match: TaskFilter,
        action: str,
        *,
        batch: int = 100,
        limit: int | None = None,
        after: str = "",
        fork: BulkFork | None = None,
        reason: str | None = None,
        by: str | None = None,
        identity: str | None = None,
        progress: Callable[[BulkProgress], None] | None = None,
    ) -> BulkProgress:
        """Apply `action` (retry, cancel, compensate, pause, resume, fork) to every task
        `match` matches in a state it moves, by task id, `batch` tasks at a time, each batch
        through `operate_async` (the same rules, and history entry, as an action on one task;
        a fork through `fork_async`, as `fork`, a `BulkFork`, says), until none is left or
        `limit` tasks were reached; `progress` is called after each batch.

        Resumable: a task acted on is in a state the action does not move, so it no longer
        matches, and the same call again goes on with the rest (a task that came back to such
        a state meanwhile, retried and failed again, matches again: `after`, the `last` id
        the interrupted run reported, goes on strictly after it). A forked task stays as it
        was, but its fork's id (`TASK~NAME`) is taken: the same call again counts it in
        `skipped` and forks it no second time; the forks themselves are left alone. A task
        that moved between the read and its action is refused, counted in `refused`, and
        left as it is."""
        _check.integer("batch", batch, 1, 10_000)
        if limit is not None:
            _check.integer("limit", limit, 1)
        _check.text("after", after)
        narrowed = self._bulk_filter(match, action)
        forking = self._bulk_fork(action, fork)
        store = await self.store()
        acted = refused = skipped = 0
        last: str | None = after or None
        done = narrowed is None
        while narrowed is not None and not done:
            room = batch if limit is None else min(batch, limit - acted - refused - skipped)
            if room == 0:
                break
            found = await store.select_tasks(narrowed, after=last or "", limit=room)
            done = len(found) < room  # a short batch: none is left after it
            if not found:
                break
            if forking is None:
                outcomes = await self.operate_async(
                    action, [t.task_id for t in found], reason=reason, by=by, identity=identity
                )
                acted += sum(1 for o in outcomes if o.applied)
                refused += sum(1 for o in outcomes if not o.applied)
            else:
                for t in found:
                    new_id = bulk_fork_id(t.task_id, forking.name)
                    if new_id is None:
                        continue
                    redrive = await self.fork_async(
                        t.task_id, start=forking.start, new_task_id=new_id,
                        new_keys_from=forking.new_keys_from, by=by, reason=reason,
                        identity=identity,
                    )  # fmt: skip
                    if redrive.applied:
                        acted += 1
                    elif await store.get_task(new_id) is not None:
                        skipped += 1  # forked by a run before
                    else:
                        refused += 1
            last = found[-1].task_id
            if progress is not None:
                progress(BulkProgress(action=action, acted=acted, refused=refused, last=last,
                                      done=done, skipped=skipped))  # fmt: skip
        return BulkProgress(action=action, acted=acted, refused=refused, last=last, done=done,
                            skipped=skipped)  # fmt: skip

    def bulk(self, match: TaskFilter, action: str, **kwargs: Any) -> BulkProgress:
        """The blocking form of `bulk_async`."""
        return self._call(self.bulk_async(match, action, **kwargs))

    async def _preview(self, store: ApplicationPort, action: OperatorAction) -> ActionOutcome:
        task = await store.get_task(action.task_id)
        if task is None:
            return ActionOutcome.missing(action.task_id)
        plan = plan_action(action, task.process_state)
        if isinstance(plan, ActionOutcome):
            return plan
        return ActionOutcome(
            task_id=action.task_id,
            applied=False,
            before=plan.before,
            after=plan.after,
            message=f"would {action.action}: {plan.before} -> {plan.after}",
        )

    async def _one(self, action: str, task_id: str, **kwargs: Any) -> TaskState:
        [outcome] = await self.operate_async(action, [task_id], **kwargs)
        if outcome.before is None:
            raise TaskNotFound(outcome.message)
        if not outcome.applied or outcome.after is None:
            raise ActionRefused(outcome.message)
        return outcome.after

    async def retry_async(self, task_id: str, *, reason: str | None = None) -> TaskState:
        """Resubmit a task in error (or whose compensation failed): its failed steps run
        again under new attempts and the same idempotency keys; completed ones are kept."""
        return await self._one("retry", task_id, reason=reason)

    async def skip_async(
        self, task_id: str, seq: int, result: Any = None, *, reason: str | None = None
    ) -> TaskState:
        """Mark step `seq` completed with `result`, as if its operation had returned it; the
        task stays in its state (one in error waits for `retry`)."""
        return await self._one("skip", task_id, seq=seq, result=result, reason=reason)

    async def pause_async(self, task_id: str, *, reason: str | None = None) -> TaskState:
        return await self._one("pause", task_id, reason=reason)

    async def resume_async(self, task_id: str, *, reason: str | None = None) -> TaskState:
        return await self._one("resume", task_id, reason=reason)

    async def cancel_async(
        self, task_id: str, *, compensate: bool = False, reason: str | None = None
    ) -> TaskState:
        """Cancel a task; with `compensate`, undo its steps first (it then ends compensated,
        or compensation_failed). It reaches the task's children that have not ended."""
        _check.flag("compensate", compensate)
        return await self._one("compensate" if compensate else "cancel", task_id, reason=reason)

    def retry(self, task_id: str, *, reason: str | None = None) -> TaskState:
        return self._call(self.retry_async(task_id, reason=reason))

    def skip(
        self, task_id: str, seq: int, result: Any = None, *, reason: str | None = None
    ) -> TaskState:
        return self._call(self.skip_async(task_id, seq, result, reason=reason))

    def pause(self, task_id: str, *, reason: str | None = None) -> TaskState:
        return self._call(self.pause_async(task_id, reason=reason))

    def resume(self, task_id: str, *, reason: str | None = None) -> TaskState:
        return self._call(self.resume_async(task_id, reason=reason))

    def cancel(
        self, task_id: str, *, compensate: bool = False, reason: str | None = None
    ) -> TaskState:
        return self._call(self.cancel_async(task_id, compensate=compensate, reason=reason))

    def __repr__(self) -> str:
        return f"<App {self.name} store={self.store_url!r}>"


class TaskTransaction:
    """The application's side of `App.transaction()`."""

    def __init__(self, app: App, tx: Transaction) -> None:
        self._app = app
        self._tx = tx

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        await self._tx.execute(sql, params)

    @overload
    async def submit(
        self,
        workflow: Callable[[Context, In], Awaitable[R]],
        input: In,
        **options: Unpack[SubmitOptions],
    ) -> TaskId[R]: ...

    @overload
    async def submit(
        self,
        workflow: Callable[[Context, None], Awaitable[R]],
        input: None = None,
        **options: Unpack[SubmitOptions],
    ) -> TaskId[R]: ...

    @overload
    async def submit(
        self, workflow: str, input: Any = None, **options: Unpack[SubmitOptions]
    ) -> TaskId[Any]: ...

    async def submit(
        self, workflow: str | WorkflowFn, input: Any = None, **options: Unpack[SubmitOptions]
    ) -> TaskId[Any]:
        """Submit a task in the application's transaction (see `App.submit_async`): it is
        created only if the transaction commits. SubmitConflict as `App.submit_async`."""
        task = self._app.new_task(workflow, input, **options)
        if not tracing.active():
            [answer] = await self._tx.submit([task])
        else:
            with _submit_span(task.workflow, [task]) as span:
                task = dataclasses.replace(task, trace_context=tracing.stored(span))
                [answer] = await self._tx.submit([task])
                _answered(span, answer)
        refuse_conflict(task, answer)
        return TaskId(task.task_id)

    async def send_event(
        self, task_id: str, name: str, payload: Any = None, *, event_id: str | None = None
    ) -> SendOutcome:
        """Send an event in the application's transaction: it is kept, and its task woken,
        only if the transaction commits (see `App.send_event_async`)."""
        event = self._app._event(task_id, name, payload, event_id)
        return _sent(task_id, name, await self._tx.send_event(*event, self._app.event_bounds))


@contextlib.contextmanager
def _submit_span(workflow: str, tasks: Sequence[Submission]) -> Iterator[Span]:
    """The span of a submit (`tracing`), a child of the caller's current span."""
    one = tasks[0] if len(tasks) == 1 else None
    attrs = {
        "messaging.system": tracing.SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "submit",
        "messaging.destination.name": workflow,
        "messaging.batch.message_count": len(tasks) if one is None else None,
        **tracing.attributes(
            workflow=workflow,
            task_id=None if one is None else one.task_id,
            version=None if one is None else one.version,
            priority=None if one is None else one.priority,
        ),
    }
    with tracing.span(
        f"submit {workflow}",
        kind="producer",
        attrs={k: v for k, v in attrs.items() if v is not None},
    ) as span:
        yield span


def _answered(span: Span, answer: Submitted) -> None:
    """Say on a submit's span whether its task was created ("exists": the id was taken)."""
    span.set_attributes(tracing.attributes(outcome="created" if answer.created else "exists"))


def refuse_conflict(task: Submission, answer: Submitted) -> None:
    """Raise SubmitConflict for a submit the store answered with a conflict: how every entry
    point in Python maps the store's answer (the command line's too)."""
    if answer.outcome == "conflict":
        raise SubmitConflict(
            task.task_id,
            answer.differs,
            workflow=(answer.workflow, task.workflow),
            version=(answer.version, task.version),
        )


def _for_version(spec: ScheduleSpec, wf: Workflow) -> ScheduleSpec:
    """A schedule's spec running `wf` (the newest version of its workflow)."""
    return dataclasses.replace(
        spec,
        version=wf.version,
        complete_within=wf.complete_within.total_seconds(),
        max_failures=wf.max_failures,
        on_failure=str(wf.on_failure),
    )


def _sent(
    task_id: str, name: str, got: SendOutcome | TaskState | EventBeyond | None
) -> SendOutcome:
    if got is None:
        raise TaskNotFound(f"no task {task_id!r}")
    if isinstance(got, TaskState):
        raise EventRefused(task_id, str(got))
    if isinstance(got, EventBeyond):
        raise EventRefused(task_id, name=name, bound=got.bound, limit=got.limit, found=got.found)
    return got


class _Portal:
    """An event loop in a thread of its own, for the blocking forms of the App's calls."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="stepwarden-portal"
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _operator_name() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment
        return "unknown"
