"""The drive of one task a scheduler holds: its workflow's run, and all that run keeps.

A `TaskDrive` holds its task under one attempt (the fencing token of every write it makes)
and is the step runner its workflow's `Context` talks to (`workflow.StepRunner`): it writes
each step through its scheduler's group commit, waits for the step's result, and ends its
hold with the task's outcome. A compensating task runs the same way, its workflow being
`workflow.compensation`. Everything of the task that lives while it runs is here: the
futures of the steps its workflow waits for, the outcomes it went on from that are not yet
recorded, the outcomes the store refused.

The walk of a step's result. Called elsewhere, it comes by the scheduler's watch of results,
which hands it to the drive of its task (`resolve`). Called by an agent instance of this
process (the step handed over at once, `LocalAgent`), the instance hands the outcome to the
drive (`_local_outcome`): the drive resolves the future its workflow waits on at once, and
keeps the outcome until its next write carries it to the store in the same transaction, or
writes it alone RECORD_WITHIN later. The store's answer goes back to the instance.

A refused outcome: the drive carries it again with each of its later writes, so that the
store applies none of them (`store/policy.advance`, the one home of that rule); a wait or a
park, which cannot carry outcomes, first writes them and stops (Abandon) when one is not
recorded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from . import _json, _logs, tracing
from .agent import AnyOperation
from .deadline import Deadline
from .errors import (
    ChildFailed,
    ConfigurationError,
    PayloadError,
    StepFailed,
    StoreError,
    TransientStoreError,
    UnknownNameError,
)
from .metrics import Metrics
from .records import (
    ClaimedTask,
    DispatchedStep,
    Held,
    NewStep,
    ParkRequest,
    Redispatch,
    Request,
    StepDispatch,
    StepOutcome,
    StepRecord,
    TaskOutcome,
    WaitOutcome,
    WaitRequest,
    idempotency_key,
)
from .retry import after_store_failure, answered
from .rules import AlertReason, describe, error_text
from .sealing import Binding
from .states import OPEN_STEP_STATES, StepState, TaskState
from .store.ports import SchedulerPort
from .workflow import Abandon, Context, Parked, Workflow, compensation

if TYPE_CHECKING:
    from opentelemetry.trace import Span

logger = logging.getLogger("stepwarden.scheduler")
T = TypeVar("T")

RESULT_SLACK = 0.25
"""Seconds a drive waits past a step's complete_by for word of its result."""
OVERDUE_LOOK = 2.0
"""Seconds at most between two looks of a drive at a step it waits for past the step's
complete_by, and at its hold of the task (`TaskDrive._result`): the looks start
RESULT_SLACK apart and double."""
RECORD_WITHIN = 0.005
"""Seconds the outcome of a step called in this process waits for the workflow's next write
(which it then shares a transaction with) before it is written alone."""


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
class Answer:
    """How a step ended, as the workflow waiting for it sees it."""

    state: StepState
    result: Any
    error: str | None

    @classmethod
    def of(cls, step: StepRecord) -> Answer:
        return cls(step.state, step.result, step.error)


@dataclass(slots=True)
class Unrecorded:
    """The outcome of a step called in this process, handed to its workflow before it is
    recorded, with the store's answer to come (True: recorded)."""

    outcome: StepOutcome
    recorded: asyncio.Future[bool]


Write = StepDispatch | TaskOutcome | None
"""What a drive writes through the group commit (None: only the outcomes it goes on from)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One item of the scheduler's group commit: a drive's write with the outcomes it rests
    on, all applied in one transaction (`Store.advance`), or the write not at all when one of
    them is refused."""

    drive: TaskDrive
    write: Write
    carried: list[Unrecorded]


class Host(Protocol):
    """What a drive takes from its scheduler: process-wide things, none of them per task."""

    store: SchedulerPort
    instance: str
    operations: Mapping[str, AnyOperation] | None
    local_agents: dict[str, LocalAgent]
    metrics: Metrics

    @property
    def workflows(self) -> Mapping[tuple[str, int], Workflow]: ...

    def workflow_of(self, held: Held) -> Workflow: ...

    def commit(self, entry: Entry) -> Awaitable[Any]:
        """Hand an entry to the group commit; its answer: the write's (a dispatch: the step
        dispatched, or None; a task outcome: whether applied; None: nothing)."""


