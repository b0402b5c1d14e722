"""The agents at run time: an `AgentRunner` claims and serves the requests of one agent.

It claims the queued requests of its agent from the store, calls the operation with a stable
idempotency key, retries transient errors with backoff and jitter while complete_by has not
passed, and reports the outcome. When complete_by passes it stops and reports nothing:
another instance may already be retrying the step.

Each runner registers in the store's agent registry and heartbeats there (its operations,
capacity, calls in flight and circuit breaker). It claims only as many requests as it has
free slots, none while its breaker is open (an instance whose service answers takes them),
and only within the operations' limits. An instance that stops heartbeating is gone: the
supervisor hands its running steps to another.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from . import _json
from ._aio import first, sleep_unless
from ._batch import Batcher
from .agent import Agent, Call
from .breaker import CLOSED, OPEN, CircuitBreaker
from .errors import CircuitOpen, PayloadError, StepLost, StoreError, TransientStoreError
from .records import (
    AgentBeat,
    OpLimit,
    Request,
    RequestHandback,
    StepOutcome,
    idempotency_key,
)
from .retry import after_store_failure, answered
from .rules import describe
from .states import StepState
from .store import CHANNEL_REQUESTS, Store

logger = logging.getLogger("stepwarden.agent")
T = TypeVar("T")

DEFAULT_HEARTBEAT = 1.0
"""Seconds between an agent instance's heartbeats in the registry."""
DEFAULT_GONE_AFTER = 5.0
"""Seconds without a heartbeat after which an agent instance is gone."""


class _Hold:
    """A runner's hold of one claimed step: its deadline, moved on by heartbeats."""

    def __init__(self, runner: AgentRunner, request: Request) -> None:
        self.runner = runner
        self.request = request
        self.loop = asyncio.get_running_loop()
        self.deadline = self.loop.time() + request.remaining
        self.complete_by = request.complete_by
        self.timeout: asyncio.Timeout | None = None

    async def heartbeat(self, details: Any) -> None:
        detail = None if details is None else _json.dumps(details, what="heartbeat details")
        r = self.request
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
        self.deadline = self.loop.time() + remaining
        self.complete_by = datetime.now(UTC) + timedelta(seconds=remaining)
        if self.timeout is not None:
            self.timeout.reschedule(self.deadline)


