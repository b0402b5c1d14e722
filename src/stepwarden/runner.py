"""The agents at run time: an `AgentRunner` claims and serves the requests of one agent.

It claims the queued requests of its agent from the store, calls the operation with a stable
idempotency key, retries transient errors with backoff and jitter while complete_by has not
passed, and reports the outcome. When complete_by passes it stops and reports nothing:
another instance may already be retrying the step.

Each runner registers in the store's agent registry and heartbeats there (its operations,
capacity, calls in flight and circuit breaker). It claims only as many requests as it has
free slots, none while its breaker is open (an instance whose service answers takes them),
and only within the operations' limits. With the requests of several tenants queued, a
claim after one that took all it asked for (a backlog) is shared among them by their weights
(`rules.claim_fairly`, `rules.fair_shares`). An instance that stops heartbeating is gone: the
supervisor hands its running steps to another.

Once per poll interval (at once on a wake-up naming one of their tasks) it asks the store, in
one query, which of its calls in flight no longer hold their step (their task cancelled,
paused or sent to compensating, the step abandoned, dispatched again or reassigned) and why
(`rules.call_lost`). Such a call is cancelled: an async operation gets CancelledError, a sync
one sees `call.cancelled`; nothing is reported for it, no failure counted, and once it has
ended the store is told (`Store.stop_calls`), so that a compensation waiting for it may start.

At each heartbeat it asks the store which steps it holds (`Store.held_steps`) and calls those
it is not calling (`AgentRunner.take_up`): a claim, or a hand-over by this process's
scheduler, whose commit was made but whose answer was lost leaves a step held and uncalled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from . import _json, _logs, tracing
from ._aio import Pace, first, sleep_unless, spread, until_beat
from ._batch import Batcher
from .agent import Agent, Call
from .breaker import CLOSED, OPEN, CircuitBreaker
from .deadline import Deadline
from .errors import CircuitOpen, PayloadError, StepLost, StoreError, TransientStoreError
from .metrics import Metrics
from .records import (
    AgentBeat,
    CallStop,
    OpLimit,
    Request,
    RequestHandback,
    StepOutcome,
    idempotency_key,
)
from .retry import after_store_failure, answered
from .rules import claim_fairly, describe
from .sealing import Binding
from .states import StepState
from .store import CHANNEL_CALLS, CHANNEL_REQUESTS, Subscription
from .store.ports import AgentPort

if TYPE_CHECKING:
    from opentelemetry.trace import Span

logger = logging.getLogger("stepwarden.agent")
T = TypeVar("T")

DEFAULT_HEARTBEAT = 2.0
"""Seconds between an agent instance's heartbeats in the registry: two and a half to the
default gone-after. A failed beat is tried again after BEAT_AGAIN."""
BEAT_AGAIN = 0.5
"""Seconds before a registry beat that failed is tried again."""
LOOKS = 2
"""Looks at the steps held (`take_up`) at the beats after a start, after a claim that
failed, and after a hand-over that was not made: a write whose answer was lost may have
made a step held by this instance and not called."""
DEFAULT_GONE_AFTER = 5.0
"""Seconds without a heartbeat after which an agent instance is gone."""
RETRY_LOG_EVERY = 10.0
"""Seconds between two info lines about an operation's retries (those between are logged at
debug, and counted in the next info line)."""


class _Lost(Exception):
    """Raised in the serving task in place of the CancelledError it was sent when its call
    lost its step (`_Hold.lose`)."""


class _Hold:
    """A runner's hold of one claimed step: its deadline, moved on by heartbeats, and why it
    was lost, once it is."""

    def __init__(
        self,
        runner: AgentRunner,
        request: Request,
        report: Callable[[StepOutcome], Awaitable[bool]] | None = None,
    ) -> None:
        self.runner = runner
        self.request = request
        self.report = report
        """Where the outcome goes when the step was handed over by this process's scheduler
        (it records it with its workflow's next write); None: written by the runner."""
        self.loop = asyncio.get_running_loop()
        self.deadline = Deadline.after(request.remaining, complete_by=request.complete_by)
        self.timeout: asyncio.Timeout | None = None
        self.cancelled: str | None = None
        self.answered = False
        """Its outcome is being recorded: the step's state no longer says whether the call
        holds it."""
        self._task: asyncio.Task[Any] | None = None
        """The serving task, while what it awaits may be interrupted."""
        self._interrupted = False
        self.span: Span | None = None
        """The call's span (`tracing`), while traced."""
        self.outcome = "stopped"
        """How the call ended, for its span."""

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.request.task_id, self.request.seq, self.request.attempt)

    @property
    def complete_by(self) -> datetime:
        return self.deadline.complete_by

    def lose(self, why: str) -> None:
        """The call no longer holds its step: say why (`Call.cancelled`), and interrupt what
        the serving task awaits, if it may be (an async operation, a wait between tries)."""
        if self.cancelled is None:
            self.cancelled = why
        if self._task is not None and not self._interrupted:
            self._interrupted = True
            self._task.cancel()

    def interruptible(self, enabled: bool) -> _Interruptible:
        """A block whose awaits `lose` interrupts (when `enabled`): the CancelledError it
        sends comes out of the block as `_Lost`; any other cancellation goes through."""
        return _Interruptible(self, enabled)

    async def heartbeat(self, details: Any) -> None:
        r = self.request
        if self.cancelled is not None:
            raise StepLost(
                f"step {r.idempotency_key} attempt {r.attempt} is no longer held by this call: "
                f"{self.cancelled}"
            )
        detail = None
        if details is not None:
            here = _json.Seal(self.runner.store.keys, Binding.step(r.task_id, r.seq))
            detail = _json.dumps(details, what="heartbeat details", seal=here)
        try:
            remaining = await self.runner.store.heartbeat_step(
                r.task_id, r.seq, r.attempt, self.runner.instance, detail
            )
        except StoreError as exc:
            # Not fatal: the step keeps the complete_by it has; the next beat may get through.
            logger.warning("heartbeat of %s: %s", r.idempotency_key, exc)
            return
        if remaining is None:
            raise StepLost(
                f"step {r.idempotency_key} attempt {r.attempt} is no longer held by this call"
            )
        self.deadline = Deadline.after(remaining)
        if self.timeout is not None:
            self.timeout.reschedule(self.deadline.at)


