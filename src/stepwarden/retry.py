"""Delays that grow: the agents' retry policy, the supervisor's backoff, alert delivery.

Every delay that grows with a count of failures comes from `backoff`, whose exponent is
capped: a count that keeps rising (a task retried for days, an alert undeliverable for a
week) gives the maximum delay, never an overflow.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from .errors import ConfigurationError, PermanentError, StoreError, TransientStoreError

T = TypeVar("T")
MAX_EXPONENT = 32
"""The highest power of the multiplier a delay is computed with."""
MAX_DELAY = 365 * 24 * 3600.0
"""The longest delay, in seconds: a deadline must stay a date both stores hold."""


def backoff(
    failures: int,
    *,
    initial: float,
    maximum: float,
    multiplier: float = 2.0,
    max_exponent: int = MAX_EXPONENT,
) -> float:
    """Seconds to wait after the `failures`-th failure in a row (1-based): `initial`, then
    growing by `multiplier` each time, never more than `maximum`."""
    exponent = min(max(0, failures - 1), max_exponent)
    try:
        delay = initial * multiplier**exponent
    except OverflowError:
        return maximum
    return min(maximum, delay)


def _check_delays(what: str, initial: float, maximum: float, multiplier: float) -> None:
    for name, value in (("initial", initial), ("maximum", maximum), ("multiplier", multiplier)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ConfigurationError(f"{what}.{name} must be a finite number, not {value!r}")
    if not 0 <= initial <= maximum <= MAX_DELAY or multiplier < 1:
        raise ConfigurationError(
            f"{what} needs 0 <= initial <= maximum <= {MAX_DELAY:g} seconds and multiplier >= 1"
        )


@dataclass(frozen=True, kw_only=True)
class Retry:
    """How an agent retries an operation that raised a transient error.

    `max_attempts` counts calls within one dispatch of a step (1 means no retry); every call
    also stops at the step's complete_by. Delays grow from `initial` by `multiplier` up to
    `maximum` seconds, with full jitter. Exceptions listed in `permanent` (and
    `stepwarden.PermanentError`) are never retried: the step fails and the task goes to Error.
    """

    max_attempts: int = 5
    initial: float = 0.1
    maximum: float = 5.0
    multiplier: float = 2.0
    jitter: bool = True
    permanent: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigurationError("Retry.max_attempts must be an integer")
        if self.max_attempts < 1:
            raise ConfigurationError("Retry.max_attempts must be at least 1")
        _check_delays("Retry", self.initial, self.maximum, self.multiplier)

    def is_permanent(self, exc: BaseException) -> bool:
        return isinstance(exc, (PermanentError, *self.permanent))

    def delay(self, attempt: int) -> float:
        """Seconds to wait after call number `attempt` (1-based) failed."""
        ceiling = backoff(
            attempt, initial=self.initial, maximum=self.maximum, multiplier=self.multiplier
        )
        return random.uniform(0, ceiling) if self.jitter else ceiling


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """How long the supervisor keeps a reset task waiting before a scheduler may claim it
    (and how long alert delivery waits before trying a failing sink again): `initial`,
    doubling with each failure in a row, up to `maximum` seconds."""

    initial: float = 0.5
    maximum: float = 30.0

    def __post_init__(self) -> None:
        _check_delays("Backoff", self.initial, self.maximum, 2.0)

    def delay(self, failures: int) -> float:
        return backoff(failures, initial=self.initial, maximum=self.maximum)


def after_store_failure(log: logging.Logger, what: str, exc: StoreError, failures: int) -> float:
    """Say a store failure and return the seconds to wait before trying again, after
    `failures` in a row: a transient one (it may pass by itself) as a warning, tried again
    soon; a permanent one (a refused query: it will not pass until someone acts) as an error
    with its traceback, tried again slowly."""
    if isinstance(exc, TransientStoreError):
        log.warning("%s: %s", what, exc)
        return backoff(failures, initial=0.1, maximum=5.0)
    log.error("%s: %s", what, exc, exc_info=exc)
    return backoff(failures, initial=1.0, maximum=60.0)


async def answered(
    log: logging.Logger,
    what: str,
    call: Callable[[], Awaitable[T]],
    *,
    pointless: Callable[[float], bool] = lambda delay: False,
    wait: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`call()`'s answer, tried again after each transient store failure (said as a warning,
    a growing delay between, which `wait` may cut short: `Store.wait_to_retry` does when the
    store answers again) until the store answers, or until waiting `delay` more seconds
    would be `pointless` (the last failure is then raised). A permanent failure is said as an
    error and raised. Only for calls that are safe to repeat (reads, fenced writes)."""
    failures = 0
    while True:
        try:
            return await call()
        except TransientStoreError as exc:
            failures += 1
            delay = after_store_failure(log, what, exc, failures)
            if pointless(delay):
                raise
            await wait(delay)
        except StoreError as exc:
            after_store_failure(log, what, exc, 1)
            raise
