"""The server store: PostgreSQL through psycopg 3, for any number of machines.

A driver of the Store (`base.py`): a pool of autocommit connections; a flow runs as one
transaction in pipeline mode, the queries it yields together sharing one round trip. A batch
query runs once for the whole batch, with each column as an array (`unnest`), so that its
cost is one statement whatever its size. Claims skip rows other claimers hold (`FOR UPDATE
SKIP LOCKED`). Every time comes from the database clock: deadlines are computed in SQL and
`remaining` seconds are read from it.

Wake-ups cross processes with LISTEN/NOTIFY: a transaction notifies before its commit (so the
notifications are delivered on commit, and only then), and `listen` forwards what other
processes notify to this store's notifier.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.adapt import Dumper
from psycopg.conninfo import conninfo_to_dict
from psycopg.errors import Diagnostic
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, dict_row
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from ..errors import (
    ConfigurationError,
    PermanentStoreError,
    StoreError,
    TransientStoreError,
)
from ..records import LeaseTry
from ..retry import PROBE_EVERY, after_transient, paced, retried
from . import _sql, policy
from ._flow import (
    CHANNEL_CALLS,
    CHANNEL_OUTBOX,
    CHANNEL_REQUESTS,
    CHANNEL_RESULTS,
    CHANNEL_TASK_DONE,
    CHANNEL_TASKS,
    Flow,
    FlowFn,
    Query,
    Rows,
    Wakeups,
)
from .base import Store, Transaction

logger = logging.getLogger("stepwarden.store.postgres")

T = TypeVar("T")
SQL = _sql.queries("postgres")
Conn = psycopg.AsyncConnection[Any]
Cursor = psycopg.AsyncCursor[DictRow]
Pipe = psycopg.AsyncPipeline

CONNECT_TIMEOUT = 10.0
"""Seconds allowed to reach the server when opening the store."""
DEFAULT_POOL_SIZE = 10
POOL_MAX_IDLE = 10.0
"""Seconds a pooled connection may stay unused before the pool closes it (one at a time,
down to one connection): a worker that was busy goes back to one beside its listener,
however many it needed under load."""
GROW_AFTER = 0.1
"""Seconds a call waits for the pool's one connection before the pool may grow to
`pool_size`: calls that meet by chance (an idle worker's roles; forty workers started at
once) share one connection rather than each opening one the pool would keep, while calls
that wait on one another (work) soon have up to `pool_size`. Back at one connection, the
pool is one connection at most again."""
STALLED = 5.0
"""Seconds a transaction may wait on its client, and a statement may wait for a lock. Every
transaction of the store is a few statements long; a client frozen mid-transaction (stopped,
swapped out, a stalled VM) would otherwise keep its row locks, among them the supervisor's
lease row during a sweep, for as long as it is frozen. The server ends such a transaction
when it sits idle (`idle_in_transaction_session_timeout`); one frozen in the middle of a
pipeline looks busy to the server, and the supervisors end it (`end_stalled_sessions`).
Waiting for a lock longer than this fails (`lock_timeout`) and the caller tries again. Set
libpq's `options` in the store URL to choose other values."""
LEASE_LOCK_WAIT = 1.0
"""Seconds a try of the lease waits for the lease row's lock (held during a leader's sweep
round, a few milliseconds; by a frozen or cut-off leader until its session is ended)."""
LEASE_BUSY_AGAIN = 0.2
"""Seconds after which a try of the lease that found its row locked is made again."""
PROBE_WITHIN = 2.0
"""Seconds a try of the server may take (one that does not answer at all)."""
NOTIFY_LIMIT = 7000
"""Bytes per notification payload (PostgreSQL refuses 8000 and more)."""
UNPREPARED = frozenset(
    {"list_tasks", "events", "history", "outbox_read", "find_tasks", "version_backlog",
     "savepoint_dependents", "rollback_dependents", "list_tagged_tasks", "find_tagged_tasks",
     "select_tasks"}
)  # fmt: skip
"""Queries with optional filters: planned for the filters each call has, not prepared; and
statements PostgreSQL cannot prepare (savepoints)."""
TRANSIENT_CLASSES = ("08", "40", "53", "57P")
"""SQLSTATE classes of an error that may pass when the call is tried again: connection
exceptions, transaction rollbacks (serialization failure, deadlock), insufficient resources,
operator intervention (shutdown, crash recovery, the server not accepting connections yet)."""
TRANSIENT_STATES = frozenset({"55P03", "57014", "25P03", "25006"})
"""Lock not available (lock_timeout), query cancelled (statement timeout), idle in
transaction session timeout, and a read-only server (`WRONG_SERVER`)."""
WRONG_SERVER = frozenset({"25006"})
"""A statement refused because the server is read-only: a standby, or a primary a failover
left behind (started again read-only, or still named by a DNS record that has not moved
yet). The connection is dropped and the call tried again on a new one, which
`target_session_attrs=read-write` takes to the primary."""

