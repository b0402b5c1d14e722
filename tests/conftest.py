"""Fixtures shared by every test: the stores under test, on SQLite and on a real PostgreSQL.

PostgreSQL is not optional: when STEPWARDEN_TEST_POSTGRES_URL (default: the local server)
cannot be reached, the run stops with an error instead of skipping half of the suite. Each
test gets its own database, cloned from a template migrated once per run.

A WARNING the server sends to a stepwarden connection fails the test that caused it
(`server_warnings.py`): received by a store of the test's process, or written to the server's
log for the test's database by any process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from stepwarden.store import Store, open_one

from .server_warnings import ServerLog, StoreWarnings, find_server_log

pytest_plugins = ["pytester"]

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
PG_URL = os.environ.get("STEPWARDEN_TEST_POSTGRES_URL", DEFAULT_PG)
STORES = ["sqlite", "postgres"]


def _with_db(url: str, dbname: str) -> str:
    base, _, query = url.partition("?")
    base = base.rsplit("/", 1)[0] + "/" + dbname
    return f"{base}?{query}" if query else base


def unique(prefix: str) -> str:
    """A database name of this run's own."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@functools.cache
def server_log() -> ServerLog | None:
    """The log of the server the tests use (None when its scan is turned off)."""
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin:
        return find_server_log(admin)


@contextlib.contextmanager
def pg_database(name: str, template: str | None = None) -> Iterator[str]:
    """A new database `name` (cloned from `template`, or empty) and its URL, dropped
    afterwards; if the server logged a WARNING to a connection of it meanwhile, the caller
    fails."""
    log = server_log()
    since = log.end() if log else 0
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        like = f' TEMPLATE "{template}"' if template else ""
        admin.execute(f'CREATE DATABASE "{name}"{like}')
    try:
        yield _with_db(PG_URL, name)
        warned = log.database_warnings(since, name) if log else []
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if warned:
        pytest.fail(f"the PostgreSQL server warned a connection to {name}:\n" + "\n".join(warned))


@pytest.fixture(autouse=True)
def _no_store_warnings() -> Iterator[None]:
    """A warning the server sent to a store of this process fails the test."""
    with StoreWarnings() as seen:
        yield
    if seen.found:
        pytest.fail("the PostgreSQL server warned a store of this test:\n" + "\n".join(seen.found))


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated template database for this run; fails the run if PostgreSQL is down, or if
    its warnings cannot be read (`server_warnings.py`)."""
    try:
        server_log()
    except psycopg.Error as exc:
        pytest.exit(f"PostgreSQL at {PG_URL} is unreachable: {exc}", returncode=3)
    except RuntimeError as exc:
        pytest.exit(str(exc), returncode=3)

    import asyncio

    name = unique("sw_tpl")
    with pg_database(name) as url:

        async def migrate() -> None:
            store = open_one(url)
            await store.open(migrate=True)
            await store.close()

        asyncio.run(migrate())
        yield name


@pytest.fixture
def pg_url(pg_template: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test, named after it (so that the
    server's log says which test each line is about)."""
    test = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40]
    with pg_database(unique(f"sw_t_{test}"), pg_template) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest) -> str:
    """The URL of an empty store, once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture(params=STORES)
def empty_store_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A store with no schema at all: a new SQLite file, or a new PostgreSQL database not
    cloned from the migrated template."""
    if request.param == "sqlite":
        yield str(request.getfixturevalue("sqlite_url"))
        return
    with pg_database(unique("sw_empty")) as url:
        yield url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = open_one(store_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


# Modules whose tests are spread one by one over the suite's processes by `make test`
# (`--dist loadscope`, with the scope below): their tests rely on no order of one another
# (`make check` runs them in a random one). Every other module runs in one process, its
# tests in their order, and so does a module here that starts a server of its own for its
# tests.
_SPREAD = ("tests/unit/", "tests/contract/")
_KEPT_TOGETHER = ("tests/contract/test_server_warnings.py",)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `--dist loadscope`: a test of a module of _SPREAD is a scope of its own, any
    other test is of its module's."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class ModuleOrTest(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module.startswith(_SPREAD) and module not in _KEPT_TOGETHER:
                return nodeid
            return module

    return ModuleOrTest(config, log)
