"""A PostgreSQL server of the test's own, on another port, that the test may stop and start
(the shared server on 5432 is never restarted): a cluster made with pg_createcluster, trust
authentication on 127.0.0.1, dropped afterwards. Its log names the application of each line:
a WARNING to a stepwarden connection fails the test (`tests/server_warnings.py`)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
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
def own_postgres(
    *, warnings_fail: bool = True, listen_on: str | None = None, trust: str | None = None
) -> Iterator[OwnPostgres]:
    """A new cluster, dropped afterwards; a WARNING it sent to a stepwarden connection
    meanwhile fails the caller (unless the caller provokes them: `warnings_fail=False`).
    `listen_on`: an address it listens on besides localhost; `trust`: clients' addresses
    (as pg_hba.conf names them) it trusts besides the loopback's."""
    name = f"sw{uuid.uuid4().hex[:8]}"
    port = _free_port()
    listen = () if listen_on is None else ("-o", f"listen_addresses=localhost,{listen_on}")
    subprocess.run(
        ["pg_createcluster", VERSION, name, "-p", str(port),
         "-o", f"log_line_prefix={OWN_PREFIX}", *listen,
         "--", "--auth-host=trust", "--auth-local=trust"],
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip
    server = OwnPostgres(name, port)
    try:
        if trust is not None:
            with Path(f"/etc/postgresql/{VERSION}/{name}/pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {trust} trust\n")
        server.start()
        yield server
        warned = server.log().stepwarden_warnings(0) if warnings_fail else []
    finally:
        subprocess.run(["pg_dropcluster", VERSION, name, "--stop"], capture_output=True,
                       timeout=120)  # fmt: skip
    if warned:
        raise AssertionError(
            f"the PostgreSQL server {name} warned a stepwarden connection:\n" + "\n".join(warned)
        )


@dataclass
class OwnPair:
    """A primary and its streaming standby, each a cluster of the test's own."""

    primary: OwnPostgres
    standby: OwnPostgres

    @property
    def url(self) -> str:
        """Both servers in one libpq URL: whichever is the primary is found."""
        p, s = self.primary.port, self.standby.port
        return f"postgresql://postgres@127.0.0.1:{p},127.0.0.1:{s}/postgres"

    def synchronous(self) -> None:
        """Commit on the primary only once the standby has it (synchronous_standby_names),
        then wait until the standby is streaming as a synchronous one."""
        with psycopg.connect(self.primary.url, autocommit=True) as db:
            db.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            db.execute("SELECT pg_reload_conf()")
            for _ in range(600):
                row = db.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
                if row and row[0] == "sync":
                    return
                time.sleep(0.05)
        raise AssertionError("the standby did not become synchronous")

    def crash_primary(self) -> None:
        """The primary dies at once (immediate shutdown: no checkpoint, sessions cut)."""
        _ctl(VERSION, self.primary.name, "stop", "-m", "immediate")

    def promote(self) -> None:
        """The standby takes over: promoted, accepting writes when this returns."""
        _ctl(VERSION, self.standby.name, "promote")
        for _ in range(600):
            with contextlib.suppress(psycopg.Error), psycopg.connect(self.standby.url) as db:
                if not db.execute("SELECT pg_is_in_recovery()").fetchone()[0]:  # type: ignore[index]
                    return
            time.sleep(0.05)
        raise AssertionError("the standby was not promoted")

    def restart_old_primary_read_only(self) -> None:
        """The old primary comes back, read-only (as a demoted server does until it is made a
        standby of the new one)."""
        conf = Path(f"/etc/postgresql/{VERSION}/{self.primary.name}/conf.d/read_only.conf")
        conf.write_text("default_transaction_read_only = on\n")
        self.primary.start()


@contextlib.contextmanager
def own_pair() -> Iterator[OwnPair]:
    """A primary (`own_postgres`) and a standby cloned from it with pg_basebackup, streaming
    (asynchronous until `synchronous()`); both dropped afterwards."""
    with own_postgres() as primary:
        name = f"sw{uuid.uuid4().hex[:8]}"
        port = _free_port()
        subprocess.run(
            ["pg_createcluster", VERSION, name, "-p", str(port),
             "-o", f"log_line_prefix={OWN_PREFIX}",
             "--", "--auth-host=trust", "--auth-local=trust"],
            check=True, capture_output=True, timeout=180,
        )  # fmt: skip
        standby = OwnPostgres(name, port)
        try:
            data = Path(f"/var/lib/postgresql/{VERSION}/{name}")
            for entry in data.iterdir():  # emptied, kept: the server's user owns it
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            subprocess.run(
                ["runuser", "-u", "postgres", "--",
                 f"/usr/lib/postgresql/{VERSION}/bin/pg_basebackup",
                 "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                 "-D", str(data), "-R", "-X", "stream", "--checkpoint=fast"],
                check=True, capture_output=True, timeout=180,
            )  # fmt: skip
            standby.start()
            yield OwnPair(primary, standby)
            warned = standby.log().stepwarden_warnings(0)
        finally:
            subprocess.run(["pg_dropcluster", VERSION, name, "--stop"], capture_output=True,
                           timeout=120)  # fmt: skip
        if warned:
            raise AssertionError(
                f"the PostgreSQL server {name} warned a stepwarden connection:\n"
                + "\n".join(warned)
            )