PG_CHANNELS = {
    CHANNEL_TASKS: "stepwarden_tasks",
    CHANNEL_REQUESTS: "stepwarden_requests",
    CHANNEL_RESULTS: "stepwarden_results",
    CHANNEL_TASK_DONE: "stepwarden_task_done",
    CHANNEL_CALLS: "stepwarden_calls",
    CHANNEL_OUTBOX: "stepwarden_outbox",  # sent by the outbox triggers
}
_FROM_PG = {pg: local for local, pg in PG_CHANNELS.items()}
SERVER_WARNINGS = frozenset({"WARNING"})
"""Severities of a server message that the store logs as a warning: the server saw something
wrong in what this client sent (a BEGIN inside a transaction, a COMMIT outside one) and went
on. NOTICE, INFO, DEBUG and LOG are logged at debug level."""
_OPTIONS = {"pool_size", "pooler"}
"""Query parameters of the store URL that are stepwarden's, not libpq's."""
POOLERS = ("none", "transaction")
"""What stands between the store and the server (`pooler=` in the URL): nothing (or a pooler
in session mode), or a pooler in transaction mode (PgBouncer's `pool_mode = transaction`),
which gives each transaction whichever server session is free: no statement is prepared,
no session setting is sent (`options`), and no LISTEN is made (wake-ups come from polling)."""
SESSION_TIMEOUTS = ("lock_timeout", "idle_in_transaction_session_timeout")
"""The settings a stalled transaction relies on to end (a frozen process's transaction is
rolled back, a lock wait gives up and is tried again): set by the store URL's `options`,
or, behind a transaction pooler, by the server (`ALTER ROLE ... SET`) or the pooler."""


def _translate(exc: psycopg.Error) -> StoreError:
    state = exc.sqlstate or ""
    transient = (
        (isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) and not state)
        or state.startswith(TRANSIENT_CLASSES)
        or state in TRANSIENT_STATES
    )
    kind = TransientStoreError if transient else PermanentStoreError
    return kind(f"PostgreSQL error: {exc}")


def _wrong_server(exc: BaseException) -> bool:
    """Whether a failure, or the psycopg error it was translated from (a StoreError raised
    by a transaction or a savepoint's flow), says the server is read-only (WRONG_SERVER)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, psycopg.Error) and (seen.sqlstate or "") in WRONG_SERVER:
            return True
        seen = seen.__cause__
    return False


def _lock_not_available(exc: BaseException) -> bool:
    """Whether a failure, or the psycopg error it was translated from, is a lock waited for
    longer than lock_timeout (SQLSTATE 55P03)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, psycopg.Error) and seen.sqlstate == "55P03":
            return True
        seen = seen.__cause__
    return False


def _lost_connection(exc: psycopg.Error) -> bool:
    """Whether a failure says the connection, or the server, is gone (not a query's own
    trouble, such as a lock timeout): no SQLSTATE, a connection exception, or the server
    shutting down or not accepting connections yet."""
    state = exc.sqlstate or ""
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) and (
        not state or state.startswith(("08", "57P"))
    )


def _bind(query: Query) -> dict[str, Any]:
    """A query's parameters; a batch's rows as one array per column, with `ord`."""
    if query.each is None:
        return dict(query.params)
    columns = {k: [row[k] for row in query.each] for k in query.each[0]} if query.each else {}
    return {**query.params, **columns, "ord": list(range(len(query.each)))}


def _chunks(items: Sequence[str]) -> list[str]:
    """Join payload items with newlines into notifications of at most NOTIFY_LIMIT bytes.
    An item longer than that on its own is left out: pollers find it all the same."""
    out: list[str] = []
    current: list[str] = []
    size = 0
    for item in items:
        n = len(item.encode())
        if n > NOTIFY_LIMIT:
            continue
        if current and size + 1 + n > NOTIFY_LIMIT:
            out.append("\n".join(current))
            current, size = [], 0
        size += n + (1 if current else 0)
        current.append(item)
    if current:
        out.append("\n".join(current))
    return out


def _chunks_each(items: Sequence[str]) -> list[str]:
    """One notification per item (those that fit one)."""
    return [item for item in items if len(item.encode()) <= NOTIFY_LIMIT]


def _notifications(wake: Wakeups) -> list[tuple[str, str]]:
    """(channel, payload) pairs: one per agent for requests, else items joined by newlines."""
    out: list[tuple[str, str]] = []
    for channel, payloads in wake.due:
        split = _chunks_each if channel == CHANNEL_REQUESTS else _chunks
        out.extend((PG_CHANNELS[channel], p) for p in split(payloads))
    return out


