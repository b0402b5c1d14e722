"""A model of the task and step state machines, and a hypothesis state machine that drives a
real store with random interleavings of every actor's writes and checks it against the model.

The actors: schedulers s1 and s2, agent instances a1 and a2 (of one agent, "pay", with the
operations "charge" and "refund"), supervisors sup1 and sup2 (under one lease) and an
operator. A scheduler may start a child task from its task's workflow (a child wait); a
child's end is recorded in its parent's wait and wakes its parent; cancelling or
compensating a parent reaches its children that have not ended, newest first. Each rule is
one store call, with current or stale fencing tokens; the model says whether the write must
apply, must be refused, or (when it depends on a deadline too close to call) may do either,
and then follows what the store did. Every example starts with a few tasks, and the
`advance` rule makes some of the writes a healthy system would make next (through the same
rules), so that examples reach steps, results and compensations whichever rules hypothesis
leaves out of them.

Time: the store reads its own clock (the process clock for SQLite, now() for PostgreSQL on
the same machine). Every time the store computes from "now" is modelled as an interval
[lo, hi] from the process clock read before and after the call; a deadline has passed for a
later call when its hi is before the call began, has not when its lo is after the call
ended, and is undecided otherwise. Short deadlines are SHORT seconds; the `expire` rule
sleeps past them.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from stepwarden.records import (
    EventRecord,
    NewStep,
    OperatorAction,
    ParkRequest,
    RequestHandback,
    SendOutcome,
    StepOutcome,
    StepRecord,
    Submission,
    TaskOutcome,
    TaskRecord,
    WaitRecord,
    WaitRequest,
)
from stepwarden.retry import Backoff
from stepwarden.rules import head_start, waiting_for_all
from stepwarden.states import (
    FINISHED_TASK_STATES,
    HELD_TASK_STATES,
    OPEN_STEP_STATES,
    OPERATOR_ACTIONS,
    OnFailure,
    StepState,
    TaskState,
)
from stepwarden.store import Store

from ..dispatching import step_dispatch

T = TypeVar("T")

SHORT = 0.03
"""Seconds of a short deadline (task, step, lease): passed after one `expire`."""
LONG = 60.0
"""Seconds of a long deadline: never passes during an example."""
EPS = 1e-5
"""Slack for the rounding of stored times (PostgreSQL keeps microseconds)."""
WORKFLOW = "wf"
AGENT = "pay"
FORWARD = "charge"
UNDO = "refund"
LEASE = "supervisor"
SCHEDULERS = ("s1", "s2")
INSTANCES = ("a1", "a2")
HOLDERS = ("sup1", "sup2")
MAX_TASKS = 4
MAX_CHILDREN = 3
"""Children started beyond the MAX_TASKS submitted."""
MAX_SEQ = 5
INPUT = '{"n": 1}'
RESULT = '{"ok": true}'
BACKOFF_MAXIMUM = 0.04
ABANDONED = "abandoned: the task is "

Maybe = bool | None
"""A prediction: True (must), False (must not), None (may: too close to a deadline)."""


def all3(*values: Maybe) -> Maybe:
    if any(v is False for v in values):
        return False
    return True if all(v is True for v in values) else None


def any3(values: Iterable[Maybe]) -> Maybe:
    values = list(values)
    if any(v is True for v in values):
        return True
    return False if all(v is False for v in values) else None


def not3(value: Maybe) -> Maybe:
    return None if value is None else not value


def agree(predicted: Maybe, observed: bool, what: str) -> None:
    """The store's observed behaviour must match a firm prediction."""
    if predicted is not None:
        assert observed == predicted, f"{what}: expected {predicted}, the store did {observed}"


Span = tuple[float, float]
"""The process clock before and after one store call."""


@dataclass(frozen=True)
class When:
    """A time the store computed, known to lie within [lo, hi] (seconds since the epoch)."""

    lo: float
    hi: float

    @staticmethod
    def now(span: Span) -> When:
        return When(span[0], span[1])

    def plus(self, seconds: float) -> When:
        return When(self.lo + seconds, self.hi + seconds)

    def earliest(self, other: When | None) -> When:
        if other is None:
            return self
        return When(min(self.lo, other.lo), min(self.hi, other.hi))

    def latest(self, other: When | None) -> When:
        if other is None:
            return self
        return When(max(self.lo, other.lo), max(self.hi, other.hi))

    def before(self, other: When) -> bool:
        """Whether this time is surely earlier than `other`."""
        return self.hi < other.lo - EPS

    def passed(self, span: Span) -> Maybe:
        """Whether this time is before the store's now during a call in `span`."""
        if self.hi < span[0] - EPS:
            return True
        if self.lo > span[1] + EPS:
            return False
        return None

    def holds(self, stamp: float) -> bool:
        return self.lo - EPS <= stamp <= self.hi + EPS


PAST = When(0.0, 0.0)


@dataclass
class MStep:
    task_id: str
    seq: int
    operation: str
    attempt: int
    task_attempt: int
    complete_by: When
    state: StepState = StepState.NOT_STARTED
    locked_by: str | None = None
    result: Any = None
    error: str | None = None
    abandoned: bool = False
    tries: int = 0
    compensation: str | None = None
    compensates: int | None = None
    position: str | None = None

    @property
    def key(self) -> str:
        return f"{self.task_id}/{self.seq}"

    @property
    def open(self) -> bool:
        return self.state in OPEN_STEP_STATES


@dataclass
class MWait:
    """A workflow's wait at its position: a timer, a wait for the event "go", or a wait for
    a child task (`name`, no wake_at)."""

    kind: str
    wake_at: When | None
    state: str = "open"
    name: str = ""
    payload: Any = None
    errors: set[str] | None = None
    """A failed child's error, when the sweep's could name one of several (see
    `error_choices`): pinned once read."""


@dataclass
class MEvent:
    event_id: str
    taken_by: int | None = None


@dataclass
class MTask:
    task_id: str
    order: int
    priority: int
    within: float
    max_failures: int
    on_failure: OnFailure
    eligible_at: When
    ranked_at: When
    """Its rank for claims: its submit, less its priority's head start."""
    state: TaskState = TaskState.PENDING
    locked_by: str | None = None
    attempt: int = 0
    failure_count: int = 0
    compensation_failures: int = 0
    complete_by: When | None = None
    result: Any = None
    error: str | None = None
    steps: dict[int, MStep] = field(default_factory=dict)
    wake_at: When | None = None
    waiting_for: str | None = None
    waits: dict[int, MWait] = field(default_factory=dict)
    inbox: list[MEvent] = field(default_factory=list)
    parent_id: str | None = None
    parent_position: str | None = None

    @property
    def held(self) -> bool:
        return self.state in HELD_TASK_STATES and self.locked_by is not None

    def open_steps(self) -> list[MStep]:
        return [s for s in self.steps.values() if s.open]

    def open_until(self) -> When | None:
        """The latest complete_by of the steps an agent may still be calling, open or
        abandoned (rules.holds_up_compensation; the model never hears of a call that
        stopped): until then a compensation waits."""
        until: When | None = None
        for s in self.steps.values():
            if s.open or s.abandoned:
                until = s.complete_by.latest(until)
        return until

    def compensable(self) -> bool:
        """Whether a step has an undo and took effect, or may have (completed, open, or
        abandoned while open)."""
        return any(
            s.compensation is not None
            and s.compensates is None
            and (s.state in (StepState.COMPLETED, *OPEN_STEP_STATES) or s.abandoned)
            for s in self.steps.values()
        )

    def close_open_steps(self) -> None:
        """A task leaving the held states leaves no request behind. An abandoned step keeps
        its locked_by: the agent instance whose call may still run, and who alone may say
        that it stopped."""
        for s in self.open_steps():
            s.state = StepState.FAILED
            s.error = ABANDONED + self.state
            s.abandoned = True

    def release(self, state: TaskState) -> None:
        self.state = state
        self.locked_by = None
        self.complete_by = None
        self.wake_at = None
        self.waiting_for = None


def after_expiry(task: MTask, compensable: bool) -> tuple[TaskState, int, int, int, bool]:
    """Where an expired held task goes (`rules.plan_expiry`): the state, its
    failure_count and compensation_failures, the count this expiry is (of the forward path,
    or of the compensation), and whether an alert is raised. `compensable`: a step or a
    child to undo."""
    forward, undoing = task.failure_count, task.compensation_failures
    if task.state == TaskState.COMPENSATING:
        undoing += 1
        failed = undoing >= task.max_failures
        state = TaskState.COMPENSATION_FAILED if failed else TaskState.COMPENSATING
        return state, forward, undoing, undoing, failed
    forward += 1
    if forward < task.max_failures:
        return TaskState.PENDING, forward, undoing, forward, False
    if task.on_failure == OnFailure.STOP:
        return TaskState.ERROR, forward, undoing, forward, True
    if task.on_failure == OnFailure.RETRY:
        return TaskState.PENDING, forward, undoing, forward, forward == task.max_failures
    if not compensable:
        return TaskState.ERROR, forward, undoing, forward, True
    return TaskState.COMPENSATING, forward, 0, forward, True