class AgentRunner:
    """Claims and serves the requests of one agent in this process."""

    def __init__(
        self,
        store: Store,
        agent: Agent,
        *,
        instance: str,
        concurrency: int = 100,
        poll_interval: float | None = None,
        heartbeat: float = DEFAULT_HEARTBEAT,
        gone_after: float = DEFAULT_GONE_AFTER,
    ) -> None:
        self.store = store
        self.agent = agent
        self.instance = instance
        self.concurrency = concurrency
        self.poll_interval = poll_interval or store.default_poll_interval
        self.heartbeat = heartbeat
        self.gone_after = gone_after
        self._inflight: dict[asyncio.Task[None], str] = {}
        self._room = asyncio.Event()
        self._beat_now = asyncio.Event()
        self._transitions: list[str] = []
        self._completions: Batcher[StepOutcome, bool] = Batcher(store.complete_steps)
        self.breaker = (
            None if agent.breaker is None else CircuitBreaker(agent.breaker, self._on_breaker)
        )

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
                await sleep_unless(stop, after_store_failure(logger, what, exc, failures))

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._beat_now.clear()
            await first(stop.wait(), self._beat_now.wait(), asyncio.sleep(self.heartbeat))
            if stop.is_set():
                return
            transitions, self._transitions = self._transitions, []
            try:
                await self.store.beat([self._beat()], self.gone_after)
                if transitions:
                    detail = {"instance": self.instance, "agent": self.agent.name}
                    await self.store.record_events(
                        [(None, "breaker", {**detail, "state": t}) for t in transitions]
                    )
            except StoreError as exc:
                self._transitions[:0] = transitions
                logger.warning("agent %s: heartbeat failed: %s", self.agent.name, exc)

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

    async def run(self, stop: asyncio.Event) -> None:
        await self.register(stop)
        sub = self.store.subscribe(CHANNEL_REQUESTS)
        beats = asyncio.create_task(self._heartbeats(stop))
        failures = 0
        try:
            while not stop.is_set():
                self._room.clear()
                free = self.concurrency - len(self._inflight)
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
                try:
                    requests = await self.store.claim_requests(
                        self.instance, self.agent.name, operations, free, limits
                    )
                    failures = 0
                except StoreError as exc:
                    failures += 1
                    what = f"agent {self.agent.name}: cannot claim requests"
                    await sleep_unless(stop, after_store_failure(logger, what, exc, failures))
                    continue
                for request in requests:
                    task = asyncio.create_task(self._serve(request))
                    self._inflight[task] = request.operation
                    task.add_done_callback(self._done)
                if len(requests) < free:
                    waits = [stop.wait(), sub.wait(self.poll_interval)]
                    if full:  # an operation at its per-instance limit: a call ending frees it
                        waits.append(self._room.wait())
                    await first(*waits)
        finally:
            self.store.unsubscribe(CHANNEL_REQUESTS, sub)
            beats.cancel()
            await asyncio.gather(beats, return_exceptions=True)

    async def drain(self, timeout: float) -> None:
        """Let the calls under way finish (up to `timeout` seconds), write their outcomes,
        and leave the registry: the steps still running here go to other instances."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=timeout)
        for task in set(self._inflight):
            task.cancel()
        await self._completions.drain()
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
    async def _serve(self, request: Request) -> None:
        op = self.agent.operations[request.operation]
        hold = _Hold(self, request)
        loop = hold.loop
        args = request.input if isinstance(request.input, list) else [request.input]
        tries = 0
        error: BaseException
        while True:
            if self.breaker is not None and not self.breaker.allow():
                await self._hand_back(hold, CircuitOpen(f"agent {self.agent.name}: open"))
                return
            tries += 1
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
            try:
                async with asyncio.timeout_at(hold.deadline) as hold.timeout:
                    value = await op.invoke(call, args)
                verdict = True
                result = _json.dumps(value, what=f"the result of {op.qualname}")
            except StepLost as exc:
                logger.info("%s for %s: %s; stopping", op.qualname, request.idempotency_key, exc)
                return
            except TimeoutError as exc:
                verdict = False
                if loop.time() >= hold.deadline:
                    logger.info(
                        "%s for %s: complete_by passed, stopping",
                        op.qualname,
                        request.idempotency_key,
                    )
                    return
                error, permanent = exc, op.retry.is_permanent(exc)
            except PayloadError as exc:
                error, permanent = exc, True
            except Exception as exc:
                error, permanent = exc, op.retry.is_permanent(exc)
                verdict = permanent
            else:
                await self._report(hold, StepState.COMPLETED, result, None, tries)
                return
            finally:
                hold.timeout = None
                if self.breaker is not None:
                    if verdict is True:
                        self.breaker.success()
                    elif verdict is False:
                        self.breaker.failure()
                    else:
                        self.breaker.abandon()
            message = describe(error)
            if permanent:
                await self._report(hold, StepState.FAILED, None, message, tries)
                return
            if self.breaker is not None and self.breaker.state == OPEN:
                # This failure opened the breaker: another instance may reach the service.
                await self._hand_back(hold, CircuitOpen(f"agent {self.agent.name}: open"))
                return
            if tries >= op.retry.max_attempts:
                logger.warning(
                    "%s for %s: giving up after %d tries (%s); the supervisor will retry the step",
                    op.qualname,
                    request.idempotency_key,
                    tries,
                    message,
                )
                return
            delay = op.retry.delay(tries)
            if loop.time() + delay >= hold.deadline:
                logger.info(
                    "%s for %s: no time left to retry (%s)",
                    op.qualname,
                    request.idempotency_key,
                    message,
                )
                return
            logger.debug(
                "%s for %s: try %d failed (%s), retrying in %.2fs",
                op.qualname,
                request.idempotency_key,
                tries,
                message,
                delay,
            )
            await asyncio.sleep(delay)

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
                pointless=lambda delay: hold.loop.time() + delay >= hold.deadline,
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
            logger.info("%s: %s, handed back to the queue", request.idempotency_key, why)

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
        applied = await self._before_complete_by(
            f"cannot record the outcome of {request.idempotency_key}",
            hold,
            lambda: self._completions.submit(outcome),
        )
        if applied is None:
            return
        if not applied:
            logger.info(
                "late outcome of %s/%d attempt %d discarded",
                request.task_id,
                request.seq,
                request.attempt,
            )
