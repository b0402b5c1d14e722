"""Workflows: the business logic, kept apart from the scheduler's machinery.

A workflow is an async function `(ctx, input) -> result` whose remote work goes through
`ctx.step(operation, *args)`. When a task is resumed (by a restarted or different scheduler),
the workflow runs again from the top: steps already completed return their recorded result at
once, so its code must take the same steps in the same order.

A workflow may wait (`ctx.sleep`, `ctx.sleep_until`, `ctx.wait_for_event`, `ctx.child`):
the wait is recorded at its position among the steps, and the task is released while it
waits (no scheduler, coroutine or deadline), then resumed by replay, where the wait returns at
once. A wait that cannot end at once parks the task only when every branch of the workflow
(`ctx.gather`) waits too: branches still running steps, or starting their own waits (a
child each), go on until then.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar, TypeVarTuple, overload

from . import _check, _json
from .agent import AnyOperation, Operation
from .errors import (
    ChildFailed,
    ConfigurationError,
    EventTimeout,
    NonDeterminismError,
    StepFailed,
    UnknownNameError,
)
from .records import (
    Adopt,
    Fence,
    Held,
    NewStep,
    ParkRequest,
    Redispatch,
    StepDispatch,
    StepRecord,
    Submission,
    WaitOutcome,
    WaitRequest,
)
from .rules import child_task_id, step_needs_compensation, submit_version
from .sealing import Binding, Keyring, input_digest
from .states import OnFailure, StepState

T = TypeVar("T")
R = TypeVar("R")
In = TypeVar("In")
Args = TypeVarTuple("Args")
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


def as_within(what: str, value: object, option: str = "complete_within") -> timedelta:
    """A bound of a claim or a step (`_check.Duration`: a timedelta or seconds), positive
    and at most MAX_COMPLETE_WITHIN, as a timedelta."""
    found = _duration(value)
    if found is None or not timedelta(0) < found <= MAX_COMPLETE_WITHIN:
        raise ConfigurationError(
            f"{what}: {option} must be a timedelta or seconds, positive and at most "
            f"{MAX_COMPLETE_WITHIN.days} days, not {_check.shown(value)}"
        )
    return found


def _duration(value: object) -> timedelta | None:
    """A timedelta, or a number of seconds (neither a bool nor NaN) as one; None otherwise."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    try:
        return timedelta(seconds=value)
    except OverflowError:
        return timedelta.max


_BRANCHES = "the branches of a gather"
"""What a divergence says is recorded where a gather's branches recorded something."""