class _ArrayLiteral(Dumper):
    """A list parameter as a PostgreSQL array literal, typed by the cast the query gives it
    (`%(x)s::text[]`). Batches travel as arrays, and their JSON texts need escaping in every
    element: psycopg's own list dumper does it with a regular expression per element, which
    cost a sixth of a worker's time; `str.replace` does it in C."""

    oid = 0  # unknown: the server takes the type from the cast

    def dump(self, obj: list[Any]) -> bytes:
        return ("{" + ",".join(map(_array_element, obj)) + "}").encode()


def _array_element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class PostgresStore(Store):
    dialect = "postgres"
    default_poll_interval = 0.5

    def __init__(self, url: str) -> None:
        self.conninfo, self.pool_size, self.connect_kwargs, self.pooler = self._parse(url)
        super().__init__(url)
        self.application_name = str(
            self.connect_kwargs.get("application_name")
            or conninfo_to_dict(self.conninfo).get("application_name")
            or ""
        )
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._listen_lock = asyncio.Lock()
        """Held while the listener's first connection is made: callers at once share it."""
        self._listen_first: Conn | None = None
        """The listener's first connection until its task runs and takes it over."""
        self._narrowed_at = -math.inf
        self._listening = False
        """Whether the listener's connection is up: every notification of the other
        processes reaches this one (`wakeups_live`)."""
        self._own_pids: set[int] = set()
        self._checking: asyncio.Task[None] | None = None
        self._probing: asyncio.Task[None] | None = None
        self._out_of_reach: str | None = None
        """Why the probe's last try of the server failed, until one succeeds: a call made
        meanwhile fails at once rather than wait for a connection the pool cannot make."""

    @staticmethod
    def _parse(url: str) -> tuple[str, int, dict[str, Any], str]:
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ConfigurationError(
                f"invalid PostgreSQL store URL {url!r}: expected postgresql://user@host/db"
            )
        params = parse_qsl(parts.query, keep_blank_values=True)
        options = {k: v for k, v in params if k in _OPTIONS}
        rest = [(k, v) for k, v in params if k not in _OPTIONS]
        raw = options.get("pool_size", str(DEFAULT_POOL_SIZE))
        try:
            pool_size = int(raw)
        except ValueError:
            pool_size = 0
        if pool_size < 1:
            raise ConfigurationError(f"pool_size must be a positive integer, not {raw!r}")
        pooler = options.get("pooler", "none")
        if pooler not in POOLERS:
            raise ConfigurationError(f"pooler must be one of {', '.join(POOLERS)}, not {pooler!r}")
        conninfo = urlunsplit(parts._replace(query=urlencode(rest, quote_via=quote)))
        kwargs: dict[str, Any] = {}
        names = {k for k, _ in rest}
        if "connect_timeout" not in names:
            kwargs["connect_timeout"] = int(CONNECT_TIMEOUT)
        if "application_name" not in names:
            kwargs["application_name"] = "stepwarden"
        if "target_session_attrs" not in names:
            # Never a standby: after a failover, a multi-host URL (host1,host2) or a moved
            # DNS name finds the new primary; a server still read-only is passed over.
            kwargs["target_session_attrs"] = "read-write"
        if pooler == "transaction":
            if "options" in names:
                raise ConfigurationError(
                    "a pooler in transaction mode does not pass `options` to the server: set "
                    "lock_timeout and idle_in_transaction_session_timeout on the server "
                    "(ALTER ROLE ... SET) or in the pooler, and leave `options` out"
                )
            kwargs["prepare_threshold"] = None  # a statement prepared on one server session
            # would be missing on the next
        elif "options" not in names:
            ms = int(STALLED * 1000)
            kwargs["options"] = f"-c idle_in_transaction_session_timeout={ms} -c lock_timeout={ms}"
        return conninfo, pool_size, kwargs, pooler

    def _notice(self, diag: Diagnostic) -> None:
        """A message the server sent to one of the store's connections (not an error: those
        are raised). A warning is logged as one, with its severity and SQLSTATE as data
        (`server_severity`, `sqlstate`) for whoever watches the logs; but the server saying
        that it shuts down (SQLSTATE class 57P, operator intervention: a restart, a
        failover) is news, not a fault of this client: logged at info."""
        severity = diag.severity_nonlocalized or diag.severity or ""
        level = logging.DEBUG
        if severity in SERVER_WARNINGS:
            going_away = (diag.sqlstate or "").startswith("57P")
            level = logging.INFO if going_away else logging.WARNING
        logger.log(
            level,
            "PostgreSQL %s (%s): %s",
            severity,
            diag.sqlstate,
            diag.message_primary,
            extra={"server_severity": severity, "sqlstate": diag.sqlstate},
        )

    def _where(self) -> str:
        """Where the server is, for messages (never the password)."""
        try:
            info = conninfo_to_dict(self.conninfo)
        except psycopg.Error:
            return "the configured server"
        hosts = str(info.get("host") or "localhost").split(",")
        ports = [p or "5432" for p in str(info.get("port") or "").split(",")]
        if len(ports) < len(hosts):  # one port for every host, as libpq reads it
            ports = ports + [ports[-1]] * (len(hosts) - len(ports))
        where = ",".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=False))
        return f"{where}/{info.get('dbname') or info.get('user') or ''}"

    # -- the driver -----------------------------------------------------------------------
    async def _configure(self, conn: Conn) -> None:
        # json comes back as its text, decoded by stepwarden's own (orjson) loads.
        conn.adapters.register_loader("json", TextLoader)
        conn.adapters.register_dumper(list, _ArrayLiteral)
        conn.add_notice_handler(self._notice)
        self._own_pids.add(conn.info.backend_pid)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        """A pooled autocommit connection; psycopg's errors become StoreError."""
        if self._pool is None:
            raise StoreError("the store is not open")
        try:
            async with self._pooled() as conn:
                yield conn
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                self._check_pool()
                if _lost_connection(exc):
                    self._probe()
            raise _translate(exc) from exc

    def _check_pool(self) -> None:
        """After a connection was lost (a server restart, a failover), test the pool's idle
        connections in the background and replace the broken ones, so that the next calls
        do not meet them one at a time."""
        if self._pool is None or self._checking is not None:
            return
        pool = self._pool

        async def check() -> None:
            try:
                await pool.check()
            except Exception as exc:  # the server is still away: the next failure tries again
                logger.debug("checking the pool's connections: %s", exc)
            finally:
                self._checking = None

        self._checking = asyncio.create_task(
            check(), name="stepwarden-pool-check", context=contextvars.Context()
        )

    async def _fetch(self, query: Query) -> Rows:
        async with self._connection() as conn:
            return await _rows(await _send(conn, query))

    async def _write_one(self, query: Query) -> Rows:
        # One statement is a transaction of its own: one round trip, no BEGIN or COMMIT.
        async with self._connection() as conn:
            started = time.perf_counter()
            rows = await _rows(await _send(conn, query))
            self._wrote(started)
        return rows

    async def _write(self, flow: FlowFn[T]) -> T:
        wake = Wakeups()
        async with self._connection() as conn:
            started = time.perf_counter()  # the connection taken: the server's time from here
            async with conn.pipeline() as pipe:
                result = await _drive(conn, pipe, flow(wake), wake)
            self._wrote(started)
        self.notifier.publish_all(wake)
        return result

    async def _write_alone(self, flow: FlowFn[T]) -> T:
        # Each statement in autocommit: one round trip, no BEGIN, no COMMIT, no pipeline; its
        # SQL notifies (delivered on its commit), and this process hears of it after. A flow's
        # later statements (a submit's read of the ids it found taken) see what it committed.
        wake = Wakeups()
        steps = flow(wake)
        queries = next(steps)
        while True:
            rows = [await self._write_one(q) for q in queries]
            try:
                queries = steps.send(rows)
            except StopIteration as stop:
                self.notifier.publish_all(wake)
                return stop.value  # type: ignore[no-any-return]

    # -- lifecycle ------------------------------------------------------------------------
    async def open(self, *, migrate: bool = True) -> None:
        if self._pool is not None:
            return
        where = self._where()
        if self.read_only:
            self._read_only_sessions()
        # A direct first connection reports an unreachable server at once and clearly;
        # the pool would only keep retrying in the background.
        try:
            probe = await psycopg.AsyncConnection.connect(
                self.conninfo, autocommit=True, **self.connect_kwargs
            )
            await probe.close()
        except psycopg.Error as exc:
            raise TransientStoreError(f"cannot connect to PostgreSQL at {where}: {exc}") from exc
        pool = self._new_pool()
        try:
            await pool.open(wait=True, timeout=CONNECT_TIMEOUT)
        except psycopg.Error as exc:
            await pool.close()
            raise TransientStoreError(f"cannot connect to PostgreSQL at {where}: {exc}") from exc
        except BaseException:
            await pool.close()
            raise
        self._pool = pool
        if self.pooler == "transaction":
            await self._check_session_timeouts()
        await self._ready(migrate)

    def _read_only_sessions(self) -> None:
        """Every session of this store reads only: its transactions are read-only
        (`default_transaction_read_only`), so that the server refuses any write."""
        if self.pooler == "transaction":
            raise ConfigurationError(
                "a read-only store needs its session options, which a pooler in transaction "
                "mode does not pass: connect to the server itself, or to a standby"
            )
        options = str(
            self.connect_kwargs.get("options")
            or conninfo_to_dict(self.conninfo).get("options")
            or ""
        )
        if "default_transaction_read_only" not in options:
            self.connect_kwargs["options"] = (
                f"{options} -c default_transaction_read_only=on".strip()
            )
        if "target_session_attrs" not in conninfo_to_dict(self.conninfo):
            self.connect_kwargs["target_session_attrs"] = "any"  # a standby serves reads

    async def _check_session_timeouts(self) -> None:
        """Behind a transaction pooler the store cannot set SESSION_TIMEOUTS itself: refuse
        to start (ConfigurationError) when the server sessions have either turned off."""
        async with self._connection() as conn:
            cur = await conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                [list(SESSION_TIMEOUTS)],
                prepare=False,
            )
            off = sorted(name for name, setting in await cur.fetchall() if setting == "0")
        if off:
            await self.close()
            ms = int(STALLED * 1000)
            raise ConfigurationError(
                f"behind a pooler in transaction mode, the server sessions must set "
                f"{' and '.join(off)} (a stalled transaction would otherwise hold its locks "
                f"for ever): e.g. ALTER ROLE <the store's role> SET lock_timeout = {ms}; "
                f"ALTER ROLE <the store's role> SET idle_in_transaction_session_timeout = {ms}"
            )

    def _new_pool(self) -> AsyncConnectionPool[Conn]:
        return AsyncConnectionPool(
            self.conninfo,
            min_size=1,
            max_size=1,  # until calls wait (`_getconn`)
            max_idle=POOL_MAX_IDLE,
            kwargs={"autocommit": True, **self.connect_kwargs},
            configure=self._configure,
            open=False,
            name="stepwarden",
        )

    async def close(self) -> None:
        probing, self._probing = self._probing, None
        if probing is not None:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing
        checking, self._checking = self._checking, None
        if checking is not None:
            checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checking
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        first, self._listen_first = self._listen_first, None
        if first is not None:  # the listener was cancelled before it ran: close its connection
            await first.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        self._own_pids.clear()

    async def schema_version(self) -> int:
        async with self._connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(SQL["schema_table_exists"])
            row = await cur.fetchone()
            if row is None or not row["present"]:
                return 0
            await cur.execute(SQL["schema_version"])
            row = await cur.fetchone()
            return int(row["version"]) if row else 0

    async def migrate(self) -> int:
        # The advisory lock makes concurrent migrations wait for each other; the second
        # then finds the work done. Each migration runs in this one transaction.
        async with self._connection() as conn, conn.transaction():
            await conn.execute(SQL["migration_lock"])
            await conn.execute(SQL["create_schema_table"])
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(SQL["schema_version"])
            row = await cur.fetchone()
            current = int(row["version"]) if row else 0
            for m in _sql.migrations(self.dialect):
                if m.version > current:
                    # No parameters: the script may hold several statements.
                    await conn.execute(m.sql.encode(), prepare=False)
                    await conn.execute(
                        SQL["record_migration"], {"version": m.version, "name": m.name}
                    )
                    current = m.version
            return current

    # -- the application ------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        async with self._connection() as conn:
            async with conn.transaction():
                tx = _PostgresTransaction(self, conn)
                yield tx
                await _notify(conn, tx.wake)
            self.notifier.publish_all(tx.wake)

    # -- the supervisor -------------------------------------------------------------------
    async def end_stalled_sessions(self) -> int:
        rows = await self._read_one(
            "end_stalled_sessions",
            application_name=self.application_name,
            stalled=STALLED,
            lock_timeout=str(int(STALLED * 1000)),
        )
        return self._ended(rows)

    async def try_lease(self, name: str, holder: str, ttl: float) -> LeaseTry:
        stalled = Query(
            "end_stalled_sessions",
            {
                "application_name": self.application_name,
                "stalled": STALLED,
                "lock_timeout": str(int(LEASE_LOCK_WAIT * 1000)),
            },
        )
        try:
            tried, rows = await self._write(partial(policy.try_lease, name, holder, ttl, stalled))
        except TransientStoreError as exc:
            if not _lock_not_available(exc):
                raise
            # The lease row is locked by a transaction of the leader's, one not stalled for
            # STALLED yet (frozen mid-sweep, or cut off): tried again soon, which ends it once
            # it is, rather than wait out the whole lock_timeout and fail.
            return LeaseTry(None, LEASE_BUSY_AGAIN)
        self._ended(rows)
        return tried

    def _ended(self, rows: Rows) -> int:
        ended = [r["pid"] for r in rows if r["ended"]]
        if ended:
            logger.warning(
                "ended %d session(s) stalled for over %.0f s mid-transaction (backend pids %s)",
                len(ended),
                STALLED,
                ", ".join(map(str, ended)),
            )
        return len(ended)

    # -- wake-ups -------------------------------------------------------------------------
    async def listen(self) -> None:
        """Forward the notifications of other processes to this store's notifier, from now
        on: the first connection is made before returning (StoreError when it fails), and
        a lost one is made again in the background, waiting as after a transient failure
        (`retry.after_transient`: 0.1 s, doubling up to 5 s), or less: at once when the
        server, out of reach, answers a probe again."""
        if self._listener is not None:
            return
        if self._pool is None:
            raise StoreError("the store is not open")
        if self.pooler == "transaction":
            return  # LISTEN is a server session's, which a transaction pooler passes on: poll
        async with self._listen_lock:
            if self._listener is not None:  # made by another call meanwhile
                return
            try:
                conn = await self._listen_connect()
            except psycopg.Error as exc:
                raise StoreError(f"cannot listen for notifications: {exc}") from exc
            if self._pool is None:  # closed while this connected
                await conn.close()
                raise StoreError("the store is not open")
            self._listen_first = conn
            self._listener = asyncio.create_task(
                self._listen_loop(conn), name="stepwarden-listen", context=contextvars.Context()
            )

    @property
    def wakeups_live(self) -> bool:
        return self._listening

    def _caught_up(self) -> None:
        """Listening again after a break: what was notified meanwhile is lost, so every
        channel is told that anything may have changed (an empty wake-up: its subscribers
        look at everything, as at a poll)."""
        for channel in PG_CHANNELS:
            self.notifier.publish(channel, [])

    async def _listen_connect(self) -> Conn:
        conn = await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, **self.connect_kwargs
        )
        conn.add_notice_handler(self._notice)
        try:
            await conn.execute("; ".join(f"LISTEN {c}" for c in PG_CHANNELS.values()).encode())
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _listen_loop(self, conn: Conn | None) -> None:
        self._listen_first = None  # closed by this loop from now on
        failures = 0  # in a row, since the last connection made
        while True:
            try:
                if conn is None:
                    conn = await self._listen_connect()
                    failures = 0
                    logger.info("listening for notifications again")
                    self._listening = True
                    self._caught_up()
                else:
                    self._listening = True
                async for n in conn.notifies():
                    # This process published its own writes already, at their commit.
                    channel = _FROM_PG.get(n.channel)
                    if n.pid in self._own_pids and channel != CHANNEL_OUTBOX:
                        continue
                    if channel is not None:
                        self.notifier.publish(channel, n.payload.split("\n"))
            except (psycopg.Error, OSError) as exc:
                logger.warning(
                    "notifications lost (%s); reconnecting in %.1f s",
                    exc,
                    after_transient(failures + 1),
                )
            except Exception:
                logger.exception(
                    "notifications lost; reconnecting in %.1f s", after_transient(failures + 1)
                )
            finally:
                self._listening = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
                    conn = None
            failures += 1
            self._probe()
            await self.wait_to_retry(after_transient(failures))

    # -- the server out of reach ----------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _pooled(self) -> AsyncIterator[Conn]:
        """A connection of the pool; of the new pool when the pool was made anew while this
        call waited for one (the server back after an outage: `_renew_pool`). While the
        probe finds the server out of reach, TransientStoreError at once: the pool would
        keep the call waiting for its timeout (30 s), and an actor's call waits to be tried
        again until the server is back anyway (`Store.wait_to_retry`)."""
        if self._out_of_reach is not None:
            raise TransientStoreError(
                f"PostgreSQL at {self._where()} is out of reach: {self._out_of_reach}"
            )
        while True:
            pool = self._pool
            if pool is None:
                raise StoreError("the store is not open")
            try:
                conn = await self._getconn(pool)
            except PoolClosed:
                if self._pool is pool or self._pool is None:
                    raise
                continue
            break
        try:
            async with conn:
                yield conn
        except Exception as exc:
            if _wrong_server(exc):
                await conn.close()  # the pool drops it and connects anew, to the primary
            raise
        finally:
            await pool.putconn(conn)
            await self._narrow(pool)

    async def _getconn(self, pool: AsyncConnectionPool[Conn]) -> Conn:
        """A connection of `pool`; one held by another call is waited for GROW_AFTER before
        the pool may open more, up to `pool_size`."""
        if pool.max_size < self.pool_size:
            try:
                return await pool.getconn(timeout=GROW_AFTER)
            except PoolTimeout:
                await pool.resize(1, self.pool_size)
        return await pool.getconn()

    async def _narrow(self, pool: AsyncConnectionPool[Conn]) -> None:
        """Once a grown pool is back at one connection, idle (POOL_MAX_IDLE), it opens no
        more until calls wait again (looked at once a second at most)."""
        if pool.max_size <= 1:
            return
        now = time.monotonic()
        if now - self._narrowed_at < 1.0:
            return
        self._narrowed_at = now
        stats = pool.get_stats()
        if stats.get("pool_size", 0) <= 1 and stats.get("pool_available", 0) >= 1:
            await pool.resize(1, 1)

    def _probe(self) -> None:
        """A connection was lost: try the server until it answers (one probe per store,
        however many calls lost theirs)."""
        self._lost()
        if self._probing is None and self._pool is not None:
            self._probing = asyncio.create_task(
                self._probe_loop(), name="stepwarden-probe", context=contextvars.Context()
            )

    async def _probe_loop(self) -> None:
        """Try a new connection every PROBE_EVERY seconds until one succeeds. When the server
        was out of reach (a try failed), the pool is made anew first: its own connections
        are from before, and it would make new ones at its own pace (1 s, 2 s, 4 s... apart).
        Then every call waiting to be tried again goes (`Store.wait_to_retry`)."""
        where = self._where()
        tried = 0.0
        refused_at: float | None = None

        async def attempt() -> AsyncConnectionPool[Conn] | None:
            nonlocal tried
            tried = time.monotonic()
            await self._try_server()
            return None if refused_at is None else await self._renew_pool()

        def refused(exc: Exception, failures: int) -> float:
            nonlocal refused_at
            self._lost()
            self._out_of_reach = str(exc) or type(exc).__name__
            if refused_at is None:
                refused_at = tried
                logger.warning(
                    "PostgreSQL at %s is out of reach (%s); trying it every %.1f s",
                    where,
                    exc,
                    PROBE_EVERY,
                )
            return paced(tried, PROBE_EVERY)

        try:
            old = await retried(attempt, refused, on=(psycopg.Error, OSError, TimeoutError))
            if refused_at is not None:
                logger.warning(
                    "PostgreSQL at %s answers again, after %.1f s out of reach",
                    where,
                    time.monotonic() - refused_at,
                )
            self._out_of_reach = None
            self._answered()
            if old is not None:  # its waiting calls fail, and take the new pool's
                await old.close()
        finally:
            self._probing = None
            self._out_of_reach = None

    async def _try_server(self) -> None:
        async with asyncio.timeout(PROBE_WITHIN):
            conn = await psycopg.AsyncConnection.connect(
                self.conninfo, autocommit=True, **self.connect_kwargs
            )
            try:
                await conn.execute("SELECT 1")
            finally:
                await conn.close()

    async def _renew_pool(self) -> AsyncConnectionPool[Conn] | None:
        """Put a new pool in the place of the old one, which it returns for closing: the
        calls waiting for one of its connections then take one of the new pool's
        (`_pooled`)."""
        old = self._pool
        if old is None:
            return None
        # The server may have restarted: a backend of another process may now have the pid of
        # one of the old connections, whose notifications must not be taken for this one's.
        self._own_pids.clear()
        new = self._new_pool()
        try:
            await new.open(wait=True, timeout=PROBE_WITHIN)
        except BaseException:
            await new.close()
            raise
        if self._pool is not old:  # closed meanwhile
            await new.close()
            return None
        self._pool = new
        return old


