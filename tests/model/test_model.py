"""The model test of the task and step state machines (see `machine.py`), on each store.

Each test runs `StoreModel` against a real store: SQLite on a new file for each example,
PostgreSQL on one database for the test, whose tables are emptied before each example. The
run is seeded: a random seed unless one is given, and a failure reports it together with
hypothesis's `@reproduce_failure` blob (`print_blob=True`) and the shrunk sequence of steps.

Environment variables, for reproducing a failure or for long runs by hand:

- STEPWARDEN_MODEL_SEED: the seed (an integer) instead of a random one;
- STEPWARDEN_MODEL_EXAMPLES: examples per store (default 40);
- STEPWARDEN_MODEL_STEPS: at most this many rules per example (default 40);
- STEPWARDEN_MODEL_REPRODUCE: "VERSION BLOB", the two arguments of a printed
  `@reproduce_failure('VERSION', b'BLOB')`, to replay that one example.

For instance::

    STEPWARDEN_MODEL_SEED=1234 .venv/bin/python -m pytest -q tests/model
    STEPWARDEN_MODEL_EXAMPLES=500 .venv/bin/python -m pytest -q tests/model
    STEPWARDEN_MODEL_REPRODUCE='6.170.15 AXicY2BgYAAAAAQAAQ==' \
        .venv/bin/python -m pytest -q tests/model -k sqlite

The same seed gives the same choices of rules and arguments; what the store does with a
deadline too close to call may still differ from one run to the next, which the model allows.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import ClassVar

import psycopg
from hypothesis import HealthCheck, reproduce_failure, seed, settings

from stepwarden.store import Store
from stepwarden.store import open_one as connect

from .machine import StoreModel

SEED = os.environ.get("STEPWARDEN_MODEL_SEED")
REPRODUCE = os.environ.get("STEPWARDEN_MODEL_REPRODUCE")
EXAMPLES = int(os.environ.get("STEPWARDEN_MODEL_EXAMPLES", "40"))
STEPS = int(os.environ.get("STEPWARDEN_MODEL_STEPS", "40"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    print_blob=True,
    database=None,  # the seed, not a replay of earlier failures, decides what runs
    suppress_health_check=[HealthCheck.too_slow],
)
TABLES = (
    "stepwarden_steps",
    "stepwarden_events",
    "stepwarden_outbox",
    "stepwarden_leases",
    "stepwarden_tasks",
)


class SQLiteModel(StoreModel):
    """SQLite, on a new database file for each example."""

    folder: ClassVar[Path]

    async def open_store(self) -> Store:
        self.path = Path(tempfile.mkdtemp(dir=self.folder))
        store = connect(f"sqlite:///{self.path / 'store.db'}")
        await store.open()
        return store

    def close_store(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class PostgresModel(StoreModel):
    """PostgreSQL, on the test's database, emptied before each example."""

    url: ClassVar[str]
    admin: ClassVar[psycopg.Connection[tuple[object, ...]]]

    async def open_store(self) -> Store:
        with self.admin.transaction():
            for table in TABLES:  # DELETE: a TRUNCATE costs ~30 ms, these few rows far less
                self.admin.execute(f"DELETE FROM {table}")
        store = connect(f"{self.url}{'&' if '?' in self.url else '?'}pool_size=2")
        await store.open(migrate=False)
        return store


def run(machine: type[StoreModel]) -> None:
    """Run the model as a test, seeded; a failure says how to run the same choices again."""
    chosen = int(SEED) if SEED else secrets.randbelow(2**32)
    seeded = seed(chosen)(machine)
    if REPRODUCE:
        version, blob = REPRODUCE.split()
        seeded = reproduce_failure(version, blob.encode())(seeded)
    seeded.TestCase.settings = SETTINGS
    try:
        seeded.TestCase().runTest()
    except BaseException as exc:
        exc.add_note(
            f"{machine.__name__}: reproduce with STEPWARDEN_MODEL_SEED={chosen} "
            f"STEPWARDEN_MODEL_EXAMPLES={EXAMPLES} STEPWARDEN_MODEL_STEPS={STEPS}, or with "
            "the @reproduce_failure blob above"
        )
        raise


def test_sqlite_model(tmp_path: Path) -> None:
    run(type("SQLiteModel", (SQLiteModel,), {"folder": tmp_path}))


def test_postgres_model(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as admin:
        # Commits need not wait for the disk: durability is not what this test checks, and
        # the test's database is dropped after it.
        dbname = admin.info.dbname
        admin.execute(f'ALTER DATABASE "{dbname}" SET synchronous_commit = off')
        run(type("PostgresModel", (PostgresModel,), {"url": pg_url, "admin": admin}))
