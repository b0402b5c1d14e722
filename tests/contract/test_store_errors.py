"""A failing store says what the caller should do: TransientStoreError when trying again may
succeed (connection lost or refused, a lock held too long, a busy file), PermanentStoreError
when the database refuses the call as it is (a constraint, a query it cannot run)."""

from __future__ import annotations

import socket
import sqlite3

import psycopg
import pytest

from stepwarden.errors import PermanentStoreError, StoreError, TransientStoreError
from stepwarden.store import Store, open_one
from stepwarden.store.sqlite import _translate

from ..rawsql import sqlite_path


async def test_a_query_the_database_refuses_is_permanent(store: Store) -> None:
    with pytest.raises(PermanentStoreError):
        async with store.transaction() as tx:
            await tx.execute("SELECT * FROM no_such_table")
    # The store goes on serving.
    assert await store.get_task("nothing") is None


def test_sqlite_busy_is_transient_and_a_constraint_permanent(sqlite_url: str) -> None:
    path = sqlite_path(sqlite_url)
    holder = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        holder.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as busy:
            other.execute("BEGIN IMMEDIATE")
        assert isinstance(_translate(busy.value), TransientStoreError)
        holder.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(sqlite3.IntegrityError) as duplicate:
            holder.execute("INSERT INTO t VALUES (1)")
        assert isinstance(_translate(duplicate.value), PermanentStoreError)
    finally:
        holder.close()
        other.close()


async def test_postgres_lock_timeout_is_transient(pg_url: str) -> None:
    store = open_one(pg_url + "?options=-c%20lock_timeout%3D100")
    await store.open()
    try:
        assert await store.acquire_lease("supervisor", "a", 30) == 1
        with psycopg.connect(pg_url) as holder:  # a transaction that keeps the lease row
            holder.execute("SELECT * FROM stepwarden_leases FOR UPDATE")
            with pytest.raises(TransientStoreError, match="lock timeout"):
                await store.acquire_lease("supervisor", "b", 30)
        assert await store.acquire_lease("supervisor", "a", 30) == 1
    finally:
        await store.close()


async def test_an_unreachable_postgres_is_transient() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = open_one(f"postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=2")
    with pytest.raises(TransientStoreError, match="cannot connect to PostgreSQL"):
        await store.open()
    assert issubclass(TransientStoreError, StoreError)


async def test_a_read_only_server_is_transient_and_its_connection_is_replaced(
    pg_url: str,
) -> None:
    """What a failover leaves behind for a while: a connection on a read-only server. The
    write fails as transient (tried again, not given up), and its connection is dropped, so
    that the next call gets a new one (in production the new primary's)."""
    name = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        # The pool's one connection is made now, on the read-only server (any session
        # accepted here, so that the store starts on it).
        store = open_one(pg_url + "?target_session_attrs=any&pool_size=1")
        await store.open(migrate=False)
        try:
            with pytest.raises(TransientStoreError, match="read-only"):
                await store.acquire_lease("supervisor", "a", 30)
            # The application's own transaction, whose failure the store has translated:
            # its connection is dropped too.
            with pytest.raises(TransientStoreError, match="read-only"):
                async with store.transaction() as tx:
                    await tx.execute("CREATE TABLE mine (k int)")
            admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            async with store.transaction() as tx:
                await tx.execute("CREATE TABLE mine (k int)")
            assert await store.acquire_lease("supervisor", "a", 30) == 1
        finally:
            await store.close()


async def test_by_default_a_read_only_server_is_passed_over(pg_url: str) -> None:
    """By default the store asks for a read-write session (`target_session_attrs`): with
    only a read-only server to reach, it does not start on it (TransientStoreError), and it
    would not stay on it."""
    name = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        store = open_one(pg_url)
        with pytest.raises(TransientStoreError, match="read-only"):
            await store.open(migrate=False)
        admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        await store.open(migrate=False)
        await store.close()