async def _notify(conn: Conn, wake: Wakeups) -> None:
    """Queue the notifications of a transaction's wake-ups, delivered on its commit."""
    pairs = _notifications(wake)
    if pairs:
        params = {"channel": [c for c, _ in pairs], "payload": [p for _, p in pairs]}
        await conn.execute(SQL["notify"], params)


async def _send(conn: Conn, query: Query) -> Cursor | None:
    """Send a query; its rows are read later (in pipeline mode, without a wait). None for
    an empty batch: there is nothing to run."""
    if query.each is not None and not query.each:
        return None
    cur = conn.cursor(row_factory=dict_row)
    prepare = False if query.name in UNPREPARED else None
    await cur.execute(SQL[query.name], _bind(query), prepare=prepare)
    return cur


async def _rows(cur: Cursor | None) -> Rows:
    if cur is None:
        return []
    try:
        return await cur.fetchall()
    except psycopg.ProgrammingError as exc:
        # A statement that returns no rows (its result is here): psycopg's own complaint,
        # with no SQLSTATE; an error of the server's is the statement's failure.
        if cur.description is None and exc.sqlstate is None:
            return []
        raise


async def _run(conn: Conn, pipe: Pipe | None, batch: list[Query]) -> list[Rows] | StoreError:
    """The rows of each query of a batch, sent together and read in one round trip. A
    query in a savepoint runs on its own; when the database refuses it, the savepoint is
    rolled back and the error returned, the transaction still usable. The savepoint is
    psycopg's (`transaction()` nested in the open transaction): its rollback also forgets
    the statements psycopg took for prepared in the commands the error made the server
    skip."""
    if not any(q.savepoint for q in batch):
        cursors = [await _send(conn, q) for q in batch]
        return [await _rows(cur) for cur in cursors]
    results: list[Rows] = []
    for query in batch:
        if not query.savepoint:
            results.append(await _rows(await _send(conn, query)))
            continue
        await _in_transaction(conn, pipe)
        try:
            async with conn.transaction():
                results.append(await _rows(await _send(conn, query)))
        except psycopg.Error as exc:
            return _translate(exc)
    return results


