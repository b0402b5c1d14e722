"""Agents: each wraps calls to one remote service, with retries bounded by complete_by.

An `Agent` is declared on the App and its operations with `@agent.operation`. At run time an
`AgentRunner` claims the queued requests of one agent from the store, calls the operation
with a stable idempotency key, retries transient errors with backoff and jitter while
complete_by has not passed, and reports the outcome. When complete_by passes it stops and
reports nothing: another instance may already be retrying the step.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from . import _json
from ._aio import first, in_daemon_thread, sleep_unless
from ._batch import Batcher
from .errors import ConfigurationError, PayloadError, StoreError
from .retry import Retry
from .states import StepState
from .store.base import CHANNEL_REQUESTS, Request, StepOutcome, Store

logger = logging.getLogger("stepwarden.agent")


@dataclass(frozen=True, slots=True)
class Call:
    """What an operation knows about the call it is serving."""

    task_id: str
    step: int
    attempt: int
    """How many times this step has been dispatched (1 on the first dispatch)."""
    try_number: int
    """Calls made so far within this dispatch, this one included."""
    idempotency_key: str
    """The same for every retry and re-dispatch of this step: pass it to the remote service."""
    complete_by: datetime
    _deadline: float
    compensates_key: str | None = None
    """On a compensation: the idempotency key of the step it undoes."""

    def remaining(self) -> float:
        """Seconds left before complete_by."""
        return max(0.0, self._deadline - asyncio.get_running_loop().time())


OperationFn = Callable[..., Any]


class Operation:
    """One operation of an agent; pass it to `ctx.step`."""

    def __init__(self, agent: Agent, fn: OperationFn, name: str, retry: Retry | None) -> None:
        self.agent = agent
        self.fn = fn
        self.name = name
        self.retry = retry or agent.retry
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__

    @property
    def qualname(self) -> str:
        return f"{self.agent.name}.{self.name}"

    async def invoke(self, call: Call, args: list[Any]) -> Any:
        if self.is_async:
            return await self.fn(call, *args)
        return await in_daemon_thread(self.fn, call, *args)

    def __repr__(self) -> str:
        return f"<Operation {self.qualname}>"


class Agent:
    """A named agent: the operations that call one remote service, and their retry policy."""

    def __init__(self, name: str, *, retry: Retry | None = None) -> None:
        if (
            not isinstance(name, str)
            or not name
            or not name.replace("_", "").replace("-", "").isalnum()
        ):
            raise ConfigurationError(f"invalid agent name {name!r}: use letters, digits, - and _")
        if retry is not None and not isinstance(retry, Retry):
            raise ConfigurationError(f"retry must be a stepwarden.Retry, not {retry!r}")
        self.name = name
        self.retry = retry or Retry()
        self.operations: dict[str, Operation] = {}

    def operation(
        self, fn: OperationFn | None = None, *, name: str | None = None, retry: Retry | None = None
    ) -> Any:
        """Register an operation; sync and async functions are both accepted.

        The function takes a `Call` and then the arguments given to `ctx.step`; it returns a
        JSON-serialisable value.
        """

        def register(fn: OperationFn) -> Operation:
            if not callable(fn):
                raise ConfigurationError(f"an operation must be a function, not {fn!r}")
            if retry is not None and not isinstance(retry, Retry):
                raise ConfigurationError(f"retry must be a stepwarden.Retry, not {retry!r}")
            op_name = name or fn.__name__
            if op_name in self.operations:
                raise ConfigurationError(f"agent {self.name!r} already has operation {op_name!r}")
            op = Operation(self, fn, op_name, retry)
            self.operations[op_name] = op
            return op

        return register(fn) if fn is not None else register

    def __getattr__(self, name: str) -> Operation:
        # `payments.charge` names the operation registered as "charge".
        operations = self.__dict__.get("operations", {})
        if name in operations:
            return operations[name]  # type: ignore[no-any-return]
        raise AttributeError(f"agent {self.__dict__.get('name')!r} has no operation {name!r}")

    def __repr__(self) -> str:
        return f"<Agent {self.name} operations={sorted(self.operations)}>"


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
    ) -> None:
        self.store = store
        self.agent = agent
        self.instance = instance
        self.concurrency = concurrency
        self.poll_interval = poll_interval or store.default_poll_interval
        self._inflight: set[asyncio.Task[None]] = set()
        self._room = asyncio.Event()
        self._completions: Batcher[StepOutcome, bool] = Batcher(store.complete_steps)
        self.discarded = 0

    async def run(self, stop: asyncio.Event) -> None:
        sub = self.store.subscribe(CHANNEL_REQUESTS)
        operations = sorted(self.agent.operations)
        failures = 0
        try:
            while not stop.is_set():
                free = self.concurrency - len(self._inflight)
                if free <= 0:
                    self._room.clear()
                    await first(stop.wait(), self._room.wait())
                    continue
                try:
                    requests = await self.store.claim_requests(
                        self.instance, self.agent.name, operations, free
                    )
                    failures = 0
                except StoreError as exc:
                    failures += 1
                    logger.warning("agent %s: cannot claim requests: %s", self.agent.name, exc)
                    await sleep_unless(stop, min(5.0, 0.1 * 2**failures))
                    continue
                for request in requests:
                    task = asyncio.create_task(self._serve(request))
                    self._inflight.add(task)
                    task.add_done_callback(self._done)
                if len(requests) < free:
                    await first(stop.wait(), sub.wait(self.poll_interval))
        finally:
            self.store.unsubscribe(CHANNEL_REQUESTS, sub)

    async def drain(self, timeout: float) -> None:
        """Let the calls under way finish (up to `timeout` seconds) and write their outcomes."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=timeout)
        for task in set(self._inflight):
            task.cancel()
        await self._completions.drain()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._room.set()
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "agent %s: serving a request failed", self.agent.name, exc_info=task.exception()
            )

    async def _serve(self, request: Request) -> None:
        op = self.agent.operations[request.operation]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.remaining
        args = request.input if isinstance(request.input, list) else [request.input]
        tries = 0
        error: BaseException
        while True:
            tries += 1
            call = Call(
                task_id=request.task_id,
                step=request.seq,
                attempt=request.attempt,
                try_number=tries,
                idempotency_key=request.idempotency_key,
                complete_by=request.complete_by,
                _deadline=deadline,
                compensates_key=(
                    None
                    if request.compensates is None
                    else f"{request.task_id}/{request.compensates}"
                ),
            )
            try:
                async with asyncio.timeout_at(deadline):
                    value = await op.invoke(call, args)
                result = _json.dumps(value, what=f"the result of {op.qualname}")
            except TimeoutError as exc:
                if loop.time() >= deadline:
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
            else:
                await self._report(request, StepState.COMPLETED, result, None, tries)
                return
            message = f"{type(error).__name__}: {error}"
            if permanent:
                await self._report(request, StepState.FAILED, None, message, tries)
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
            if loop.time() + delay >= deadline:
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

    async def _report(
        self, request: Request, state: StepState, result: str | None, error: str | None, tries: int
    ) -> None:
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
        try:
            applied = await self._completions.submit(outcome)
        except StoreError as exc:
            logger.warning(
                "cannot record the outcome of %s/%d: %s; the supervisor will retry it",
                request.task_id,
                request.seq,
                exc,
            )
            return
        if not applied:
            self.discarded += 1
            logger.info(
                "late outcome of %s/%d attempt %d discarded",
                request.task_id,
                request.seq,
                request.attempt,
            )
