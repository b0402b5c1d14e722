"""The embedded store: SQLite in WAL mode, for one machine and any number of processes.

A driver of the Store (`base.py`): one connection per Store, used from one thread. A flow
runs whole in that thread as one transaction, so a store call costs one thread hop, not one
per statement. Writes take the database lock up front (`BEGIN IMMEDIATE`): a claim is
exclusive across processes, and every write of a flow holds until commit. A batch query runs
once for each row of the batch. A query of several statements in queries.sql runs its first
statement, then the others once for each row the first returned, with that row's columns
added to the parameters: the rows of the query are those of the first statement. Times are
seconds since the epoch, from this machine's clock (`:now`, one reading per transaction).
Wake-ups reach the other processes on the file by Unix datagrams (`_wake.py`), and by their
polling when one is lost; `?wake=off` in the URL leaves a process to polling alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import orjson

from .. import rules
from ..errors import (
    ConfigurationError,
    PermanentStoreError,
    SchemaVersionError,
    StoreError,
    TransientStoreError,
)
from ..retry import new_file, retried
from . import _sql
from ._flow import Flow, FlowFn, Query, Rows, Wakeups
from ._wake import WakeChannel
from .base import Store, Transaction

logger = logging.getLogger(__name__)

T = TypeVar("T")
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL", "extra": "EXTRA"}
_WAKE = {"on": True, "off": False}
"""`?wake=`: whether this process wakes the others on the file and is woken by them through
datagrams (`on`, the default), or neither, each finding new work at its poll (`off`)."""
_TRANSIENT = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
"""Result codes (primary) of a call that may succeed when tried again: another process holds
the database lock longer than the busy timeout."""


def _split(script: str) -> list[str]:
    """The statements of a script; a trigger's body (BEGIN ... END;) stays whole. Comment
    lines are dropped."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines():
        if line.strip().startswith("--"):
            continue
        buffer += line + "\n"
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements


SQL = {name: _split(text) for name, text in _sql.queries("sqlite").items()}


