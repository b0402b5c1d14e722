"""Workflows: the business logic, kept apart from the scheduler's machinery.

A workflow is an async function `(ctx, input) -> result` whose remote work goes through
`ctx.step(operation, *args)`. When a task is resumed (by a restarted or different scheduler),
the workflow runs again from the top: steps already completed return their recorded result at
once, so its code must take the same steps in the same order.

A workflow may wait (`ctx.sleep`, `ctx.sleep_until`, `ctx.wait_for_event`): the wait is
recorded at its position among the steps, and the task is released while it waits (no
scheduler, coroutine or deadline), then resumed by replay, where the wait returns at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from . import _check, _json
from .agent import Operation
from .errors import (
    ConfigurationError,
    EventTimeout,
    NonDeterminismError,
    StepFailed,
    UnknownNameError,
)
from .records import (
    Adopt,
    Held,
    NewStep,
    Redispatch,
    StepDispatch,
    StepRecord,
    WaitOutcome,
    WaitRequest,
)
from .states import OnFailure, StepState

WorkflowFn = Callable[..., Awaitable[Any]]
MAX_COMPLETE_WITHIN = timedelta(days=365)
"""The longest claim of a task or a step: complete_by must stay a date both stores hold."""
MAX_WAIT = timedelta(days=3660)
"""The longest timer or event wait (about ten years)."""

_BRANCH: contextvars.ContextVar[tuple[Context, str] | None] = contextvars.ContextVar(
    "stepwarden_branch", default=None
)
"""The branch of a `Context.gather` the current asyncio task runs: its Context and the prefix
of its places ("3.2.")."""


def _check_within(what: str, value: object, option: str = "complete_within") -> None:
    if not isinstance(value, timedelta) or not timedelta(0) < value <= MAX_COMPLETE_WITHIN:
        raise ConfigurationError(
            f"{what}: {option} must be a timedelta, positive and at most "
            f"{MAX_COMPLETE_WITHIN.days} days, not {_check.shown(value)}"
        )


@dataclass(frozen=True, slots=True)
class Workflow:
    name: str
    fn: WorkflowFn
    complete_within: timedelta
    max_failures: int
    on_failure: OnFailure = OnFailure.COMPENSATE
    alert_after: int = 3
    """Alert the operator when a step of this workflow is dispatched this many times."""
    version: int = 1
    """Which version of the workflow `name` this is: a task runs to its end on the version
    it was submitted with (`App.workflow(version=...)`)."""

    def __post_init__(self) -> None:
        _check.integer(f"workflow {self.name!r}: version", self.version, 1)
        _check_within(f"workflow {self.name!r}", self.complete_within)
        _check.integer(f"workflow {self.name!r}: alert_after", self.alert_after, 2)
        _check.integer(f"workflow {self.name!r}: max_failures", self.max_failures, 1)

    @property
    def key(self) -> tuple[str, int]:
        """(name, version): what a scheduler claims tasks by."""
        return (self.name, self.version)


class Abandon(BaseException):
    """The scheduler no longer holds the task (complete_by passed, or it was reset): the
    workflow stops and writes nothing, like an agent whose complete_by has passed."""


class Parked(Abandon):
    """The task waits (a timer, an event): released, its workflow stops here and is resumed
    by replay when the wait ends."""


class StepRunner(Protocol):
    """What runs a workflow's steps (the scheduler): the Context talks to it only."""

    instance: str
    operations: Mapping[str, Operation] | None
    """The operations of the App's agents by "agent.operation"; None accepts any."""

    def workflow_of(self, held: Held) -> Workflow: ...

    async def run_step(
        self,
        held: Held,
        dispatch: StepDispatch,
        step_name: str,
        *,
        fallback: StepDispatch | None = None,
    ) -> Any:
        """Write `dispatch` (or, when it is fenced out, `fallback`), then wait for the
        step's result: its value, or StepFailed."""

    async def wait(self, request: WaitRequest) -> WaitOutcome:
        """Record or read the wait at its position; park the task when it must wait."""


