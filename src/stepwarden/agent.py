"""Agents, as an application declares them: each wraps calls to one remote service.

An `Agent` is declared on the App and its operations with `@agent.operation`; an operation
receives a `Call` (its idempotency key, deadline and attempt) and the arguments given to
`ctx.step`. The runtime that claims requests and calls operations is `runner.py`.

An operation keeps its types: `Operation[*Args, R]` holds the types of the arguments it takes
after its `Call` and of its result (an async operation's awaited one), which `ctx.step` checks
and returns.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar, TypeVarTuple, overload

from . import _check
from ._aio import in_daemon_thread
from ._check import Seconds
from .breaker import Breaker
from .deadline import Deadline
from .errors import ConfigurationError, PayloadError
from .retry import Retry

MAX_LIMIT_KEY = 200

Args = TypeVarTuple("Args")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


@dataclass(frozen=True, kw_only=True)
class Limit:
    """How many calls of an operation may run, and start, at once.

    `concurrency`: steps running at once across every process; `per_instance`: at once in one
    agent instance; `rate` starts per `per` seconds across every process. With `key` (a
    function of the step's arguments, returning a string such as a customer id),
    `concurrency` and `rate` hold for each key apart. The key is taken when the step is
    recorded. Limits are enforced when agents claim requests: a request waits in the queue
    (its complete_by running) until it may start.
    """

    concurrency: int | None = None
    per_instance: int | None = None
    rate: int | None = None
    per: Seconds = Seconds(1.0)
    key: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        for what in ("concurrency", "per_instance", "rate"):
            value = getattr(self, what)
            if value is not None:
                _check.integer(f"Limit.{what}", value, 1)
        if (
            not isinstance(self.per, int | float)
            or isinstance(self.per, bool)
            or not 0 < self.per <= 86400
        ):
            raise ConfigurationError(f"Limit.per must be seconds in (0, 86400], not {self.per!r}")
        if self.key is not None and not callable(self.key):
            raise ConfigurationError(f"Limit.key must be a function, not {self.key!r}")

    def key_of(self, args: tuple[Any, ...] | list[Any]) -> str | None:
        """The limit key of a step with these arguments (None without a key function)."""
        if self.key is None:
            return None
        try:
            value = self.key(*args)
        except Exception as exc:
            what = f"{type(exc).__name__}: {exc}"
            raise PayloadError(f"the limit key function raised {what}") from exc
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise PayloadError(f"a limit key must be a string or an integer, not {value!r}")
        key = str(value)
        if not key or len(key) > MAX_LIMIT_KEY:
            raise PayloadError(f"a limit key must have 1 to {MAX_LIMIT_KEY} characters")
        return key


class CallHold(Protocol):
    """The runner's hold of the step a call serves: its deadline, moved on by heartbeats,
    and why it was lost, once it is."""

    loop: asyncio.AbstractEventLoop
    deadline: Deadline
    """complete_by, moved on by heartbeats."""
    cancelled: str | None
    """Why the call no longer holds its step (None while it does)."""

    async def heartbeat(self, details: Any) -> None: ...


class Call:
    """What an operation knows about the call it is serving."""

    __slots__ = (
        "_hold",
        "attempt",
        "compensates_key",
        "idempotency_key",
        "step",
        "task_id",
        "try_number",
    )

    def __init__(
        self,
        *,
        task_id: str,
        step: int,
        attempt: int,
        try_number: int,
        idempotency_key: str,
        hold: CallHold,
        compensates_key: str | None = None,
    ) -> None:
        self.task_id = task_id
        self.step = step
        self.attempt = attempt
        """How many times this step has been dispatched (1 on the first dispatch)."""
        self.try_number = try_number
        """Calls made so far within this dispatch, this one included."""
        self.idempotency_key = idempotency_key
        """The same for every retry and re-dispatch of this step: pass it to the remote
        service."""
        self.compensates_key = compensates_key
        """On a compensation: the idempotency key of the step it undoes."""
        self._hold = hold

    @property
    def complete_by(self) -> datetime:
        """When this call must be done; a heartbeat moves it on."""
        return self._hold.deadline.complete_by

    @property
    def cancelled(self) -> str | None:
        """Why this call was cancelled, once its step is no longer held by it (its task
        cancelled, paused or sent to compensating by an operator, the step abandoned,
        dispatched again or reassigned): a short reason such as "the task is cancelled".
        None while the call holds its step. An async operation is cancelled then
        (`asyncio.CancelledError` is raised inside it); a sync one cannot be interrupted and
        should check this in a long loop, and stop. Whatever the operation returns after
        that is discarded."""
        return self._hold.cancelled

    def remaining(self) -> float:
        """Seconds left before complete_by."""
        return self._hold.deadline.remaining()

    async def heartbeat(self, details: Any = None) -> None:
        """Tell the store this call is alive: the step's complete_by moves to now + its
        complete_within (never past the task's complete_by, nor the step's total timeout),
        and `details` (JSON) are recorded with the step. Raises StepLost when this call no
        longer holds the step (and from then on: see `cancelled`): stop then. From a sync
        operation use `heartbeat_sync`."""
        await self._hold.heartbeat(details)

    def heartbeat_sync(self, details: Any = None) -> None:
        """`heartbeat` for a sync operation (which runs in a thread of its own)."""
        asyncio.run_coroutine_threadsafe(self._hold.heartbeat(details), self._hold.loop).result()

    def __repr__(self) -> str:
        return f"<Call {self.idempotency_key} attempt={self.attempt} try={self.try_number}>"


OperationFn = Callable[..., Any]


class Operation(Generic[*Args, R_co]):
    """One operation of an agent; pass it to `ctx.step`.

    `Operation[str, dict[str, Any]]` takes a `str` (after its `Call`) and returns a dict: the
    types `@agent.operation` reads from the function it declares. `AnyOperation` is one whose
    types are not known: one found through its agent (`payments.charge`) or by its name."""

    def __init__(
        self,
        agent: Agent,
        fn: Callable[[Call, *Args], Any],
        name: str,
        retry: Retry | None,
        limit: Limit | None = None,
    ) -> None:
        self.agent = agent
        self.fn = fn
        self.name = name
        self.retry = retry or agent.retry
        self.limit = limit
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


AnyOperation = Operation[*tuple[Any, ...], Any]
"""An operation whose argument and result types are not known."""


class Register(Protocol):
    """What `@agent.operation(...)` with options returns: it declares the function it is
    given, keeping its types as `Agent.operation` does."""

    @overload
    def __call__(self, fn: Callable[[Call, *Args], Awaitable[R]]) -> Operation[*Args, R]: ...

    @overload
    def __call__(self, fn: Callable[[Call, *Args], R]) -> Operation[*Args, R]: ...

    @overload
    def __call__(self, fn: Callable[..., Awaitable[R]]) -> Operation[*tuple[Any, ...], R]: ...

    @overload
    def __call__(self, fn: Callable[..., R]) -> Operation[*tuple[Any, ...], R]: ...


class Agent:
    """A named agent: the operations that call one remote service, and their retry policy."""

    def __init__(
        self, name: str, *, retry: Retry | None = None, breaker: Breaker | None = None
    ) -> None:
        if (
            not isinstance(name, str)
            or not name
            or not name.replace("_", "").replace("-", "").isalnum()
        ):
            raise ConfigurationError(f"invalid agent name {name!r}: use letters, digits, - and _")
        if retry is not None and not isinstance(retry, Retry):
            raise ConfigurationError(f"retry must be a stepwarden.Retry, not {retry!r}")
        if breaker is not None and not isinstance(breaker, Breaker):
            raise ConfigurationError(f"breaker must be a stepwarden.Breaker, not {breaker!r}")
        self.name = name
        self.retry = retry or Retry()
        self.breaker = breaker
        """The thresholds of this agent's circuit breaker (one per process); None: none."""
        self.operations: dict[str, AnyOperation] = {}

    @overload
    def operation(
        self,
        fn: Callable[[Call, *Args], Awaitable[R]],
        *,
        name: str | None = None,
        retry: Retry | None = None,
        limit: Limit | None = None,
    ) -> Operation[*Args, R]: ...

    @overload
    def operation(
        self,
        fn: Callable[[Call, *Args], R],
        *,
        name: str | None = None,
        retry: Retry | None = None,
        limit: Limit | None = None,
    ) -> Operation[*Args, R]: ...

    @overload
    def operation(
        self,
        fn: Callable[..., Awaitable[R]],
        *,
        name: str | None = None,
        retry: Retry | None = None,
        limit: Limit | None = None,
    ) -> Operation[*tuple[Any, ...], R]: ...

    @overload
    def operation(
        self,
        fn: Callable[..., R],
        *,
        name: str | None = None,
        retry: Retry | None = None,
        limit: Limit | None = None,
    ) -> Operation[*tuple[Any, ...], R]: ...

    @overload
    def operation(
        self,
        fn: None = None,
        *,
        name: str | None = None,
        retry: Retry | None = None,
        limit: Limit | None = None,
    ) -> Register: ...

    def operation(
        self,
        fn: OperationFn | None = None,
        *,
        name: str | None = None,
        retry: Retry | None = None,
        limit: Limit | None = None,
    ) -> AnyOperation | Register:
        """Register an operation; sync and async functions are both accepted.

        The function takes a `Call` and then the arguments given to `ctx.step`; it returns a
        JSON-serialisable value. `limit` bounds how many of its calls run and start at once
        (`stepwarden.Limit`).

        The Operation keeps the function's types: the types of the parameters after the
        `Call` (`ctx.step` passes its arguments by position, so each of them, one with a
        default too, is an argument `ctx.step` expects) and the result type, an async
        function's awaited one. A function with keyword-only parameters or `**kwargs` keeps
        its result type only.
        """

        def register(fn: OperationFn) -> AnyOperation:
            if not callable(fn):
                raise ConfigurationError(f"an operation must be a function, not {fn!r}")
            if retry is not None and not isinstance(retry, Retry):
                raise ConfigurationError(f"retry must be a stepwarden.Retry, not {retry!r}")
            if limit is not None and not isinstance(limit, Limit):
                raise ConfigurationError(f"limit must be a stepwarden.Limit, not {limit!r}")
            op_name = name or fn.__name__
            if op_name in self.operations:
                raise ConfigurationError(f"agent {self.name!r} already has operation {op_name!r}")
            op: AnyOperation = Operation(self, fn, op_name, retry, limit)
            self.operations[op_name] = op
            return op

        return register(fn) if fn is not None else register

    def __getattr__(self, name: str) -> AnyOperation:
        # `payments.charge` names the operation registered as "charge".
        operations = self.__dict__.get("operations", {})
        if name in operations:
            return operations[name]  # type: ignore[no-any-return]
        raise AttributeError(f"agent {self.__dict__.get('name')!r} has no operation {name!r}")

    def __repr__(self) -> str:
        return f"<Agent {self.name} operations={sorted(self.operations)}>"