async def _in_transaction(conn: Conn, pipe: Pipe | None) -> None:
    """Make sure psycopg knows the flow's transaction is open before it nests a savepoint in
    it. The flow's BEGIN was queued in the pipeline, and psycopg reads a transaction's state
    only from the server's answer to a sync: until then it takes the connection for idle, and
    its `transaction()` would send a BEGIN of its own (a warning, ignored) and, on leaving,
    a COMMIT that ends the flow's transaction half-way."""
    if pipe is not None and conn.info.transaction_status != TransactionStatus.INTRANS:
        await pipe.sync()
    if conn.info.transaction_status != TransactionStatus.INTRANS:
        raise RuntimeError(
            f"a savepoint outside the flow's transaction ({conn.info.transaction_status.name})"
        )


async def _command(conn: Conn, command: bytes) -> None:
    """A statement of transaction control (sent as it is: PostgreSQL does not prepare
    them); in pipeline mode it is queued with the rest."""
    await conn.execute(command, prepare=False)


async def _steps(
    conn: Conn, pipe: Pipe | None, flow: Flow[T]
) -> tuple[T | None, list[Cursor | None] | None]:
    """Run a flow's queries in the transaction open on `conn` (in pipeline mode when `pipe`
    is given): its result, or the cursors of the queries it left to be read after the commit
    (`Query.after_commit`)."""
    try:
        batch = next(flow)
        while True:
            if batch and all(q.after_commit for q in batch):
                return None, [await _send(conn, q) for q in batch]
            results = await _run(conn, pipe, batch)
            batch = flow.throw(results) if isinstance(results, StoreError) else flow.send(results)
    except StopIteration as stop:
        return stop.value, None


