"""Secrets in payloads: stored for the operation that needs them, never shown.

Wrap a value in `Secret` anywhere in a task's input or a step's arguments. It is stored in the
state store (as JSON, under the reserved key "$secret") so that the operation gets it back,
again wrapped: `call`-side code reads it with `.reveal()`. Everything stepwarden shows (the
command line, `repr`, logs, alerts) prints `***` in its place.

    app.submit(process_order, {"id": 42, "card": stepwarden.Secret("4111 1111 1111 1111")})
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

T = TypeVar("T")

SECRET_KEY = "$secret"
"""The reserved key of a secret in stored JSON: {"$secret": value}."""
MASK = "***"


class Secret(Generic[T]):
    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        self._value = value

    def reveal(self) -> T:
        """The wrapped value, for the code that must use it."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and bool(other._value == self._value)

    def __hash__(self) -> int:
        return hash((Secret, MASK))

    def __reduce__(self) -> Any:
        raise TypeError("a Secret is not picklable")
