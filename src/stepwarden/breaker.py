"""Circuit breakers: an agent instance stops calling a remote service that keeps failing.

One `CircuitBreaker` per agent per process, shared by every call of that agent there. Closed,
it counts consecutive transient failures; at `Breaker.failures` it opens. Open, calls fail
fast without touching the service, and the instance claims no request of that agent, so that
instances whose service answers take them. After `reset_after` seconds it is half-open: up to
`trial_calls` calls go through; a success closes it, a failure opens it again. A permanent
error is an answer, not a failure of the service: it counts as a success here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _check
from ._check import Seconds
from .errors import ConfigurationError

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


@dataclass(frozen=True, kw_only=True)
class Breaker:
    """The thresholds of an agent's circuit breaker (`Agent(..., breaker=Breaker())`)."""

    failures: int = 5
    """Consecutive transient failures that open the breaker."""
    reset_after: Seconds = Seconds(30.0)
    """How long (a timedelta or seconds) the breaker stays open before letting trial calls
    through (half-open)."""
    trial_calls: int = 1
    """Calls let through at once while half-open."""

    def __post_init__(self) -> None:
        _check.integer("Breaker.failures", self.failures, 1)
        _check.integer("Breaker.trial_calls", self.trial_calls, 1)
        if (
            not isinstance(self.reset_after, int | float)
            or isinstance(self.reset_after, bool)
            or not 0 < self.reset_after <= 86400
        ):
            raise ConfigurationError(
                f"Breaker.reset_after must be seconds in (0, 86400], not {self.reset_after!r}"
            )


class CircuitBreaker:
    """The state of one breaker; `on_change(state)` is called on every transition."""

    def __init__(
        self,
        config: Breaker,
        on_change: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.state = CLOSED
        self.failures = 0
        self.opened = 0
        """Times it opened."""
        self._opened_at = 0.0
        self._trials = 0
        self._on_change = on_change
        self._clock = clock

    def _move(self, state: str) -> None:
        if state != self.state:
            self.state = state
            if self._on_change is not None:
                self._on_change(state)

    def _refresh(self) -> None:
        if self.state == OPEN and self._clock() - self._opened_at >= self.config.reset_after:
            self._trials = 0
            self._move(HALF_OPEN)

    def room(self) -> int | None:
        """How many more calls may start now: None when any number may (closed)."""
        self._refresh()
        if self.state == CLOSED:
            return None
        if self.state == OPEN:
            return 0
        return max(0, self.config.trial_calls - self._trials)

    def reopens_in(self) -> float | None:
        """Seconds until an open breaker lets a trial call through."""
        if self.state != OPEN:
            return None
        return max(0.0, self._opened_at + self.config.reset_after - self._clock())

    def allow(self) -> bool:
        """Whether a call may go to the service now; a half-open breaker counts it as a
        trial. Every allowed call must end in `success()` or `failure()`."""
        room = self.room()
        if room is None:
            return True
        if room <= 0:
            return False
        self._trials += 1
        return True

    def success(self) -> None:
        self.failures = 0
        if self.state == HALF_OPEN:
            self._trials = max(0, self._trials - 1)
        self._move(CLOSED)

    def abandon(self) -> None:
        """An allowed call ended with no word on the service (its step was lost)."""
        if self.state == HALF_OPEN:
            self._trials = max(0, self._trials - 1)

    def failure(self) -> None:
        self.failures += 1
        if self.state == HALF_OPEN or (
            self.state == CLOSED and self.failures >= self.config.failures
        ):
            self._trials = 0
            self._opened_at = self._clock()
            self.opened += 1
            self._move(OPEN)

    def snapshot(self) -> dict[str, Any]:
        """What the registry publishes of this breaker."""
        self._refresh()
        detail: dict[str, Any] = {"failures": self.failures, "opened": self.opened}
        reopens = self.reopens_in()
        if reopens is not None:
            detail["half_open_in"] = round(reopens, 3)
        return detail
