"""The dashboard's connections under attack, against a real `stepwarden dashboard` process:
300 connections that send their headers, or their sign-in body, a byte short, under an
open-file limit of 300, keep out neither a right request nor the process's own files; a
request sent too slowly is answered 408 and closed, and an application waiting for its body
is told that its client went, without a traceback; past the cap a connection is answered
503, or takes the place of one that has been waiting for its request's headers."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import select
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import stepwarden as sw
from stepwarden import cli
from stepwarden import dashboard as web
from tests.cli.helpers import REPO, STEPWARDEN, process_env
from tests.conftest import STORES

from .conftest import TOKEN

OPEN_FILES = 300
WITHIN = 30.0
"""Seconds any awaited outcome may take, however loaded the machine (each comes well before)."""
HALF_HEADERS = b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
HALF_SIGN_IN = (
    b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken=abc"
)
RIGHT = (
    f"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
    "Connection: close\r\n\r\n"
).encode()


@dataclass
class Dashboard:
    proc: subprocess.Popen[str]
    port: int
    said: list[str]
    """The lines it printed before serving."""
    stderr: Path

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=WITHIN)

    def log(self) -> str:
        return self.stderr.read_text()


@contextlib.contextmanager
def dashboard(
    store_url: str, tmp_path: Path, *args: str, open_files: int | None = None, lines: int = 1
) -> Iterator[Dashboard]:
    """`stepwarden dashboard` on a free port, its open-file limit lowered to `open_files`;
    `lines`: the lines it prints before it serves."""

    def limit() -> None:
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    stderr = tmp_path / "dashboard.stderr"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [STEPWARDEN, "--store", store_url, "dashboard", "--port", "0", *args],
            cwd=REPO,
            env=process_env({"STEPWARDEN_DASHBOARD_TOKEN": TOKEN}),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            preexec_fn=limit,
        )
    try:
        assert proc.stdout is not None
        said = [proc.stdout.readline().strip() for _ in range(lines)]
        assert "stepwarden dashboard of" in said[0], (said, stderr.read_text())
        port = int(said[0].rstrip("/").rsplit(":", 1)[-1])
        served = Dashboard(proc, port, said, stderr)
        until("the dashboard to answer", lambda: answer(served) == b"HTTP/1.1 200")
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def until(what: str, check: Callable[[], object], timeout: float = WITHIN) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def answer(served: Dashboard, request: bytes = RIGHT) -> bytes:
    """The status line a new connection's request is answered with (b"" if none)."""
    try:
        with served.connect() as conn:
            conn.sendall(request)
            return read_all(conn)[:12]
    except OSError:
        return b""


def read_all(conn: socket.socket) -> bytes:
    """What the server sends until it closes the connection (a reset ends it too)."""
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := conn.recv(65536):
            got += chunk
    return got


class Watched:
    """Connections to the server, closed when the block ends, and what the server sent on
    each: `ended()` tells those it has closed."""

    def __init__(self, served: Dashboard) -> None:
        self.served = served
        self.conns: list[socket.socket] = []
        self.got: dict[socket.socket, bytes] = {}
        self.done: set[socket.socket] = set()

    def __enter__(self) -> Watched:
        return self

    def __exit__(self, *exc: object) -> None:
        for conn in self.conns:
            conn.close()

    def open(self, sending: bytes) -> socket.socket:
        conn = self.served.connect()
        self.conns.append(conn)
        self.got[conn] = b""
        conn.setblocking(False)
        if sending:
            conn.sendall(sending)
        return conn

    def ended(self, conns: list[socket.socket] | None = None) -> dict[socket.socket, bytes]:
        """Of `conns` (every one), those the server has closed, each with the first bytes of
        what it sent; waits for none."""
        poll = select.poll()
        by_fd = {c.fileno(): c for c in self.conns if c not in self.done and c.fileno() >= 0}
        for fd in by_fd:
            poll.register(fd, select.POLLIN)
        for fd, _ in poll.poll(0):
            conn = by_fd[fd]
            try:
                while chunk := conn.recv(65536):
                    self.got[conn] += chunk
                self.done.add(conn)
            except BlockingIOError:
                pass  # what came so far is kept: the connection is still open
            except ConnectionResetError:
                self.done.add(conn)
        return {c: self.got[c][:12] for c in conns or self.conns if c in self.done}


@pytest.fixture(params=STORES)
def migrated(request: pytest.FixtureRequest) -> str:
    url = str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))

    async def migrate() -> None:
        app = sw.App("migrate", store=url)
        await app.store()
        await app.aclose()

    asyncio.run(migrate())
    return url