async def _drive(conn: Conn, pipe: Pipe, flow: Flow[T], wake: Wakeups) -> T:
    """Run a flow as one transaction on `conn` in pipeline mode, notifying its wake-ups
    before the commit; queries left to be read after the commit go with the COMMIT.

    BEGIN and COMMIT are queued with the flow's queries, and the COMMIT's outcome is read
    with one sync: psycopg's `transaction()` in pipeline mode syncs on entering and leaving
    its block besides, two more round trips (and their wake-ups) per transaction."""
    try:
        await _command(conn, b"BEGIN")
        result, deferred = await _steps(conn, pipe, flow)
        await _notify(conn, wake)
        await _command(conn, b"COMMIT")
        await pipe.sync()
    except BaseException:
        await _abandon(conn, pipe)
        raise
    if deferred is None:
        return result  # type: ignore[return-value]
    try:
        flow.send([await _rows(cur) for cur in deferred])
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    raise RuntimeError("a flow went on after the queries it read after the commit")


async def _abandon(conn: Conn, pipe: Pipe) -> None:
    """Roll back the transaction of a flow that failed, or was cancelled before its COMMIT
    was read (a COMMIT the server ran stays: the caller is told of the cancellation, not of
    the outcome, as of a connection lost then). psycopg's `rollback()`, not a ROLLBACK
    statement: it also forgets the statements psycopg took for prepared in the commands the
    error made the server skip, which would otherwise fail on that connection from then on."""
    if conn.broken or conn.closed:
        return
    with contextlib.suppress(psycopg.Error):
        with contextlib.suppress(psycopg.Error):
            await pipe.sync()  # the commands after an error were skipped: end them
        await conn.rollback()


class _PostgresTransaction(Transaction):
    def __init__(self, store: Store, conn: Conn) -> None:
        super().__init__(store)
        self._conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        try:
            # Without parameters the text is sent as it is (no `%` placeholder parsing).
            await self._conn.execute(sql, params or None)
        except psycopg.Error as exc:
            raise _translate(exc) from exc

    async def _run(self, flow: FlowFn[T]) -> T:
        try:
            result, deferred = await _steps(self._conn, None, flow(self.wake))
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        assert deferred is None, "a flow of the application's transaction reads after commit"
        return result  # type: ignore[return-value]