@dataclass
class MLease:
    holder: str
    term: int
    expires: When


@dataclass(frozen=True)
class Snapshot:
    tasks: dict[str, TaskRecord | None]
    steps: dict[str, list[StepRecord]]
    events: list[EventRecord]
    counts: dict[TaskState, int]
    listed: list[TaskRecord]
    waits: dict[str, list[WaitRecord]]

    def same_as(self, other: Snapshot) -> bool:
        return (self.tasks, self.steps, self.events, self.counts, self.waits) == (
            other.tasks,
            other.steps,
            other.events,
            other.counts,
            other.waits,
        )


@dataclass(frozen=True)
class ExpectedEvent:
    task_id: str
    kind: str
    detail: dict[str, Any]
    """Keys the recorded detail must have with these values."""


def agent_may_write(s: MStep | None, attempt: int, instance: str, span: Span) -> Maybe:
    """Whether an agent's write to a step (an outcome, a hand-back) may apply: the step runs
    under this attempt, held by this instance, and its complete_by has not passed."""
    if s is None:
        return False
    return all3(
        s.state == StepState.RUNNING,
        s.attempt == attempt,
        s.locked_by == instance,
        not3(s.complete_by.passed(span)),
    )


def recorded_already(s: MStep | None, state: StepState, attempt: int, instance: str) -> bool:
    """Whether an agent's outcome is the one its step holds already (a try whose answer was
    lost): the store takes it as recorded and changes nothing."""
    return (
        s is not None
        and (s.state, s.attempt, s.locked_by) == (state, attempt, instance)
        and not s.abandoned
    )


def pick(items: list[T], index: int) -> T | None:
    return items[index % len(items)] if items else None


tokens = st.sampled_from([0, 0, 0, -1, 1])
"""How a writer's fencing token relates to the current one: mostly current, or stale."""
whose = st.sampled_from(["holder", "holder", "other"])
"""The writer: the one holding the task or step, or another one."""


