"""A deadline in this process: a moment by the monotonic clock, set from the seconds left.

The database's clock decides every deadline (a task's or a step's complete_by): a store
answers with the seconds left (`remaining`), and this process counts them down on its own
monotonic clock, the one asyncio's event loop keeps (`loop.time()`, for `asyncio.timeout_at`),
which no change of the wall clock moves. `Deadline.after(remaining)` is the only place where
seconds left become a moment.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True, slots=True, order=True)
class Deadline:
    """A moment on the monotonic clock (`at`), and the wall-clock time it stands for
    (`complete_by`, as shown to an operation). Ordered by `at`: `min(a, b)` is the earlier."""

    at: float
    """The moment on the monotonic clock (`time.monotonic`, as asyncio's loop reads it)."""
    given: datetime | None = field(default=None, compare=False)
    """The wall time the store gave for it, if it gave one."""

    @classmethod
    def after(cls, remaining: float, *, complete_by: datetime | None = None) -> Deadline:
        """`remaining` seconds from now (negative: already passed). `complete_by`: the wall
        time the store gave for it, if it gave one."""
        return cls(time.monotonic() + remaining, complete_by)

    @property
    def complete_by(self) -> datetime:
        """The same moment on the wall clock, for display (never for counting down): the
        store's, or now plus what is left by this clock."""
        if self.given is not None:
            return self.given
        return datetime.now(UTC) + timedelta(seconds=self.at - time.monotonic())

    def remaining(self) -> float:
        """Seconds left, 0 once passed."""
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def passes_within(self, seconds: float) -> bool:
        """Whether it passes within `seconds` from now (a wait that long would outlive it)."""
        return time.monotonic() + seconds >= self.at
