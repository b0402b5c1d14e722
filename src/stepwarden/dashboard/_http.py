"""The dashboard server's connections: how long a client may take to send a request, and how
many connections are served at once.

uvicorn reads a request for as long as its client takes: its keep-alive timeout starts only
after a response, so a connection that sends its headers (or its body) a byte at a time holds
a file descriptor for ever, and a few hundred of them stop the server from accepting any
other (EMFILE). A `Gate` keeps them in bounds, with uvicorn's h11 protocol (`Gate.protocol`)
and the listening socket (`Gate.listen`):

- a request's headers must arrive whole within `header_timeout` seconds of the connection
  (or of the end of the previous response on a kept-alive one);
- its body within `body_timeout` seconds of the end of its headers;
- past either, the connection is answered 408 (if the client had sent part of a request)
  and closed; an application still waiting for that body is told that its client went;
- at most `max_connections` are open at once. Past it, a new connection takes the place of
  the one that has been waiting longest for its request's headers (for MIN_WAIT seconds at
  least: a slow client, or an idle kept-alive one); when none has, it is answered 503 and
  closed as it is accepted, before it holds anything of the server. A request under way (a
  long poll, a stream) is never closed for another.

What each client of the application API may hold at once (its long polls and streams) is
counted where its token is known (the access guard), not here: a connection has no client
before its headers arrive.

The connections closed are counted, and said in one line a minute at most (REPORT_EVERY),
whatever their number.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("stepwarden.dashboard")

DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_MAX_CONNECTIONS = 4096
RESERVED_FILES = 64
"""File descriptors kept for other uses than connections (the store's, the logs, the
listening socket...): the cap is never above the open-file limit less these."""
MIN_WAIT = 1.0
"""Seconds a connection must have waited for its request's headers before a new one may take
its place at the cap (a burst of new clients is answered 503 rather than closing each
other)."""
REPORT_EVERY = 60.0


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a client may take to send a request's headers and its body (seconds), and
    how many connections are open at once."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if not (self.header_timeout > 0 and self.body_timeout > 0 and self.max_connections > 0):
            raise ValueError(f"every limit must be positive: {self}")


def connection_room(wanted: int) -> tuple[int, int]:
    """How many connections this process may hold at once, up to `wanted`, and its open-file
    limit: the soft limit is raised toward the hard one when it is short (as far as the
    system lets it), and the files open now and RESERVED_FILES more are left for the rest."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    other = _open_files() + RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted + other:
        raised = wanted + other if hard == resource.RLIM_INFINITY else min(wanted + other, hard)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY:
        return wanted, soft
    return max(1, min(wanted, soft - other)), soft


def _open_files() -> int:
    for listing in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return len(os.listdir(listing))
    return 0


@dataclass
class _Tally:
    """The connections closed since the last report, said in one line a minute at most (the
    first refusal after a quiet minute at once: a cap reached is news)."""

    max_connections: int
    refused: int = 0
    replaced: int = 0
    late: int = 0
    last: float = float("-inf")
    """When the last report was made (the event loop's clock)."""
    scheduled: asyncio.TimerHandle | None = field(default=None, repr=False)

    def count(self, kind: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if self.scheduled is None:
            loop = asyncio.get_running_loop()
            quiet = loop.time() - self.last >= REPORT_EVERY
            delay = 0.0 if quiet and kind != "late" else REPORT_EVERY
            self.scheduled = loop.call_later(delay, self.report)

    def report(self) -> None:
        self.scheduled = None
        self.last = asyncio.get_running_loop().time()
        said = []
        if self.refused:
            said.append(f"{self.refused} refused (503) past the cap of {self.max_connections}")
        if self.replaced:
            said.append(f"{self.replaced} waiting for their request closed to make room")
        if self.late:
            said.append(f"{self.late} closed for sending their request too slowly (408)")
        if said:  # a slow client alone is no alarm; a cap reached is
            level = logging.WARNING if self.refused or self.replaced else logging.INFO
            logger.log(level, "connections: %s", "; ".join(said))
        self.refused = self.replaced = self.late = 0


def _raw(status: bytes, message: bytes) -> bytes:
    """A whole answer, written without h11 (none was begun on the connection)."""
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"connection: close\r\ncontent-length: "
        + str(len(message)).encode()
        + b"\r\n\r\n"
        + message
    )


TOO_SLOW = _raw(b"408 Request Timeout", b"the request was not sent in time")
TOO_MANY = _raw(b"503 Service Unavailable", b"too many connections: try again")
MAX_REPLACING = 16
"""Connections closed to make room whose close has not yet completed, at most: each holds its
file descriptor until then."""


