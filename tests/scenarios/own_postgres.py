"""A PostgreSQL server of the test's own, on another port, that the test may stop and start
(the shared server on 5432 is never restarted): a cluster made with pg_createcluster, trust
authentication on 127.0.0.1, dropped afterwards. Its log names the application of each line:
a WARNING to a stepwarden connection fails the test (`tests/server_warnings.py`)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from ..server_warnings import OWN_PREFIX, ServerLog

VERSION = "15"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ctl(*args: str) -> None:
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", *args], check=True,
                   capture_output=True, timeout=120)  # fmt: skip


@dataclass
class OwnPostgres:
    name: str
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        """Stop the server at once (fast shutdown: sessions are ended, as in a crash of the
        network or a failover)."""
        _ctl(VERSION, self.name, "stop", "-m", "fast")

    def start(self) -> None:
        _ctl(VERSION, self.name, "start")

    def log(self) -> ServerLog:
        return ServerLog(Path(f"/var/log/postgresql/postgresql-{VERSION}-{self.name}.log"))

    def accepts(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2):
                return True
        except psycopg.Error:
            return False


@contextlib.contextmanager
def own_postgres(*, warnings_fail: bool = True) -> Iterator[OwnPostgres]:
    """A new cluster, dropped afterwards; a WARNING it sent to a stepwarden connection
    meanwhile fails the caller (unless the caller provokes them: `warnings_fail=False`)."""
    name = f"sw{uuid.uuid4().hex[:8]}"
    port = _free_port()
    subprocess.run(
        ["pg_createcluster", VERSION, name, "-p", str(port), "--start",
         "-o", f"log_line_prefix={OWN_PREFIX}",
         "--", "--auth-host=trust", "--auth-local=trust"],
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip
    server = OwnPostgres(name, port)
    try:
        yield server
        warned = server.log().stepwarden_warnings(0) if warnings_fail else []
    finally:
        subprocess.run(["pg_dropcluster", VERSION, name, "--stop"], capture_output=True,
                       timeout=120)  # fmt: skip
    if warned:
        raise AssertionError(
            f"the PostgreSQL server {name} warned a stepwarden connection:\n" + "\n".join(warned)
        )