class TaskDrive:
    """One task held by this scheduler under one attempt, and its workflow's run."""

    def __init__(self, host: Host, claimed: ClaimedTask) -> None:
        task = claimed.task
        self.host = host
        self.claimed = claimed
        self.held = Held(
            task.task_id, task.attempt, task.workflow, task.priority, task.version, task.tenant
        )
        self.task_id = task.task_id
        self.instance = host.instance
        self.began = time.monotonic()
        """When it was claimed (about), on the monotonic clock: its run's time is counted from
        there (`Metrics.task_ran`)."""
        self.outcome = "stopped"
        """How its run ended, for its metrics: processed, failed, compensated,
        compensation_failed, waiting (parked), or stopped (no outcome recorded)."""
        self.operations = host.operations
        self.keys = host.store.keys
        """The keyring of the scheduler's store: it seals what the workflow hands on."""
        self.deadline = Deadline.after(claimed.remaining)
        """The task's complete_by: the drive stops there and writes nothing more."""
        self.run_task: asyncio.Task[None] | None = None
        """The asyncio task that runs the drive (set by the scheduler)."""
        self._waiting: dict[int, asyncio.Future[Answer]] = {}
        """The steps its workflow waits for, by seq."""
        self._unrecorded: list[Unrecorded] = []
        """Outcomes of steps called here that its workflow went on from, not yet recorded."""
        self._refused: list[StepOutcome] = []
        """Outcomes the store refused after its workflow went on from them: carried again
        with each later write, which the store then does not apply."""
        self._recording: set[asyncio.Task[bool]] = set()
        """Writes of outcomes alone under way (kept from the garbage collector)."""
        self.span: Span | None = None
        """The span of this run (`tracing`), while traced; `outcome` ends it."""
        self._tags = dict(task.tags)
        """The task's tags as its claim read them and its workflow set them since."""

    def key(self, seq: int) -> str:
        """The idempotency key of the task's step `seq` (a fork's: its original's keys)."""
        task = self.claimed.task
        return idempotency_key(
            task.task_id, seq, keys_of=task.keys_of, new_keys_from=task.new_keys_from
        )

    @property
    def workflows(self) -> Mapping[tuple[str, int], Workflow]:
        return self.host.workflows

    def workflow_of(self, held: Held) -> Workflow:
        return self.host.workflow_of(held)

    # -- the run --------------------------------------------------------------------------
    async def run(self) -> None:
        """Run the task's workflow (its compensation, when it is compensating) until it
        ends, then record how it ended; stop and write nothing when the hold is lost.
        Traced, the run is a span (`tracing`): a child of the task's submit, linked to the
        task's run before it, current while the workflow runs."""
        _logs.about_task(self.task_id, self.held.workflow, self.held.attempt)
        if not tracing.active():
            await self._run()
            return
        task = self.claimed.task
        compensating = task.process_state == TaskState.COMPENSATING
        span = self.span = tracing.start(
            f"{'compensate' if compensating else 'run'} {task.workflow}",
            kind="consumer",
            parent_of=tracing.parent(task.trace_context),
            links=tracing.link(task.run_trace, link="previous_run"),
            attrs={
                "messaging.system": tracing.SYSTEM,
                "messaging.operation.type": "process",
                "messaging.destination.name": task.workflow,
                **tracing.attributes(
                    task_id=task.task_id,
                    workflow=task.workflow,
                    version=task.version,
                    task_attempt=task.attempt,
                    failure_count=task.failure_count,
                    scheduler=self.instance,
                    process_state=str(task.process_state),
                    replay=bool(self.claimed.steps or self.claimed.waits),
                ),
            },
        )
        try:
            await self._note_run(span)
            with tracing.current(span):
                await self._run()
        finally:
            span.set_attributes(tracing.attributes(outcome=self.outcome))
            if self.outcome in ("failed", TaskState.COMPENSATION_FAILED):
                tracing.failed(span, f"the task ended {self.outcome}")
            span.end()

    async def _note_run(self, span: Span) -> None:
        """Record the run's trace context with its task, for the next run to link to."""
        context = tracing.stored(span)
        if context is None:
            return
        try:
            await self.host.store.note_run(self.task_id, self.held.attempt, self.instance, context)
        except StoreError as exc:  # the next run goes without its link
            logger.info("task %s: cannot record its run's trace context: %s", self.task_id, exc)

    async def _run(self) -> None:
        task = self.claimed.task
        ctx = Context(self, self.held, self.claimed.steps, self.claimed.waits)
        compensating = task.process_state == TaskState.COMPENSATING
        state: TaskState
        result: str | None = None
        error: str | None = None
        try:
            async with asyncio.timeout_at(self.deadline.at) as deadline:
                if compensating:
                    await compensation(ctx, self.claimed.steps)
                    state, error = TaskState.COMPENSATED, task.error
                else:
                    value = await self.workflow_of(self.held).fn(ctx, task.input)
                    await ctx.settle()
                    result = _json.dumps(
                        value,
                        what=f"the result of workflow {task.workflow!r}",
                        seal=_json.Seal(self.keys, Binding.result(task.task_id)),
                    )
                    state = TaskState.PROCESSED
        except Parked:
            logger.debug("task %s: waits, released", task.task_id)
            self.outcome = "waiting"
            return
        except Abandon:
            return
        except TimeoutError as exc:
            if deadline.expired():
                logger.info(
                    "task %s: complete_by passed, leaving it to the supervisor", task.task_id
                )
                return
            if compensating:
                raise
            state, error = TaskState.ERROR, describe(exc)
        except StepFailed as exc:
            if compensating:
                state = TaskState.COMPENSATION_FAILED
                error = f"{task.error}; then the compensation failed: {exc}"
            else:
                state, error = TaskState.ERROR, error_text(str(exc))
        except (ChildFailed, PayloadError, UnknownNameError) as exc:
            if compensating:
                raise
            state, error = TaskState.ERROR, error_text(str(exc))
        except Exception as exc:
            if compensating:
                raise
            logger.warning(
                "task %s: workflow %s raised", task.task_id, task.workflow, exc_info=True
            )
            state, error = TaskState.ERROR, describe(exc)
        finally:
            ctx.close()
        await self._finish(state, result, error)

    async def _finish(self, state: TaskState, result: str | None, error: str | None) -> None:
        outcome = TaskOutcome(
            task_id=self.task_id,
            attempt=self.held.attempt,
            scheduler=self.instance,
            state=state,  # type: ignore[arg-type]
            result=result,
            error=error,
        )
        try:
            applied = await self._answered(
                f"task {self.task_id}: cannot record its outcome", lambda: self._submit(outcome)
            )
        except StoreError as exc:  # permanent: said by _answered; the supervisor recovers it
            logger.error("task %s: its outcome is not recorded: %s", self.task_id, exc)
            return
        if applied:
            self.outcome = "failed" if state == TaskState.ERROR else str(state)
            self.host.metrics.task_ended(self.held.workflow, state, self.held.tenant)
        if not applied:
            logger.info("task %s: outcome discarded, the task is no longer held", self.task_id)
        elif state in (TaskState.ERROR, TaskState.COMPENSATION_FAILED):
            logger.error("ALERT task %s: %s: %s", self.task_id, state, error)

    # -- steps ----------------------------------------------------------------------------
    async def run_step(
        self,
        held: Held,
        dispatch: StepDispatch,
        step_name: str,
        *,
        fallback: StepDispatch | None = None,
        span: Span | None = None,
    ) -> Any:
        """Record and queue a step (or take over / re-dispatch a recorded one), then wait for
        its result until its complete_by. Traced, in a span of its dispatch (`span`), whose
        trace context is recorded with the step."""
        if self.span is not None and span is None:
            return await self._traced_step(held, dispatch, step_name, fallback)
        if isinstance(dispatch, NewStep) and self.claimed.task.keys_of is not None:
            dispatch = replace(dispatch, idempotency_key=self.key(dispatch.seq))
        where = (self.task_id, dispatch.seq)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting[dispatch.seq] = future
        local = self._local_for(dispatch)
        if local is not None:
            assert isinstance(dispatch, NewStep)
            handed = dispatch = replace(dispatch, claimed_by=local.instance)
        try:
            try:
                got, written = await self._write_step(dispatch)
                if local is not None:
                    if got is not None and written is handed:
                        local.serve_local(
                            self._request(handed, got), partial(self._local_outcome, future)
                        )
                    else:
                        local.release_local(where)
                    local = None
                if got is None and fallback is not None:
                    got, _ = await self._write_step(fallback)
                    if got is not None:
                        tracing.event(span, "dispatched_again", seq=got.seq, attempt=got.attempt)
                        await self._alert_if_retried_too_often(fallback, got, step_name)
                if got is not None and span is not None:
                    span.set_attributes(tracing.attributes(attempt=got.attempt))
                if got is None:
                    # Fenced out, or the step finished meanwhile: only the latter lets us go on.
                    record = await self._finished(dispatch.seq)
                else:
                    record = await self._result(dispatch.seq, future, got.remaining)
            except StoreError as exc:  # permanent (transient ones are tried again)
                logger.error(
                    "task %s: the store refused step %d (%s), leaving it to the supervisor",
                    self.task_id,
                    dispatch.seq,
                    exc,
                )
                raise Abandon from exc
        finally:
            if local is not None:  # stopped before its write said whether to hand it over
                local.release_local(where)
            if self._waiting.get(dispatch.seq) is future:
                del self._waiting[dispatch.seq]
        if record.state == StepState.COMPLETED:
            return record.result
        raise StepFailed(step_name, record.error)

    async def _traced_step(
        self,
        held: Held,
        dispatch: StepDispatch,
        step_name: str,
        fallback: StepDispatch | None,
    ) -> Any:
        """`run_step` in the span of its dispatch, a child of the run's."""
        assert self.span is not None
        span = tracing.start(
            f"dispatch {step_name}",
            kind="producer",
            parent_of=self.span,
            attrs={
                "messaging.system": tracing.SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "dispatch",
                **tracing.attributes(
                    task_id=self.task_id,
                    workflow=held.workflow,
                    version=held.version,
                    seq=dispatch.seq,
                    step=step_name,
                    position=dispatch.position if isinstance(dispatch, NewStep) else None,
                    compensates=dispatch.compensates if isinstance(dispatch, NewStep) else None,
                    idempotency_key=self.key(dispatch.seq),
                    task_attempt=held.attempt,
                    dispatch=type(dispatch).__name__.lower(),
                ),
            },
        )
        outcome = "abandoned"
        try:
            context = tracing.stored(span)
            dispatch = replace(dispatch, trace_context=context)
            if fallback is not None:
                fallback = replace(fallback, trace_context=context)
            try:
                value = await self.run_step(held, dispatch, step_name, fallback=fallback, span=span)
            except StepFailed as exc:
                outcome = "failed"
                tracing.failed(span, exc)
                raise
            outcome = "completed"
            return value
        finally:
            span.set_attributes(tracing.attributes(outcome=outcome))
            span.end()

    def waited(self) -> list[tuple[str, int]]:
        """The steps (task_id, seq) whose result its workflow waits for."""
        return [(self.task_id, seq) for seq, f in self._waiting.items() if not f.done()]

    def waits_for(self, seq: int) -> bool:
        future = self._waiting.get(seq)
        return future is not None and not future.done()

    def resolve(self, step: StepRecord) -> None:
        """A finished step, read by the scheduler's watch of results."""
        future = self._waiting.get(step.seq)
        if future is not None and not future.done():
            future.set_result(Answer.of(step))

    async def _write_step(self, write: StepDispatch) -> tuple[DispatchedStep | None, StepDispatch]:
        """Write a step, trying again while the store is unreachable; with it, the write that
        made it. A try whose answer was lost may have been applied: then the step is found as
        that try left it (open, under this attempt of the task) and taken as written, or
        queued again if its complete_by passed meanwhile."""
        uncertain = False
        failures = 0
        while True:
            try:
                got = await self._submit(write)
            except TransientStoreError as exc:
                failures += 1
                uncertain = True
                what = f"task {write.task_id}: cannot record step {write.seq}"
                await self.host.store.wait_to_retry(
                    after_store_failure(logger, what, exc, failures)
                )
                continue
            if got is not None or not uncertain:
                return got, write
            found = await self._answered(
                f"task {write.task_id}: cannot read step {write.seq}",
                partial(self.host.store.read_step, write.task_id, write.seq),
            )
            if found is None:
                return None, write
            step, remaining = found
            if step.state not in OPEN_STEP_STATES or step.task_attempt != self.held.attempt:
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
                task_id=self.task_id,
                task_attempt=self.held.attempt,
                scheduler=self.instance,
                seq=step.seq,
                agent=step.agent,
                expected_attempt=step.attempt,
                complete_within=(
                    step.complete_within
                    or self.workflow_of(self.held).complete_within.total_seconds()
                ),
                trace_context=write.trace_context,
            )
            uncertain = False

    async def _result(self, seq: int, future: asyncio.Future[Answer], remaining: float) -> Answer:
        """Wait for a step's result until its complete_by; while the step is still open for
        this attempt of the task with its complete_by moved on (a heartbeat, or its agent
        instance gone and the step reassigned), wait on.

        Open past its complete_by, the step is the supervisor's, which either fails it (its
        pick-up or total timeout passed: the task stays held, and its workflow goes on from
        the failure) or expires the task (the hold of this attempt ends). Which one depends
        on when its sweep comes, so the drive waits for either: the failure wakes it like
        any result; it looks at the step and its hold again OVERDUE_LOOK apart at most, and
        stops once the task is no longer held by it (or at the task's complete_by)."""
        look = RESULT_SLACK
        while True:
            try:
                async with asyncio.timeout_at(Deadline.after(max(0.0, remaining) + look).at):
                    return await asyncio.shield(future)
            except TimeoutError:
                pass
            found = await self._answered(
                f"task {self.task_id}: cannot read step {seq}",
                lambda: self.host.store.read_held_step(
                    self.task_id, seq, self.held.attempt, self.instance
                ),
            )
            if found is None:
                raise Abandon
            step, remaining, held = found
            if not held:
                raise Abandon
            if step.state in (StepState.COMPLETED, StepState.FAILED):
                return Answer.of(step)
            if step.task_attempt != self.held.attempt:
                raise Abandon
            look = RESULT_SLACK if remaining > 0 else min(2 * look, OVERDUE_LOOK)

    async def _finished(self, seq: int) -> Answer:
        found = await self._answered(
            f"task {self.task_id}: cannot read step {seq}",
            lambda: self.host.store.finished_steps([(self.task_id, seq)]),
        )
        if not found:
            raise Abandon
        return Answer.of(found[0])

    async def _alert_if_retried_too_often(
        self, dispatch: StepDispatch, got: DispatchedStep, step_name: str
    ) -> None:
        threshold = self.workflow_of(self.held).alert_after
        if got.attempt != threshold:
            return
        detail = {
            "reason": str(AlertReason.STEP_RETRIED),
            "seq": dispatch.seq,
            "step": step_name,
            "attempt": got.attempt,
            "error": f"step {step_name!r} dispatched {got.attempt} times",
        }
        logger.error("ALERT task %s: %s", self.task_id, detail["error"])
        self.host.metrics.alert(str(AlertReason.STEP_RETRIED))
        try:
            await self.host.store.record_events([(self.task_id, "alert", detail)])
        except StoreError as exc:
            logger.warning("task %s: cannot record an alert: %s", self.task_id, exc)

    # -- waits ----------------------------------------------------------------------------
    async def tag(self, held: Held, key: str, value: str) -> None:
        """Tag the task while this drive holds it: at once when it has that tag already (a
        replay), else written, fenced by the hold (Abandon when it is no longer held)."""
        if self._tags.get(key) == value:
            return
        answer = await self._answered(
            f"task {self.task_id}: cannot tag it",
            lambda: self.host.store.tag_task(self.task_id, held.attempt, self.instance, key, value),
        )
        if answer is False:
            raise Abandon
        if isinstance(answer, str):
            raise ConfigurationError(f"task {self.task_id!r}: {answer}")
        self._tags[key] = value

    async def wait(self, request: WaitRequest) -> WaitOutcome:
        """Record or read a wait (tried again while the store is unreachable: a try whose
        answer was lost is found as it left the wait, or the task parked, hence fenced).
        Traced, a child task's runs are children of this run's span."""
        await self._outcomes_first()
        if request.child is not None and self.span is not None:
            child = replace(request.child, trace_context=tracing.stored(self.span))
            request = replace(request, child=child)
        try:
            outcome = await self._answered(
                f"task {self.task_id}: cannot record its wait {request.seq}",
                partial(self.host.store.wait, request),
            )
        except StoreError as exc:  # permanent: the supervisor recovers the task
            logger.error(
                "task %s: the store refused wait %d (%s), leaving it to the supervisor",
                self.task_id,
                request.seq,
                exc,
            )
            raise Abandon from exc
        if outcome.now:
            self.host.metrics.wait_ended(self.held.workflow, request.kind, outcome.state)
        return outcome

    async def park(self, request: ParkRequest) -> WaitOutcome:
        """Park a task whose workflow waits in every branch (tried again while the store is
        unreachable: a try whose answer was lost is found parked, hence fenced)."""
        await self._outcomes_first()
        try:
            return await self._answered(
                f"task {self.task_id}: cannot park it", partial(self.host.store.park, request)
            )
        except StoreError as exc:  # permanent: the supervisor recovers the task
            logger.error(
                "task %s: the store refused its park (%s), leaving it to the supervisor",
                self.task_id,
                exc,
            )
            raise Abandon from exc

    # -- steps called in this process -----------------------------------------------------
    def _local_for(self, dispatch: StepDispatch) -> LocalAgent | None:
        """The agent instance of this process a new step goes to at once, its room reserved:
        one of the step's agent with room now for its operation (`LocalAgent.take_local`)."""
        if not isinstance(dispatch, NewStep) or dispatch.claimed_by is not None:
            return None
        local = self.host.local_agents.get(dispatch.agent)
        if local is None or not local.take_local(
            dispatch.operation, (dispatch.task_id, dispatch.seq)
        ):
            return None
        return local

    def _request(self, dispatch: NewStep, got: DispatchedStep) -> Request:
        """The request of a step recorded as held by an agent instance of this process, as
        that instance would have claimed it."""
        return Request(
            task_id=dispatch.task_id,
            seq=dispatch.seq,
            attempt=got.attempt,
            agent=dispatch.agent,
            operation=dispatch.operation,
            input=_json.loads(
                dispatch.input, at=Binding.step(dispatch.task_id, dispatch.seq), keys=self.keys
            ),
            idempotency_key=self.key(dispatch.seq),
            complete_by=Deadline.after(got.remaining).complete_by,
            remaining=got.remaining,
            compensates=dispatch.compensates,
            workflow=self.held.workflow,
            trace_context=dispatch.trace_context,
        )

    async def _local_outcome(self, future: asyncio.Future[Answer], outcome: StepOutcome) -> bool:
        """The outcome of a step called in this process: its workflow goes on from it at once,
        and it is recorded with the workflow's next write (or alone, RECORD_WITHIN later).
        True once recorded; False when the store refused it (the step no longer held)."""
        loop = asyncio.get_running_loop()
        recorded: asyncio.Future[bool] = loop.create_future()
        self._unrecorded.append(Unrecorded(outcome, recorded))
        if not future.done():
            here = Binding.step(outcome.task_id, outcome.seq)
            result = _json.loads(outcome.result, at=here, keys=self.keys)
            future.set_result(Answer(outcome.state, result, outcome.error))
        loop.call_later(RECORD_WITHIN, self._record_alone)
        return await recorded

    def _record_alone(self) -> None:
        """Write the outcomes that no write of its workflow took along: one writer at a time
        (while the store is out of reach, it tries again at its own pace, carrying what
        came meanwhile), and another after it if outcomes are left."""
        if self._unrecorded and not self._recording:
            writing = asyncio.create_task(self._outcomes_alone())
            self._recording.add(writing)
            writing.add_done_callback(self._recorded_alone)

    def _recorded_alone(self, writing: asyncio.Task[bool]) -> None:
        self._recording.discard(writing)
        if self._unrecorded:
            asyncio.get_running_loop().call_later(RECORD_WITHIN, self._record_alone)

    async def _outcomes_first(self) -> None:
        """Before a write that cannot carry them (a wait, a park): record the outcomes its
        workflow went on from; Abandon when one is refused."""
        if not (self._unrecorded or self._refused):
            return
        pending = [u.recorded for u in self._unrecorded]
        kept = await self._outcomes_alone()
        answers = await asyncio.gather(*pending, return_exceptions=True)
        if not kept or any(a is False for a in answers):
            raise Abandon

    async def _outcomes_alone(self) -> bool:
        """Write the outcomes not yet recorded (with those refused): False when the store
        refused one of those it carried, or could not say (a permanent failure: the drive
        stops there, leaving the task to the supervisor)."""
        carried: list[Unrecorded] = []

        def write() -> Awaitable[Any]:
            nonlocal carried
            carried = self._carried()
            return self.host.commit(Entry(self, None, carried))

        try:
            await self._answered(f"task {self.task_id}: cannot record the outcome of a step", write)
        except StoreError as exc:  # permanent: each waiting call has been told
            logger.error("task %s: the outcome of a step is not recorded: %s", self.task_id, exc)
            return False
        return not any(
            u.recorded.done() and not u.recorded.cancelled() and u.recorded.result() is False
            for u in carried
        )

    def _submit(self, write: Write) -> Awaitable[Any]:
        """Hand a write to the group commit with the outcomes its workflow went on from (and
        those refused, which keep the store from applying it): all in one transaction."""
        return self.host.commit(Entry(self, write, self._carried()))

    def _carried(self) -> list[Unrecorded]:
        """What the next write carries: the outcomes refused (again) and those unrecorded."""
        loop = asyncio.get_running_loop()
        carried = []
        for o in self._refused:
            again: asyncio.Future[bool] = loop.create_future()
            again.add_done_callback(lambda f: f.cancelled() or f.exception())  # no one awaits it
            carried.append(Unrecorded(o, again))
        carried += self._unrecorded
        self._unrecorded = []
        return carried

    # -- the group commit's word ----------------------------------------------------------
    def carry_again(self, carried: list[Unrecorded]) -> None:
        """A group commit that carried these outcomes failed and may be tried again: they go
        with the drive's next write, or alone, whichever comes first."""
        fresh = [u for u in carried if u.outcome not in self._refused]
        self._unrecorded[:0] = fresh
        if not self._recording:  # else the writer under way takes them with its next try
            asyncio.get_running_loop().call_later(RECORD_WITHIN, self._record_alone)

    def answered(self, carried: Unrecorded, recorded: bool) -> None:
        """The store's word on an outcome carried: recorded, or refused (then carried again
        with every later write, none of which the store applies)."""
        o = carried.outcome
        if not recorded and o not in self._refused:
            self._refused.append(o)
            logger.info(
                "task %s: the outcome of step %d was refused (the step is no longer held by its "
                "call); the task's workflow stops here",
                o.task_id,
                o.seq,
            )
        elif recorded and o in self._refused:
            self._refused.remove(o)
        if not carried.recorded.done():
            carried.recorded.set_result(recorded)

    async def _answered(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`'s answer, tried again while the store is unreachable."""
        return await answered(logger, what, call, wait=self.host.store.wait_to_retry)
