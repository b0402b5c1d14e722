"""The scheduler: claims pending tasks, drives their workflows, dispatches their steps.

One Scheduler instance runs many workflows concurrently as coroutines in one event loop: the
tasks of the (workflow, version)s it has, each with the version it was submitted with. Step
records and task outcomes of concurrent workflows are written together (group commit), and
step results arrive by wake-up (in-process, or LISTEN/NOTIFY on PostgreSQL) with polling as the
fallback. A scheduler that no longer holds a task (its complete_by passed, or the supervisor
reset it) stops that workflow and writes nothing: its writes are fenced by the task attempt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Protocol, TypeVar

from . import _json
from ._aio import first, sleep_unless
from ._batch import Batcher
from .agent import Operation
from .errors import (
    ChildFailed,
    PayloadError,
    StepFailed,
    StoreError,
    TransientStoreError,
    UnknownNameError,
)
from .records import (
    Adopt,
    ClaimedTask,
    DispatchedStep,
    Held,
    NewStep,
    ParkRequest,
    Redispatch,
    Released,
    Request,
    SchedulerBeat,
    StepDispatch,
    StepOutcome,
    StepRecord,
    TaskOutcome,
    WaitOutcome,
    WaitRequest,
    idempotency_key,
    step_key,
)
from .retry import after_store_failure, answered
from .rules import AlertReason, describe, error_text, step_needs_compensation, unrunnable
from .states import OPEN_STEP_STATES, StepState, TaskState
from .store import CHANNEL_RESULTS, CHANNEL_TASKS, Store
from .workflow import Abandon, Context, Parked, Workflow

logger = logging.getLogger("stepwarden.scheduler")
T = TypeVar("T")

RESULT_SLACK = 0.25
"""Seconds a scheduler waits past a step's complete_by for word of its result."""
ROOM_EVERY = 0.05
"""Seconds between two reads of the agents' room (admission): a claim loop that woke often
would otherwise cost a read each time."""
DEFAULT_HEARTBEAT = 1.0
"""Seconds between a scheduler instance's heartbeats in the registry."""
DEFAULT_GONE_AFTER = 5.0
"""Seconds without a heartbeat after which a scheduler instance is gone: the supervisor gives
its tasks back for another scheduler to resume."""
ADMIT_BATCH = 25
"""A scheduler whose agents have room for fewer tasks than this waits ROOM_EVERY once before
claiming them: claims of one or two tasks each would cost a commit each."""
RECORD_WITHIN = 0.005
"""Seconds the outcome of a step called in this process waits for the workflow's next write
(which it then shares a transaction with) before it is written alone."""
VERSIONS_EVERY = 60.0
"""Seconds between two looks (the first at start) for tasks of a scheduler's workflows at
versions it does not have, each logged as a warning while any wait."""


class LocalAgent(Protocol):
    """An agent instance in the scheduler's own process (`AgentRunner`), to which a step may
    be handed at once: recorded running, held by it, called without a queue or a wake-up."""

    instance: str

    def take_local(self, operation: str, where: tuple[str, int]) -> bool:
        """Reserve room for one call of `operation` now, if it may be handed over, for the
        step `where` (task_id, seq) about to be written as held by this instance."""

    def release_local(self, where: tuple[str, int]) -> None:
        """Give back a reservation whose step was not handed over after all (a write whose
        answer was lost may have recorded it held by this instance all the same: the
        instance takes it up, `AgentRunner.take_up`)."""

    def serve_local(
        self, request: Request, report: Callable[[StepOutcome], Awaitable[bool]]
    ) -> None:
        """Call a step recorded as held by this instance (its reservation taken); its
        outcome goes to `report`, whose answer says whether it was recorded."""


@dataclass(frozen=True, slots=True)
class _Answer:
    """How a step ended, as the workflow waiting for it sees it."""

    state: StepState
    result: Any
    error: str | None

    @classmethod
    def of(cls, step: StepRecord) -> _Answer:
        return cls(step.state, step.result, step.error)


@dataclass(slots=True)
class _Unrecorded:
    """The outcome of a step called in this process, handed to its workflow before it is
    recorded: it is written with the task's next write, or alone soon after."""

    outcome: StepOutcome
    recorded: asyncio.Future[bool]


