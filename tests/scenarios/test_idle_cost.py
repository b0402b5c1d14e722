"""What an idle worker costs the database: a real `stepwarden worker` (every role, the
engine's defaults) on a database of the test's own, with no work to do, counted by
PostgreSQL itself (`pg_stat_database`: xact_commit + xact_rollback of that database, read
from another database once every session of the worker has ended, when the server has
counted all of its transactions). The bound is wide, for a busy machine: an idle worker
that leads the supervisors aims at 5 transactions a second at most, and pays a few dozen
more to start and stop; the figures themselves are measured by `make bench`."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import psycopg

from tests.conftest import PG_URL

from .harness import Cluster

DEFAULTS = (
    "--poll-interval", "0.5",
    "--supervisor-interval", "1",
    "--lease-ttl", "5",
    "--backoff-initial", "0.5",
    "--backoff-max", "30",
)  # fmt: skip
"""The engine's defaults, in place of the scenarios' short intervals."""
WINDOW = 10.0
"""Seconds the worker is left idle."""
START_AND_STOP = 60
"""Transactions allowed for starting (the migrations checked, the registry joined, the
schedules stored) and stopping (the registry left, the lease given back)."""
PER_SECOND = 5
"""Transactions a second allowed while idle: the leader's goal (one that is not the leader
aims at one at most)."""


def _transactions(dbname: str) -> int:
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        [(count,)] = admin.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            [dbname],
        ).fetchall()
        return int(count)


def _sessions(dbname: str) -> int:
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        [(count,)] = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [dbname]
        ).fetchall()
        return int(count)


def test_an_idle_worker_costs_few_transactions(pg_cluster: Cluster) -> None:
    dbname = urlsplit(pg_cluster.store_url).path.lstrip("/")
    pg_cluster.wait_until(lambda: _sessions(dbname) == 0 or None, "no session on the database")
    before = _transactions(dbname)
    began = time.monotonic()
    worker = pg_cluster.start("idle", *DEFAULTS)
    # The window is what is measured: a length of time, not a condition awaited.
    time.sleep(WINDOW)
    pg_cluster.terminate(worker)
    worker.popen.wait(timeout=60)
    lived = time.monotonic() - began
    pg_cluster.wait_until(
        lambda: _sessions(dbname) == 0 or None, "the worker's sessions to end", timeout=30
    )
    spent = _transactions(dbname) - before
    bound = START_AND_STOP + PER_SECOND * lived
    assert spent <= bound, (
        f"an idle worker made {spent} transactions in {lived:.1f} s (bound {bound:.0f})\n"
        + pg_cluster.logs()
    )
