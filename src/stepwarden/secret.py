"""Secrets in payloads: stored for the operation that needs them, never shown.

Wrap a value in `Secret` anywhere in a task's input or a step's arguments. It is stored in the
state store so that the operation gets it back, again wrapped: `call`-side code reads it with
`.reveal()`. With a keyring, it is stored sealed (`stepwarden.sealing`: `{"$sealed": ...}`),
and opened by `.reveal()` in a process that holds the key; without one, as plain JSON under
the reserved key "$secret". Everything stepwarden shows (the command line, `repr`, logs,
alerts) prints `***` in its place.

    app.submit(process_order, {"id": 42, "card": stepwarden.Secret("4111 1111 1111 1111")})
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

from .errors import KeyringError
from .sealing import Sealed

T = TypeVar("T")

SECRET_KEY = "$secret"
"""The reserved key of a secret in stored JSON: {"$secret": value}."""
MASK = "***"


def public_url(url: str) -> str:
    """What may be shown of a URL that may carry credentials: its scheme, host and port,
    never its path (a Slack webhook keeps its secret there), user, password, query or
    fragment."""
    return _without_credentials(url, path=False)


def public_name(name: str) -> str:
    """A sink's name as it may be shown (the dashboard, the log): a `webhook:URL` name as
    `webhook:` and the URL's public form."""
    kind, sep, rest = name.partition(":")
    if sep and "://" in rest:
        return f"{kind}:{public_url(rest)}"
    return name


def stored_url(url: str) -> str:
    """What of a webhook's URL names its sink in the outbox, which records delivery by that
    name: its scheme, host, port and path (as earlier versions named it, so that no alert is
    sent again), never its user, password, query or fragment. Shown only as `public_url`."""
    return _without_credentials(url, path=True)


def stored_name(name: str) -> str:
    """A sink's name as the outbox records delivery by it: a `webhook:URL` name with the
    URL's stored form (a name stored by an earlier version held its credentials)."""
    kind, sep, rest = name.partition(":")
    if sep and "://" in rest:
        return f"{kind}:{stored_url(rest)}"
    return name


def _without_credentials(url: str, *, path: bool) -> str:
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return MASK
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path if path else "", "", ""))


class Secret(Generic[T]):
    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        self._value: T | Sealed = value

    def reveal(self) -> T:
        """The wrapped value, for the code that must use it. A secret read from a store that
        seals them (`stepwarden.sealing`) is opened here, once: KeyringError where the
        process holds no key for it."""
        if isinstance(self._value, Sealed):
            self._value = self._value.open()
        return self._value  # type: ignore[return-value]

    @property
    def sealed(self) -> Sealed | None:
        """The value as the store holds it, while it has not been opened (None: it is
        plain, or opened)."""
        return self._value if isinstance(self._value, Sealed) else None

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return False
        mine, theirs = self.sealed, other.sealed
        if mine is not None and theirs is not None and mine.blob == theirs.blob:
            return True
        try:
            return bool(other.reveal() == self.reveal())
        except KeyringError:  # sealed, and not to be opened here: unequal unless the same
            return False

    def __hash__(self) -> int:
        return hash((Secret, MASK))

    def __reduce__(self) -> Any:
        raise TypeError("a Secret is not picklable")
