"""A PgBouncer of the test's own (Debian's package, installed by `make test`) in front of the
shared PostgreSQL server, in transaction mode: each transaction gets whichever server
session is free, as in production behind a pooler."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def pgbouncer(server_url: str, *, pool_size: int = 10) -> Iterator[int]:
    """PgBouncer in transaction mode forwarding every database to the server of
    `server_url`; yields its port. It runs as the `postgres` user (it refuses root)."""
    server = urlsplit(server_url)
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="sw-pgbouncer-"))
    ini = workdir / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = host={server.hostname} port={server.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir / 'users.txt'}\n"
        f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n"
        f"logfile = {workdir / 'pgbouncer.log'}\npidfile = {workdir / 'pgbouncer.pid'}\n"
    )
    (workdir / "users.txt").write_text(f'"{server.username or "postgres"}" ""\n')
    shutil.chown(workdir, "postgres")
    for f in workdir.iterdir():
        shutil.chown(f, "postgres")
    # Its log (stderr too: a pipe nobody read would fill and stop it) goes to a file.
    stderr = (workdir / "stderr.log").open("wb")
    proc = subprocess.Popen([BINARY, "-q", "-u", "postgres", str(ini)], stderr=stderr)
    try:
        url = f"postgresql://{server.username or 'postgres'}@127.0.0.1:{port}{server.path}"
        for _ in range(200):
            if proc.poll() is not None:
                said = (workdir / "stderr.log").read_text(errors="replace")
                raise RuntimeError(f"pgbouncer stopped: {said!r}")
            with (
                contextlib.suppress(psycopg.Error),
                psycopg.connect(url, autocommit=True, connect_timeout=1),
            ):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("pgbouncer did not start")
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stderr.close()
        shutil.rmtree(workdir, ignore_errors=True)