class StoreModel(RuleBasedStateMachine):
    """Drives one store, opened afresh for each example (see `open_store`)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.store: Store | None = None
        self.store = self.loop.run_until_complete(self.open_store())
        self.tasks: dict[str, MTask] = {}
        self.order: list[str] = []
        self.lease: MLease | None = None
        self.max_term = 0
        self.refused = False
        self.expected_events: list[ExpectedEvent] = []
        self.error_choices: dict[str, set[str]] = {}
        self.snap = self.read()

    # -- plumbing -----------------------------------------------------------------------
    async def open_store(self) -> Store:
        """A store, empty, opened on this machine's loop."""
        raise NotImplementedError

    def close_store(self) -> None:
        """After the store is closed: remove what the example left behind."""

    def teardown(self) -> None:
        try:
            if self.store is not None:
                self.loop.run_until_complete(self.store.close())
                self.store = None
            self.close_store()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    @property
    def s(self) -> Store:
        assert self.store is not None
        return self.store

    def call(self, coro: Awaitable[T]) -> tuple[T, Span]:
        t0 = time.time()
        out = self.loop.run_until_complete(coro)
        return out, (t0, time.time())

    def read(self) -> Snapshot:
        async def read() -> Snapshot:
            tasks = {tid: await self.s.get_task(tid) for tid in self.order}
            steps = {tid: await self.s.get_steps(tid) for tid in self.order}
            events = await self.s.events(limit=100_000)
            counts = await self.s.count_tasks()
            listed = await self.s.list_tasks(limit=1000)
            waits = {tid: await self.s.waits(tid) for tid in self.order}
            return Snapshot(tasks, steps, events, counts, listed, waits)

        return self.loop.run_until_complete(read())

    def task_at(self, index: int, prefer: Callable[[MTask], bool] | None = None) -> MTask:
        """The task at `index`; mostly (index below 7 of 0-9) one of the tasks `prefer`
        picks, when there is one, so that writes meant to apply often find what they need."""
        pool = self.order
        if prefer is not None and index < 7:
            pool = [tid for tid in self.order if prefer(self.tasks[tid])] or pool
        found = pick(pool, index)
        assert found is not None
        return self.tasks[found]

    def other(self, names: tuple[str, ...], name: str | None) -> str:
        return names[1] if name == names[0] else names[0]

    def expect_event(self, task_id: str, kind: str, **detail: Any) -> None:
        self.expected_events.append(ExpectedEvent(task_id, kind, detail))

    def has_tasks(self) -> bool:
        return bool(self.order)

    # -- children -------------------------------------------------------------------------
    def compensable(self, t: MTask) -> bool:
        """A step to undo, or a child that has not ended (compensating the task compensates
        it)."""
        return t.compensable() or any(
            c.parent_id == t.task_id and c.state not in FINISHED_TASK_STATES
            for c in self.tasks.values()
        )

    def ended(self, tasks: Iterable[MTask], span: Span) -> None:
        """Tasks that ended in one transaction: the end of each child is recorded in its
        parent's open wait for it, and a waiting parent is pending again (one `woke` event,
        naming its first child by id)."""
        for c in sorted(tasks, key=lambda c: c.task_id):
            parent = self.tasks.get(c.parent_id or "")
            if parent is None:
                continue
            for w in parent.waits.values():
                if w.kind == "child" and w.name == c.task_id and w.state == "open":
                    processed = c.state == TaskState.PROCESSED
                    w.state = "done" if processed else "failed"
                    w.payload = c.result if processed else {"state": c.state, "error": c.error}
                    w.errors = None if processed else self.error_choices.get(c.task_id)
                    if parent.state == TaskState.WAITING:
                        parent.release(TaskState.PENDING)
                        parent.eligible_at = When.now(span)
                        self.expect_event(parent.task_id, "woke", child=c.task_id, state=c.state)

    def apply_action(self, t: MTask, action: str, span: Span, **detail: Any) -> None:
        """What an applied operator action (other than skip) does to a task, and its event."""
        before = t.state
        after = OPERATOR_ACTIONS[action][before]
        if action == "retry" and after == TaskState.PENDING:
            t.failure_count = 0
        if after == TaskState.COMPENSATING:
            t.compensation_failures = 0
        now = When.now(span)
        t.eligible_at = now.latest(t.open_until()) if after == TaskState.COMPENSATING else now
        t.release(after)
        if action in ("cancel", "compensate"):
            t.close_open_steps()
        if action == "retry":
            undo = after == TaskState.COMPENSATING
            for s in t.steps.values():
                if s.state == StepState.FAILED and (s.compensates is not None) == undo:
                    s.state = StepState.NOT_STARTED
                    s.complete_by = now
                    s.locked_by = None
                    s.error = None
                    s.abandoned = False
        self.expect_event(
            t.task_id, "operator", action=action, **{"from": before, "to": after}, **detail
        )

    def cascade(self, parent: MTask, cause: str, actor: str, span: Span) -> list[MTask]:
        """The children of `parent` that have not ended, newest first, get the parent's
        action (a failure: compensate), where it applies; and so on to theirs. The tasks
        reached."""
        verb = "cancel" if cause == "cancel" else "compensate"
        why = {
            "cancel": f"its parent {parent.task_id!r} was cancelled",
            "compensate": f"its parent {parent.task_id!r} is compensated",
            "failed": f"its parent {parent.task_id!r} failed and is compensated",
        }[cause]
        kids = [
            c
            for c in self.tasks.values()
            if c.parent_id == parent.task_id
            and c.state not in FINISHED_TASK_STATES
            and c.state in OPERATOR_ACTIONS[verb]
        ]
        reached: list[MTask] = []
        for c in sorted(kids, key=lambda c: c.order, reverse=True):
            self.apply_action(c, verb, span, by=actor, reason=why, parent=parent.task_id)
            reached.append(c)
            reached.extend(self.cascade(c, verb, actor, span))
        return reached

    # -- the application ----------------------------------------------------------------
    @initialize(
        tasks=st.lists(
            st.tuples(
                st.sampled_from([0, 1]),
                st.sampled_from([SHORT, LONG, LONG]),
                st.integers(1, 3),
                st.sampled_from(list(OnFailure)),
            ),
            min_size=1,
            max_size=MAX_TASKS,
        )
    )
    def start(self, tasks: list[tuple[int, float, int, OnFailure]]) -> None:
        """Every example begins with tasks, whichever rules it then leaves out."""
        for priority, within, max_failures, on_failure in tasks:
            self.submit(priority, within, max_failures, on_failure, again=1)

    @rule(
        priority=st.sampled_from([0, 1]),
        within=st.sampled_from([SHORT, LONG, LONG]),
        max_failures=st.integers(1, 3),
        on_failure=st.sampled_from(list(OnFailure)),
        again=st.integers(0, 9),
    )
    def submit(
        self, priority: int, within: float, max_failures: int, on_failure: OnFailure, again: int
    ) -> None:
        """A new task; or a task_id already there, which is left as it is."""
        if (again == 0 and self.order) or len(self.order) >= MAX_TASKS:
            task_id = self.order[again % len(self.order)]
        else:
            task_id = f"t{len(self.order) + 1}"
        new = Submission(
            task_id=task_id,
            workflow=WORKFLOW,
            input=INPUT,
            priority=priority,
            complete_within=within,
            max_failures=max_failures,
            on_failure=on_failure,
        )
        [answer], span = self.call(self.s.submit([new]))
        created = answer.created
        assert created == (task_id not in self.tasks), f"submit {task_id}: created={created}"
        if not created:
            self.refused = True
            return
        self.tasks[task_id] = MTask(
            task_id=task_id,
            order=len(self.order),
            priority=priority,
            within=within,
            max_failures=max_failures,
            on_failure=on_failure,
            eligible_at=When.now(span),
            ranked_at=When.now(span).plus(-head_start(priority)),
        )
        self.order.append(task_id)

    # -- the schedulers -----------------------------------------------------------------
    def claimable(self, task: MTask, span: Span) -> Maybe:
        if task.state == TaskState.PENDING or (
            task.state == TaskState.COMPENSATING and task.locked_by is None
        ):
            return task.eligible_at.passed(span)
        return False

    @precondition(has_tasks)
    @rule(scheduler=st.sampled_from(SCHEDULERS), limit=st.sampled_from([1, 10]))
    def claim(self, scheduler: str, limit: int) -> None:
        """Claim eligible tasks: pending ones, and compensating ones nobody holds."""
        claimed, span = self.call(self.s.claim_tasks(scheduler, [WORKFLOW], limit))
        may = {tid: self.claimable(t, span) for tid, t in self.tasks.items()}
        got = [c.task.task_id for c in claimed]
        assert len(got) == len(set(got)) and len(got) <= limit, f"claimed {got}"
        for tid in got:
            assert may[tid] is not False, (
                f"{scheduler} claimed {tid}, which is {self.tasks[tid].state} "
                f"(held by {self.tasks[tid].locked_by}) and not eligible"
            )
        must = [tid for tid, v in may.items() if v]
        if limit >= len(self.tasks):
            assert set(must) <= set(got), f"{scheduler} claimed {got}, not all of {must}"
        elif must:
            assert got, f"{scheduler} claimed nothing of {must}"
            first = self.tasks[got[0]].ranked_at
            assert not any(self.tasks[tid].ranked_at.before(first) for tid in must), (
                f"{got} before {must}"
            )
        if not got:
            self.refused = True
        for c in claimed:
            t = self.tasks[c.task.task_id]
            assert c.steps == self.snap.steps[t.task_id], "a claim returns the recorded steps"
            t.attempt += 1
            t.locked_by = scheduler
            if t.state == TaskState.PENDING:
                t.state = TaskState.PROCESSING
            t.complete_by = When.now(span).plus(t.within)
            assert c.task.attempt == t.attempt and c.task.locked_by == scheduler
            assert c.task.process_state == t.state
            assert t.within - (span[1] - span[0]) - EPS <= c.remaining <= t.within + EPS

    @precondition(has_tasks)
    @rule(
        i=st.integers(0, 9),
        kind=st.sampled_from(["new", "new", "redispatch", "adopt"]),
        who=whose,
        token=tokens,
        j=st.integers(0, 9),
        expected=tokens,
        within=st.sampled_from([SHORT, LONG]),
        flavor=st.sampled_from(["plain", "undoable", "undoable", "undo"]),
    )
    def dispatch(
        self,
        i: int,
        kind: str,
        who: str,
        token: int,
        j: int,
        expected: int,
        within: float,
        flavor: str,
    ) -> None:
        """A scheduler records a step (new), re-dispatches one (attempt + 1) or adopts one,
        as the holder or not, under the current task attempt or a stale one."""
        t = self.task_at(i, lambda t: t.held)
        holder = t.locked_by or SCHEDULERS[0]
        scheduler = holder if who == "holder" else self.other(SCHEDULERS, t.locked_by)
        task_attempt = t.attempt + token
        seqs = sorted(t.steps)
        undoable = [s.seq for s in t.steps.values() if s.compensation and s.compensates is None]
        operation, compensation, compensates = FORWARD, None, None
        if kind == "new":
            fresh = (max(seqs) + 1) if seqs else 1
            seq = pick(seqs, j) if (j == 0 and seqs) or fresh > MAX_SEQ else fresh
            if flavor == "undo" and undoable:
                operation, compensates = UNDO, pick(undoable, j)
            elif flavor == "undoable":
                compensation = f"{AGENT}.{UNDO}"
        else:
            seq = pick(seqs, j) or 1
        assert seq is not None
        step = t.steps.get(seq)
        expected_attempt = (step.attempt if step else 1) + expected
        d = step_dispatch(
            kind,
            task_id=t.task_id,
            task_attempt=task_attempt,
            scheduler=scheduler,
            seq=seq,
            name=f"{AGENT}.{operation}",
            agent=AGENT,
            operation=operation,
            input=INPUT,
            priority=t.priority,
            complete_within=within,
            expected_attempt=expected_attempt,
            compensation=compensation,
            compensation_input=INPUT if compensation else None,
            compensates=compensates,
            position=None if compensates is not None else str(seq),
        )
        [got], span = self.call(self.s.dispatch_steps([d]))
        held = t.held and t.locked_by == scheduler and t.attempt == task_attempt
        ok: Maybe
        if kind == "new":
            ok = held and step is None
        else:
            ok = held and step is not None and step.open and step.attempt == expected_attempt
            if kind == "adopt" and ok and step is not None:
                ok = not3(step.complete_by.passed(span))
        agree(ok, got is not None, f"{kind} of {t.task_id}/{seq} by {scheduler}@{task_attempt}")
        if got is None:
            self.refused = True
            return
        deadline = When.now(span).plus(within).earliest(t.complete_by)
        if kind == "new":
            step = t.steps[seq] = MStep(
                task_id=t.task_id,
                seq=seq,
                operation=operation,
                attempt=1,
                task_attempt=task_attempt,
                complete_by=deadline,
                compensation=compensation,
                compensates=compensates,
                position=None if compensates is not None else str(seq),
            )
        elif kind == "redispatch":
            assert step is not None
            step.attempt += 1
            step.state = StepState.NOT_STARTED
            step.locked_by = None
            step.task_attempt = task_attempt
            step.complete_by = deadline
        else:
            assert step is not None
            step.task_attempt = task_attempt
        assert got.attempt == step.attempt, f"dispatched attempt {got.attempt} != {step.attempt}"
        c = step.complete_by
        assert c.lo - span[1] - EPS <= got.remaining <= c.hi - span[0] + EPS

    @precondition(has_tasks)
    @rule(
        i=st.integers(0, 9),
        who=whose,
        token=tokens,
        branches=st.integers(2, 4),
        within=st.sampled_from([SHORT, LONG]),
        undoable=st.booleans(),
    )
    def fan_out(
        self, i: int, who: str, token: int, branches: int, within: float, undoable: bool
    ) -> None:
        """A scheduler records the first steps of the branches of a gather in one batch (as
        the group commit writes steps started together): each at its branch's place, all open
        at once; as the holder or not, under the current task attempt or a stale one."""
        t = self.task_at(i, lambda t: t.held)
        holder = t.locked_by or SCHEDULERS[0]
        scheduler = holder if who == "holder" else self.other(SCHEDULERS, t.locked_by)
        task_attempt = t.attempt + token
        first = max(t.steps, default=0) + 1
        if first + branches - 1 > MAX_SEQ + 4:
            self.refused = True
            return
        place = sum(1 for s in t.steps.values() if s.position and "." not in s.position) + 1
        compensation = f"{AGENT}.{UNDO}" if undoable else None
        batch = [
            step_dispatch(
                "new",
                task_id=t.task_id,
                task_attempt=task_attempt,
                scheduler=scheduler,
                seq=first + b,
                name=f"{AGENT}.{FORWARD}",
                agent=AGENT,
                operation=FORWARD,
                input=INPUT,
                priority=t.priority,
                complete_within=within,
                compensation=compensation,
                compensation_input=INPUT if compensation else None,
                position=f"{place}.{b + 1}.1",
            )
            for b in range(branches)
        ]
        got, span = self.call(self.s.dispatch_steps(batch))
        held = t.held and t.locked_by == scheduler and t.attempt == task_attempt
        for d, g in zip(batch, got, strict=True):
            agree(held, g is not None, f"fan-out step {t.task_id}/{d.seq} by {scheduler}")
        if not held:
            self.refused = True
            return
        deadline = When.now(span).plus(within).earliest(t.complete_by)
        for d in batch:
            t.steps[d.seq] = MStep(
                task_id=t.task_id,
                seq=d.seq,
                operation=FORWARD,
                attempt=1,
                task_attempt=task_attempt,
                complete_by=deadline,
                compensation=compensation,
                position=d.position if isinstance(d, NewStep) else None,
            )

    @precondition(has_tasks)
    @rule(
        i=st.integers(0, 9),
        who=whose,
        token=tokens,
        outcome=st.sampled_from(
            [
                TaskState.PROCESSED,
                TaskState.ERROR,
                TaskState.COMPENSATED,
                TaskState.COMPENSATION_FAILED,
            ]
        ),
    )
    def finish(self, i: int, who: str, token: int, outcome: TaskState) -> None:
        """A scheduler ends its hold of a task (or a stale one tries to)."""
        self.finish_task(self.task_at(i, lambda t: t.held), who, token, outcome)

    def finish_task(self, t: MTask, who: str, token: int, outcome: TaskState) -> None:
        holder = t.locked_by or SCHEDULERS[0]
        scheduler = holder if who == "holder" else self.other(SCHEDULERS, t.locked_by)
        attempt = t.attempt + token
        processed = outcome == TaskState.PROCESSED
        o = TaskOutcome(
            task_id=t.task_id,
            attempt=attempt,
            scheduler=scheduler,
            state=outcome,  # type: ignore[arg-type]
            result='{"r": 1}' if processed else None,
            error=None if processed else "declined",
        )
        [done], span = self.call(self.s.finish_tasks([o]))
        ok = t.held and t.locked_by == scheduler and t.attempt == attempt
        ok = ok and t.state == o.held_as
        agree(ok, done, f"finish {t.task_id} {outcome} by {scheduler}@{attempt}")
        if not done:
            self.refused = True
            return
        state = outcome
        if outcome == TaskState.ERROR and t.on_failure != OnFailure.STOP and self.compensable(t):
            state = TaskState.COMPENSATING
            t.compensation_failures = 0
        t.eligible_at = When.now(span).latest(t.open_until())
        t.release(state)
        t.result = {"r": 1} if processed else None
        t.error = o.error
        t.close_open_steps()
        if outcome in (TaskState.ERROR, TaskState.COMPENSATION_FAILED):
            reason = "task_error" if outcome == TaskState.ERROR else "compensation_failed"
            self.expect_event(t.task_id, "alert", reason=reason, then=str(state))
        if state in FINISHED_TASK_STATES:
            self.ended([t], span)
        elif state == TaskState.COMPENSATING:  # its failure compensates its children
            self.cascade(t, "failed", "stepwarden", span)

    # -- the agents ---------------------------------------------------------------------
    def agents_step(
        self, i: int, j: int, who: str, token: int
    ) -> tuple[MTask, int | None, MStep | None, str, int]:
        """A step an agent writes to (mostly a running one), the writing instance (its holder
        or another) and the attempt it names (current or stale)."""

        def running(t: MTask) -> list[int]:
            return sorted(q for q, s in t.steps.items() if s.state == StepState.RUNNING)

        t = self.task_at(i, lambda t: bool(running(t)))
        step = pick((j < 7 and running(t)) or sorted(t.steps), j)
        s = t.steps.get(step) if step is not None else None
        holder = (s.locked_by if s else None) or INSTANCES[0]
        instance = holder if who == "holder" else self.other(INSTANCES, s.locked_by if s else None)
        return t, step, s, instance, (s.attempt if s else 1) + token

    @precondition(has_tasks)
    @rule(
        instance=st.sampled_from(INSTANCES),
        operations=st.sampled_from([(FORWARD,), (UNDO,), (FORWARD, UNDO)]),
    )
    def claim_requests(self, instance: str, operations: tuple[str, ...]) -> None:
        """An agent instance claims the queued requests (not started, in time) it serves."""
        got, span = self.call(self.s.claim_requests(instance, AGENT, operations, 100))
        claimed = {(r.task_id, r.seq): r for r in got}
        assert len(claimed) == len(got)
        for t in self.tasks.values():
            for s in t.steps.values():
                may = all3(
                    s.state == StepState.NOT_STARTED,
                    s.operation in operations,
                    not3(s.complete_by.passed(span)),
                )
                agree(may, (t.task_id, s.seq) in claimed, f"{instance} claims {s.key}")
                r = claimed.get((t.task_id, s.seq))
                if r is None:
                    continue
                assert (r.attempt, r.idempotency_key, r.compensates) == (
                    s.attempt,
                    s.key,
                    s.compensates,
                )
                assert (r.operation, r.agent, r.input) == (s.operation, AGENT, {"n": 1})
                s.state = StepState.RUNNING
                s.locked_by = instance
        if not got:
            self.refused = True

    @precondition(has_tasks)
    @rule(
        i=st.integers(0, 9),
        j=st.integers(0, 9),
        who=whose,
        token=tokens,
        state=st.sampled_from([StepState.COMPLETED, StepState.COMPLETED, StepState.FAILED]),
    )
    def complete(self, i: int, j: int, who: str, token: int, state: StepState) -> None:
        """An agent instance reports a result, as the instance holding the step or not,
        for the current step attempt or a stale one (mostly of a running step)."""

        t, step, s, instance, attempt = self.agents_step(i, j, who, token)
        ok_ = state == StepState.COMPLETED
        o = StepOutcome(
            task_id=t.task_id,
            seq=step or 1,
            attempt=attempt,
            agent_instance=instance,
            state=state,  # type: ignore[arg-type]
            result=RESULT if ok_ else None,
            error=None if ok_ else "boom",
            tries=2,
        )
        [done], span = self.call(self.s.complete_steps([o]))
        again = recorded_already(s, state, attempt, instance)
        may = True if again else agent_may_write(s, attempt, instance, span)
        agree(may, done, f"{instance} completes {t.task_id}/{o.seq}@{attempt} {state}")
        if not done:
            self.refused = True
            return
        if again:
            return
        assert s is not None
        s.state = state
        s.result = {"ok": True} if ok_ else None
        s.error = o.error
        s.tries = 2
        if not ok_:
            self.expect_event(t.task_id, "step_failed", seq=s.seq, attempt=attempt)

    @precondition(has_tasks)
    @rule(
        i=st.integers(0, 9),
        j=st.integers(0, 9),
        who=whose,
        token=tokens,
        then=st.sampled_from(["step", "step", "finish"]),
        claim=st.booleans(),
        within=st.sampled_from([SHORT, LONG]),
    )
    def group_commit(
        self, i: int, j: int, who: str, token: int, then: str, claim: bool, within: float
    ) -> None:
        """A scheduler's group commit with a step called in its own process: the step's
        outcome (by the holding instance or not, current attempt or stale) and what the
        workflow wrote next on it, by the task's holder: a new step (handed at once to an
        agent instance, or queued), or the task's end. What comes next applies only if the
        outcome does, and its own fence holds."""
        t, step, s, instance, attempt = self.agents_step(i, j, who, token)
        o = StepOutcome(
            task_id=t.task_id,
            seq=step or 1,
            attempt=attempt,
            agent_instance=instance,
            state=StepState.COMPLETED,
            result=RESULT,
            error=None,
            tries=1,
        )
        holder = t.locked_by or SCHEDULERS[0]
        fresh = max([*t.steps, 0]) + 1
        dispatches: list[NewStep] = []
        finishes: list[TaskOutcome] = []
        if then == "step":
            dispatches.append(
                NewStep(
                    task_id=t.task_id,
                    task_attempt=t.attempt,
                    scheduler=holder,
                    seq=fresh,
                    name=f"{AGENT}.{FORWARD}",
                    agent=AGENT,
                    operation=FORWARD,
                    input=INPUT,
                    priority=t.priority,
                    complete_within=within,
                    position=str(fresh),
                    claimed_by=INSTANCES[j % 2] if claim else None,
                )
            )
        else:
            finishes.append(
                TaskOutcome(
                    task_id=t.task_id,
                    attempt=t.attempt,
                    scheduler=holder,
                    state=TaskState.PROCESSED,
                    result='{"r": 1}',
                    error=None,
                )
            )
        held_as = t.state
        (done, dispatched, finished), span = self.call(self.s.advance([o], dispatches, finishes))
        again = recorded_already(s, StepState.COMPLETED, attempt, instance)
        may = True if again else agent_may_write(s, attempt, instance, span)
        agree(may, done[0], f"{instance} completes {t.task_id}/{o.seq}@{attempt} with more")
        if done[0] and not again:
            assert s is not None
            s.state = StepState.COMPLETED
            s.result = {"ok": True}
            s.error = None
            s.tries = 1
        held = t.held and t.locked_by == holder
        if dispatches:
            ok = done[0] and held and fresh not in t.steps
            agree(ok, dispatched[0] is not None, f"{t.task_id}/{fresh} after the outcome")
            if dispatched[0] is not None:
                d = dispatches[0]
                t.steps[fresh] = MStep(
                    task_id=t.task_id,
                    seq=fresh,
                    operation=FORWARD,
                    attempt=1,
                    task_attempt=t.attempt,
                    complete_by=When.now(span).plus(within).earliest(t.complete_by),
                    state=StepState.RUNNING if d.claimed_by else StepState.NOT_STARTED,
                    locked_by=d.claimed_by,
                    position=str(fresh),
                )
        if finishes:
            ok = done[0] and held and held_as == TaskState.PROCESSING
            agree(ok, finished[0], f"finish {t.task_id} after the outcome")
            if finished[0]:
                t.eligible_at = When.now(span).latest(t.open_until())
                t.release(TaskState.PROCESSED)
                t.result = {"r": 1}
                t.error = None
                t.close_open_steps()
                self.ended([t], span)
        if not (done[0] and (dispatches or finishes)):
            self.refused = True

    @precondition(has_tasks)
    @rule(i=st.integers(0, 9), j=st.integers(0, 9), who=whose, token=tokens)
    def hand_back(self, i: int, j: int, who: str, token: int) -> None:
        """An agent instance whose breaker opened hands a claimed request back to the queue,
        as the instance holding the step or not, for the current attempt or a stale one."""

        t, step, s, instance, attempt = self.agents_step(i, j, who, token)
        back = RequestHandback(
            task_id=t.task_id,
            seq=step or 1,
            attempt=attempt,
            agent_instance=instance,
            reason="breaker open",
        )
        [done], span = self.call(self.s.hand_back([back]))
        may = agent_may_write(s, attempt, instance, span)
        agree(may, done, f"{instance} hands back {t.task_id}/{back.seq}@{attempt}")
        if not done:
            self.refused = True
            return
        assert s is not None
        s.state = StepState.NOT_STARTED
        s.locked_by = None
        detail = {"seq": s.seq, "attempt": attempt, "from": instance}
        self.expect_event(t.task_id, "handed_back", **detail)

    # -- the supervisors ----------------------------------------------------------------
    @rule(holder=st.sampled_from(HOLDERS), ttl=st.sampled_from([SHORT, LONG, LONG]))
    def acquire_lease(self, holder: str, ttl: float) -> None:
        """Take or renew the lease; its term rises whenever it changes hands or lapses."""
        term, span = self.call(self.s.acquire_lease(LEASE, holder, ttl))
        self.refused = True  # no task, step or event changes
        lease = self.lease
        if lease is None:
            assert term == 1, f"first lease term {term}"
        else:
            lapsed = lease.expires.passed(span)
            if lease.holder == holder:
                if lapsed is not None:
                    assert term == (lease.term + 1 if lapsed else lease.term), term
                else:
                    assert term in (lease.term, lease.term + 1), term
            else:
                agree(lapsed, term is not None, f"{holder} takes the lease of {lease.holder}")
                if term is not None:
                    assert term == lease.term + 1, f"lease taken over at term {term}"
        if term is None:
            return
        assert term >= self.max_term, f"the lease term fell from {self.max_term} to {term}"
        self.max_term = term
        self.lease = MLease(holder, term, When.now(span).plus(ttl))

    @rule(holder=st.sampled_from(HOLDERS))
    def release_lease(self, holder: str) -> None:
        self.call(self.s.release_lease(LEASE, holder))
        self.refused = True
        if self.lease is not None and self.lease.holder == holder:
            self.lease.expires = PAST

    def expired(self, t: MTask, span: Span) -> tuple[Maybe, set[int | None]]:
        """Whether a task is due for the sweep: held, and its complete_by or that of an open
        step of its current attempt passed; and the seqs the sweep may name."""
        seqs: set[int | None] = set()
        if not t.held:
            return False, seqs
        assert t.complete_by is not None
        due = [t.complete_by.passed(span)]
        if due[0] is not False:
            seqs.add(None)
        for s in t.open_steps():
            if s.task_attempt == t.attempt:
                late = s.complete_by.passed(span)
                due.append(late)
                if late is not False:
                    seqs.add(s.seq)
        return any3(due), seqs

    @rule(
        who=st.sampled_from(["leader", "leader", "leader", *HOLDERS]),
        token=st.sampled_from([0, 0, 0, -1]),
        backoff=st.sampled_from([0.0, 0.0, 0.02]),
    )
    def sweep(self, who: str, token: int, backoff: float) -> None:
        """A supervisor sweeps under the lease, at the current term or a stale one. The
        leader first takes the lease again when it may have lapsed, as a supervisor does each
        round (sup1 takes it when nobody ever held it)."""
        now = time.time()
        if self.lease is None or (
            who == "leader" and self.lease.expires.passed((now, now)) is not False
        ):
            self.acquire_lease(self.lease.holder if self.lease else HOLDERS[0], LONG)
            self.refused = False
        assert self.lease is not None
        holder = self.lease.holder if who == "leader" else who
        term = self.lease.term + token
        expired, span = self.call(
            self.s.sweep(
                lease=LEASE,
                holder=holder,
                term=term,
                limit=100,
                backoff=Backoff(initial=backoff, maximum=BACKOFF_MAXIMUM),
            )
        )
        swept = {e.task_id: e for e in expired}
        assert len(swept) == len(expired), f"a task swept twice: {expired}"
        leased = all3(
            holder == self.lease.holder,
            term == self.lease.term,
            not3(self.lease.expires.passed(span)),
        )
        if leased is False:
            assert expired == [], f"{holder}@{term} swept without the lease: {expired}"
        if not expired:
            self.refused = True
            return
        leased = True
        compensable = {tid: self.compensable(t) for tid, t in self.tasks.items()}
        ended: list[MTask] = []
        given_up: list[MTask] = []
        for t in list(self.tasks.values()):
            due, seqs = self.expired(t, span)
            e = swept.get(t.task_id)
            agree(
                all3(leased, due),
                e is not None,
                f"sweep of {t.task_id} ({t.state}, held by {t.locked_by}, "
                f"failure_count {t.failure_count})",
            )
            if e is None:
                continue
            assert e.seq in seqs, f"sweep of {t.task_id} names seq {e.seq}, not one of {seqs}"
            held_as = t.state
            state, failure_count, compensation_failures, count, alert = after_expiry(
                t, compensable[t.task_id]
            )
            assert (e.process_state, e.failure_count) == (state, count), (
                f"sweep of {t.task_id}: {e.process_state} at {e.failure_count}, "
                f"expected {state} at {count}"
            )
            self.expect_event(t.task_id, "expired", attempt=t.attempt, failure_count=count)
            eligible = When.now(span).plus(min(BACKOFF_MAXIMUM, backoff * 2 ** (count - 1)))
            if state not in (TaskState.PENDING, held_as):
                # Abandoned steps may still take effect until their complete_by: their
                # compensation waits for it (`rules.holds_up_compensation`).
                eligible = eligible.latest(t.open_until())
            t.eligible_at = eligible
            t.failure_count = failure_count
            t.compensation_failures = compensation_failures
            t.release(state)
            if state not in (TaskState.PENDING, held_as):
                t.close_open_steps()
            if state in FINISHED_TASK_STATES:
                ended.append(t)
            elif state == TaskState.COMPENSATING and held_as == TaskState.PROCESSING:
                given_up.append(t)
            if alert:
                reason = "max_failures" if held_as == TaskState.PROCESSING else state
                self.expect_event(t.task_id, "alert", reason=str(reason), then=str(state))
                phase = " while compensating" if held_as == TaskState.COMPENSATING else ""
                self.error_choices[t.task_id] = {
                    f"complete_by passed {count} time(s){phase}, the last time on "
                    f"{'the task' if q is None else f'step {q}'}; max_failures reached"
                    for q in seqs
                }
        self.ended(ended, span)
        for t in given_up:  # given up and compensated: its children are compensated too
            self.cascade(t, "failed", "stepwarden", span)

    # -- waits: timers and events -------------------------------------------------------
    @precondition(has_tasks)
    @rule(
        i=st.integers(0, 9),
        who=whose,
        token=tokens,
        kind=st.sampled_from(["timer", "timer", "event"]),
        delay=st.sampled_from([SHORT, LONG]),
        again=st.booleans(),
        park=st.sampled_from([True, False]),
    )
    def wait(
        self, i: int, who: str, token: int, kind: str, delay: float, again: bool, park: bool
    ) -> None:
        """A scheduler's wait at a new position of its task's workflow, or again at the last
        one (as on replay): fenced by the hold and the attempt; recorded once; done when its
        timer has fired or an event "go" is there to take; otherwise the task is parked, or,
        asked not to park (other branches of the workflow still run), the wait is blocked.
        Event waits are long (they never time out here)."""
        t = self.task_at(i, prefer=lambda t: t.state == TaskState.PROCESSING)
        scheduler = (
            (t.locked_by or SCHEDULERS[0])
            if who == "holder"
            else self.other(SCHEDULERS, t.locked_by)
        )
        attempt = t.attempt + token
        mine = [q for q, w in t.waits.items() if w.kind != "child"]
        if again and mine:
            seq = max(mine)
            kind = t.waits[seq].kind
        else:
            seq = max([*t.steps, *t.waits], default=0) + 1
        name = "go" if kind == "event" else ""
        request = WaitRequest(
            task_id=t.task_id, task_attempt=attempt, scheduler=scheduler, seq=seq, kind=kind,
            name=name, delay=LONG if kind == "event" else delay, position=str(seq), park=park,
        )  # fmt: skip
        out, span = self.call(self.s.wait(request))
        held = (t.state, t.locked_by, t.attempt) == (TaskState.PROCESSING, scheduler, attempt)
        if not held:
            assert out.state == "fenced", f"wait on {t.task_id} by {scheduler}@{attempt}: {out}"
            self.refused = True
            return
        w = t.waits.get(seq)
        fresh = w is None
        if w is None:
            w = t.waits[seq] = MWait(kind, When.now(span).plus(request.delay), name=name)
        if w.state == "done":
            assert out.state == "done", f"{t.task_id}/{seq}: a done wait said {out}"
            self.refused = True
            return
        if kind == "timer":
            assert w.wake_at is not None
            due = w.wake_at.passed(span)
            agree(due, out.state == "done", f"timer {t.task_id}/{seq}")
            if out.state == "done":
                w.state = "done"
                return
        else:
            event = next((e for e in t.inbox if e.taken_by is None), None)
            agree(event is not None, out.state == "done", f"event wait {t.task_id}/{seq}")
            if event is not None:
                assert out.payload == event.event_id, f"{t.task_id}/{seq} took {out.payload}"
                event.taken_by = seq
                w.state = "done"
                return
        if not park:
            assert out.state == "blocked", f"{t.task_id}/{seq}: {out}"
            self.refused = not fresh
            return
        assert out.state == "parked", f"{t.task_id}/{seq}: {out}"
        t.release(TaskState.WAITING)
        t.wake_at = w.wake_at
        t.waiting_for = "timer" if kind == "timer" else "event:go"
        self.expect_event(t.task_id, "waiting", seq=seq, **{"for": t.waiting_for})

    @precondition(has_tasks)
    @rule(
        i=st.integers(0, 9),
        who=whose,
        token=tokens,
        again=st.booleans(),
        park=st.sampled_from([True, False, False]),
        taken=st.sampled_from([False, False, False, True]),
        within=st.sampled_from([SHORT, LONG, LONG]),
    )
    def start_child(
        self, i: int, who: str, token: int, again: bool, park: bool, taken: bool, within: float
    ) -> None:
        """A scheduler's child wait at a new position of its task's workflow (creating the
        child, pending, in the same transaction), or again at its last child wait (as on
        replay): fenced by the hold and the attempt; done with the child's result once it
        ended processed, child_failed once it ended otherwise; otherwise the task is parked
        (no wake_at), or the wait blocked. A child task id another task has is refused, and
        nothing is written."""
        t = self.task_at(i, prefer=lambda t: t.state == TaskState.PROCESSING)
        scheduler = (
            (t.locked_by or SCHEDULERS[0])
            if who == "holder"
            else self.other(SCHEDULERS, t.locked_by)
        )
        attempt = t.attempt + token
        kids = [q for q, w in t.waits.items() if w.kind == "child"]
        if again and kids:
            seq = max(kids)
            child_id = t.waits[seq].name
        else:
            seq = max([*t.steps, *t.waits], default=0) + 1
            child_id = self.order[i % len(self.order)] if taken else f"{t.task_id}:{seq}"
        if child_id not in self.tasks and len(self.order) >= MAX_TASKS + MAX_CHILDREN:
            self.refused = True  # no room for another child in this example
            return
        new = Submission(
            task_id=child_id, workflow=WORKFLOW, input=INPUT, priority=t.priority,
            complete_within=within, max_failures=2, on_failure=OnFailure.COMPENSATE,
            parent_id=t.task_id, parent_position=str(seq),
        )  # fmt: skip
        request = WaitRequest(
            task_id=t.task_id, task_attempt=attempt, scheduler=scheduler, seq=seq,
            kind="child", name=child_id, position=str(seq), park=park, child=new,
        )  # fmt: skip
        out, span = self.call(self.s.wait(request))
        what = f"child wait {t.task_id}/{seq} for {child_id} by {scheduler}@{attempt}"
        held = (t.state, t.locked_by, t.attempt) == (TaskState.PROCESSING, scheduler, attempt)
        if not held:
            assert out.state == "fenced", f"{what}: {out}"
            self.refused = True
            return
        w = t.waits.get(seq)
        fresh = w is None
        if w is None:
            if child_id in self.tasks:  # another task's id (or the task's own)
                assert out.state == "refused" and out.reason, f"{what}: {out}"
                self.refused = True
                return
            self.tasks[child_id] = MTask(
                task_id=child_id,
                order=len(self.order),
                priority=t.priority,
                within=within,
                max_failures=2,
                on_failure=OnFailure.COMPENSATE,
                eligible_at=When.now(span),
                ranked_at=When.now(span).plus(-head_start(t.priority)),
                parent_id=t.task_id,
                parent_position=str(seq),
            )
            self.order.append(child_id)
            w = t.waits[seq] = MWait("child", None, name=child_id)
            self.expect_event(t.task_id, "child_started", child=child_id, seq=seq)
        if w.state == "done":
            assert (out.state, out.payload) == ("done", w.payload), f"{what}: {out}"
            self.refused = True
            return
        if w.state == "failed":
            assert (out.state, out.payload) == ("child_failed", w.payload), f"{what}: {out}"
            self.refused = True
            return
        if not park:
            assert out.state == "blocked", f"{what}: {out}"
            self.refused = not fresh
            return
        assert out.state == "parked", f"{what}: {out}"
        t.release(TaskState.WAITING)
        t.waiting_for = f"child:{child_id}"
        self.expect_event(t.task_id, "waiting", seq=seq, until=None, **{"for": t.waiting_for})

    @precondition(has_tasks)
    @rule(i=st.integers(0, 9), who=whose, token=tokens, some=st.booleans())
    def park(self, i: int, who: str, token: int, some: bool) -> None:
        """A scheduler parks its task on its open waits (all, or the first) once every
        branch of its workflow waits: not when one of them can end now (a timer due, an
        event kept, a child ended: "ready"); else the task waits until the earliest
        wake_at. Fenced by the hold and the attempt."""
        t = self.task_at(i, prefer=lambda t: t.state == TaskState.PROCESSING and any(
            w.state == "open" for w in t.waits.values()
        ))  # fmt: skip
        scheduler = (
            (t.locked_by or SCHEDULERS[0])
            if who == "holder"
            else self.other(SCHEDULERS, t.locked_by)
        )
        attempt = t.attempt + token
        open_ = sorted(q for q, w in t.waits.items() if w.state == "open")
        if not open_:
            self.refused = True  # a park names the waits it parks on
            return
        seqs = tuple(open_[:1] if some else open_)
        request = ParkRequest(
            task_id=t.task_id, task_attempt=attempt, scheduler=scheduler, seqs=seqs
        )
        out, span = self.call(self.s.park(request))
        held = (t.state, t.locked_by, t.attempt) == (TaskState.PROCESSING, scheduler, attempt)
        if not held:
            assert out.state == "fenced", f"park of {t.task_id} by {scheduler}@{attempt}: {out}"
            self.refused = True
            return
        kept = any(e.taken_by is None for e in t.inbox)
        ready = any3(
            (w.kind == "event" and kept) or (False if w.wake_at is None else w.wake_at.passed(span))
            for w in (t.waits[q] for q in seqs)
        )
        agree(ready, out.state == "ready", f"park of {t.task_id} on {seqs}")
        if out.state == "ready":
            self.refused = True
            return
        assert out.state == "parked", f"park of {t.task_id} on {seqs}: {out}"
        waits = [t.waits[q] for q in seqs]
        t.release(TaskState.WAITING)
        wakes = [w.wake_at for w in waits if w.wake_at is not None]
        t.wake_at = None
        for wake_at in wakes:
            t.wake_at = wake_at.earliest(t.wake_at)
        t.waiting_for = waiting_for_all([(str(q), t.waits[q].kind, t.waits[q].name) for q in seqs])
        detail: dict[str, Any] = {"seq": seqs[0], "for": t.waiting_for}
        if len(seqs) > 1:
            detail["seqs"] = list(seqs)
        self.expect_event(t.task_id, "waiting", **detail)

    @precondition(has_tasks)
    @rule(i=st.integers(0, 9), action=st.sampled_from(["cancel", "compensate"]))
    def operate_parent(self, i: int, action: str) -> None:
        """An operator cancels or compensates a task, mostly one with children that have not
        ended: the action reaches them, newest first, and theirs."""
        self.operate_on(
            self.task_at(i, lambda t: any(
                c.parent_id == t.task_id and c.state not in FINISHED_TASK_STATES
                for c in self.tasks.values()
            )),
            action,
            None,
        )  # fmt: skip

    @precondition(has_tasks)
    @rule(i=st.integers(0, 9), how=st.sampled_from(["processed", "error", "cancel"]))
    def end_child(self, i: int, how: str) -> None:
        """A child ends, by its scheduler (processed, or error) or by an operator's cancel:
        its end is recorded in its parent's wait and its parent, waiting, is woken. (Whether
        there is a child depends on what the store did: not a precondition, which hypothesis
        needs to depend on its choices only.)"""
        kids = [t for t in self.tasks.values() if t.parent_id is not None]
        if not kids:
            self.refused = True
            return
        live = [t for t in kids if t.state not in FINISHED_TASK_STATES]
        waited = [t for t in live if self.tasks[t.parent_id or ""].state == TaskState.WAITING]
        c = pick(waited or live or kids, i)
        assert c is not None
        if how != "cancel" and c.held and c.state == TaskState.PROCESSING:
            outcome = TaskState.PROCESSED if how == "processed" else TaskState.ERROR
            self.finish_task(c, "holder", 0, outcome)
        else:
            self.operate_on(c, "cancel", None)

    @precondition(has_tasks)
    @rule(i=st.integers(0, 9), event=st.sampled_from(["e1", "e2", "e3"]))
    def send(self, i: int, event: str) -> None:
        """An event "go" for a task: kept (once per event_id) until a wait takes it, and the
        task woken if it waits for it; an event_id sent before is answered as sent before,
        whatever the task's state; a new one is refused by a finished task."""
        t = self.task_at(i, prefer=lambda t: t.state == TaskState.WAITING)
        payload = f'"{event}"'
        out, span = self.call(self.s.send_event(t.task_id, "go", payload, event))
        new = all(e.event_id != event for e in t.inbox)
        if new and t.state in FINISHED_TASK_STATES:
            assert out == t.state, f"a send to {t.task_id} ({t.state}): {out}"
            self.refused = True
            return
        assert isinstance(out, SendOutcome), f"a send to {t.task_id} ({t.state}): {out}"
        assert out.sent == new, f"send {event} to {t.task_id}: sent={out.sent}"
        if not new:
            assert not out.woke
            self.refused = True
            return
        t.inbox.append(MEvent(event))
        waits_for_it = any(w.kind == "event" and w.state == "open" for w in t.waits.values())
        woke = t.state == TaskState.WAITING and waits_for_it
        assert out.woke == woke, f"send {event} to {t.task_id} ({t.state}): woke={out.woke}"
        self.expect_event(t.task_id, "event_received", event_id=event, woke=woke)
        if woke:
            t.release(TaskState.PENDING)
            t.eligible_at = When.now(span)

    @rule(who=st.sampled_from(["leader", "leader", *HOLDERS]), token=st.sampled_from([0, 0, -1]))
    def wake(self, who: str, token: int) -> None:
        """The supervisor wakes the waiting tasks whose wake_at has passed, under the lease."""
        now = time.time()
        if self.lease is None or (
            who == "leader" and self.lease.expires.passed((now, now)) is not False
        ):
            self.acquire_lease(self.lease.holder if self.lease else HOLDERS[0], LONG)
            self.refused = False
        assert self.lease is not None
        holder = self.lease.holder if who == "leader" else who
        term = self.lease.term + token
        woken, span = self.call(self.s.wake_due(lease=LEASE, holder=holder, term=term, limit=100))
        leased = all3(
            holder == self.lease.holder,
            term == self.lease.term,
            not3(self.lease.expires.passed(span)),
        )
        got = {w.task_id for w in woken}
        if leased is False:
            assert not got, f"{holder}@{term} woke tasks without the lease: {got}"
        if not got:
            self.refused = True
        for t in self.tasks.values():
            due: Maybe = False
            if t.state == TaskState.WAITING and t.wake_at is not None:
                due = all3(leased, t.wake_at.passed(span))
            agree(due, t.task_id in got, f"wake of {t.task_id} ({t.state})")
            if t.task_id in got:
                self.expect_event(t.task_id, "woke", waited_for=t.waiting_for)
                t.release(TaskState.PENDING)
                t.eligible_at = When.now(span)

    # -- the operator -------------------------------------------------------------------
    @precondition(has_tasks)
    @rule(
        i=st.integers(0, 9),
        action=st.sampled_from(sorted(OPERATOR_ACTIONS)),
        j=st.integers(0, 9),
    )
    def operate(self, i: int, action: str, j: int) -> None:
        """An operator action, on a task in any state (most are refused), or on no task."""
        t = self.task_at(i) if j else None
        seq = None
        if action == "skip":
            seq = (pick(sorted(t.steps), j) if t else None) or MAX_SEQ + 1
        self.operate_on(t, action, seq)

    def operate_on(self, t: MTask | None, action: str, seq: int | None) -> None:
        task_id = t.task_id if t else "nobody"
        a = OperatorAction(
            action=action,  # type: ignore[arg-type]
            task_id=task_id,
            actor="ops",
            reason="model",
            seq=seq,
            result='"by hand"' if action == "skip" else None,
        )
        [out], span = self.call(self.s.operate([a]))
        assert out.task_id == task_id
        if t is None:
            assert (out.applied, out.before, out.after) == (False, None, None), out
            self.refused = True
            return
        before = t.state
        moves = OPERATOR_ACTIONS[action]
        after = moves.get(before)
        ok = after is not None
        if action == "skip":
            step = t.steps.get(seq or 0)
            ok = ok and step is not None and step.state != StepState.COMPLETED
        agree(ok, out.applied, f"{action} of {task_id} ({before}, seq {seq})")
        assert out.before == before, f"{action} of {task_id}: before {out.before} != {before}"
        if not out.applied:
            assert out.after == before
            self.refused = True
            return
        assert after is not None and out.after == after
        if action == "skip":
            s = t.steps[seq or 0]
            s.state = StepState.COMPLETED
            s.result = "by hand"
            s.error = None
            s.abandoned = False
            s.locked_by = None
            detail = {"action": action, "by": "ops", "from": before, "to": after, "seq": seq}
            self.expect_event(t.task_id, "operator", **detail)
            return
        self.apply_action(t, action, span, by="ops", reason="model")
        reached = self.cascade(t, action, "ops", span) if action in ("cancel", "compensate") else []
        self.ended([x for x in [t, *reached] if x.state in FINISHED_TASK_STATES], span)

    # -- progress -----------------------------------------------------------------------
    @precondition(has_tasks)
    @rule(
        moves=st.lists(
            st.tuples(
                st.integers(0, 9),
                st.integers(0, 6),
                st.sampled_from([SHORT, LONG, LONG]),
                st.sampled_from(["plain", "undoable", "undoable", "undo"]),
                st.integers(0, 4),
                st.sampled_from(INSTANCES),
            ),
            min_size=1,
            max_size=4,
        )
    )
    def advance(self, moves: list[tuple[int, int, float, str, int, str]]) -> None:
        """A few of the writes a healthy system would make next, each by the actor it falls
        to, with current tokens, through the rule that makes it and checked as after any
        rule: so that examples go deep whichever of the other rules they leave out."""
        for n, move in enumerate(moves):
            if n:
                self.store_matches_model()
            self.progress(*move)

    def progress(
        self, k: int, i: int, within: float, flavor: str, fail: int, instance: str
    ) -> None:
        """The k-th of the writes that would move things on now."""
        now = time.time()
        tasks = list(self.tasks.values())
        held = [t for t in tasks if t.held]
        steps = [s for t in tasks for s in t.steps.values()]
        actions: list[Callable[[], None]] = []
        if any(s.state == StepState.RUNNING for s in steps):
            state = StepState.FAILED if fail == 0 else StepState.COMPLETED
            actions.append(lambda: self.complete(i, i, "holder", 0, state))
        if any(s.state == StepState.NOT_STARTED for s in steps):
            actions.append(lambda: self.claim_requests(instance, (FORWARD, UNDO)))
        if held:
            t = self.task_at(i, lambda t: t.held)
            seqs = sorted(t.steps)
            actions.append(lambda: self.dispatch(i, "new", "holder", 0, 1, 0, within, flavor))
            actions.append(lambda: self.fan_out(i, "holder", 0, 2 + fail % 3, within, fail < 2))
            if t.state == TaskState.COMPENSATING:  # the undo of a step not yet undone
                undoable = [
                    s.seq for s in t.steps.values() if s.compensation and s.compensates is None
                ]
                done = {s.compensates for s in t.steps.values()}
                for j, q in enumerate(undoable, start=len(undoable)):
                    if q not in done:
                        undo = functools.partial(self.dispatch, i, "new", "holder", 0, j, 0)
                        actions.append(functools.partial(undo, within, "undo"))
                        break
            for j, q in enumerate(seqs):
                step = t.steps[q]
                if step.open and step.task_attempt != t.attempt:
                    late = step.complete_by.passed((now, now)) is not False
                    kind = "redispatch" if late else "adopt"
                    again = functools.partial(self.dispatch, i, kind, "holder", 0, j, 0)
                    actions.append(functools.partial(again, within, flavor))
            if fail <= 1:
                if t.state == TaskState.PROCESSING:
                    outcome = TaskState.ERROR if fail == 0 else TaskState.PROCESSED
                else:
                    outcome = TaskState.COMPENSATION_FAILED if fail == 0 else TaskState.COMPENSATED
                actions.append(lambda: self.finish(i, "holder", 0, outcome))
            actions.append(lambda: self.sweep("leader", 0, 0.0))
            if t.state == TaskState.PROCESSING:  # a child, and the park of the task's waits
                park = fail % 2 == 0
                actions.append(lambda: self.start_child(i, "holder", 0, False, park, False, within))
                actions.append(lambda: self.wait(i, "holder", 0, "timer", within, False, False))
                actions.append(lambda: self.park(i, "holder", 0, False))
        if any(t.state in (TaskState.PENDING, TaskState.COMPENSATING) for t in tasks):
            actions.append(lambda: self.claim(SCHEDULERS[i % 2], 10))
        if not actions:
            self.refused = True
            return
        actions[k % len(actions)]()

    # -- time ---------------------------------------------------------------------------
    def deadlines(self) -> list[When]:
        """Every time the model knows the store computed and may compare with its now."""
        found = [t.eligible_at for t in self.tasks.values()]
        found += [t.complete_by for t in self.tasks.values() if t.complete_by is not None]
        found += [s.complete_by for t in self.tasks.values() for s in t.steps.values()]
        found += [w.wake_at for t in self.tasks.values() for w in t.waits.values() if w.wake_at]
        if self.lease is not None:
            found.append(self.lease.expires)
        return found

    @rule()
    def expire(self) -> None:
        """Let every short deadline pass: sleep until the latest of them is behind the clock
        (the long ones never pass during an example)."""
        now = time.time()
        short = [w.hi for w in self.deadlines() if w.hi < now + LONG / 2]
        until = max(short, default=now) + 2 * EPS + 0.001
        while (left := until - time.time()) > 0:
            time.sleep(left)
        self.refused = True

    # -- the checks ---------------------------------------------------------------------
    @invariant()
    def store_matches_model(self) -> None:
        old, new = self.snap, self.read()
        try:
            if self.refused:
                assert new.same_as(old), "a refused write (or no write) changed the store"
            self.check_events(old, new)
            self.check_history(old, new)
            self.check_tasks(new)
        finally:
            self.snap = new
            self.refused = False
            self.expected_events = []

    def check_events(self, old: Snapshot, new: Snapshot) -> None:
        assert new.events[: len(old.events)] == old.events, "recorded events changed"
        ids = [e.id for e in new.events]
        assert ids == sorted(set(ids)), "event ids do not rise"
        added = new.events[len(old.events) :]
        got = Counter((e.task_id, e.kind) for e in added)
        want = Counter((e.task_id, e.kind) for e in self.expected_events)
        assert got == want, f"events recorded {dict(got)}, expected {dict(want)}"
        for task_id in {e.task_id for e in self.expected_events}:
            recorded = [e for e in added if e.task_id == task_id]
            expected = [e for e in self.expected_events if e.task_id == task_id]
            for r, x in zip(recorded, expected, strict=True):
                assert r.kind == x.kind, f"{task_id}: events {recorded} expected {expected}"
                for k, v in x.detail.items():
                    assert r.detail.get(k) == v, f"{task_id}: {r.kind} {r.detail}: {k} != {v}"

    def check_history(self, old: Snapshot, new: Snapshot) -> None:
        """What may only grow or never change, from one rule to the next."""
        for tid, before in old.tasks.items():
            after = new.tasks.get(tid)
            assert before is not None and after is not None, f"task {tid} disappeared"
            assert after.attempt >= before.attempt, f"{tid}: attempt fell"
            was = {s.seq: s for s in old.steps[tid]}
            now = {s.seq: s for s in new.steps[tid]}
            assert set(was) <= set(now), f"{tid}: a step disappeared"
            for seq, s in was.items():
                n = now[seq]
                assert n.attempt >= s.attempt, f"{tid}/{seq}: step attempt fell"
                assert n.idempotency_key == s.idempotency_key, f"{tid}/{seq}: key changed"
                if s.state == StepState.COMPLETED:
                    assert n == s, f"{tid}/{seq}: a completed step changed: {s} -> {n}"

    def check_tasks(self, snap: Snapshot) -> None:
        assert sorted(t.task_id for t in snap.listed) == sorted(self.order), "list_tasks"
        counts = Counter(t.state for t in self.tasks.values())
        assert snap.counts == {s: counts.get(s, 0) for s in TaskState}, "count_tasks"
        for listed in snap.listed:
            assert snap.tasks[listed.task_id] == listed, "list_tasks and get_task differ"
        for tid, t in self.tasks.items():
            rec = snap.tasks[tid]
            assert rec is not None
            self.check_task(t, rec, snap.steps[tid])
            self.check_waits(t, snap.waits[tid])

    def check_waits(self, t: MTask, waits: list[WaitRecord]) -> None:
        got = {w.seq: (w.kind, w.name, w.state) for w in waits}
        want = {q: (w.kind, w.name, w.state) for q, w in t.waits.items()}
        assert got == want, f"{t.task_id}: waits (kind, name, state) {got}, the model says {want}"
        for w in waits:
            m = t.waits[w.seq]
            if m.wake_at is None:
                assert w.wake_at is None, f"{t.task_id}/{w.seq}: wake_at {w.wake_at}"
            else:
                assert w.wake_at is not None and m.wake_at.holds(w.wake_at.timestamp())
            if m.kind == "child" and m.state != "open":
                if m.errors is not None:  # one of the sweep's errors: pinned now
                    assert w.payload["state"] == m.payload["state"], f"{t.task_id}/{w.seq}"
                    assert w.payload["error"] in m.errors, f"{t.task_id}/{w.seq}: {w.payload}"
                    m.payload, m.errors = w.payload, None
                assert w.payload == m.payload, f"{t.task_id}/{w.seq}: payload {w.payload}"

    def check_task(self, t: MTask, rec: TaskRecord, steps: list[StepRecord]) -> None:
        tid = t.task_id
        state = TaskState(rec.process_state)
        # Generic invariants, whatever the model says.
        held = rec.locked_by is not None
        assert held == (rec.complete_by is not None), f"{tid}: locked_by without complete_by"
        if state == TaskState.PROCESSING:
            assert held, f"{tid}: processing, not held"
        elif state != TaskState.COMPENSATING:
            assert not held, f"{tid}: {state} but held by {rec.locked_by}"
        assert (rec.finished_at is not None) == (state in FINISHED_TASK_STATES), (
            f"{tid}: {state} with finished_at {rec.finished_at}"
        )
        if rec.on_failure != OnFailure.RETRY:
            assert rec.failure_count <= rec.max_failures, f"{tid}: failure_count over max"
        assert rec.compensation_failures <= rec.max_failures, f"{tid}: compensation over max"
        for s in steps:
            assert s.idempotency_key == f"{tid}/{s.seq}"
            if state in FINISHED_TASK_STATES:
                assert s.state not in OPEN_STEP_STATES, f"{tid} is {state}, step {s.seq} open"
            assert (s.finished_at is not None) == (s.state not in OPEN_STEP_STATES), (
                f"{tid}/{s.seq}: {s.state} with finished_at {s.finished_at}"
            )
        # The model.
        choices = self.error_choices.pop(tid, None)
        if choices is not None:  # the sweep's error names the task or one of its steps
            assert rec.error in choices, f"{tid}: error {rec.error!r}, expected one of {choices}"
            t.error = rec.error
        want = (
            t.state, t.locked_by, t.attempt, t.failure_count, t.compensation_failures, t.result,
            t.error,
        )  # fmt: skip
        got = (
            state, rec.locked_by, rec.attempt, rec.failure_count, rec.compensation_failures,
            rec.result, rec.error,
        )  # fmt: skip
        assert got == want, (
            f"{tid}: (state, locked_by, attempt, failure_count, compensation_failures, result,"
            f" error) is {got}, "
            f"the model says {want}"
        )
        if t.complete_by is not None:
            assert rec.complete_by is not None
            assert t.complete_by.holds(rec.complete_by.timestamp()), f"{tid}: complete_by"
        assert rec.waiting_for == t.waiting_for, f"{tid}: waiting_for {rec.waiting_for}"
        assert (rec.parent_id, rec.parent_position) == (t.parent_id, t.parent_position), (
            f"{tid}: parent {rec.parent_id} at {rec.parent_position}"
        )
        if t.wake_at is None:
            assert rec.wake_at is None, f"{tid}: wake_at {rec.wake_at}, the model has none"
        else:
            assert rec.wake_at is not None and t.wake_at.holds(rec.wake_at.timestamp()), (
                f"{tid}: wake_at {rec.wake_at}"
            )
        have = {s.seq: s for s in steps}
        assert sorted(have) == sorted(t.steps), f"{tid}: steps {sorted(have)}"
        for seq, m in t.steps.items():
            s = have[seq]
            want_s = (
                m.state,
                m.attempt,
                m.task_attempt,
                m.locked_by,
                m.key,
                m.result,
                m.error,
                m.abandoned,
                m.tries,
                m.operation,
                m.compensation,
                m.compensates,
                m.position,
            )
            got_s = (
                StepState(s.state),
                s.attempt,
                s.task_attempt,
                s.locked_by,
                s.idempotency_key,
                s.result,
                s.error,
                s.abandoned,
                s.tries,
                s.operation,
                s.compensation,
                s.compensates,
                s.position,
            )
            assert got_s == want_s, (
                f"{tid}/{seq}: (state, attempt, task_attempt, locked_by, key, result, error, "
                f"abandoned, tries, operation, compensation, compensates, position) is {got_s}, "
                f"the model says {want_s}"
            )
            assert s.input == {"n": 1}
            assert m.complete_by.holds(s.complete_by.timestamp()), f"{tid}/{seq}: complete_by"
