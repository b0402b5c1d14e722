"""Fixtures shared by every test: the stores under test, on SQLite and on a real PostgreSQL.

PostgreSQL is not optional: when STEPWARDEN_TEST_POSTGRES_URL (default: the local server)
cannot be reached, the run stops with an error instead of skipping half of the suite. Each
test gets its own database, cloned from a template migrated once per run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from stepwarden.store import Store, open_store

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
PG_URL = os.environ.get("STEPWARDEN_TEST_POSTGRES_URL", DEFAULT_PG)
STORES = ["sqlite", "postgres"]


def _with_db(url: str, dbname: str) -> str:
    base, _, query = url.partition("?")
    base = base.rsplit("/", 1)[0] + "/" + dbname
    return f"{base}?{query}" if query else base


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated template database for this run; fails the run if PostgreSQL is down."""
    try:
        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        pytest.exit(f"PostgreSQL at {PG_URL} is unreachable: {exc}", returncode=3)
    name = f"sw_tpl_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_db(PG_URL, name)

    import asyncio

    async def migrate() -> None:
        store = open_store(url)
        await store.open(migrate=True)
        await store.close()

    asyncio.run(migrate())
    try:
        yield name
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test."""
    name = f"sw_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    try:
        yield _with_db(PG_URL, name)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
    name = f"sw_empty_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_db(PG_URL, name)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = open_store(store_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()
