"""Where a task's status messages may go: a `reply_to` names a channel of the outbox (a
name without `://`), or a destination on a broker, `amqp://host[:port]/queue` (RabbitMQ),
`nats://host[:port]/subject` (NATS JetStream) or `redis://host[:port]/stream` (a Redis
stream), which the relay publishes to with the workers' credentials (`relay.py`).

The broker destinations allowed are the operator's to list, in a file of their own, without
credentials: the file that `STEPWARDEN_DESTINATIONS` names, or `App(destinations=PATH)`
(`stepwarden worker` and `stepwarden dashboard --destinations FILE`). One entry a line,
`NAME BROKER NAMES`: the entry's name (what a client's `destinations` setting in the tokens
file grants), the broker as `scheme://host[:port]`, and the queues, streams or subjects
allowed there, separated by commas: a name, a start of names followed by `*`, or `*` for
any. Blank lines and lines starting with `#` are skipped.

    # NAME    BROKER                  NAMES
    orders    amqp://rabbit:5672      order-status,replies.*
    events    nats://nats             shop.events.*

A destination is matched on its parsed parts (`Destination`: scheme, host, port, name),
never as text: `amqp://rabbit:5672/order-status` and `amqp://rabbit/order-status` are one
destination, `amqp://rabbit.evil/...` is another broker. Without a file no broker
destination is allowed. A submit naming an unlisted one is refused (ConfigurationError,
nothing stored), and the relay refuses the messages of an unlisted one stored before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from ._files import OWNERS_TO_WRITE, read_guarded
from .errors import ConfigurationError
from .secret import public_url

SCHEMES = {"amqp": 5672, "nats": 4222, "redis": 6379}
"""The brokers a `reply_to` may name, and their default ports. (Migration 0017's SQL names
the same schemes: a message for one of these is due at once.)"""
ENV = "STEPWARDEN_DESTINATIONS"
"""The environment variable that names the destinations file."""
BROKERS_ENV = "STEPWARDEN_BROKERS"
"""The environment variable that names the workers' file of broker credentials
(`relay.Brokers`)."""
ANY = "*"
ENTRY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
MAX_ENTRIES = 10_000
_WHAT = {"amqp": "queue", "nats": "subject", "redis": "stream"}


@dataclass(frozen=True)
class Destination:
    """Where a task's status messages go: a queue, a subject or a stream of one broker."""

    scheme: str
    host: str
    port: int
    name: str

    @property
    def broker(self) -> str:
        """The broker, as the credentials file names it: `scheme://host:port`."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def is_destination(reply_to: str) -> bool:
    """Whether a `reply_to` names a broker destination rather than a plain channel."""
    return "://" in reply_to


def destination(reply_to: str) -> Destination:
    """The broker destination a `reply_to` names; ConfigurationError (never showing a user or
    password) when it is not one that can be relayed to."""
    scheme, _, _ = reply_to.partition("://")
    shown = public_url(reply_to)
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"reply_to {shown!r} names no broker that status messages go to: "
            "amqp://host[:port]/queue, nats://host[:port]/subject or "
            "redis://host[:port]/stream (or a channel name without '://')"
        )
    parts = urlsplit(reply_to)
    if "@" in parts.netloc:
        raise ConfigurationError(
            f"reply_to {shown!r} carries credentials: a task records only the destination; "
            f"give the workers the broker's credentials in the file ${BROKERS_ENV} names"
        )
    try:
        port = parts.port
    except ValueError:
        raise ConfigurationError(f"reply_to {shown!r} has a bad port") from None
    if not parts.hostname:
        raise ConfigurationError(f"reply_to {shown!r} names no host")
    if parts.query or parts.fragment or "?" in reply_to or "#" in reply_to:
        raise ConfigurationError(f"reply_to {shown!r}: a destination has no query or fragment")
    name = unquote(parts.path[1:])
    what = _WHAT[scheme]
    if not name:
        raise ConfigurationError(f"reply_to {shown!r} names no {what}: {scheme}://host/{what}")
    if scheme == "nats" and (any(c.isspace() or c in "*>" for c in name) or "" in name.split(".")):
        raise ConfigurationError(
            f"reply_to {reply_to!r}: a NATS subject is dot-separated tokens, without "
            "spaces or wildcards"
        )
    if scheme == "amqp" and len(name.encode()) > 255:
        raise ConfigurationError(f"reply_to {reply_to!r}: a queue name is at most 255 bytes")
    return Destination(scheme, parts.hostname, port or SCHEMES[scheme], name)


def broker(text: str) -> Destination:
    """The broker `scheme://host[:port]` names (a Destination without a name: its `broker`
    is the broker's key); ConfigurationError when it is not one, never showing a password."""
    parts = urlsplit(text if isinstance(text, str) else "")
    port: int | None
    try:
        port = parts.port
    except ValueError:
        port = -1
    if (
        parts.scheme not in SCHEMES
        or not parts.hostname
        or "@" in parts.netloc
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or port == -1
    ):
        raise ConfigurationError(
            f"{public_url(str(text))!r} is not a broker: scheme://host[:port] with "
            f"scheme one of {sorted(SCHEMES)}, without a user, password or path"
        )
    return Destination(parts.scheme, parts.hostname, port or SCHEMES[parts.scheme], "")


@dataclass(frozen=True)
class Entry:
    """A line of the destinations file: a broker, and the names allowed there."""

    name: str
    broker: Destination
    names: tuple[str, ...]
    """Each a name, a start of names followed by `*`, or `*` for any."""

    def allows(self, dest: Destination) -> bool:
        """Whether `dest` is on this entry's broker, with a name it allows."""
        at = self.broker
        if (dest.scheme, dest.host, dest.port) != (at.scheme, at.host, at.port):
            return False
        for allowed in self.names:
            if allowed.endswith(ANY):
                if dest.name.startswith(allowed[:-1]):
                    return True
            elif dest.name == allowed:
                return True
        return False


@dataclass(frozen=True)
class Destinations:
    """The broker destinations status messages may go to (the destinations file); none by
    default."""

    entries: tuple[Entry, ...] = ()
    source: str | None = None
    """Where the list was read from (None: none was given)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Destinations:
        """From the file `STEPWARDEN_DESTINATIONS` names; none when it is unset."""
        path = (os.environ if environ is None else environ).get(ENV)
        return cls.from_file(path) if path else cls()

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Destinations:
        """From the file at `path`. A file others than its owner may write is refused:
        whoever can write it can send status messages anywhere."""
        text = read_guarded(path, "the destinations file", OWNERS_TO_WRITE)
        return cls.parse(text, os.fspath(path))

    @classmethod
    def parse(cls, text: str, source: str = "the destinations file") -> Destinations:
        """The entries of a destinations file's text; ConfigurationError naming the line at
        fault."""
        entries: dict[str, Entry] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                entry = _entry(line.split())
                if entry.name in entries:
                    raise ConfigurationError(f"the entry {entry.name!r} is named twice")
            except ConfigurationError as exc:
                raise ConfigurationError(f"{source}, line {number}: {exc}") from None
            entries[entry.name] = entry
            if len(entries) > MAX_ENTRIES:
                raise ConfigurationError(f"{source}: more than {MAX_ENTRIES} entries")
        return cls(tuple(entries.values()), source)

    def names(self) -> frozenset[str]:
        """The entries' names."""
        return frozenset(e.name for e in self.entries)

    def find(self, dest: Destination, among: Collection[str] | None = None) -> Entry | None:
        """The first entry that allows `dest`, of those named `among` (None: of all)."""
        for entry in self.entries:
            if (among is None or entry.name in among) and entry.allows(dest):
                return entry
        return None

    def check(self, reply_to: str, among: Collection[str] | None = None) -> Destination:
        """The destination `reply_to` names, when an entry (of those named `among`; None:
        any) allows it; ConfigurationError, never showing a password, when none does."""
        dest = destination(reply_to)
        if self.find(dest, among) is not None:
            return dest
        shown = f"{dest.broker}/{dest.name}"
        if self.source is None:
            raise ConfigurationError(
                f"reply_to {shown!r}: no broker destination is allowed, for none is listed "
                f"(the destinations file: ${ENV}, --destinations FILE, App(destinations=...))"
            )
        if among is not None:
            raise ConfigurationError(
                f"reply_to {shown!r} is not a destination this client may name (its entries "
                f"of the destinations file: {', '.join(sorted(among)) or 'none'})"
            )
        raise ConfigurationError(
            f"reply_to {shown!r} is not listed in the destinations file {self.source}: "
            f"status messages go only to the {_WHAT[dest.scheme]}s it lists"
        )


def _entry(fields: list[str]) -> Entry:
    if len(fields) != 3:
        raise ConfigurationError(
            f"expected NAME BROKER NAMES (the names separated by commas), not {len(fields)} "
            "field(s)"
        )
    name, where, listed = fields
    if not ENTRY_NAME.fullmatch(name):
        raise ConfigurationError(
            f"an entry's name is 1 to 64 letters, digits, '_', '.', '@' or '-', not {name!r}"
        )
    at = broker(where)
    names = tuple(n for n in listed.split(",") if n)
    if not names:
        raise ConfigurationError("give the entry at least one name (or * for any)")
    for allowed in names:
        if ANY in allowed[:-1]:
            raise ConfigurationError(
                f"{allowed!r}: a name, or a start of names followed by '*' (only at the end)"
            )
    return Entry(name, at, names)
