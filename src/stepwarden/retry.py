"""Delays and the loops that wait them: the agents' retry policy, the supervisor's backoff,
alert delivery, and every store call tried again (the roles', the Store's reads and
submits, the drivers' reconnections).

Every delay that grows with a count of failures comes from `backoff`, whose exponent is
capped: a count that keeps rising (a task retried for days, an alert undeliverable for a
week) gives the maximum delay, never an overflow. Every loop that tries a call again is
`retried`, given one of the schedules below.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ._check import Seconds
from .errors import ConfigurationError, PermanentError, StoreError, TransientStoreError

_JITTER = random.Random()
"""The jitter's own generator: the process-wide one (`random`'s) is left to the
application, its seeds and its tests."""

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)
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
    `maximum` (each a timedelta or seconds), with full jitter. Exceptions listed in `permanent` (and
    `stepwarden.PermanentError`) are never retried: the step fails and the task goes to Error.
    """

    max_attempts: int = 5
    initial: Seconds = Seconds(0.1)
    maximum: Seconds = Seconds(5.0)
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
        return _JITTER.uniform(0, ceiling) if self.jitter else ceiling


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """How long the supervisor keeps a reset task waiting before a scheduler may claim it
    (and how long alert delivery waits before trying a failing sink again): `initial`,
    doubling with each failure in a row, up to `maximum` (each a timedelta or seconds)."""

    initial: Seconds = Seconds(0.5)
    maximum: Seconds = Seconds(30.0)

    def __post_init__(self) -> None:
        _check_delays("Backoff", self.initial, self.maximum, 2.0)

    def delay(self, failures: int) -> float:
        return backoff(failures, initial=self.initial, maximum=self.maximum)


# -- store calls tried again ---------------------------------------------------------------

TRIES = 5
"""How many times a call that is safe to repeat (a read, a submission) is tried when the
store fails transiently, over about 1.5 seconds: a lost connection is replaced, a restarting
server is waited for a moment."""
PROBE_EVERY = 0.5
"""Seconds between two tries of a server out of reach (a connection lost, until a try
succeeds): the calls waiting for it go as soon as one does."""
NEW_FILE_TRIES = 9
"""How many times a store tries to set up a new database file that another process is
setting up at the same moment (SQLite's switch to WAL, which does not wait on the busy
handler), over about 4 seconds."""


def after_transient(failures: int) -> float:
    """Seconds to wait after the `failures`-th transient store failure in a row (it may pass
    by itself): 0.1, doubling up to 5."""
    return backoff(failures, initial=0.1, maximum=5.0)


def after_permanent(failures: int) -> float:
    """Seconds to wait after the `failures`-th permanent store failure in a row (a refused
    query: it will not pass until someone acts): 1, doubling up to 60."""
    return backoff(failures, initial=1.0, maximum=60.0)


def within_tries(failures: int) -> float | None:
    """Seconds to wait before the next try of a call tried TRIES times at most: 0.1,
    doubling up to 1; None once they are spent."""
    return None if failures >= TRIES else backoff(failures, initial=0.1, maximum=1.0)


def new_file(failures: int) -> float | None:
    """Seconds to wait before the next try of a new database file's setup: 0.01, ten times
    more every three tries (0.01, 0.02, 0.05, 0.1, ... s), 2 at most; None after
    NEW_FILE_TRIES."""
    if failures >= NEW_FILE_TRIES:
        return None
    return backoff(failures, initial=0.01, maximum=2.0, multiplier=10 ** (1 / 3))


def paced(started: float, every: float) -> float:
    """Seconds to wait for the next of tries made every `every` seconds, the last of which
    started at `started` (`time.monotonic()`): a try that took longer is followed at once."""
    return max(0.0, started + every - time.monotonic())


async def retried(
    call: Callable[[], Awaitable[T]],
    delay: Callable[[E, int], float | None],
    *,
    on: type[E] | tuple[type[E], ...],
    wait: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`call()`'s answer, tried again after each failure of the kinds `on` names:
    `delay(failure, failures)` (those in a row, from 1) gives the seconds to `wait` before the
    next try, or None to give up (that failure is raised). Any other failure is raised at
    once. Only for calls that are safe to repeat."""
    failures = 0
    while True:
        try:
            return await call()
        except on as exc:
            failures += 1
            seconds = delay(exc, failures)
            if seconds is None:
                raise
            await wait(seconds)


def after_store_failure(log: logging.Logger, what: str, exc: StoreError, failures: int) -> float:
    """Say a store failure and return the seconds to wait before trying again, after
    `failures` in a row: a transient one (it may pass by itself) as a warning, tried again
    soon; a permanent one (a refused query: it will not pass until someone acts) as an error
    with its traceback, tried again slowly."""
    if isinstance(exc, TransientStoreError):
        log.warning("%s: %s", what, exc)
        return after_transient(failures)
    log.error("%s: %s", what, exc, exc_info=exc)
    return after_permanent(failures)


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

    def delay(exc: TransientStoreError, failures: int) -> float | None:
        seconds = after_store_failure(log, what, exc, failures)
        return None if pointless(seconds) else seconds

    try:
        return await retried(call, delay, on=TransientStoreError, wait=wait)
    except StoreError as exc:
        if not isinstance(exc, TransientStoreError):
            after_store_failure(log, what, exc, 1)
        raise