class _Interruptible:
    def __init__(self, hold: _Hold, enabled: bool) -> None:
        self.hold = hold
        self.enabled = enabled

    def __enter__(self) -> None:
        if self.enabled:
            self.hold._task = asyncio.current_task()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self.hold
        task, hold._task = hold._task, None
        if not hold._interrupted or task is None:
            return
        hold._interrupted = False
        # The cancellation `lose` asked for is taken back; another one (a drain) stands.
        if task.uncancel() == 0 and kind is asyncio.CancelledError:
            raise _Lost from exc


class AgentRunner:
    """Claims and serves the requests of one agent in this process."""

    def __init__(
        self,
        store: AgentPort,
        agent: Agent,
        *,
        instance: str,
        concurrency: int = 100,
        poll_interval: float | None = None,
        heartbeat: float = DEFAULT_HEARTBEAT,
        gone_after: float = DEFAULT_GONE_AFTER,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.agent = agent
        self.metrics = metrics or Metrics()
        """Where it counts its calls and their outcomes (its worker's)."""
        self.metrics.watch_agent(agent.name, self)
        self.instance = instance
        self.concurrency = concurrency
        self.poll_interval = poll_interval or store.default_poll_interval
        self._pace = Pace(self.poll_interval, lambda: store.wakeups_live)
        """How long the claim loop waits for word of requests before it claims anyway."""
        self.heartbeat = heartbeat
        self.gone_after = gone_after
        self._inflight: dict[asyncio.Task[None], str] = {}
        self._handing: Counter[tuple[str, int]] = Counter()
        """The steps (task_id, seq) this process's scheduler is handing over, each with room
        promised (`take_local`): never taken up (`take_up`) while it hands them over."""
        self._ended: set[tuple[str, int, int]] = set()
        """Calls of this instance that ended, by (task_id, seq, attempt), while the store may
        still show their step held by it (out of tries or time: it waits for its complete_by
        as any): never taken up. Forgotten once a look finds the step no longer held."""
        self._claims = 0
        """Claims begun (`claim_requests`); `_claiming` of them not yet answered and started.
        A claim committed but not yet answered shows its steps held by this instance and not
        called: `take_up` acts on a look that no claim overlapped, or it would call them twice."""
        self._claiming = 0
        self._looking = asyncio.Lock()
        """Held by a look at the steps held (`take_up`): no claim begins meanwhile, so that
        a look is not always overlapped by a claim (both loops may beat at one period)."""
        self._looks = LOOKS
        """Looks at the steps it holds still to make at its next beats (`LOOKS`)."""
        self._queue_empty = False
        """The last claim found fewer queued requests than it had room for: a step handed
        over passes none that waits (until a wake-up says some may, and a claim looks)."""
        self._accepting = False
        self._holds: dict[tuple[str, int, int], _Hold] = {}
        """The steps of the calls in flight, by (task_id, seq, attempt)."""
        self._watcher: asyncio.Task[None] | None = None
        self._room = asyncio.Event()
        self._beat_now = asyncio.Event()
        self._opened = asyncio.Event()
        """Set when the breaker opens: a claim under way is given up (`_claim`)."""
        self._transitions: list[str] = []
        self._completions: Batcher[StepOutcome, bool] = Batcher(store.complete_steps)
        self._stops: Batcher[CallStop, bool] = Batcher(store.stop_calls)
        self.breaker = (
            None if agent.breaker is None else CircuitBreaker(agent.breaker, self._on_breaker)
        )
        self._retries = _logs.Quiet(RETRY_LOG_EVERY)
        """A retry is logged at info at most once every RETRY_LOG_EVERY seconds per
        operation (the others at debug, counted in the next line)."""

    # -- gauges of its metrics, read at a scrape ------------------------------------------
    def calls_in_flight(self) -> int:
        return len(self._inflight)

    def slots_free(self) -> int:
        return max(0, self.concurrency - len(self._inflight) - sum(self._handing.values()))

    def breaker_state(self) -> str:
        return CLOSED if self.breaker is None else self.breaker.state

    # -- the registry ---------------------------------------------------------------------
    def _beat(self) -> AgentBeat:
        return AgentBeat(
            instance=self.instance,
            agent=self.agent.name,
            operations=tuple(sorted(self.agent.operations)),
            capacity=self.concurrency,
            inflight=len(self._inflight),
            breaker=CLOSED if self.breaker is None else self.breaker.state,
            breaker_detail={} if self.breaker is None else self.breaker.snapshot(),
        )

    def _on_breaker(self, state: str) -> None:
        log = logger.warning if state != CLOSED else logger.info
        log("agent %s (%s): circuit breaker %s", self.agent.name, self.instance, state)
        self._transitions.append(state)
        if state == OPEN:
            self._opened.set()
        self._beat_now.set()
        self._room.set()

    async def register(self, stop: asyncio.Event) -> None:
        """Register in the store before claiming anything, trying again until it works."""
        failures = 0
        while not stop.is_set():
            try:
                await self.store.beat([self._beat()], self.gone_after)
                return
            except StoreError as exc:
                failures += 1
                what = f"agent {self.agent.name}: cannot register"
                await self.store.wait_to_retry(
                    after_store_failure(logger, what, exc, failures), stop
                )

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        failed = False
        while not stop.is_set():
            # Reckoned just before sleeping: the beat due at the next multiple of the period,
            # with the process's other beats (one transaction), not as late as this one's
            # write took.
            pause = until_beat(self.heartbeat)
            if failed:
                pause = min(pause, BEAT_AGAIN)
            self._beat_now.clear()
            await first(stop.wait(), self._beat_now.wait(), asyncio.sleep(pause))
            if stop.is_set():
                return
            transitions, self._transitions = self._transitions, []
            try:
                await self.store.beat([self._beat()], self.gone_after)
                await self._record_transitions(transitions)
            except StoreError as exc:
                self._transitions[:0] = transitions
                logger.warning("agent %s: heartbeat failed: %s", self.agent.name, exc)
                failed = True
                continue
            except asyncio.CancelledError:  # stopping: the drain records them
                self._transitions[:0] = transitions
                raise
            failed = False
            if not self._looks:
                continue
            await asyncio.sleep(spread())  # not at the instant the other agents look
            try:
                await self.take_up()
            except StoreError as exc:
                logger.warning("agent %s: cannot read the steps it holds: %s", self.agent.name, exc)

    async def _record_transitions(self, transitions: Sequence[str]) -> None:
        """The breaker's transitions, as events of the history."""
        if transitions:
            detail = {"instance": self.instance, "agent": self.agent.name}
            await self.store.record_events(
                [(None, "breaker", {**detail, "state": t}) for t in transitions]
            )

    # -- steps handed over by this process's scheduler ------------------------------------
    def take_local(self, operation: str, where: tuple[str, int]) -> bool:
        """Reserve room for the step `where` (task_id, seq) of `operation` that this
        process's scheduler would hand over at once (recorded running, held by this
        instance): only while this instance runs, has room, its breaker is closed, the
        operation has no limit (limits are counted by claims) and no queued request of this
        agent waits (it would be passed)."""
        op = self.agent.operations.get(operation)
        if not self._accepting or op is None or op.limit is not None:
            return False
        if self.breaker is not None and self.breaker.state != CLOSED:
            return False
        if not self._queue_empty or len(self._inflight) + self._handing.total() >= self.concurrency:
            return False
        self._handing[where] += 1
        return True

    def release_local(self, where: tuple[str, int]) -> None:
        """The step `where` is not handed over after all: its room is free. Should a write
        whose answer was lost have recorded it held by this instance, `take_up` calls it."""
        self._handed(where)
        self._looks = LOOKS
        self._room.set()

    def serve_local(
        self, request: Request, report: Callable[[StepOutcome], Awaitable[bool]]
    ) -> None:
        """Call a step recorded as held by this instance, its room reserved; its outcome
        goes to `report`. Not when this instance calls it already, or did (`take_up` found it
        first): that call's outcome is recorded as any claimed step's."""
        self._handed((request.task_id, request.seq))
        key = (request.task_id, request.seq, request.attempt)
        if key in self._holds or key in self._ended:
            self._room.set()
            return
        self._start(request, report)

    def _handed(self, where: tuple[str, int]) -> None:
        self._handing[where] -= 1
        if self._handing[where] <= 0:
            del self._handing[where]

    # -- steps held but not called --------------------------------------------------------
    async def take_up(self) -> int:
        """Call the steps the store shows held by this instance (`Store.held_steps`) that it
        is not calling: a claim or a hand-over whose commit was made but whose answer was
        lost leaves them so, and they would wait for their complete_by. Not while a claim
        of this instance is under way (its answer may bring them), nor those being
        handed over, nor those whose call here ended (out of tries or time, they wait for
        their complete_by as any step). How many it took up."""
        if not self._accepting or self._claiming:
            return 0
        async with self._looking:
            if self._claiming:
                return 0
            claims = self._claims
            ended = set(self._ended)
            held = await self.store.held_steps(self.instance, self.agent.name)
            if self._claiming or self._claims != claims:
                return 0  # a claim overlapped the look: its steps may be in `held`, unstarted
            self._looks = max(0, self._looks - 1)
        self._ended -= ended - {(r.task_id, r.seq, r.attempt) for r in held}
        taken = 0
        for request in held:
            key = (request.task_id, request.seq, request.attempt)
            if (
                key in self._holds
                or key in self._ended
                or (request.task_id, request.seq) in self._handing
                or request.operation not in self.agent.operations
                or not self._accepting
            ):
                continue
            logger.warning(
                "%s attempt %d: held by this instance but not called (word of its claim was "
                "lost); calling it now",
                request.idempotency_key,
                request.attempt,
            )
            self._start(request)
            taken += 1
        return taken

    # -- claiming -------------------------------------------------------------------------
    def _limits(self) -> dict[str, OpLimit]:
        limits: dict[str, OpLimit] = {}
        running: dict[str, int] = {}
        for name in self._inflight.values():
            running[name] = running.get(name, 0) + 1
        for name, op in self.agent.operations.items():
            lim = op.limit
            if lim is None:
                continue
            room = None if lim.per_instance is None else lim.per_instance - running.get(name, 0)
            limits[name] = OpLimit(
                concurrency=lim.concurrency, rate=lim.rate, per=float(lim.per), room=room
            )
        return limits

    # -- calls that no longer hold their step ---------------------------------------------
    async def _watch_calls(self, stop: asyncio.Event) -> None:
        """Every poll interval, and at once on a wake-up naming the task of a call in flight,
        stop the calls in flight whose step is no longer theirs. Runs until `stop` is set and
        no call is in flight (a drain ends it)."""
        sub = self.store.subscribe(CHANNEL_CALLS)
        loop = asyncio.get_running_loop()
        next_check = loop.time() + self.poll_interval
        try:
            while not (stop.is_set() and not self._holds):
                payloads = await sub.wait(max(0.0, next_check - loop.time()))
                if payloads:  # empty: some may have been missed (`Store.wakeups_live`)
                    named = set(payloads)
                    if not any(h.request.task_id in named for h in self._holds.values()):
                        continue
                next_check = loop.time() + self.poll_interval
                await self._check_calls()
        finally:
            self.store.unsubscribe(CHANNEL_CALLS, sub)

    async def _check_calls(self, holds: list[_Hold] | None = None) -> None:
        """Ask the store which of these calls (those in flight) no longer hold their step,
        in one query, and stop those."""
        if holds is None:
            holds = [h for h in self._holds.values() if h.cancelled is None and not h.answered]
        if not holds:
            return
        try:
            lost = await self.store.lost_calls(self.instance, [h.key for h in holds])
        except StoreError as exc:
            logger.warning("agent %s: cannot check its calls: %s", self.agent.name, exc)
            return
        for hold in holds:
            why = lost.get(hold.key)
            if why is not None and hold.cancelled is None:
                logger.info(
                    "%s attempt %d: cancelling the call: %s",
                    hold.request.idempotency_key,
                    hold.request.attempt,
                    why,
                )
                hold.lose(why)

    async def _stop_watching(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def run(self, stop: asyncio.Event) -> None:
        await self.register(stop)
        sub = self.store.subscribe(CHANNEL_REQUESTS)
        beats = asyncio.create_task(self._heartbeats(stop))
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch_calls(stop))
        failures = 0
        # The last claim: how many it took of how many it asked for (`rules.claim_fairly`).
        last_claimed: int | None = None
        last_asked = 0
        self._accepting = True
        await sleep_unless(stop, spread())  # not at the instant the process's other roles claim
        try:
            while not stop.is_set():
                self._room.clear()
                free = self.concurrency - len(self._inflight) - self._handing.total()
                trial = None if self.breaker is None else self.breaker.room()
                if trial is not None:
                    free = min(free, trial)
                limits = self._limits()
                full = {op for op, lim in limits.items() if lim.room is not None and lim.room <= 0}
                operations = sorted(set(self.agent.operations) - full)
                if free <= 0 or not operations:
                    reopens = None if self.breaker is None else self.breaker.reopens_in()
                    waits: list[Awaitable[Any]] = [stop.wait(), self._room.wait()]
                    if reopens is not None:
                        waits.append(asyncio.sleep(reopens))
                    await first(*waits)
                    continue
                if self._looking.locked():
                    async with self._looking:  # a look under way: begin after it
                        pass
                self._claims += 1
                self._claiming += 1
                delay: float | None = None
                try:
                    fairly = claim_fairly(last_claimed=last_claimed, last_asked=last_asked)
                    requests = await self._claim(operations, free, limits, fairly)
                    last_claimed, last_asked = len(requests), free
                    for request in requests:
                        self._start(request)
                except StoreError as exc:
                    failures += 1
                    self._looks = LOOKS  # its answer lost, it may have claimed all the same
                    what = f"agent {self.agent.name}: cannot claim requests"
                    delay = after_store_failure(logger, what, exc, failures)
                else:
                    failures = 0
                    self._queue_empty = len(requests) < free
                finally:
                    self._claiming -= 1
                if delay is not None:
                    await self.store.wait_to_retry(delay, stop)
                    continue
                if requests or limits:  # a limit's window passes without a wake-up
                    self._pace.busy()
                if len(requests) < free:
                    waits = [stop.wait(), self._requests_queued(sub)]
                    if full:  # an operation at its per-instance limit: a call ending frees it
                        waits.append(self._room.wait())
                    await first(*waits)
        finally:
            self._accepting = False
            self.store.unsubscribe(CHANNEL_REQUESTS, sub)
            beats.cancel()
            await asyncio.gather(beats, return_exceptions=True)
            if not self._inflight:  # else it watches the calls still in flight, to the drain
                await self._stop_watching()

    async def _requests_queued(self, sub: Subscription) -> None:
        """Wait for word of requests queued (a poll interval at most): from then on, until a
        claim has taken what waits, no step is handed over past them."""
        if await sub.wait(self._pace.wait()) is not None:
            self._queue_empty = False
            self._pace.busy()

    async def drain(self, timeout: float) -> None:
        """Let the calls under way finish (up to `timeout` seconds), write their outcomes
        (and the breaker's changes since the last heartbeat), and leave the registry: the
        steps still running here go to other instances."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=timeout)
        for task in set(self._inflight):
            task.cancel()
        await self._completions.drain()
        await self._stops.drain()
        await self._stop_watching()
        transitions, self._transitions = self._transitions, []
        try:  # those of the breaker since the last heartbeat
            await self._record_transitions(transitions)
        except StoreError as exc:
            logger.warning(
                "agent %s: cannot record its breaker's changes: %s", self.agent.name, exc
            )
        try:
            await self.store.leave(self.instance, [self.agent.name])
        except StoreError as exc:
            logger.warning("agent %s: cannot leave the registry: %s", self.agent.name, exc)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.pop(task, None)
        self._room.set()
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "agent %s: serving a request failed", self.agent.name, exc_info=task.exception()
            )

    # -- serving --------------------------------------------------------------------------
    def _start(
        self, request: Request, report: Callable[[StepOutcome], Awaitable[bool]] | None = None
    ) -> None:
        """Serve a step this instance holds: its hold is known at once (`take_up` passes
        it by), its call made in a task of its own."""
        hold = _Hold(self, request, report)
        self._holds[hold.key] = hold
        self._ended.discard(hold.key)
        task = asyncio.create_task(self._serve(hold))
        self._inflight[task] = request.operation
        task.add_done_callback(self._done)

    async def _serve(self, hold: _Hold) -> None:
        r = hold.request
        _logs.about_step(r.task_id, r.workflow, f"{r.agent}.{r.operation}", r.seq, r.attempt)
        try:
            if tracing.active():
                await self._traced_calls(hold)
            else:
                await self._calls(hold)
        finally:
            if self._holds.get(hold.key) is hold:
                del self._holds[hold.key]
                self._ended.add(hold.key)

    async def _traced_calls(self, hold: _Hold) -> None:
        """`_calls` in a span of its own (`tracing`), a child of the span of the step's
        dispatch (in whatever process it was) and the current span while the operation runs,
        so that the operation's own instrumented calls join it."""
        request = hold.request
        op = self.agent.operations[request.operation]
        span = hold.span = tracing.start(
            f"call {op.qualname}",
            kind="consumer",
            parent_of=tracing.parent(request.trace_context),
            attrs={
                "messaging.system": tracing.SYSTEM,
                "messaging.operation.type": "process",
                "messaging.destination.name": self.agent.name,
                "code.function.name": _function_name(op.fn),
                **tracing.attributes(
                    task_id=request.task_id,
                    seq=request.seq,
                    attempt=request.attempt,
                    idempotency_key=request.idempotency_key,
                    agent=self.agent.name,
                    operation=request.operation,
                    agent_instance=self.instance,
                    compensates=request.compensates,
                    handed_over=hold.report is not None,
                ),
            },
        )
        try:
            with tracing.current(span):
                await self._calls(hold)
        finally:
            span.set_attributes(tracing.attributes(outcome=hold.outcome))
            span.end()

    async def _claim(
        self, operations: Sequence[str], free: int, limits: dict[str, OpLimit], fairly: bool
    ) -> list[Request]:
        """The store's claim of up to `free` requests (shared among the tenants waiting when
        `fairly`: `rules.claim_fairly`), given up when the breaker opens
        meanwhile: a claim that waits for work (the agent protocol's long poll) would
        otherwise take back the very request this instance has just handed back for its
        open breaker. A claim given up may have been made all the same (its answer lost):
        the next beats look at the steps this instance holds."""
        claim = asyncio.ensure_future(
            self.store.claim_requests(
                self.instance, self.agent.name, operations, free, limits, fairly=fairly
            )
        )
        if self.breaker is None:
            return await claim
        self._opened.clear()
        opened = asyncio.ensure_future(self._opened.wait())
        try:
            await asyncio.wait({claim, opened}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            opened.cancel()
        if claim.done():
            return claim.result()
        claim.cancel()
        await asyncio.wait({claim})
        self._looks = LOOKS
        return [] if claim.cancelled() else claim.result()  # or it had ended meanwhile

    async def _calls(self, hold: _Hold) -> None:
        """Call the operation of a claimed request until it answers, fails for good, runs
        out of tries or time, or loses its step; report what is to be reported."""
        request = hold.request
        op = self.agent.operations[request.operation]
        args = request.input if isinstance(request.input, list) else [request.input]
        tries = 0
        while True:
            if hold.cancelled is not None:
                await self._stopped(op, hold)
                return
            if self.breaker is not None and not self.breaker.allow():
                await self._hand_back(hold, CircuitOpen(f"agent {self.agent.name}: open"))
                return
            tries += 1
            if tries == 1:  # begun: a step handed back before its first try was not
                self.metrics.step_claimed(
                    self.agent.name,
                    request.operation,
                    0.0 if hold.report is not None else request.queued,
                )
            if hold.span is not None:
                hold.span.set_attributes(tracing.attributes(tries=tries))
            call = Call(
                task_id=request.task_id,
                step=request.seq,
                attempt=request.attempt,
                try_number=tries,
                idempotency_key=request.idempotency_key,
                hold=hold,
                compensates_key=(
                    None
                    if request.compensates is None
                    else idempotency_key(request.task_id, request.compensates)
                ),
            )
            verdict: bool | None = None  # the service answered (True), or failed (False)
            error: BaseException | None = None
            permanent = False
            result = ""
            began = time.perf_counter()
            try:
                async with asyncio.timeout_at(hold.deadline.at) as hold.timeout:
                    # An async operation is cancelled when its call loses the step; a sync
                    # one runs in a thread, which nothing interrupts: it sees call.cancelled.
                    with hold.interruptible(op.is_async):
                        value = await op.invoke(call, args)
                if hold.cancelled is None:  # else it returned all the same: discarded
                    verdict = True
                    result = _json.dumps(
                        value,
                        what=f"the result of {op.qualname}",
                        seal=_json.Seal(
                            self.store.keys, Binding.step(request.task_id, request.seq)
                        ),
                    )
            except _Lost:
                pass
            except StepLost as exc:
                if hold.cancelled is None:
                    logger.info(
                        "%s for %s: %s; stopping", op.qualname, request.idempotency_key, exc
                    )
                    await self._check_calls([hold])  # why, if the store can tell
                    if hold.cancelled is None:
                        return
            except TimeoutError as exc:
                verdict = False
                if hold.deadline.expired():
                    # Past complete_by (a sync operation may even run on): nothing to report,
                    # and a stop would change nothing.
                    logger.info(
                        "%s for %s: complete_by passed, stopping",
                        op.qualname,
                        request.idempotency_key,
                    )
                    hold.outcome = "expired"
                    tracing.failed(hold.span, "complete_by passed")
                    return
                error, permanent = exc, op.retry.is_permanent(exc)
            except PayloadError as exc:
                error, permanent = exc, True
            except Exception as exc:
                error, permanent = exc, op.retry.is_permanent(exc)
                verdict = permanent
            finally:
                hold.timeout = None
                self.metrics.step_tried(
                    self.agent.name,
                    request.operation,
                    _tried(verdict, error),
                    time.perf_counter() - began,
                )
                if self.breaker is not None:
                    if verdict is True and hold.cancelled is None:
                        self.breaker.success()
                    elif verdict is False and hold.cancelled is None:
                        self.breaker.failure()
                    else:
                        self.breaker.abandon()
            if hold.cancelled is not None:
                await self._stopped(op, hold)
                return
            if error is None:
                await self._report(hold, StepState.COMPLETED, result, None, tries)
                return
            message = describe(error)
            if hold.span is not None:
                hold.span.record_exception(error, tracing.attributes(try_number=tries))
            if permanent:
                tracing.failed(hold.span, error)
                await self._report(hold, StepState.FAILED, None, message, tries)
                return
            if self.breaker is not None and self.breaker.state == OPEN:
                # This failure opened the breaker: another instance may reach the service.
                tracing.event(hold.span, "breaker_opened", agent_instance=self.instance)
                await self._hand_back(hold, CircuitOpen(f"agent {self.agent.name}: open"))
                return
            if tries >= op.retry.max_attempts:
                hold.outcome = "gave_up"
                tracing.failed(hold.span, error)
                logger.warning(
                    "%s for %s: giving up after %d tries (%s); the supervisor will retry the step",
                    op.qualname,
                    request.idempotency_key,
                    tries,
                    message,
                )
                return
            delay = op.retry.delay(tries)
            if hold.deadline.passes_within(delay):
                logger.info(
                    "%s for %s: no time left to retry (%s)",
                    op.qualname,
                    request.idempotency_key,
                    message,
                )
                hold.outcome = "gave_up"
                tracing.failed(hold.span, error)
                return
            tracing.event(hold.span, "retry", try_number=tries, delay=delay, error=message)
            held = self._retries.admit(op.qualname)
            (logger.debug if held is None else logger.info)(
                "%s for %s: try %d failed (%s), retrying in %.2fs%s",
                op.qualname,
                request.idempotency_key,
                tries,
                message,
                delay,
                f" ({held} other retries of {op.qualname} since the last line)" if held else "",
            )
            self.metrics.step_retried(self.agent.name, request.operation)
            try:
                with hold.interruptible(True):
                    await asyncio.sleep(delay)
            except _Lost:
                pass  # stopped at the top of the loop

    async def _stopped(self, op: Any, hold: _Hold) -> None:
        """The call of a step it no longer holds has ended: report no outcome, and tell the
        store (before complete_by, after which it would change nothing)."""
        request = hold.request
        why = hold.cancelled or "the step is no longer held by this call"
        logger.info("%s for %s: cancelled (%s)", op.qualname, request.idempotency_key, why)
        hold.outcome = "cancelled"
        tracing.event(hold.span, "cancelled", reason=why)
        stop = CallStop(
            task_id=request.task_id,
            seq=request.seq,
            attempt=request.attempt,
            agent_instance=self.instance,
            reason=why,
        )
        await self._before_complete_by(
            f"cannot record that the call of {request.idempotency_key} stopped",
            hold,
            lambda: self._stops.submit(stop),
        )

    async def _before_complete_by(
        self, what: str, hold: _Hold, call: Callable[[], Awaitable[T]]
    ) -> T | None:
        """`call()`'s answer (a write fenced by the step's complete_by), tried again after
        each transient store failure while the step's complete_by has not passed: after it,
        the write could only be refused, and the supervisor dispatches the step again. None
        when no answer came (said in the log)."""
        try:
            return await answered(
                logger,
                what,
                call,
                pointless=hold.deadline.passes_within,
                wait=self.store.wait_to_retry,
            )
        except TransientStoreError:
            logger.warning("%s before its complete_by; the supervisor will retry it", what)
        except StoreError:
            pass  # said by answered
        return None

    async def _hand_back(self, hold: _Hold, why: CircuitOpen) -> None:
        request = hold.request
        handback = RequestHandback(
            task_id=request.task_id,
            seq=request.seq,
            attempt=request.attempt,
            agent_instance=self.instance,
            reason=str(why),
        )
        answer = await self._before_complete_by(
            f"cannot hand back {request.idempotency_key}",
            hold,
            lambda: self.store.hand_back([handback]),
        )
        if answer is None:
            return
        [back] = answer
        if back:
            self.metrics.step_handed_back(self.agent.name, request.operation)
            logger.info("%s: %s, handed back to the queue", request.idempotency_key, why)
            hold.outcome = "handed_back"
            tracing.event(hold.span, "handed_back", reason=str(why))

    async def _report(
        self, hold: _Hold, state: StepState, result: str | None, error: str | None, tries: int
    ) -> None:
        request = hold.request
        outcome = StepOutcome(
            task_id=request.task_id,
            seq=request.seq,
            attempt=request.attempt,
            agent_instance=self.instance,
            state=state,  # type: ignore[arg-type]
            result=result,
            error=error,
            tries=tries,
        )
        report = hold.report or self._completions.submit
        hold.answered = True
        hold.outcome = str(state)
        applied = await self._before_complete_by(
            f"cannot record the outcome of {request.idempotency_key}",
            hold,
            lambda: report(outcome),
        )
        if applied is None:
            return
        if applied:
            self.metrics.step_reported(self.agent.name, request.operation, state)
        if not applied:
            hold.outcome = "discarded"
            logger.info(
                "late outcome of %s/%d attempt %d discarded",
                request.task_id,
                request.seq,
                request.attempt,
            )
            # The step was taken from this call as it answered (its task cancelled...): the
            # call has ended, which a compensation waiting for it needs to know.
            await self._check_calls([hold])
            if hold.cancelled is not None:
                await self._stopped(self.agent.operations[request.operation], hold)


def _tried(verdict: bool | None, error: BaseException | None) -> str:
    """How a try of an operation ended, for its metrics: ok, error, timeout, or cancelled
    (its call lost the step, or stopped: no word on the service)."""
    if error is None:
        return {True: "ok", False: "timeout", None: "cancelled"}[verdict]
    return "timeout" if isinstance(error, TimeoutError) else "error"


def _function_name(fn: Any) -> str:
    """An operation's function as OpenTelemetry's `code.function.name` names it."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