def _diverged(
    task_id: str,
    position: str | None,
    asked: str,
    recorded: str | None = None,
) -> NonDeterminismError:
    """The error of a run that took another path than the one its task recorded: at
    `position` (when known), the workflow `asked` for something and `recorded` is what is
    recorded there; without `recorded`, `asked` is the whole reason (the store's). The one
    wording of a divergence, for a run and for `stepwarden check-upgrade` alike."""
    where = f"task {task_id!r}" if position is None else f"task {task_id!r} position {position}"
    what = (
        asked
        if recorded is None
        else f"the workflow asked for {asked} but {recorded} "
        f"{'are' if recorded == _BRANCHES else 'is'} recorded there"
    )
    return NonDeterminismError(
        f"{where}: {what}; a workflow must take the same steps and waits in the same order "
        "when it is resumed",
        task_id=task_id,
        position=position,
        asked=None if recorded is None else asked,
        recorded=recorded,
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
    stuck_after: float | None = None
    """Seconds a task of this workflow may stay unmoved before one `task_stuck` alert per
    reason that holds it (None: never)."""

    def __post_init__(self) -> None:
        _check.integer(f"workflow {self.name!r}: version", self.version, 1)
        as_within(f"workflow {self.name!r}", self.complete_within)
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
    """The task waits (a timer, an event, a child): released, its workflow stops here and
    is resumed by replay when a wait ends."""


def workflow_name(workflow: str | WorkflowFn) -> str:
    """The name of a workflow given by name or by its declared function."""
    if isinstance(workflow, str):
        return workflow
    return str(
        getattr(workflow, "__stepwarden_workflow__", getattr(workflow, "__name__", repr(workflow)))
    )


class StepRunner(Protocol):
    """What runs a workflow's steps (its task's drive, `drive.TaskDrive`): the Context talks
    to it only."""

    instance: str
    operations: Mapping[str, AnyOperation] | None
    """The operations of the App's agents by "agent.operation"; None accepts any."""
    keys: Keyring | None
    """The keyring that seals the secrets the workflow hands to its steps and children
    (None: stored plain)."""

    @property
    def workflows(self) -> Mapping[tuple[str, int], Workflow]:
        """The App's workflows by (name, version): the children a workflow may start."""

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

    async def tag(self, held: Held, key: str, value: str) -> None:
        """Tag the task `key` = `value` while it is held (nothing written when it has that
        tag); ConfigurationError when the tag is beyond the task's bound."""

    async def wait(self, request: WaitRequest) -> WaitOutcome:
        """Record or read the wait at its position; park the task when it must wait (and
        the request says to)."""

    async def park(self, request: ParkRequest) -> WaitOutcome:
        """Park the task on its open waits, unless one of them can end now."""


@dataclass(eq=False)
class _Branch:
    """What one branch of a workflow (its body, or a branch of a `gather`) is doing, for the
    park: a branch is quiet while it only waits (a wait that must park, or a gather of quiet
    branches); a branch running steps or code is not."""

    ops: int = 0
    """Steps and wait records under way (and waits being taken up again)."""
    blocked: int = 0
    """Waits that must park, registered with the Context."""
    gathers: int = 0
    """Gathers it awaits (their branches count instead of it)."""
    done: bool = False

    def quiet(self) -> bool:
        return self.done or (self.ops == 0 and (self.blocked > 0 or self.gathers > 0))


@dataclass(eq=False)
class _Blocked:
    seq: int
    branch: _Branch
    future: asyncio.Future[None]
    resolved: bool = False


@dataclass(eq=False)
class _Gathered:
    """A gather's branches: the gather's own branch counts as busy from the moment the
    gather will return (its last branch finished, or one raised) until it does."""

    parent: _Branch
    left: int
    woke: bool = False
    branches: list[_Branch] = field(default_factory=list)


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
        self._undoing = {s.compensates: s for s in steps if s.compensates is not None}
        """The recorded compensations, by the seq of the step each undoes."""
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
        self._branches: dict[str, _Branch] = {"": _Branch()}
        """What each branch does, by its prefix: the park waits until every one is quiet."""
        self._blocked: dict[int, _Blocked] = {}
        """The waits that must park, by seq, until the park's word."""
        self._quiet_changed: asyncio.Event | None = None
        self._parker: asyncio.Task[None] | None = None

    def _fence(self) -> Fence:
        """The fence of every record this context writes: the task as its drive holds it."""
        return {
            "task_id": self._held.task_id,
            "task_attempt": self._held.attempt,
            "scheduler": self._runner.instance,
        }

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

    def _branch(self) -> _Branch:
        """The branch the caller runs in."""
        return self._branches.setdefault(self._prefix(), _Branch())

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
                raise _diverged(
                    self._held.task_id,
                    None,
                    "a patch marker",
                    "another record"
                    if outcome.recorded is None
                    else f"a {_wait_name(*outcome.recorded)}",
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
                raise _diverged(
                    self._held.task_id, place, f"patch {patch_id!r}", f"patch {marker[2]!r}"
                )
            self._place()
            return True
        if self._recorded_at_or_under(place):
            return False  # recorded by the code before the patch: the old path
        place = self._place()
        request = WaitRequest(
            **self._fence(),
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

    def left_behind(self) -> NonDeterminismError | None:
        """Once the workflow has returned: the divergence of a run that ended before a step
        or wait recorded at a place it never took (the first such, by place), or None when
        it took every recorded place. A run is not failed by it (its task ends processed,
        its open steps abandoned): `stepwarden check-upgrade` reports it."""
        places = [(p, f"step {s.name!r}") for p, s in self._recorded.items()]
        places += [
            (p, f"a {_wait_name(kind, name)}")
            for p, (_, kind, name) in self._waits.items()
            if kind != "patch"  # a marker left behind changes nothing
        ]
        for place, what in sorted(places, key=lambda p: [int(n) for n in p[0].split(".")]):
            prefix, _, n = place.rpartition(".")
            if self._taken.get(f"{prefix}." if prefix else "", 0) < int(n):
                return _diverged(self._held.task_id, place, "its end", what)
        return None

    def _recorded_at_or_under(self, place: str) -> bool:
        """Whether a step, a wait or a gather's branch is recorded at `place`."""
        return place in self._recorded or place in self._waits or self._recorded_under(place)

    def _recorded_under(self, place: str) -> bool:
        """Whether the branches of a gather at `place` recorded something."""
        under = place + "."
        return any(p.startswith(under) for p in (*self._recorded, *self._waits))

    def close(self) -> None:
        """The workflow's run is over (returned, raised, parked or dropped): stop waiting
        for it to be quiet."""
        if self._parker is not None:
            self._parker.cancel()
            self._parker = None

    def _changed(self) -> None:
        if self._quiet_changed is not None:
            self._quiet_changed.set()

    def _alone(self, branch: _Branch) -> bool:
        """Whether a wait of `branch` that cannot end at once may park the task in the same
        transaction: nothing else of the workflow is under way or waiting (its other branches
        have finished, or await this one in a gather)."""
        if self._blocked or branch.ops or branch.blocked:
            return False
        return all(b is branch or b.quiet() for b in self._branches.values())

    def _quiescent(self) -> bool:
        """Every live branch waits on a wait that must park (or on a gather of such)."""
        return bool(self._blocked) and all(b.quiet() for b in self._branches.values())

    async def _park_when_quiet(self) -> None:
        """Once every branch waits, park the task on all their waits in one transaction: or,
        when one of them can end now, let them all take their waits up again."""
        assert self._quiet_changed is not None
        while True:
            await self._quiet_changed.wait()
            self._quiet_changed.clear()
            if not self._quiescent():
                continue
            request = ParkRequest(
                **self._fence(),
                seqs=tuple(sorted(self._blocked)),
            )
            error: BaseException | None = None
            try:
                outcome = await self._runner.park(request)
            except (Exception, Abandon) as exc:  # the workflow's branches raise it
                error = exc
            else:
                if outcome.state == "parked":
                    error = Parked()
                elif outcome.state != "ready":
                    error = Abandon()
            for entry in list(self._blocked.values()):
                if entry.seq not in request.seqs:
                    continue
                del self._blocked[entry.seq]
                entry.resolved = True
                entry.branch.blocked -= 1
                entry.branch.ops += 1  # busy again until it has taken its wait up
                if not entry.future.done():
                    if error is None:
                        entry.future.set_result(None)
                    else:
                        entry.future.set_exception(error)

    def _new_seq(self) -> int:
        self._last_seq += 1
        return self._last_seq

    async def gather(self, *branches: Coroutine[Any, Any, T]) -> list[T]:
        """Run `branches` (coroutines: `ctx.step(...)` calls, or calls of async functions that
        take steps of their own) side by side and return their results in order (typed as a
        list of their common type: annotate it `list[Any]` for branches of different types).

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
        found = self._recorded.get(position)
        if found is not None or position in self._waits:
            what = (
                f"step {found.name!r}"
                if found is not None
                else f"a {_wait_name(*self._waits[position][1:])}"
            )
            for b in branches:
                b.close()
            raise _diverged(self._held.task_id, position, "a gather", what)
        if not branches:
            return []
        await self._recorded_markers()
        loop = asyncio.get_running_loop()
        gathered = _Gathered(parent=self._branch(), left=len(branches))
        tasks: list[asyncio.Task[Any]] = []
        for i, branch in enumerate(branches, 1):
            prefix = f"{position}.{i}."
            sub = self._branches[prefix] = _Branch()
            gathered.branches.append(sub)
            context = contextvars.copy_context()
            context.run(_BRANCH.set, (self, prefix))
            tasks.append(loop.create_task(self._run_branch(branch, sub, gathered), context=context))
        gathered.parent.gathers += 1
        try:
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
        finally:
            gathered.parent.gathers -= 1
            if gathered.woke:
                gathered.parent.ops -= 1

    async def _run_branch(
        self, branch: Coroutine[Any, Any, Any], sub: _Branch, gathered: _Gathered
    ) -> Any:
        """Run one branch of a gather, noting for the park when it finishes and when the
        gather will return because of it."""
        finished = False
        try:
            value = await branch
            finished = True
            return value
        finally:
            sub.done = True
            gathered.left -= 1
            if not gathered.woke and (not finished or gathered.left == 0):
                gathered.woke = True
                gathered.parent.ops += 1
            self._changed()

    async def step(
        self,
        operation: Operation[*Args, R],
        *args: *Args,
        complete_within: _check.Duration | None = None,
        name: str | None = None,
        compensate: Operation[*Args, Any] | None = None,
        pickup_within: _check.Duration | None = None,
        total_within: _check.Duration | None = None,
    ) -> R:
        """Run `operation(*args)` through its agent and return its result.

        Typed as the operation is: `args` are checked against its parameters after the
        `Call`, the result has its return type (an async operation's awaited one), and
        `compensate` takes the same arguments.

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
        if recorded is None and self._recorded_under(position):
            raise _diverged(self._held.task_id, position, f"step {step_name!r}", _BRANCHES)
        if position in self._waits:
            _, kind, wait_name = self._waits[position]
            raise _diverged(
                self._held.task_id,
                position,
                f"step {step_name!r}",
                f"a {_wait_name(kind, wait_name)}",
            )
        bounds = {
            what: None if value is None else as_within(f"step {step_name!r}", value, what)
            for what, value in (
                ("complete_within", complete_within),
                ("pickup_within", pickup_within),
                ("total_within", total_within),
            )
        }
        pickup, total = bounds["pickup_within"], bounds["total_within"]
        bound = bounds["complete_within"] or self._runner.workflow_of(self._held).complete_within
        held = self._held
        if recorded is None:
            payload = _json.dumps(
                list(args),
                what=f"the input of step {step_name!r}",
                seal=_json.Seal(self._runner.keys, Binding.step(held.task_id, seq)),
            )
            new = NewStep(
                **self._fence(),
                seq=seq,
                name=step_name,
                agent=operation.agent.name,
                operation=operation.name,
                input=payload,
                priority=held.priority,
                complete_within=bound.total_seconds(),
                compensation=None if compensate is None else compensate.qualname,
                compensation_input=None if compensate is None else payload,
                limit_key=None if operation.limit is None else operation.limit.key_of(args),
                pickup_within=None if pickup is None else pickup.total_seconds(),
                total_within=None if total is None else total.total_seconds(),
                position=position,
            )
            await self._recorded_markers()
            result: R = await self._busy(self._runner.run_step(held, new, step_name))
            return result
        wanted = (step_name, operation.agent.name, operation.name)
        found = (recorded.name, recorded.agent, recorded.operation)
        if wanted != found:
            raise _diverged(
                held.task_id,
                position,
                f"step {wanted[0]!r} ({wanted[1]}.{wanted[2]})",
                f"step {found[0]!r} ({found[1]}.{found[2]})",
            )
        replayed: R = await self._recorded_step(recorded, step_name, bound)
        return replayed

    async def _recorded_step(self, recorded: StepRecord, step_name: str, within: timedelta) -> Any:
        """A step an earlier run recorded: its result, StepFailed, or (open, dispatched by an
        earlier attempt) taken over while it is in time, otherwise dispatched again under a
        new attempt and the same idempotency key. The one path of every recorded step, the
        workflow's and the compensation's."""
        if recorded.state == StepState.COMPLETED:
            return recorded.result
        if recorded.state == StepState.FAILED:
            raise StepFailed(step_name, recorded.error)
        held = self._held
        adopt = Adopt(
            **self._fence(),
            seq=recorded.seq,
            expected_attempt=recorded.attempt,
        )
        again = Redispatch(
            **self._fence(),
            seq=recorded.seq,
            agent=recorded.agent,
            expected_attempt=recorded.attempt,
            complete_within=within.total_seconds(),
        )
        return await self._busy(self._runner.run_step(held, adopt, step_name, fallback=again))

    async def _undo(self, step: StepRecord) -> None:
        """Run the compensation of `step` as a step of its own (`compensates` = its seq, no
        place: it is found again by the step it undoes), or go on from the one recorded."""
        assert step.compensation is not None
        step_name = f"compensate {step.name}"
        within = self._runner.workflow_of(self._held).complete_within
        recorded = self._undoing.get(step.seq)
        if recorded is not None:
            await self._recorded_step(recorded, step_name, within)
            return
        agent, _, operation = step.compensation.partition(".")
        undo = (self._runner.operations or {}).get(step.compensation)
        args = step.compensation_input
        args = args if isinstance(args, list) else [args]
        held = self._held
        seq = self._new_seq()
        new = NewStep(
            **self._fence(),
            seq=seq,
            name=step_name,
            agent=agent,
            operation=operation,
            input=_json.dumps(
                step.compensation_input,
                what="a compensation input",
                seal=_json.Seal(self._runner.keys, Binding.step(held.task_id, seq)),
            ),
            priority=held.priority,
            complete_within=within.total_seconds(),
            compensates=step.seq,
            limit_key=None if undo is None or undo.limit is None else undo.limit.key_of(args),
        )
        await self._busy(self._runner.run_step(held, new, step_name))

    async def _busy(self, work: Awaitable[T]) -> T:
        """`work`, during which the caller's branch counts as busy (not quiet)."""
        branch = self._branch()
        branch.ops += 1
        try:
            return await work
        finally:
            branch.ops -= 1
            self._changed()

    # -- what the task is about ----------------------------------------------------------
    async def tag(self, key: str, value: str) -> None:
        """Tag this task `key` = `value` (a key it has already takes the new value): it is
        found by its tags (`App.tasks(tags=...)`, `stepwarden tasks --tag KEY=VALUE`, the
        dashboard) beside those of its submit. Idempotent, and it takes no place: a replay
        that tags it again writes nothing, and a tag added to a workflow is no divergence
        for the tasks it runs already. Raises ConfigurationError for a key or value beyond
        its bound (`_check.tag`), or a tag past the task's `_check.MAX_TAGS`."""
        _check.tag(key, value)
        await self._busy(self._runner.tag(self._held, key, value))

    # -- waits ----------------------------------------------------------------------------
    async def sleep(self, delay: _check.Duration) -> None:
        """A durable timer: the task is released and resumed `delay` (a timedelta or seconds)
        later (by the store's clock), wherever a scheduler runs; on replay, once fired, it
        returns at once."""
        wait = _check_wait("sleep", delay)
        await self._wait(self._place(), "timer", "", delay=wait.total_seconds())

    async def sleep_until(self, when: datetime) -> None:
        """A durable timer to `when` (a datetime with its time zone)."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise ConfigurationError(
                f"sleep_until needs a datetime with its time zone, not {_check.shown(when)}"
            )
        await self._wait(self._place(), "timer", "", until=when)

    async def wait_for_event(self, name: str, *, timeout: _check.Duration) -> Any:
        """The JSON payload of the next event `name` sent to this task (`App.send_event`),
        one sent before the workflow got here included; each event is taken by one wait, in
        the order sent. The task is released while it waits. Raises EventTimeout when none
        comes within `timeout` (a timedelta or seconds)."""
        _check.name("the event's name", name)
        wait = _check_wait("wait_for_event: timeout", timeout)
        outcome = await self._wait(self._place(), "event", name, delay=wait.total_seconds())
        if outcome.state == "timed_out":
            raise EventTimeout(name, wait.total_seconds())
        return outcome.payload

    @overload
    async def child(
        self,
        workflow: Callable[[Context, In], Awaitable[R]],
        input: In,
        *,
        task_id: str | None = None,
    ) -> R: ...

    @overload
    async def child(
        self,
        workflow: Callable[[Context, None], Awaitable[R]],
        input: None = None,
        *,
        task_id: str | None = None,
    ) -> R: ...

    @overload
    async def child(
        self, workflow: str, input: Any = None, *, task_id: str | None = None
    ) -> Any: ...

    async def child(
        self, workflow: str | WorkflowFn, input: Any = None, *, task_id: str | None = None
    ) -> Any:
        """Start the workflow `workflow` (declared in this App) as a task of its own, a child
        of this one, and return its result once it is processed.

        The child has its own id, history, retries and operator actions; its id is
        `task_id`, or this task's id and the child's place ("order-42:3"), the same on every
        replay. It is recorded at its place like a step or a wait, and created with it in
        one transaction; the task is released while it waits for the child (like a timer),
        and woken when the child ends. On replay, a child that ended returns at once.
        Raises ChildFailed when the child ended otherwise than processed (error,
        compensated, compensation_failed, cancelled). A `task_id` that another task already
        has fails this task with a ConfigurationError. Children started in the branches of
        a `gather` run at the same time.

        Given the workflow's function, `input` is checked against its input parameter and
        the result has its return type; given its name, both are Any."""
        name = workflow_name(workflow)
        versions = {v: wf for (n, v), wf in self._runner.workflows.items() if n == name}
        if not versions:
            known = ", ".join(sorted({n for n, _ in self._runner.workflows})) or "none"
            raise UnknownNameError(f"ctx.child: unknown workflow {name!r} (declared: {known})")
        wf = versions[submit_version(name, versions)]  # the newest, as a submit
        position = self._place()
        held = self._held
        child_id = child_task_id(held.task_id, position) if task_id is None else task_id
        _check.new_task_id(child_id)
        new = Submission(
            task_id=child_id,
            workflow=wf.name,
            input=_json.dumps(
                input,
                what=f"the input of child {child_id!r}",
                seal=_json.Seal(self._runner.keys, Binding.input(child_id)),
            ),
            input_digest=input_digest(_json.plain(input), self._runner.keys),
            priority=held.priority,
            complete_within=wf.complete_within.total_seconds(),
            max_failures=wf.max_failures,
            on_failure=str(wf.on_failure),
            parent_id=held.task_id,
            parent_position=position,
            version=wf.version,
            tenant=held.tenant,
        )
        outcome = await self._wait(position, "child", child_id, child=new)
        if outcome.state == "child_failed":
            ended = outcome.payload if isinstance(outcome.payload, dict) else {}
            raise ChildFailed(child_id, str(ended.get("state")), ended.get("error"))
        return outcome.payload

    async def _wait(
        self,
        position: str,
        kind: str,
        name: str,
        *,
        delay: float = 0.0,
        until: datetime | None = None,
        child: Submission | None = None,
    ) -> WaitOutcome:
        held = self._held
        step = self._recorded.get(position)
        if step is None and position not in self._waits and self._recorded_under(position):
            raise _diverged(held.task_id, position, f"a {_wait_name(kind, name)}", _BRANCHES)
        if step is not None:
            raise _diverged(
                held.task_id, position, f"a {_wait_name(kind, name)}", f"step {step.name!r}"
            )
        recorded = self._waits.get(position)
        await self._recorded_markers()
        seq = self._new_seq() if recorded is None else recorded[0]
        branch = self._branch()
        while True:
            request = WaitRequest(
                **self._fence(),
                seq=seq,
                kind=kind,
                name=name,
                delay=delay,
                until=until,
                position=position,
                park=self._alone(branch),
                child=child,
            )
            outcome = await self._busy(self._runner.wait(request))
            if outcome.state == "mismatch" and outcome.reason:
                raise _diverged(held.task_id, position, outcome.reason)
            if outcome.state == "mismatch" and outcome.recorded is not None:
                raise _diverged(
                    held.task_id,
                    position,
                    f"a {_wait_name(kind, name)}",
                    f"a {_wait_name(*outcome.recorded)}",
                )
            if outcome.state == "refused":
                raise ConfigurationError(outcome.reason or f"ctx.child: {name!r} is refused")
            if outcome.state == "parked":
                raise Parked
            if outcome.state == "fenced":
                raise Abandon
            if outcome.state != "blocked":
                return outcome
            await self._until_parked_or_ready(seq, branch)

    async def _until_parked_or_ready(self, seq: int, branch: _Branch) -> None:
        """A wait that must park: registered until every branch waits too. Returns when one
        of the waits can end now (the caller takes its wait up again); raises Parked when
        the task is parked."""
        loop = asyncio.get_running_loop()
        entry = _Blocked(seq=seq, branch=branch, future=loop.create_future())
        self._blocked[seq] = entry
        branch.blocked += 1
        if self._quiet_changed is None:
            self._quiet_changed = asyncio.Event()
        if self._parker is None:
            self._parker = loop.create_task(self._park_when_quiet())
        self._changed()
        try:
            await entry.future
        finally:
            if entry.resolved:
                branch.ops -= 1
            else:  # cancelled while it waited (a branch of a failed gather)
                branch.blocked -= 1
                self._blocked.pop(seq, None)
            self._changed()


async def compensation(ctx: Context, steps: Sequence[StepRecord]) -> None:
    """The workflow of a compensating task: undo, newest first, each of its steps that took
    (or may have taken) effect (`rules.step_needs_compensation`), each undo a step recorded
    like any (its result recorded, adopted or dispatched again on resume through the same
    path as the workflow's steps). Raises StepFailed when an undo fails."""
    for step in reversed(steps):
        if step_needs_compensation(step):
            await ctx._undo(step)


def _wait_name(kind: str, name: str) -> str:
    if kind == "patch":
        return f"patch marker {name!r}"
    if kind == "timer":
        return "timer"
    return f"child task {name!r}" if kind == "child" else f"wait for event {name!r}"


def _check_wait(what: str, value: object) -> timedelta:
    found = _duration(value)
    if found is None or not timedelta(0) <= found <= MAX_WAIT:
        raise ConfigurationError(
            f"{what} must be a timedelta or seconds from 0 to {MAX_WAIT.days} days, not "
            f"{_check.shown(value)}"
        )
    return found