class Gate:
    """The connections of one server: how many it holds (from their accept to the end of
    their close), which of them wait for a request's headers, and the limits."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.held = 0
        self.live: set[_Guarded] = set()
        self.replacing = 0
        self.tally = _Tally(limits.max_connections)

    def protocol(self) -> type[H11Protocol]:
        """The protocol class of the server (uvicorn's `http=`)."""
        return type("GuardedH11Protocol", (_Guarded,), {"gate": self})

    def listen(self, sock: socket.socket) -> socket.socket:
        """A listening socket on the same one as `sock` (a duplicate, for the server to close
        when it stops), that admits connections through this gate."""
        gated = _GatedSocket(sock.family, sock.type, sock.proto, fileno=os.dup(sock.fileno()))
        gated.gate = self
        return gated

    def admit(self) -> bool:
        """Whether a connection just accepted may be served (it then counts as held)."""
        if self.held < self.limits.max_connections or self._make_room():
            self.held += 1
            return True
        self.tally.count("refused")
        return False

    def _make_room(self) -> bool:
        """Close the connection waiting longest for its request's headers, if one has waited
        MIN_WAIT seconds; whether one was."""
        if self.replacing >= MAX_REPLACING:
            return False
        oldest: _Guarded | None = None
        since = time.monotonic() - MIN_WAIT
        for other in self.live:
            if other.waiting_since is not None and other.waiting_since <= since:
                oldest, since = other, other.waiting_since
        if oldest is None:
            return False
        self.live.discard(oldest)
        oldest.replaced = True
        self.replacing += 1
        oldest.close(TOO_SLOW if oldest.heard else b"")
        self.tally.count("replaced")
        return True

    def gone(self, connection: _Guarded) -> None:
        """`connection` is closed: its file descriptor is free."""
        self.held -= 1
        self.live.discard(connection)
        if connection.replaced:
            self.replacing -= 1


class _GatedSocket(socket.socket):
    """A listening socket whose connections are admitted by its gate: one refused is
    answered 503 and closed as it is accepted."""

    gate: Gate

    def accept(self) -> tuple[socket.socket, Any]:
        while True:  # until one is admitted, or none is waiting (BlockingIOError)
            conn, address = super().accept()
            if self.gate.admit():
                return conn, address
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.send(TOO_MANY)
                conn.recv(65536)  # what the client sent already, read: closed, it is no reset
            conn.close()


class _Guarded(H11Protocol):
    """uvicorn's h11 protocol, with the read deadlines of its gate's limits; each connection
    counted by the gate from its accept (by the gate's socket) to its close."""

    gate: ClassVar[Gate]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting_since: float | None = None
        """Since when (monotonic) the connection waits for a request's headers; None while a
        request is under way."""
        self.heard = False
        """Whether part of the awaited request has arrived."""
        self.deadline: asyncio.TimerHandle | None = None
        self.reading_body = False
        self.replaced = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.gate.live.add(self)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        self.gate.gone(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.waiting_since is not None:
            self.heard = True
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        self._watch()

    def _watch(self) -> None:
        """Set the deadline that the request's state calls for: its headers', its body's, or
        none while the application has the request whole."""
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if self.waiting_since is None:
                self._stop()
                self.waiting_since = time.monotonic()
                self.heard = bool(self.conn.trailing_data[0])
                timeout = self.gate.limits.header_timeout
                self.deadline = self.loop.call_later(timeout, self._late)
        elif state is h11.SEND_BODY:
            if not self.reading_body:
                self._stop()
                self.reading_body = True
                timeout = self.gate.limits.body_timeout
                self.deadline = self.loop.call_later(timeout, self._late)
        else:
            self._stop()

    def _stop(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        self.waiting_since = None
        self.reading_body = False

    def _late(self) -> None:
        """The request's headers or its body did not arrive in time."""
        self.deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self.reading_body and cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the application waiting for the body: its client went
            cycle.message_event.set()
        answered = self.reading_body and cycle is not None and cycle.response_started
        self.close(b"" if answered or not (self.heard or self.reading_body) else TOO_SLOW)
        self.gate.tally.count("late")

    def close(self, answer: bytes) -> None:
        """Close the connection, with `answer` first (none when empty)."""
        self._stop()
        if self.transport.is_closing():
            return
        if answer:
            self.transport.write(answer)
        self.transport.close()