def _wal(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA journal_mode=WAL")


def _translate(exc: sqlite3.Error) -> StoreError:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _TRANSIENT:
        return TransientStoreError(f"SQLite error: {exc}")
    return PermanentStoreError(f"SQLite error: {exc}")


def _dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


def _bind(params: Mapping[str, Any], now: float) -> dict[str, Any]:
    """Parameters as SQLite takes them: a list as JSON text (read with json_each)."""
    bound = {k: orjson.dumps(v).decode() if isinstance(v, list) else v for k, v in params.items()}
    bound["now"] = now
    return bound


def _execute(conn: sqlite3.Connection, query: Query, now: float) -> Rows:
    first, *then = SQL[query.name]
    runs = (
        [dict(query.params)]
        if query.each is None
        else [{**query.params, **row, "ord": i} for i, row in enumerate(query.each)]
    )
    out: Rows = []
    for params in runs:
        bound = _bind(params, now)
        rows = conn.execute(first, bound).fetchall()
        for row in rows:
            for statement in then:
                conn.execute(statement, {**bound, **row})
        out.extend(rows)
    return out


def _drive(conn: sqlite3.Connection, flow: Flow[T], now: float) -> T:
    """Run a flow's queries in order, in the transaction open on `conn`."""
    try:
        batch = next(flow)
        while True:
            results: list[Rows] = []
            failure: StoreError | None = None
            for query in batch:
                if not query.savepoint:
                    results.append(_execute(conn, query, now))
                    continue
                conn.execute("SAVEPOINT flow")
                try:
                    results.append(_execute(conn, query, now))
                except sqlite3.Error as exc:
                    conn.execute("ROLLBACK TO flow")
                    failure = _translate(exc)
                    break
                finally:
                    conn.execute("RELEASE flow")
            batch = flow.throw(failure) if failure is not None else flow.send(results)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


class SQLiteStore(Store):
    """Other processes on the file are woken through Unix datagram sockets (`_wake`); a
    wake-up lost costs a poll interval, which is short. With `?wake=off` this store sends
    and receives none: it and the processes it would wake wait for their polls."""

    dialect = "sqlite"
    default_poll_interval = 0.05
    claim_gather = 0.05  # default_poll_interval: busy, it claims as often as it would poll

    def __init__(self, url: str) -> None:
        self.path, self.synchronous, wake = self._parse(url)
        super().__init__(url)
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = asyncio.Lock()
        self._wake = WakeChannel(self.path) if wake and self.path != ":memory:" else None

    @staticmethod
    def _parse(url: str) -> tuple[str, str, bool]:
        """The database's path, its `synchronous` setting and whether it wakes by datagrams."""
        parts = urlsplit(url)
        if parts.scheme != "sqlite" or parts.netloc not in ("", "localhost"):
            raise ConfigurationError(
                f"invalid SQLite store URL {url!r}: expected sqlite:///relative/path.db "
                "or sqlite:////absolute/path.db"
            )
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise ConfigurationError(f"invalid SQLite store URL {url!r}: no database path")
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(options) - {"synchronous", "wake"}
        if unknown:
            raise ConfigurationError(
                f"unknown SQLite store option(s): {', '.join(sorted(unknown))}"
            )
        sync = options.get("synchronous", "full").lower()
        if sync not in _SYNCHRONOUS:
            raise ConfigurationError(f"synchronous must be one of {', '.join(_SYNCHRONOUS)}")
        wake = options.get("wake", "on").lower()
        if wake not in _WAKE:
            raise ConfigurationError(
                f"wake must be one of {', '.join(_WAKE)}, not {options['wake']!r}"
            )
        return path, _SYNCHRONOUS[sync], _WAKE[wake]

    # -- the driver -----------------------------------------------------------------------
    def _connect(self, create: bool) -> sqlite3.Connection:
        target, uri = self.path, False
        if self.path != ":memory:":
            path = Path(self.path)
            if not path.parent.exists():
                raise ConfigurationError(
                    f"the folder of SQLite database {self.path!r} does not exist"
                )
            if not create:
                if not path.exists():
                    raise SchemaVersionError(
                        f"there is no database at {self.path!r}; create it with "
                        "`stepwarden migrate`"
                    )
                target, uri = path.resolve().as_uri() + "?mode=rw", True
        conn = sqlite3.connect(
            target, isolation_level=None, check_same_thread=False, timeout=30, uri=uri
        )
        conn.row_factory = _dict_row
        conn.create_function("stepwarden_step_deadline", 5, rules.step_deadline, deterministic=True)
        return conn

    def _settle(self, conn: sqlite3.Connection) -> None:
        """The connection's settings, once its file is in WAL mode."""
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=30000")
        if self.read_only:
            conn.execute("PRAGMA query_only=ON")  # every write of this connection refused

    async def _in_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None or self._executor is None:
            raise StoreError("the store is not open")
        conn, executor = self._conn, self._executor
        async with self._lock:
            try:
                return await asyncio.get_running_loop().run_in_executor(executor, fn, conn)
            except sqlite3.Error as exc:
                raise _translate(exc) from exc

    async def _fetch(self, query: Query) -> Rows:
        return await self._in_thread(lambda conn: _execute(conn, query, time.time()))

    async def _write(self, flow: FlowFn[T]) -> T:
        wake = Wakeups()

        began = 0.0

        def transaction(conn: sqlite3.Connection) -> T:
            nonlocal began
            began = time.perf_counter()  # the connection's turn: the database's time from here
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = _drive(conn, flow(wake), time.time())
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        result = await self._in_thread(transaction)
        self._wrote(began)
        self.notifier.publish_all(wake)
        if self._wake is not None:
            self._wake.send(wake)
        return result

    # -- lifecycle ------------------------------------------------------------------------
    async def open(self, *, migrate: bool = True) -> None:
        if self._conn is not None:
            return
        executor = ThreadPoolExecutor(1, thread_name_prefix="stepwarden-sqlite")
        loop = asyncio.get_running_loop()
        conn: sqlite3.Connection | None = None
        try:
            conn = await loop.run_in_executor(executor, self._connect, migrate)
            opened = conn
            # Switching a new file to WAL does not wait on the busy handler: when another
            # process opens the same new file at the same moment, try again for a while.
            await retried(
                lambda: loop.run_in_executor(executor, _wal, opened),
                lambda _, failures: new_file(failures),
                on=sqlite3.OperationalError,
            )
            await loop.run_in_executor(executor, self._settle, conn)
        except BaseException as exc:
            if conn is not None:
                executor.submit(conn.close)
            executor.shutdown(wait=False)
            if isinstance(exc, sqlite3.Error):
                message = f"cannot open SQLite database {self.path!r}: {exc}"
                raise type(_translate(exc))(message) from exc
            raise
        self._conn, self._executor = conn, executor
        await self._ready(migrate)

    async def listen(self) -> None:
        """Receive the wake-ups of the other processes on this file, from now on."""
        if self._conn is None:
            raise StoreError("the store is not open")
        if self._wake is not None:
            try:
                self._wake.listen(self.notifier.publish)
            except OSError as exc:  # no such sockets here: the poll finds the work
                logger.warning("no wake-ups from other processes (%s): polling only", exc)

    async def close(self) -> None:
        if self._wake is not None:
            self._wake.close()
        if self._conn is None or self._executor is None:
            return
        conn, executor = self._conn, self._executor
        self._conn = None
        self._executor = None
        await asyncio.get_running_loop().run_in_executor(executor, conn.close)
        executor.shutdown(wait=True)

    async def schema_version(self) -> int:
        def read(conn: sqlite3.Connection) -> int:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'stepwarden_schema'"
            ).fetchone()
            if not exists:
                return 0
            row = conn.execute("SELECT max(version) AS v FROM stepwarden_schema").fetchone()
            return int(row["v"] or 0)

        return await self._in_thread(read)

    async def migrate(self) -> int:
        def apply(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS stepwarden_schema "
                    "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
                )
                row = conn.execute("SELECT max(version) AS v FROM stepwarden_schema").fetchone()
                current = int(row["v"] or 0)
                for m in _sql.migrations(self.dialect):
                    if m.version > current:
                        for statement in _split(m.sql):
                            conn.execute(statement)
                        conn.execute(
                            "INSERT INTO stepwarden_schema VALUES (?, ?, ?)",
                            (m.version, m.name, time.time()),
                        )
                        current = m.version
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return current

        return await self._in_thread(apply)

    # -- the application ------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        if self._conn is None or self._executor is None:
            raise StoreError("the store is not open")
        async with self._lock:
            tx = _SQLiteTransaction(self, self._conn, self._executor)
            await tx.hop(lambda conn: conn.execute("BEGIN IMMEDIATE"))
            try:
                yield tx
            except BaseException:
                await tx.hop(lambda conn: conn.execute("ROLLBACK"))
                raise
            await tx.hop(lambda conn: conn.execute("COMMIT"))
        self.notifier.publish_all(tx.wake)
        if self._wake is not None:
            self._wake.send(tx.wake)

    async def _worth_writing(self, query: str, /, **params: Any) -> bool:
        return bool(await self._read_one(query, **params))


class _SQLiteTransaction(Transaction):
    def __init__(
        self, store: Store, conn: sqlite3.Connection, executor: ThreadPoolExecutor
    ) -> None:
        super().__init__(store)
        self._conn = conn
        self._executor = executor

    async def hop(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, self._conn)
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        await self.hop(lambda conn: conn.execute(sql, params))

    async def _run(self, flow: FlowFn[T]) -> T:
        return await self.hop(lambda conn: _drive(conn, flow(self.wake), time.time()))
