"""Retry policy of agents: exponential backoff with jitter, bounded by complete_by."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .errors import ConfigurationError, PermanentError


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
        if self.max_attempts < 1:
            raise ConfigurationError("Retry.max_attempts must be at least 1")
        if self.initial < 0 or self.maximum < self.initial or self.multiplier < 1:
            raise ConfigurationError("Retry needs 0 <= initial <= maximum and multiplier >= 1")

    def is_permanent(self, exc: BaseException) -> bool:
        return isinstance(exc, (PermanentError, *self.permanent))

    def delay(self, attempt: int) -> float:
        """Seconds to wait after call number `attempt` (1-based) failed."""
        ceiling = min(self.maximum, self.initial * self.multiplier ** float(attempt - 1))
        return random.uniform(0, ceiling) if self.jitter else ceiling


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """How long the supervisor keeps a reset task waiting before a scheduler may claim it."""

    initial: float = 0.5
    maximum: float = 30.0

    def delay(self, failure_count: int) -> float:
        return min(self.maximum, self.initial * 2.0 ** max(0, failure_count - 1))
