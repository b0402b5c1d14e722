"""The PostgreSQL server's warnings to stepwarden's connections fail the test that caused them.

A warning is the server telling a client that what it sent was wrong but carried on (a BEGIN
inside a transaction, a COMMIT outside one): the assertions of a test may all pass while a
transaction's boundary is broken. Two nets catch them:

- in the test's own process, the store logs each warning its connections receive
  (`stepwarden.store.postgres`, with `server_severity` as data): `StoreWarnings` collects them;
- for worker processes, the server's log is read for the lines of the test's own database
  (`user@database` in the shared server's `log_line_prefix`), or, on a cluster of the test's
  own, for the lines of a stepwarden application (its `log_line_prefix` names it).

The server's log is found by `pg_current_logfile()` (logging collector on), else by Debian's
`pg_lsclusters` for the server's port on this machine; STEPWARDEN_TEST_POSTGRES_LOG names it
otherwise (or `off`, for a server whose log this machine cannot read: then only the first net
holds).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg

from stepwarden.store.postgres import SERVER_WARNINGS

STORE_LOGGER = "stepwarden.store.postgres"
LOG_ENV = "STEPWARDEN_TEST_POSTGRES_LOG"
LOGGED = ("debug5", "debug4", "debug3", "debug2", "debug1", "info", "notice", "warning")
"""Values of log_min_messages under which the server logs its warnings."""
OWN_PREFIX = "%m [%p] app=%a %q%u@%d "
"""The log_line_prefix of a test's own cluster: the application of each line."""


class StoreWarnings(logging.Handler):
    """The server warnings that the stores of this process received."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if (
            getattr(record, "server_severity", None) in SERVER_WARNINGS
            and record.levelno >= logging.WARNING
        ):
            self.found.append(record.getMessage())

    def __enter__(self) -> StoreWarnings:
        logging.getLogger(STORE_LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(STORE_LOGGER).removeHandler(self)


@dataclass
class ServerLog:
    """A server's log file, read from an offset on."""

    path: Path

    def end(self) -> int:
        return self.path.stat().st_size

    def warnings(self, since: int, pattern: re.Pattern[str]) -> list[str]:
        """The WARNING lines written since `since` whose prefix matches `pattern`."""
        with self.path.open("rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
        return [
            line
            for line in text.splitlines()
            if " WARNING:  " in line and pattern.search(line.split(" WARNING:  ", 1)[0])
        ]

    def database_warnings(self, since: int, database: str) -> list[str]:
        return self.warnings(since, re.compile(rf"@{re.escape(database)}$"))

    def stepwarden_warnings(self, since: int) -> list[str]:
        """On a cluster of a test's own: the lines of every stepwarden application."""
        return self.warnings(since, re.compile(r" app=stepwarden\S* "))


def find_server_log(admin: psycopg.Connection[tuple[object, ...]]) -> ServerLog | None:
    """The log of the server `admin` is connected to; None when STEPWARDEN_TEST_POSTGRES_LOG
    is `off`. Raises RuntimeError, saying what to set, when it cannot be found or read, or
    when the server does not log its warnings."""
    named = os.environ.get(LOG_ENV, "")
    if named == "off":
        return None
    level = str(_one(admin, "SHOW log_min_messages"))
    if level not in LOGGED:
        raise RuntimeError(
            f"the PostgreSQL server logs no warnings (log_min_messages = {level}): the tests "
            f"cannot see them; set it to warning, or {LOG_ENV}=off"
        )
    prefix = str(_one(admin, "SHOW log_line_prefix"))
    if "%d" not in prefix:
        raise RuntimeError(
            f"the PostgreSQL server's log_line_prefix ({prefix!r}) does not name the database "
            f"of each line: the tests cannot tell their warnings; add %d, or {LOG_ENV}=off"
        )
    path = Path(named) if named else _located(admin)
    if path is None or not os.access(path, os.R_OK):
        raise RuntimeError(
            f"cannot read the PostgreSQL server's log ({path or 'not found'}): set {LOG_ENV} "
            "to its path, or to off to rely on the store's own report of warnings alone"
        )
    return ServerLog(path)


def _one(admin: psycopg.Connection[tuple[object, ...]], query: str) -> object:
    row = admin.execute(query).fetchone()
    return None if row is None else row[0]


def _located(admin: psycopg.Connection[tuple[object, ...]]) -> Path | None:
    current = _one(admin, "SELECT pg_current_logfile()")
    if current:
        path = Path(str(current))
        return path if path.is_absolute() else Path(str(_one(admin, "SHOW data_directory"))) / path
    port = int(str(_one(admin, "SHOW port")))
    data = str(_one(admin, "SHOW data_directory"))
    try:
        listed = subprocess.run(["pg_lsclusters", "--json"], capture_output=True, check=True,
                                text=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    for cluster in json.loads(listed):
        if int(cluster.get("port", 0)) == port and cluster.get("pgdata") == data:
            logfile = cluster.get("logfile")
            return Path(logfile) if logfile else None
    return None