def test_slow_connections_keep_out_neither_a_right_request_nor_the_store(
    migrated: str, tmp_path: Path
) -> None:
    """300 connections that each send all but the end of their headers, or of a sign-in's
    body, and wait, under an open-file limit of 300: the dashboard holds no more of them than
    its cap (within that limit, the store's files left aside), answers the others 503 at
    once, and serves a right request all the while; it never runs out of files."""
    with dashboard(
        migrated, tmp_path, "--header-timeout", "600", "--body-timeout", "600",
        open_files=OPEN_FILES, lines=2,
    ) as served:  # fmt: skip
        cap = int(served.said[1].split()[2])  # "at most N connections at once ..."
        assert 0 < cap <= OPEN_FILES - 64, served.said
        with Watched(served) as slow:
            for n in range(300):
                slow.open(HALF_HEADERS if n % 2 else HALF_SIGN_IN)
            # A right request: served as soon as a slow connection has waited long enough to
            # give its place (at once when there is room), however many keep waiting.
            until("a right request to be served", lambda: answer(served) == b"HTTP/1.1 200")
            assert answer(served) == b"HTTP/1.1 200"
            ended = slow.ended()
            assert set(ended.values()) <= {b"HTTP/1.1 503", b"HTTP/1.1 408"}, ended.values()
            still_open = 300 - len(ended)  # a few gave their place to the right requests
            assert cap // 2 < still_open <= cap, (cap, still_open, len(ended))
            # What the server does with its store needs files too: it reads the store.
            with served.connect() as conn:
                conn.sendall(RIGHT.replace(b"/api/overview", b"/api/tasks"))
                assert read_all(conn).startswith(b"HTTP/1.1 200")
        until("the dashboard to serve as before", lambda: answer(served) == b"HTTP/1.1 200")
    log = served.log()
    assert "Too many open files" not in log and "Traceback" not in log, log[:3000]
    assert "past the cap of" in log and len(log.splitlines()) <= 3, log  # a line a minute


def test_a_request_sent_too_slowly_is_answered_408_and_closed(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Half-sent headers, a half-sent sign-in body and a half-sent API body, past their
    deadlines: answered 408 and closed; a connection that sent nothing, closed without an
    answer; a client that goes in the middle of its body is no traceback either, and the
    log has no line for any of them but one that counts them."""
    migrate = sw.App("migrate", store=sqlite_url)
    asyncio.run(migrate.store())
    asyncio.run(migrate.aclose())
    half_api = (
        b"POST /api/actions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + TOKEN.encode() + b'\r\nContent-Length: 100\r\n\r\n{"act'
    )
    timeouts = ("--header-timeout", "1", "--body-timeout", "1")
    with dashboard(sqlite_url, tmp_path, *timeouts) as served, Watched(served) as slow:
        sent = {
            request: [slow.open(request) for _ in range(20)]
            for request in (HALF_HEADERS, HALF_SIGN_IN, half_api, b"")
        }
        for _ in range(20):  # clients that go in the middle of their body
            with served.connect() as conn:
                conn.sendall(HALF_SIGN_IN)
        until("the slow connections to be closed", lambda: len(slow.ended()) == 80)
        for request, conns in sent.items():
            expected = b"" if request == b"" else b"HTTP/1.1 408"
            assert set(slow.ended(conns).values()) == {expected}, request
        assert answer(served) == b"HTTP/1.1 200"
    log = served.log()
    assert "Traceback" not in log and "ClientDisconnect" not in log, log[:3000]
    assert len(log.splitlines()) <= 1, log  # the count, said a minute later at most


def test_past_the_cap_a_connection_is_answered_503_or_takes_a_waiting_ones_place(
    sqlite_url: str, tmp_path: Path
) -> None:
    """--max-connections 4: with four requests under way (bodies still arriving), a fifth
    connection is answered 503 and closed; with three, and one connection that sent nothing,
    a new one is served once that one has waited a second, and that one is closed."""
    migrate = sw.App("migrate", store=sqlite_url)
    asyncio.run(migrate.store())
    asyncio.run(migrate.aclose())
    with (
        dashboard(
            sqlite_url, tmp_path, "--max-connections", "4", "--body-timeout", "600"
        ) as served,
        Watched(served) as held,
    ):
        under_way = [held.open(HALF_SIGN_IN) for _ in range(4)]
        for _ in range(3):
            with served.connect() as refused:
                assert read_all(refused).startswith(b"HTTP/1.1 503"), "not refused"
        under_way.pop().close()
        until("the room of the closed one", lambda: answer(served) == b"HTTP/1.1 200")
        idle = held.open(b"")  # takes the fourth place, and sends nothing
        until("a new connection to take the idle one's place",
              lambda: answer(served) == b"HTTP/1.1 200")  # fmt: skip
        until("the idle one to be closed", lambda: idle in held.ended([idle]))
        assert held.ended([idle]) == {idle: b""}  # without an answer: it asked nothing
        assert held.ended(under_way) == {}  # the requests under way are still open
    assert "past the cap of 4" in served.log()


def test_the_command_line_s_defaults_are_the_server_s() -> None:
    defaults = {p.name: p.default for p in cli.dashboard.params}
    assert defaults["header_timeout"] == web.DEFAULT_HEADER_TIMEOUT
    assert defaults["body_timeout"] == web.DEFAULT_BODY_TIMEOUT
    assert defaults["max_connections"] == web.DEFAULT_MAX_CONNECTIONS
    assert defaults["forwarded_allow_ips"] == ""