_Write = StepDispatch | TaskOutcome | None
"""What a workflow writes to the store through the scheduler's group commit (None: only the
outcomes it goes on from)."""


class Scheduler:
    def __init__(
        self,
        store: Store,
        workflows: Mapping[tuple[str, int], Workflow],
        *,
        instance: str,
        concurrency: int = 1000,
        poll_interval: float | None = None,
        operations: Mapping[str, Operation] | None = None,
        admission: bool = True,
        heartbeat: float = DEFAULT_HEARTBEAT,
        gone_after: float = DEFAULT_GONE_AFTER,
        versions_every: float = VERSIONS_EVERY,
    ) -> None:
        self.store = store
        self.heartbeat = heartbeat
        self.gone_after = gone_after
        self.versions_every = versions_every
        self.workflows = dict(workflows)
        """What this scheduler runs, by (workflow, version): it claims those tasks only."""
        for key, wf in self.workflows.items():
            if key != wf.key:
                raise ValueError(f"workflow {wf.name!r} version {wf.version} filed as {key}")
        self.operations = operations
        """The operations of the App's agents by "agent.operation"; None accepts any."""
        self.instance = instance
        self.concurrency = concurrency
        self.admission = admission
        self._room_left: int | None = None
        self._room_at = float("-inf")
        self._waited = False
        """Claim no more tasks than the agents have room for (`Store.agent_room`): a task
        left pending has no deadline running, a step queued behind full agents has."""
        self.poll_interval = poll_interval or store.default_poll_interval
        self._running: set[asyncio.Task[None]] = set()
        self._driving: dict[str, asyncio.Task[None]] = {}
        """The drive of each task by its id: a task claimed again (released meanwhile, say by
        the supervisor when a step's agent was gone) stops its older, fenced-out drive."""
        self._room = asyncio.Event()
        self._waiting: dict[str, tuple[tuple[str, int], asyncio.Future[_Answer]]] = {}
        self._writes: Batcher[tuple[_Write, list[_Unrecorded]], Any] = Batcher(
            self._write_group, yields=3
        )
        """The group commit of the workflows' writes with the outcomes they go on from."""
        self.local_agents: dict[str, LocalAgent] = {}
        """This process's agent instances by agent name (set by the worker): a new step of
        an operation one of them has room for is handed to it at once."""
        self._unrecorded: dict[str, list[_Unrecorded]] = {}
        """By task: outcomes of steps called here that its workflow went on from, not yet
        known to be recorded."""
        self._recording: set[asyncio.Task[None]] = set()
        """Writes of outcomes alone under way (kept from the garbage collector)."""
        self._drove: set[tuple[str, int]] = set()
        """The tasks (task_id, attempt) this instance has driven and may still hold:
        `give_back_undriven` leaves them be. Forgotten once a look finds them no longer held."""
        self._undriven: set[tuple[str, int]] = set()
        """Tasks the last look found held by this instance and not driven by it."""
        self._refused: set[str] = set()
        """Tasks an outcome of which the store refused after their workflow went on from it:
        nothing more is written for them (their hold is over, or about to be)."""

    def workflow_of(self, held: Held) -> Workflow:
        return self.workflows[(held.workflow, held.version)]

    # -- the loops ------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event, *, drain_timeout: float = 30.0) -> None:
        """Register, then claim and drive tasks until `stop` is set; then let the workflows
        under way finish (up to `drain_timeout` seconds) and give back the tasks still held,
        for another scheduler to resume at once."""
        if not await self._register(stop):
            return
        results = asyncio.create_task(self._watch_results())
        beats = asyncio.create_task(self._heartbeats())
        versions = asyncio.create_task(self._watch_versions())
        try:
            await self._claim_loop(stop)
            if self._running:
                await asyncio.wait(set(self._running), timeout=drain_timeout)
            for task in set(self._running):
                task.cancel()
            if self._running:
                await asyncio.wait(set(self._running))
            await self._writes.drain()
        finally:
            results.cancel()
            beats.cancel()
            versions.cancel()
            await asyncio.gather(results, beats, versions, return_exceptions=True)
            await self._leave()

    # -- the registry ---------------------------------------------------------------------
    def _beat(self) -> SchedulerBeat:
        return SchedulerBeat(
            instance=self.instance,
            workflows=tuple(sorted({name for name, _ in self.workflows})),
            capacity=self.concurrency,
            held=len(self._running),
            versions=tuple(sorted(self.workflows)),
        )

    async def _register(self, stop: asyncio.Event) -> bool:
        """Register in the store before claiming anything, trying until it works (False
        when stopped first)."""
        failures = 0
        while not stop.is_set():
            try:
                await self.store.beat_schedulers([self._beat()], self.gone_after)
                return True
            except StoreError as exc:
                failures += 1
                what = f"scheduler {self.instance}: cannot register"
                await self.store.wait_to_retry(
                    after_store_failure(logger, what, exc, failures), stop
                )
        return False

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            try:
                await self.store.beat_schedulers([self._beat()], self.gone_after)
            except StoreError as exc:
                logger.warning("scheduler %s: heartbeat failed: %s", self.instance, exc)
                continue
            try:
                await self.give_back_undriven()
            except StoreError as exc:
                logger.warning("scheduler %s: cannot read its tasks: %s", self.instance, exc)

    async def give_back_undriven(self) -> list[Released]:
        """Give back the tasks this instance holds, in time, that it has not driven under
        their attempt, seen so at two looks in a row (a claim answered meanwhile is driven by
        the second): a claim whose commit was made but whose answer was lost leaves them so,
        and they would wait for their complete_by. A task whose drive here stopped, leaving
        it to the supervisor, is not given back (its failure is counted at its deadline)."""
        drove = set(self._drove)
        held = await self.store.held_tasks(self.instance)
        self._drove -= drove - set(held)
        undriven = {
            (task_id, attempt)
            for task_id, attempt in held
            if task_id not in self._driving and (task_id, attempt) not in self._drove
        }
        twice, self._undriven = undriven & self._undriven, undriven - self._undriven
        if not twice:
            return []
        released = await self.store.release_held(self.instance, only=twice)
        for r in released:
            logger.warning(
                "task %s: held by this scheduler but not driven (word of its claim was lost); "
                "given back (now %s)",
                r.task_id,
                r.process_state,
            )
        return released

    async def _watch_versions(self) -> None:
        """Say, as a warning every `versions_every` seconds (the first at start), which tasks
        of this scheduler's workflows wait at a version it does not have: it leaves them to
        a scheduler with that version, and there may be none."""
        names = sorted({name for name, _ in self.workflows})
        while True:
            try:
                backlog = await self.store.version_backlog(names)
            except StoreError as exc:
                logger.debug("scheduler %s: cannot read the backlog: %s", self.instance, exc)
                backlog = []
            for b in unrunnable(backlog, self.workflows):
                have = sorted(v for name, v in self.workflows if name == b.workflow)
                logger.warning(
                    "scheduler %s: %d task(s) of workflow %r version %d wait for a scheduler "
                    "with that version (this one runs %s %s of it)",
                    self.instance,
                    b.tasks,
                    b.workflow,
                    b.version,
                    "version" if len(have) == 1 else "versions",
                    ", ".join(str(v) for v in have),
                )
            await asyncio.sleep(self.versions_every)

    async def _leave(self) -> None:
        """Give back the tasks still held (their workflows were stopped) and leave the
        registry, so that nothing waits for this instance to be found gone."""
        try:
            released = await self.store.release_held(self.instance)
            await self.store.leave_scheduler(self.instance)
        except StoreError as exc:  # the supervisor gives them back once this one is gone
            logger.warning("scheduler %s: cannot hand back its tasks: %s", self.instance, exc)
            return
        if released:
            logger.info(
                "scheduler %s: handed back %d task(s) still held",
                self.instance,
                len(released),
            )

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        sub = self.store.subscribe(CHANNEL_TASKS)
        names = sorted(self.workflows)  # (workflow, version): the tasks this one may run
        failures = 0
        try:
            while not stop.is_set():
                free = self.concurrency - len(self._running)
                if free <= 0:
                    self._room.clear()
                    await first(stop.wait(), self._room.wait())
                    continue
                limit = min(free, 200)
                try:
                    if self.admission:
                        admitted = await self._admit(limit)
                        if admitted < min(limit, ADMIT_BATCH) and not self._waited:
                            # The agents are full, or nearly: let room gather for a while
                            # rather than claim a task or two at a time (once, then claim
                            # what there is).
                            self._waited = True
                            await sleep_unless(stop, ROOM_EVERY)
                            continue
                        self._waited = False
                        if admitted <= 0:
                            continue
                        limit = admitted
                    claimed = await self.store.claim_tasks(self.instance, names, limit)
                    if self._room_left is not None:
                        self._room_left -= len(claimed)
                    failures = 0
                except StoreError as exc:
                    failures += 1
                    what = "scheduler: cannot claim tasks"
                    await self.store.wait_to_retry(
                        after_store_failure(logger, what, exc, failures), stop
                    )
                    continue
                for c in claimed:
                    older = self._driving.get(c.task.task_id)
                    if older is not None:
                        older.cancel()
                    self._refused.discard(c.task.task_id)
                    self._drove.add((c.task.task_id, c.task.attempt))
                    task = asyncio.create_task(self._drive(c))
                    self._driving[c.task.task_id] = task
                    self._running.add(task)
                    task.add_done_callback(partial(self._done, c.task.task_id))
                if len(claimed) < limit:
                    await first(stop.wait(), sub.wait(self.poll_interval))
        finally:
            self.store.unsubscribe(CHANNEL_TASKS, sub)

    async def _admit(self, limit: int) -> int:
        """How many tasks to claim: `limit`, or fewer when the agents are full. The agents'
        room is read at most every ROOM_EVERY seconds, and counted down by the claims made
        in between (another scheduler's claims are seen at the next read)."""
        now = asyncio.get_running_loop().time()
        if now - self._room_at >= ROOM_EVERY:
            self._room_left = await self.store.agent_room()
            self._room_at = now
        return limit if self._room_left is None else min(limit, self._room_left)

    def _done(self, task_id: str, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if self._driving.get(task_id) is task:
            del self._driving[task_id]
            self._refused.discard(task_id)
        self._room.set()
        if not task.cancelled() and task.exception() is not None:
            logger.error("scheduler: driving a task failed", exc_info=task.exception())

    async def _watch_results(self) -> None:
        """Resolve the steps workflows wait for: at once on a wake-up naming them, and by a
        full poll every so often for results whose wake-up did not reach this process."""
        sub = self.store.subscribe(CHANNEL_RESULTS)
        loop = asyncio.get_running_loop()
        full_every = max(self.poll_interval, 0.2)
        last_full = loop.time()
        try:
            while True:
                payloads = await sub.wait(full_every)
                if not self._waiting:
                    last_full = loop.time()
                    continue
                if payloads is None or loop.time() - last_full >= full_every:
                    wanted = list(self._waiting)
                    last_full = loop.time()
                else:
                    wanted = [k for k in payloads if k in self._waiting]
                if not wanted:
                    continue
                try:
                    found = await self.store.finished_steps(
                        [self._waiting[k][0] for k in wanted if k in self._waiting]
                    )
                except StoreError as exc:
                    logger.warning("scheduler: cannot read step results: %s", exc)
                    await asyncio.sleep(min(1.0, full_every))
                    continue
                for record in found:
                    entry = self._waiting.get(step_key(record.task_id, record.seq))
                    if entry is not None and not entry[1].done():
                        entry[1].set_result(_Answer.of(record))
        finally:
            self.store.unsubscribe(CHANNEL_RESULTS, sub)

    # -- one task -------------------------------------------------------------------------
    async def _drive(self, claimed: ClaimedTask) -> None:
        task = claimed.task
        if task.process_state == TaskState.COMPENSATING:
            await self._drive_compensation(claimed)
            return
        held = Held(task.task_id, task.attempt, task.workflow, task.priority, task.version)
        workflow = self.workflow_of(held)
        ctx = Context(self, held, claimed.steps, claimed.waits)
        loop = asyncio.get_running_loop()
        state: TaskState
        result: str | None = None
        error: str | None = None
        try:
            async with asyncio.timeout_at(loop.time() + claimed.remaining) as deadline:
                value = await workflow.fn(ctx, task.input)
                await ctx.settle()
            result = _json.dumps(value, what=f"the result of workflow {task.workflow!r}")
            state = TaskState.PROCESSED
        except Parked:
            logger.debug("task %s: waits, released", task.task_id)
            return
        except Abandon:
            return
        except TimeoutError as exc:
            if deadline.expired():
                logger.info(
                    "task %s: complete_by passed, leaving it to the supervisor", task.task_id
                )
                return
            state, error = TaskState.ERROR, describe(exc)
        except (StepFailed, ChildFailed, PayloadError, UnknownNameError) as exc:
            state, error = TaskState.ERROR, error_text(str(exc))
        except Exception as exc:
            logger.warning(
                "task %s: workflow %s raised", task.task_id, task.workflow, exc_info=True
            )
            state, error = TaskState.ERROR, describe(exc)
        finally:
            ctx.close()
        await self._finish(task.task_id, task.attempt, state, result, error)

    async def _finish(
        self, task_id: str, attempt: int, state: TaskState, result: str | None, error: str | None
    ) -> None:
        outcome = TaskOutcome(
            task_id=task_id,
            attempt=attempt,
            scheduler=self.instance,
            state=state,  # type: ignore[arg-type]
            result=result,
            error=error,
        )
        try:
            applied = await self._answered(
                f"task {task_id}: cannot record its outcome",
                lambda: self._submit_write(outcome),
            )
        except StoreError as exc:  # permanent: said by _answered; the supervisor recovers it
            logger.error("task %s: its outcome is not recorded: %s", task_id, exc)
            return
        if not applied:
            logger.info("task %s: outcome discarded, the task is no longer held", task_id)
        elif state in (TaskState.ERROR, TaskState.COMPENSATION_FAILED):
            logger.error("ALERT task %s: %s: %s", task_id, state, error)

    async def _drive_compensation(self, claimed: ClaimedTask) -> None:
        """Run the compensations of the task's steps that took (or may have taken) effect,
        newest first, each as a recorded step of its own; resume those already recorded."""
        task = claimed.task
        held = Held(task.task_id, task.attempt, task.workflow, task.priority, task.version)
        workflow = self.workflow_of(held)
        recorded = {s.compensates: s for s in claimed.steps if s.compensates is not None}
        next_seq = max((s.seq for s in claimed.steps), default=0) + 1
        to_undo = [s for s in reversed(claimed.steps) if step_needs_compensation(s)]
        within = workflow.complete_within.total_seconds()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(loop.time() + claimed.remaining) as deadline:
                for step in to_undo:
                    done = recorded.get(step.seq)
                    if done is not None and done.state == StepState.COMPLETED:
                        continue
                    if done is not None and done.state == StepState.FAILED:
                        raise StepFailed(done.name, done.error)
                    assert step.compensation is not None
                    agent, _, operation = step.compensation.partition(".")
                    undo = (self.operations or {}).get(step.compensation)
                    args = step.compensation_input
                    args = args if isinstance(args, list) else [args]
                    seq = next_seq if done is None else done.seq
                    name = f"compensate {step.name}"
                    if done is None:
                        next_seq += 1
                        await self.run_step(
                            held,
                            NewStep(
                                task_id=task.task_id,
                                task_attempt=task.attempt,
                                scheduler=self.instance,
                                seq=seq,
                                name=name,
                                agent=agent,
                                operation=operation,
                                input=_json.dumps(
                                    step.compensation_input, what="a compensation input"
                                ),
                                priority=task.priority,
                                complete_within=within,
                                compensates=step.seq,
                                limit_key=(
                                    None
                                    if undo is None or undo.limit is None
                                    else undo.limit.key_of(args)
                                ),
                            ),
                            name,
                        )
                    else:
                        fence = Adopt(
                            task_id=task.task_id,
                            task_attempt=task.attempt,
                            scheduler=self.instance,
                            seq=seq,
                            expected_attempt=done.attempt,
                        )
                        again = Redispatch(
                            task_id=task.task_id,
                            task_attempt=task.attempt,
                            scheduler=self.instance,
                            seq=seq,
                            agent=agent,
                            expected_attempt=done.attempt,
                            complete_within=within,
                        )
                        await self.run_step(held, fence, name, fallback=again)
        except Abandon:
            return
        except TimeoutError:
            if deadline.expired():
                return  # the supervisor releases it
            raise
        except StepFailed as exc:
            error = f"{task.error}; then the compensation failed: {exc}"
            await self._finish(
                task.task_id, task.attempt, TaskState.COMPENSATION_FAILED, None, error
            )
            return
        await self._finish(task.task_id, task.attempt, TaskState.COMPENSATED, None, task.error)

    async def run_step(
        self,
        held: Held,
        dispatch: StepDispatch,
        step_name: str,
        *,
        fallback: StepDispatch | None = None,
    ) -> Any:
        """Record and queue a step (or take over / re-dispatch a recorded one), then wait for
        its result until its complete_by."""
        where = (held.task_id, dispatch.seq)
        key = step_key(*where)
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._waiting[key] = (where, future)
        local = self._local_for(dispatch)
        if local is not None:
            assert isinstance(dispatch, NewStep)
            handed = dispatch = replace(dispatch, claimed_by=local.instance)
        try:
            try:
                got, written = await self._write_step(held, dispatch)
                if local is not None:
                    if got is not None and written is handed:
                        local.serve_local(
                            self._request(handed, got),
                            partial(self._local_outcome, future),
                        )
                    else:
                        local.release_local(where)
                    local = None
                if got is None and fallback is not None:
                    got, _ = await self._write_step(held, fallback)
                    if got is not None:
                        await self._alert_if_retried_too_often(held, fallback, got, step_name)
                if got is None:
                    # Fenced out, or the step finished meanwhile: only the latter lets us go on.
                    record = await self._finished(where)
                else:
                    record = await self._result(held, where, future, got.remaining)
            except StoreError as exc:  # permanent (transient ones are tried again)
                logger.error(
                    "task %s: the store refused step %d (%s), leaving it to the supervisor",
                    held.task_id,
                    dispatch.seq,
                    exc,
                )
                raise Abandon from exc
        finally:
            if local is not None:  # stopped before its write said whether to hand it over
                local.release_local(where)
            if self._waiting.get(key, (where, None))[1] is future:
                del self._waiting[key]
        if record.state == StepState.COMPLETED:
            return record.result
        raise StepFailed(step_name, record.error)

    # -- steps called in this process -------------------------------------------------------
    def _local_for(self, dispatch: StepDispatch) -> LocalAgent | None:
        """The agent instance of this process a new step goes to at once, its room reserved:
        one of the step's agent with room now for its operation (`LocalAgent.take_local`)."""
        if not isinstance(dispatch, NewStep) or dispatch.claimed_by is not None:
            return None
        local = self.local_agents.get(dispatch.agent)
        if local is None or not local.take_local(
            dispatch.operation, (dispatch.task_id, dispatch.seq)
        ):
            return None
        return local

    @staticmethod
    def _request(dispatch: NewStep, got: DispatchedStep) -> Request:
        """The request of a step recorded as held by an agent instance of this process, as
        that instance would have claimed it."""
        return Request(
            task_id=dispatch.task_id,
            seq=dispatch.seq,
            attempt=got.attempt,
            agent=dispatch.agent,
            operation=dispatch.operation,
            input=_json.loads(dispatch.input),
            idempotency_key=idempotency_key(dispatch.task_id, dispatch.seq),
            complete_by=datetime.now(UTC) + timedelta(seconds=got.remaining),
            remaining=got.remaining,
            compensates=dispatch.compensates,
        )

    async def _local_outcome(self, future: asyncio.Future[_Answer], outcome: StepOutcome) -> bool:
        """The outcome of a step called in this process: its workflow goes on from it at once,
        and it is recorded with the workflow's next write (or alone, RECORD_WITHIN later).
        True once recorded; False when the store refused it (the step no longer held)."""
        recorded: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        pending = self._unrecorded.setdefault(outcome.task_id, [])
        pending.append(_Unrecorded(outcome, recorded))
        if not future.done():
            result = None if outcome.result is None else _json.loads(outcome.result)
            future.set_result(_Answer(outcome.state, result, outcome.error))
        asyncio.get_running_loop().call_later(
            RECORD_WITHIN, self._record_alone, outcome.task_id
        )
        return await recorded

    def _record_alone(self, task_id: str) -> None:
        """Write the outcomes of a task that no write of its workflow took along."""
        if self._unrecorded.get(task_id):
            writing = asyncio.create_task(self._outcomes_alone(task_id))
            self._recording.add(writing)
            writing.add_done_callback(self._recording.discard)

    async def _outcomes_first(self, task_id: str) -> None:
        """Before a write that cannot carry them (a wait, a park): record the outcomes the
        task's workflow went on from; Abandon when one was refused."""
        if self._unrecorded.get(task_id):
            await self._outcomes_alone(task_id)
        if task_id in self._refused:
            raise Abandon

    async def _outcomes_alone(self, task_id: str) -> None:
        try:
            await self._answered(
                f"task {task_id}: cannot record the outcome of a step",
                lambda: self._submit_write(None, task_id),
            )
        except StoreError as exc:  # permanent: each waiting call has been told
            logger.error("task %s: the outcome of a step is not recorded: %s", task_id, exc)

    def _submit_write(self, write: _Write, task_id: str | None = None) -> Awaitable[Any]:
        """Hand a write to the group commit with the outcomes its task's workflow went on
        from: all in one transaction. A write of a task whose outcome was refused is not
        made (a dispatch: None; an outcome: False)."""
        tid = task_id if write is None else write.task_id
        assert tid is not None
        carried = self._unrecorded.pop(tid, [])
        return self._writes.submit((write, carried))

    async def _write_group(self, items: Sequence[tuple[_Write, list[_Unrecorded]]]) -> list[Any]:
        """One transaction for the writes handed in together (`Store.advance`). A write whose
        try fails gets the exception, and its outcomes go back to their task, to go with
        its write tried again."""
        out: list[Any] = [None] * len(items)
        outcomes: list[_Unrecorded] = []
        dispatches: list[tuple[int, StepDispatch]] = []
        finishes: list[tuple[int, TaskOutcome]] = []
        for i, (write, carried) in enumerate(items):
            task_id = write.task_id if write is not None else (
                carried[0].outcome.task_id if carried else None
            )
            if task_id in self._refused:
                for u in carried:
                    if not u.recorded.done():
                        u.recorded.set_result(False)
                out[i] = False if isinstance(write, TaskOutcome) else None
                continue
            outcomes.extend(carried)
            if isinstance(write, TaskOutcome):
                finishes.append((i, write))
                out[i] = False
            elif write is not None:
                dispatches.append((i, write))
        try:
            done, dispatched, finished = await self.store.advance(
                [u.outcome for u in outcomes],
                [d for _, d in dispatches],
                [f for _, f in finishes],
            )
        except TransientStoreError:
            # Tried again with their task's next write, or alone: whichever comes first.
            loop = asyncio.get_running_loop()
            for tid in {u.outcome.task_id for u in outcomes}:
                again = [u for u in outcomes if u.outcome.task_id == tid]
                self._unrecorded[tid] = again + self._unrecorded.get(tid, [])
                loop.call_later(RECORD_WITHIN, self._record_alone, tid)
            raise
        except BaseException as exc:
            for u in outcomes:
                if not u.recorded.done():
                    if isinstance(exc, Exception):
                        u.recorded.set_exception(exc)
                    else:
                        u.recorded.cancel()
            raise
        for u, ok in zip(outcomes, done, strict=True):
            if not ok:
                self._refused.add(u.outcome.task_id)
                logger.info(
                    "task %s: the outcome of step %d was refused (the step is no longer held "
                    "by its call); the task's workflow stops here",
                    u.outcome.task_id,
                    u.outcome.seq,
                )
            if not u.recorded.done():
                u.recorded.set_result(ok)
        for (i, _), got in zip(dispatches, dispatched, strict=True):
            out[i] = got
        for (i, _), ok in zip(finishes, finished, strict=True):
            out[i] = ok
        return out

    async def wait(self, request: WaitRequest) -> WaitOutcome:
        """Record or read a wait (tried again while the store is unreachable: a try whose
        answer was lost is found as it left the wait, or the task parked, hence fenced)."""
        await self._outcomes_first(request.task_id)
        try:
            return await self._answered(
                f"task {request.task_id}: cannot record its wait {request.seq}",
                partial(self.store.wait, request),
            )
        except StoreError as exc:  # permanent: the supervisor recovers the task
            logger.error(
                "task %s: the store refused wait %d (%s), leaving it to the supervisor",
                request.task_id,
                request.seq,
                exc,
            )
            raise Abandon from exc

    async def park(self, request: ParkRequest) -> WaitOutcome:
        """Park a task whose workflow waits in every branch (tried again while the store is
        unreachable: a try whose answer was lost is found parked, hence fenced)."""
        await self._outcomes_first(request.task_id)
        try:
            return await self._answered(
                f"task {request.task_id}: cannot park it", partial(self.store.park, request)
            )
        except StoreError as exc:  # permanent: the supervisor recovers the task
            logger.error(
                "task %s: the store refused its park (%s), leaving it to the supervisor",
                request.task_id,
                exc,
            )
            raise Abandon from exc

    async def _write_step(
        self, held: Held, write: StepDispatch
    ) -> tuple[DispatchedStep | None, StepDispatch]:
        """Write a step, trying again while the store is unreachable; with it, the write that
        made it. A try whose answer was lost may have been applied: then the step is found as
        that try left it (open, under this attempt of the task) and taken as written, or
        queued again if its complete_by passed meanwhile."""
        uncertain = False
        failures = 0
        while True:
            if held.task_id in self._refused:
                raise Abandon
            try:
                got = await self._submit_write(write)
            except TransientStoreError as exc:
                failures += 1
                uncertain = True
                what = f"task {write.task_id}: cannot record step {write.seq}"
                await self.store.wait_to_retry(after_store_failure(logger, what, exc, failures))
                continue
            if got is not None or not uncertain:
                return got, write
            found = await self._answered(
                f"task {write.task_id}: cannot read step {write.seq}",
                partial(self.store.read_step, write.task_id, write.seq),
            )
            if found is None:
                return None, write
            step, remaining = found
            if step.state not in OPEN_STEP_STATES or step.task_attempt != held.attempt:
                return None, write  # finished meanwhile, or not this attempt's
            if remaining > 0:
                got = DispatchedStep(
                    task_id=step.task_id, seq=step.seq, attempt=step.attempt, remaining=remaining
                )
                if (
                    isinstance(write, NewStep)
                    and write.claimed_by is not None
                    and (step.state != StepState.RUNNING or step.locked_by != write.claimed_by)
                ):
                    return got, replace(write, claimed_by=None)  # open, but not as written
                return got, write
            write = Redispatch(
                task_id=held.task_id,
                task_attempt=held.attempt,
                scheduler=self.instance,
                seq=step.seq,
                agent=step.agent,
                expected_attempt=step.attempt,
                complete_within=(
                    step.complete_within or self.workflow_of(held).complete_within.total_seconds()
                ),
            )
            uncertain = False

    async def _answered(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`'s answer, tried again while the store is unreachable."""
        return await answered(logger, what, call, wait=self.store.wait_to_retry)

    async def _alert_if_retried_too_often(
        self, held: Held, dispatch: StepDispatch, got: DispatchedStep, step_name: str
    ) -> None:
        threshold = self.workflow_of(held).alert_after
        if got.attempt != threshold:
            return
        detail = {
            "reason": str(AlertReason.STEP_RETRIED),
            "seq": dispatch.seq,
            "step": step_name,
            "attempt": got.attempt,
            "error": f"step {step_name!r} dispatched {got.attempt} times",
        }
        logger.error("ALERT task %s: %s", held.task_id, detail["error"])
        try:
            await self.store.record_events([(held.task_id, "alert", detail)])
        except StoreError as exc:
            logger.warning("task %s: cannot record an alert: %s", held.task_id, exc)

    async def _result(
        self,
        held: Held,
        where: tuple[str, int],
        future: asyncio.Future[_Answer],
        remaining: float,
    ) -> _Answer:
        """Wait for a step's result until its complete_by; while the step is still open for
        this attempt of the task with its complete_by moved on (a heartbeat, or its agent
        instance gone and the step reassigned), wait on."""
        while True:
            try:
                async with asyncio.timeout(max(0.0, remaining) + RESULT_SLACK):
                    return await asyncio.shield(future)
            except TimeoutError:
                pass
            found = await self._answered(
                f"task {held.task_id}: cannot read step {where[1]}",
                lambda: self.store.read_step(*where),
            )
            if found is None:
                raise Abandon
            step, remaining = found
            if step.state in (StepState.COMPLETED, StepState.FAILED):
                return _Answer.of(step)
            if remaining <= 0 or step.task_attempt != held.attempt:
                raise Abandon

    async def _finished(self, where: tuple[str, int]) -> _Answer:
        found = await self._answered(
            f"task {where[0]}: cannot read step {where[1]}",
            lambda: self.store.finished_steps([where]),
        )
        if not found:
            raise Abandon
        return _Answer.of(found[0])