class Context:
    """Handed to a workflow: records and dispatches its steps, replays the recorded ones.

    Each step, wait and gather takes the next place (`position`) of the branch it runs in:
    "1", "2", ... in the workflow's body, "3.2.1", "3.2.2", ... in the second branch of a
    `gather` at 3. A replay matches what the workflow does with what was recorded by these
    places, which do not depend on when results arrive; `seq` only numbers the records in
    the order they were made.
    """

    def __init__(
        self,
        runner: StepRunner,
        held: Held,
        steps: list[StepRecord],
        waits: Mapping[str, tuple[int, str, str]] | None = None,
    ) -> None:
        self._runner = runner
        self._held = held
        self._recorded = {s.position: s for s in steps if s.position is not None}
        self._waits = dict(waits or {})
        """The recorded waits by position, with their seq, kind and name."""
        self._last_seq = max(
            [s.seq for s in steps] + [seq for seq, _, _ in self._waits.values()], default=0
        )
        self._taken: dict[str, int] = {}
        """The places taken so far in each branch, by the branch's prefix ("" for the body)."""
        self._markers: list[asyncio.Future[WaitOutcome]] = []
        """Patch markers being recorded: written before anything the workflow records after
        them (a marker matters only to a replay that finds records after it)."""

    @property
    def task_id(self) -> str:
        return self._held.task_id

    @property
    def attempt(self) -> int:
        """How many times a scheduler has claimed this task."""
        return self._held.attempt

    def _prefix(self) -> str:
        branch = _BRANCH.get()
        return branch[1] if branch is not None and branch[0] is self else ""

    def _peek(self) -> str:
        """The next place in the branch the caller runs in, not taken."""
        prefix = self._prefix()
        return f"{prefix}{self._taken.get(prefix, 0) + 1}"

    def _place(self) -> str:
        """Take the next place in the branch the caller runs in (before any await, so that
        steps started together take their places in the order they were started)."""
        prefix = self._prefix()
        n = self._taken.get(prefix, 0) + 1
        self._taken[prefix] = n
        return f"{prefix}{n}"

    async def settle(self) -> None:
        """Wait for what this context still owes the store (the patch markers taken); the
        scheduler calls it when the workflow returns."""
        await self._recorded_markers()

    async def _recorded_markers(self) -> None:
        """Wait until the patch markers taken so far are recorded (before what follows)."""
        while self._markers:
            outcome = await self._markers[0]
            self._markers.pop(0)
            if outcome.state == "fenced":
                raise Abandon
            if outcome.state == "mismatch":
                raise NonDeterminismError(
                    f"task {self._held.task_id!r}: a patch marker's place holds "
                    f"{outcome.recorded}; a workflow must take the same steps and waits in the "
                    "same order when it is resumed"
                )

    # -- changing code while tasks run ----------------------------------------------------
    def patched(self, patch_id: str) -> bool:
        """Whether this task takes the code path added by the patch `patch_id`.

        True for a task that had not got this far when the code changed (a marker is recorded
        at this place, so a replay takes the new path again); False for a task whose old code
        recorded something else here (its replay goes on down the old path). Write the new
        path under `if ctx.patched("id"):` beside the old one; once no task started before the
        patch is left, keep only the new path and call `ctx.deprecate_patch("id")` there.
        """
        _check.name("patch_id", patch_id)
        place = self._peek()
        marker = self._waits.get(place)
        if marker is not None and marker[1] == "patch":
            if marker[2] != patch_id:
                raise NonDeterminismError(
                    f"task {self._held.task_id!r} position {place}: the workflow asked for "
                    f"patch {patch_id!r} but patch {marker[2]!r} is recorded there"
                )
            self._place()
            return True
        if self._recorded_at_or_under(place):
            return False  # recorded by the code before the patch: the old path
        place = self._place()
        request = WaitRequest(
            task_id=self._held.task_id,
            task_attempt=self._held.attempt,
            scheduler=self._runner.instance,
            seq=self._new_seq(),
            kind="patch",
            name=patch_id,
            position=place,
        )
        writing = asyncio.ensure_future(self._runner.wait(request))
        # Read by what the workflow records next; if it records nothing more, nobody awaits it.
        writing.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._markers.append(writing)
        return True

    def deprecate_patch(self, patch_id: str) -> None:
        """Where a patch's new path is now the only one: a task that recorded the patch's
        marker here replays past it; other tasks record nothing."""
        _check.name("patch_id", patch_id)
        marker = self._waits.get(self._peek())
        if marker is not None and marker[1:] == ("patch", patch_id):
            self._place()

    def _recorded_at_or_under(self, place: str) -> bool:
        """Whether a step, a wait or a gather's branch is recorded at `place`."""
        if place in self._recorded or place in self._waits:
            return True
        under = place + "."
        return any(p.startswith(under) for p in (*self._recorded, *self._waits))

    def _new_seq(self) -> int:
        self._last_seq += 1
        return self._last_seq

    async def gather(self, *branches: Coroutine[Any, Any, Any]) -> list[Any]:
        """Run `branches` (coroutines: `ctx.step(...)` calls, or calls of async functions that
        take steps of their own) side by side and return their results in order.

        Each branch numbers its steps and waits on its own (the gather takes one place; its
        i-th branch's steps take places under it), so a replay finds each branch's records
        however the branches interleaved. When a branch raises, the others are cancelled:
        they stop waiting (their steps already queued still run, and are compensated with the
        task's other steps if it fails) and the first error, by branch order among those
        raised, is raised here.
        """
        for branch in branches:
            if not inspect.iscoroutine(branch):
                for b in branches:
                    if inspect.iscoroutine(b):
                        b.close()
                raise ConfigurationError(
                    "ctx.gather takes coroutines (ctx.step(...) or a call of an async "
                    f"function), not {_check.shown(branch)}"
                )
        position = self._place()
        await self._recorded_markers()
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[Any]] = []
        for i, branch in enumerate(branches, 1):
            context = contextvars.copy_context()
            context.run(_BRANCH.set, (self, f"{position}.{i}."))
            tasks.append(loop.create_task(branch, context=context))
        if not tasks:
            return []
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks)
            raise
        failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception()]
        if failed:
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks)
            error = failed[0].exception()
            assert error is not None
            raise error
        return [t.result() for t in tasks]

    async def step(
        self,
        operation: Operation,
        *args: Any,
        complete_within: timedelta | None = None,
        name: str | None = None,
        compensate: Operation | None = None,
        pickup_within: timedelta | None = None,
        total_within: timedelta | None = None,
    ) -> Any:
        """Run `operation(*args)` through its agent and return its result.

        The step is recorded (with its complete_by) before its request is queued. On resume,
        a completed step returns its recorded result without running again; a failed one
        raises StepFailed.

        `compensate` names the operation that undoes this step, should the task fail later:
        it is recorded with the step and called with the same arguments (its `Call` names
        the step it undoes in `compensates_key`).

        `complete_within` bounds each dispatch of the step (a `Call.heartbeat` extends it);
        `pickup_within`: the step fails when no agent claims a dispatch of it in that time;
        `total_within`: the step fails when not completed that long after its first
        dispatch, across every attempt.
        """
        known = self._runner.operations
        for op in (operation, compensate):
            if op is not None and known is not None and op.qualname not in known:
                raise UnknownNameError(
                    f"operation {op.qualname!r} is not one of the App's agents' operations "
                    "(declare its agent with app.agent)"
                )
        position = self._place()
        recorded = self._recorded.get(position)
        seq = recorded.seq if recorded is not None else self._new_seq()
        step_name = name or operation.qualname
        if position in self._waits:
            _, kind, wait_name = self._waits[position]
            raise NonDeterminismError(
                f"task {self._held.task_id!r} position {position}: the workflow asked for "
                f"step {step_name!r} but a {_wait_name(kind, wait_name)} is recorded there; "
                "a workflow must take the same steps and waits in the same order when it is "
                "resumed"
            )
        for what, value in (
            ("complete_within", complete_within),
            ("pickup_within", pickup_within),
            ("total_within", total_within),
        ):
            if value is not None:
                _check_within(f"step {step_name!r}", value, what)
        within = complete_within or self._runner.workflow_of(self._held).complete_within
        held = self._held
        scheduler = self._runner.instance
        if recorded is None:
            payload = _json.dumps(list(args), what=f"the input of step {step_name!r}")
            new = NewStep(
                task_id=held.task_id,
                task_attempt=held.attempt,
                scheduler=scheduler,
                seq=seq,
                name=step_name,
                agent=operation.agent.name,
                operation=operation.name,
                input=payload,
                priority=held.priority,
                complete_within=within.total_seconds(),
                compensation=None if compensate is None else compensate.qualname,
                compensation_input=None if compensate is None else payload,
                limit_key=None if operation.limit is None else operation.limit.key_of(args),
                pickup_within=None if pickup_within is None else pickup_within.total_seconds(),
                total_within=None if total_within is None else total_within.total_seconds(),
                position=position,
            )
            await self._recorded_markers()
            return await self._runner.run_step(held, new, step_name)
        wanted = (step_name, operation.agent.name, operation.name)
        found = (recorded.name, recorded.agent, recorded.operation)
        if wanted != found:
            raise NonDeterminismError(
                f"task {held.task_id!r} position {position}: the workflow asked for "
                f"{wanted[0]!r} ({wanted[1]}.{wanted[2]}) but the recorded step is "
                f"{found[0]!r} ({found[1]}.{found[2]}); a workflow must take the same steps "
                "in the same order when it is resumed"
            )
        if recorded.state == StepState.COMPLETED:
            return recorded.result
        if recorded.state == StepState.FAILED:
            raise StepFailed(step_name, recorded.error)
        # Open step dispatched by an earlier attempt: take it over while it is in time,
        # otherwise dispatch it again under a new attempt and the same idempotency key.
        adopt = Adopt(
            task_id=held.task_id,
            task_attempt=held.attempt,
            scheduler=scheduler,
            seq=seq,
            expected_attempt=recorded.attempt,
        )
        again = Redispatch(
            task_id=held.task_id,
            task_attempt=held.attempt,
            scheduler=scheduler,
            seq=seq,
            agent=recorded.agent,
            expected_attempt=recorded.attempt,
            complete_within=within.total_seconds(),
        )
        return await self._runner.run_step(held, adopt, step_name, fallback=again)

    # -- waits ----------------------------------------------------------------------------
    async def sleep(self, delay: timedelta) -> None:
        """A durable timer: the task is released and resumed `delay` later (by the store's
        clock), wherever a scheduler runs; on replay, once fired, it returns at once."""
        _check_wait("sleep", delay)
        await self._wait("timer", "", delay=delay.total_seconds())

    async def sleep_until(self, when: datetime) -> None:
        """A durable timer to `when` (a datetime with its time zone)."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise ConfigurationError(
                f"sleep_until needs a datetime with its time zone, not {_check.shown(when)}"
            )
        await self._wait("timer", "", until=when)

    async def wait_for_event(self, name: str, *, timeout: timedelta) -> Any:
        """The JSON payload of the next event `name` sent to this task (`App.send_event`),
        one sent before the workflow got here included; each event is taken by one wait, in
        the order sent. The task is released while it waits. Raises EventTimeout when none
        comes within `timeout`."""
        _check.name("the event's name", name)
        _check_wait("wait_for_event: timeout", timeout)
        outcome = await self._wait("event", name, delay=timeout.total_seconds())
        if outcome.state == "timed_out":
            raise EventTimeout(name, timeout.total_seconds())
        return outcome.payload

    async def _wait(
        self, kind: str, name: str, *, delay: float = 0.0, until: datetime | None = None
    ) -> WaitOutcome:
        position = self._place()
        held = self._held
        step = self._recorded.get(position)
        if step is not None:
            raise NonDeterminismError(
                f"task {held.task_id!r} position {position}: the workflow asked for a "
                f"{_wait_name(kind, name)} but the recorded step is {step.name!r}; a workflow "
                "must take the same steps and waits in the same order when it is resumed"
            )
        recorded = self._waits.get(position)
        request = WaitRequest(
            task_id=held.task_id,
            task_attempt=held.attempt,
            scheduler=self._runner.instance,
            seq=self._new_seq() if recorded is None else recorded[0],
            kind=kind,
            name=name,
            delay=delay,
            until=until,
            position=position,
        )
        await self._recorded_markers()
        outcome = await self._runner.wait(request)
        if outcome.state == "mismatch" and outcome.recorded is not None:
            raise NonDeterminismError(
                f"task {held.task_id!r} position {position}: the workflow asked for a "
                f"{_wait_name(kind, name)} but a {_wait_name(*outcome.recorded)} is recorded "
                "there; a workflow must take the same steps and waits in the same order when "
                "it is resumed"
            )
        if outcome.state == "parked":
            raise Parked
        if outcome.state == "fenced":
            raise Abandon
        return outcome


def _wait_name(kind: str, name: str) -> str:
    if kind == "patch":
        return f"patch marker {name!r}"
    return "timer" if kind == "timer" else f"wait for event {name!r}"


def _check_wait(what: str, value: object) -> None:
    if not isinstance(value, timedelta) or not timedelta(0) <= value <= MAX_WAIT:
        raise ConfigurationError(
            f"{what} must be a timedelta from 0 to {MAX_WAIT.days} days, not "
            f"{_check.shown(value)}"
        )
