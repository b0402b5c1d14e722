"""The server store: PostgreSQL through psycopg 3, for any number of machines.

A pool of autocommit connections; each Store method is one transaction, sent in pipeline
mode so that its statements share round trips. Batches go in one statement per kind, with
the batch as arrays (`unnest`), so that their cost is one statement whatever their size.
Claims skip rows other claimers hold (`FOR UPDATE SKIP LOCKED`). Every time comes from the
database clock: deadlines are computed in SQL and `remaining` seconds are read from it.

Wake-ups cross processes with LISTEN/NOTIFY: writes notify inside their transaction (so the
notifications are delivered on commit, and only then), and `listen` forwards what other
processes notify to this store's notifier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import psycopg
from psycopg.adapt import Dumper
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool

from .._json import loads
from ..errors import ConfigurationError, SchemaVersionError, StoreError
from ..states import FINISHED_TASK_STATES, StepState, TaskState, expiry_error, next_after_expiry
from . import _sql
from .base import (
    CHANNEL_OUTBOX,
    CHANNEL_REQUESTS,
    CHANNEL_RESULTS,
    CHANNEL_TASK_DONE,
    CHANNEL_TASKS,
    DURATION_BUCKETS,
    SCAN,
    ActionOutcome,
    Activity,
    ActivityBucket,
    AgentBeat,
    AgentInstance,
    ClaimedTask,
    DispatchedStep,
    EventRecord,
    Expired,
    LeaseRecord,
    NewTask,
    OperatorAction,
    OpLimit,
    OutboxMessage,
    Request,
    RequestHandback,
    StepDispatch,
    StepOutcome,
    StepRecord,
    StepStats,
    StepSwept,
    Store,
    TaskOutcome,
    TaskRecord,
    Transaction,
    action_detail,
    pick_within_limits,
    plan_action,
    step_key,
)

logger = logging.getLogger("stepwarden.store.postgres")

T = TypeVar("T")
Q = _sql.queries("postgres")
Conn = psycopg.AsyncConnection[Any]

CONNECT_TIMEOUT = 10.0
"""Seconds allowed to reach the server when opening the store."""
DEFAULT_POOL_SIZE = 10
STALLED = 5.0
"""Seconds a transaction may wait on its client, and a statement may wait for a lock. Every
transaction of the store is a few statements long; a client frozen mid-transaction (stopped,
swapped out, a stalled VM) would otherwise keep its row locks, among them the supervisor's
lease row during a sweep, for as long as it is frozen. The server ends such a transaction
when it sits idle (`idle_in_transaction_session_timeout`); one frozen in the middle of a
pipeline looks busy to the server, and the supervisors end it (`end_stalled_sessions`).
Waiting for a lock longer than this fails (`lock_timeout`) and the caller tries again. Set
libpq's `options` in the store URL to choose other values."""
NOTIFY_LIMIT = 7000
"""Bytes per notification payload (PostgreSQL refuses 8000 and more)."""

PG_CHANNELS = {
    CHANNEL_TASKS: "stepwarden_tasks",
    CHANNEL_REQUESTS: "stepwarden_requests",
    CHANNEL_RESULTS: "stepwarden_results",
    CHANNEL_TASK_DONE: "stepwarden_task_done",
    CHANNEL_OUTBOX: "stepwarden_outbox",  # sent by the outbox triggers
}
_FROM_PG = {pg: local for local, pg in PG_CHANNELS.items()}
_OPTIONS = {"pool_size"}
"""Query parameters of the store URL that are stepwarden's, not libpq's."""


def task_record(row: DictRow) -> TaskRecord:
    return TaskRecord(
        task_id=row["task_id"],
        workflow=row["workflow"],
        input=loads(row["input"]),
        process_state=TaskState(row["process_state"]),
        locked_by=row["locked_by"],
        complete_by=row["complete_by"],
        failure_count=row["failure_count"],
        max_failures=row["max_failures"],
        attempt=row["attempt"],
        priority=row["priority"],
        complete_within=row["complete_within"],
        result=loads(row["result"]),
        error=row["error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
        on_failure=row["on_failure"],
        reply_to=row["reply_to"],
    )


def step_record(row: DictRow) -> StepRecord:
    return StepRecord(
        task_id=row["task_id"],
        seq=row["seq"],
        name=row["name"],
        agent=row["agent"],
        operation=row["operation"],
        state=StepState(row["state"]),
        attempt=row["attempt"],
        task_attempt=row["task_attempt"],
        complete_by=row["complete_by"],
        idempotency_key=row["idempotency_key"],
        input=loads(row["input"]),
        result=loads(row["result"]),
        error=row["error"],
        locked_by=row["locked_by"],
        tries=row["tries"],
        created_at=row["created_at"],
        claimed_at=row["claimed_at"],
        finished_at=row["finished_at"],
        compensation=row["compensation"],
        compensation_input=loads(row["compensation_input"]),
        compensates=row["compensates"],
        reassignments=row["reassignments"],
        heartbeat=loads(row["heartbeat"]),
        heartbeat_at=row["heartbeat_at"],
        limit_key=row["limit_key"],
    )


def _request(r: DictRow) -> Request:
    return Request(
        task_id=r["task_id"],
        seq=r["seq"],
        attempt=r["attempt"],
        agent=r["agent"],
        operation=r["operation"],
        input=loads(r["input"]),
        idempotency_key=r["idempotency_key"],
        complete_by=r["complete_by"],
        remaining=r["remaining"],
        compensates=r["compensates"],
    )


def _message(row: DictRow) -> OutboxMessage:
    return OutboxMessage(
        id=row["id"],
        channel=row["channel"],
        task_id=row["task_id"],
        kind=row["kind"],
        detail=loads(row["detail"]),
        at=row["at"],
        attempts=row["attempts"],
        delivered_to=tuple(loads(row["delivered_to"])),
    )


def _first_of_each(items: Sequence[T], key: Callable[[T], Hashable]) -> list[int]:
    """Positions of the first item of each key. Batches send only those: a later duplicate
    could only fail its fence once the first one has applied, as it does one at a time."""
    seen: set[Hashable] = set()
    keep = []
    for i, item in enumerate(items):
        k = key(item)
        if k not in seen:
            seen.add(k)
            keep.append(i)
    return keep


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


class _Notices:
    """Notifications to send in a transaction, and to publish locally after its commit."""

    def __init__(self) -> None:
        self.remote: list[tuple[str, str]] = []
        self.local: list[tuple[str, list[str]]] = []

    def tasks(self) -> None:
        self.remote.append((PG_CHANNELS[CHANNEL_TASKS], ""))
        self.local.append((CHANNEL_TASKS, [""]))

    def requests(self, agents: Sequence[str]) -> None:
        self.remote.extend((PG_CHANNELS[CHANNEL_REQUESTS], a) for a in _chunks_each(agents))
        self.local.append((CHANNEL_REQUESTS, list(agents)))

    def listed(self, channel: str, payloads: Sequence[str]) -> None:
        self.remote.extend((PG_CHANNELS[channel], p) for p in _chunks(payloads))
        self.local.append((channel, list(payloads)))

    async def send(self, conn: Conn) -> None:
        if self.remote:
            await conn.execute(
                Q["notify"],
                {
                    "channel": [c for c, _ in self.remote],
                    "payload": [p for _, p in self.remote],
                },
            )

    def publish(self, store: Store) -> None:
        for channel, payloads in self.local:
            store.notifier.publish(channel, payloads)


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
        super().__init__()
        self.url = url
        self.conninfo, self.pool_size, self.connect_kwargs = self._parse(url)
        self.application_name = str(
            self.connect_kwargs.get("application_name")
            or conninfo_to_dict(self.conninfo).get("application_name")
            or ""
        )
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._listen_first: Conn | None = None
        """The listener's first connection until its task runs and takes it over."""
        self._own_pids: set[int] = set()

    @staticmethod
    def _parse(url: str) -> tuple[str, int, dict[str, Any]]:
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
        conninfo = urlunsplit(parts._replace(query=urlencode(rest)))
        kwargs: dict[str, Any] = {}
        names = {k for k, _ in rest}
        if "connect_timeout" not in names:
            kwargs["connect_timeout"] = int(CONNECT_TIMEOUT)
        if "application_name" not in names:
            kwargs["application_name"] = "stepwarden"
        if "options" not in names:
            ms = int(STALLED * 1000)
            kwargs["options"] = f"-c idle_in_transaction_session_timeout={ms} -c lock_timeout={ms}"
        return conninfo, pool_size, kwargs

    def _where(self) -> str:
        """Where the server is, for messages (never the password)."""
        try:
            info = conninfo_to_dict(self.conninfo)
        except psycopg.Error:
            return "the configured server"
        host = info.get("host") or "localhost"
        port = info.get("port") or "5432"
        return f"{host}:{port}/{info.get('dbname') or info.get('user') or ''}"

    # -- plumbing -------------------------------------------------------------------------
    async def _configure(self, conn: Conn) -> None:
        # json comes back as its text, decoded by stepwarden's own (orjson) loads.
        conn.adapters.register_loader("json", TextLoader)
        conn.adapters.register_dumper(list, _ArrayLiteral)
        self._own_pids.add(conn.info.backend_pid)

    def _require(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        if self._pool is None:
            raise StoreError("the store is not open")
        return self._pool

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        """A pooled autocommit connection; psycopg's errors become StoreError."""
        pool = self._require()
        try:
            async with pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL error: {exc}") from exc

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Conn]:
        """One transaction in pipeline mode: statements are sent without waiting, and a
        round trip happens only when a result is read, and at commit."""
        async with self._connection() as conn, conn.pipeline(), conn.transaction():
            yield conn

    @staticmethod
    async def _rows(conn: Conn, query: str, params: dict[str, Any]) -> list[DictRow]:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(query, params)
        return await cur.fetchall()

    @staticmethod
    async def _queue(
        conn: Conn, query: str, params: dict[str, Any]
    ) -> psycopg.AsyncCursor[DictRow]:
        """Send a statement; its rows are read later (in pipeline mode, without a wait)."""
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(query, params)
        return cur

    async def _read(
        self, query: str, params: dict[str, Any], *, prepare: bool | None = None
    ) -> list[DictRow]:
        """One statement in autocommit: its own transaction, one round trip."""
        async with self._connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query, params, prepare=prepare)
            return await cur.fetchall()

    # -- lifecycle ------------------------------------------------------------------------
    async def open(self, *, migrate: bool = True) -> None:
        if self._pool is not None:
            return
        where = self._where()
        # A direct first connection reports an unreachable server at once and clearly;
        # the pool would only keep retrying in the background.
        try:
            probe = await psycopg.AsyncConnection.connect(
                self.conninfo, autocommit=True, **self.connect_kwargs
            )
            await probe.close()
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to PostgreSQL at {where}: {exc}") from exc
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            self.conninfo,
            min_size=1,
            max_size=self.pool_size,
            kwargs={"autocommit": True, **self.connect_kwargs},
            configure=self._configure,
            open=False,
            name="stepwarden",
        )
        try:
            await pool.open(wait=True, timeout=CONNECT_TIMEOUT)
        except psycopg.Error as exc:
            await pool.close()
            raise StoreError(f"cannot connect to PostgreSQL at {where}: {exc}") from exc
        except BaseException:
            await pool.close()
            raise
        self._pool = pool
        try:
            if migrate:
                await self.migrate()
            await self._check_version()
        except BaseException:
            await self.close()
            raise

    async def _check_version(self) -> None:
        found, known = await self.schema_version(), _sql.latest_version(self.dialect)
        if found > known:
            raise SchemaVersionError(
                f"the database schema is at version {found}, newer than this stepwarden "
                f"understands ({known}); upgrade stepwarden"
            )
        if found < known:
            raise SchemaVersionError(
                f"the database schema is at version {found}, older than this stepwarden "
                f"needs ({known}); run `stepwarden migrate`"
            )

    async def close(self) -> None:
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
            await cur.execute(Q["schema_table_exists"])
            row = await cur.fetchone()
            if row is None or not row["present"]:
                return 0
            await cur.execute(Q["schema_version"])
            row = await cur.fetchone()
            return int(row["version"]) if row else 0

    async def migrate(self) -> int:
        # The advisory lock makes concurrent migrations wait for each other; the second
        # then finds the work done. Each migration runs in this one transaction.
        async with self._connection() as conn, conn.transaction():
            await conn.execute(Q["migration_lock"])
            await conn.execute(Q["create_schema_table"])
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(Q["schema_version"])
            row = await cur.fetchone()
            current = int(row["version"]) if row else 0
            for m in _sql.migrations(self.dialect):
                if m.version > current:
                    # No parameters: the script may hold several statements.
                    await conn.execute(m.sql.encode(), prepare=False)
                    await conn.execute(
                        Q["record_migration"], {"version": m.version, "name": m.name}
                    )
                    current = m.version
            return current

    # -- the application ------------------------------------------------------------------
    async def submit(self, tasks: Sequence[NewTask]) -> list[bool]:
        if not tasks:
            return []
        notices = _Notices()
        async with self._transaction() as conn:
            created = await _insert_tasks(conn, tasks)
            if any(created):
                notices.tasks()
                await notices.send(conn)
        notices.publish(self)
        return created

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        notices = _Notices()
        async with self._connection() as conn, conn.transaction():
            tx = _PostgresTransaction(conn)
            yield tx
            if tx.created:
                notices.tasks()
                await notices.send(conn)
        notices.publish(self)

    async def get_task(self, task_id: str) -> TaskRecord | None:
        rows = await self._read(Q["get_task"], {"task_id": task_id})
        return task_record(rows[0]) if rows else None

    async def get_steps(self, task_id: str) -> list[StepRecord]:
        return [step_record(r) for r in await self._read(Q["get_steps"], {"task_id": task_id})]

    async def list_tasks(
        self, *, state: TaskState | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        params = {
            "state": None if state is None else str(state),
            "workflow": workflow,
            "limit": limit,
        }
        # Unprepared, so that each call is planned for the filters it actually has.
        return [task_record(r) for r in await self._read(Q["list_tasks"], params, prepare=False)]

    async def count_tasks(self) -> dict[TaskState, int]:
        counts = {s: 0 for s in TaskState}
        for row in await self._read(Q["count_tasks"], {}):
            counts[TaskState(row["process_state"])] = int(row["n"])
        return counts

    async def record_events(self, events: Sequence[tuple[str | None, str, Any]]) -> None:
        if not events:
            return
        params = {
            "task_id": [e[0] for e in events],
            "kind": [e[1] for e in events],
            "detail": [orjson.dumps(e[2]).decode() for e in events],
        }
        async with self._connection() as conn:
            await conn.execute(Q["insert_events"], params)

    async def events(
        self, *, task_id: str | None = None, kind: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        params = {"task_id": task_id, "kind": kind, "limit": limit}
        return [
            EventRecord(
                id=r["id"],
                task_id=r["task_id"],
                at=r["at"],
                kind=r["kind"],
                detail=loads(r["detail"]),
            )
            for r in await self._read(Q["events"], params, prepare=False)
        ]

    # -- the scheduler --------------------------------------------------------------------
    # -- the outbox -----------------------------------------------------------------------
    async def outbox(
        self,
        *,
        channel: str | None = None,
        task_id: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[OutboxMessage]:
        params = {"channel": channel, "task_id": task_id, "after": after, "limit": limit}
        return [_message(r) for r in await self._read(Q["outbox_read"], params, prepare=False)]

    async def due_alerts(self, limit: int) -> list[OutboxMessage]:
        return [_message(r) for r in await self._read(Q["outbox_due"], {"limit": limit})]

    async def record_delivery(
        self, message_id: int, delivered_to: Sequence[str], *, done: bool, retry_in: float
    ) -> None:
        params = {
            "id": message_id,
            "delivered_to": orjson.dumps(list(delivered_to)).decode(),
            "done": done,
            "retry_in": float(retry_in),
        }
        async with self._connection() as conn:
            await conn.execute(Q["outbox_delivered"], params)

    # -- retention ------------------------------------------------------------------------
    async def purge(self, older_than: float, limit: int) -> int:
        params = {"older_than": float(older_than), "limit": limit}
        return len(await self._read(Q["purge"], params))

    # -- the operator ---------------------------------------------------------------------
    async def operate(self, actions: Sequence[OperatorAction]) -> list[ActionOutcome]:
        outcomes: list[ActionOutcome] = []
        notices = _Notices()
        async with self._transaction() as conn:
            for action in actions:
                outcomes.append(await self._operate(conn, action))
            moved = {o.after for o in outcomes if o.applied}
            if moved & {TaskState.PENDING, TaskState.COMPENSATING}:
                notices.tasks()
            if moved & FINISHED_TASK_STATES:
                notices.listed(CHANNEL_TASK_DONE, [o.task_id for o in outcomes if o.applied])
            skipped = [
                step_key(a.task_id, a.seq)
                for a, o in zip(actions, outcomes, strict=True)
                if o.applied and a.action == "skip" and a.seq is not None
            ]
            if skipped:
                notices.listed(CHANNEL_RESULTS, skipped)
            await notices.send(conn)
        notices.publish(self)
        return outcomes

    async def _operate(self, conn: Conn, action: OperatorAction) -> ActionOutcome:
        rows = await self._rows(conn, Q["op_read_task"], {"task_id": action.task_id})
        if not rows:
            return ActionOutcome(
                task_id=action.task_id,
                applied=False,
                before=None,
                after=None,
                message=f"no task {action.task_id!r}",
            )
        before = TaskState(rows[0]["process_state"])
        plan = plan_action(action, before)
        if isinstance(plan, str):
            return ActionOutcome(
                task_id=action.task_id, applied=False, before=before, after=before, message=plan
            )
        if action.action == "skip":
            params: dict[str, Any] = {
                "task_id": action.task_id,
                "seq": action.seq,
                "result": action.result,
            }
            if not await self._rows(conn, Q["op_skip_step"], params):
                return ActionOutcome(
                    task_id=action.task_id,
                    applied=False,
                    before=before,
                    after=before,
                    message=f"task {action.task_id!r} has no step {action.seq} left to complete",
                )
        else:
            await conn.execute(
                Q["op_move_task"],
                {
                    "task_id": action.task_id,
                    "from": str(before),
                    "attempt": rows[0]["attempt"],
                    "to": str(plan.after),
                    "reset_failures": plan.reset_failures,
                    "wait_open": plan.wait_open,
                    "final": plan.final,
                },
            )
            if plan.close_open:
                await conn.execute(
                    Q["op_close_open_steps"], {"task_id": action.task_id, "state": str(plan.after)}
                )
            if plan.reopen is not None:
                await conn.execute(
                    Q["op_reopen_steps"],
                    {"task_id": action.task_id, "compensations": plan.reopen},
                )
        detail = orjson.dumps(action_detail(action, plan)).decode()
        await conn.execute(Q["op_event"], {"task_id": action.task_id, "detail": detail})
        return ActionOutcome(
            task_id=action.task_id, applied=True, before=before, after=plan.after, message="done"
        )

    async def claim_tasks(
        self, scheduler: str, workflows: Sequence[str], limit: int
    ) -> list[ClaimedTask]:
        if limit <= 0 or not workflows:
            return []
        params = {"scheduler": scheduler, "workflows": list(workflows), "limit": limit}
        steps: psycopg.AsyncCursor[DictRow] | None = None
        async with self._transaction() as conn:
            rows = await self._rows(conn, Q["claim_tasks"], params)
            if rows:
                # Sent with the COMMIT; the pipeline's final sync receives its rows, which
                # are then read below without touching the connection again.
                ids = [r["task_id"] for r in rows]
                steps = await self._queue(conn, Q["steps_of_tasks"], {"task_ids": ids})
        if not rows:
            return []
        by_task: dict[str, list[StepRecord]] = {}
        if steps is not None:
            try:
                for s in await steps.fetchall():
                    by_task.setdefault(s["task_id"], []).append(step_record(s))
            except psycopg.Error as exc:  # pragma: no cover - the rows are already here
                raise StoreError(f"PostgreSQL error: {exc}") from exc
        rows.sort(key=lambda r: (-r["priority"], r["created_at"]))
        return [
            ClaimedTask(
                task=task_record(r),
                steps=by_task.get(r["task_id"], []),
                remaining=r["remaining"],
            )
            for r in rows
        ]

    async def dispatch_steps(self, batch: Sequence[StepDispatch]) -> list[DispatchedStep | None]:
        out: list[DispatchedStep | None] = [None] * len(batch)
        if not batch:
            return out
        new = [i for i, d in enumerate(batch) if d.kind == "new"]
        again = [i for i, d in enumerate(batch) if d.kind == "redispatch"]
        adopt = [i for i, d in enumerate(batch) if d.kind == "adopt"]

        # New steps are deduplicated in SQL; for the others, the first of identical fences.
        def fenced(d: StepDispatch) -> Hashable:
            return (d.task_id, d.seq, d.expected_attempt, d.task_attempt, d.scheduler)

        again = [again[j] for j in _first_of_each([batch[i] for i in again], fenced)]
        adopt = [adopt[j] for j in _first_of_each([batch[i] for i in adopt], fenced)]
        notices = _Notices()
        async with self._transaction() as conn:
            # The statements go together; their results come back in one round trip.
            cursors: list[psycopg.AsyncCursor[DictRow]] = []
            if new:
                ds = [batch[i] for i in new]
                params: dict[str, Any] = {
                    "task_id": [d.task_id for d in ds],
                    "seq": [d.seq for d in ds],
                    "task_attempt": [d.task_attempt for d in ds],
                    "scheduler": [d.scheduler for d in ds],
                    "name": [d.name for d in ds],
                    "agent": [d.agent for d in ds],
                    "operation": [d.operation for d in ds],
                    "priority": [d.priority for d in ds],
                    "complete_within": [float(d.complete_within) for d in ds],
                    "idempotency_key": [f"{d.task_id}/{d.seq}" for d in ds],
                    "input": [d.input for d in ds],
                    "ord": new,
                    "compensation": [d.compensation for d in ds],
                    "compensation_input": [d.compensation_input for d in ds],
                    "compensates": [d.compensates for d in ds],
                    "pickup_within": [d.pickup_within for d in ds],
                    "total_within": [d.total_within for d in ds],
                    "limit_key": [d.limit_key for d in ds],
                }
                cursors.append(await self._queue(conn, Q["dispatch_new"], params))
            for kind, positions in (("redispatch", again), ("adopt", adopt)):
                if not positions:
                    continue
                ds = [batch[i] for i in positions]
                params = {
                    "task_id": [d.task_id for d in ds],
                    "seq": [d.seq for d in ds],
                    "task_attempt": [d.task_attempt for d in ds],
                    "scheduler": [d.scheduler for d in ds],
                    "expected_attempt": [d.expected_attempt for d in ds],
                    "ord": positions,
                }
                if kind == "redispatch":
                    params["complete_within"] = [float(d.complete_within) for d in ds]
                query = Q["dispatch_again"] if kind == "redispatch" else Q["dispatch_adopt"]
                cursors.append(await self._queue(conn, query, params))
            for cur in cursors:
                for r in await cur.fetchall():
                    i = r["ord"]
                    out[i] = DispatchedStep(
                        task_id=batch[i].task_id,
                        seq=batch[i].seq,
                        attempt=r["attempt"],
                        remaining=r["remaining"],
                    )
            agents = sorted(
                {d.agent for d, o in zip(batch, out, strict=True) if o and d.kind != "adopt"}
            )
            if agents:
                notices.requests(agents)
                await notices.send(conn)
        notices.publish(self)
        return out

    async def finished_steps(self, keys: Sequence[tuple[str, int]]) -> list[StepRecord]:
        if not keys:
            return []
        params = {"task_id": [k[0] for k in keys], "seq": [k[1] for k in keys]}
        return [step_record(r) for r in await self._read(Q["finished_steps"], params)]

    async def read_step(self, task_id: str, seq: int) -> tuple[StepRecord, float] | None:
        rows = await self._read(Q["read_step"], {"task_id": task_id, "seq": seq})
        return (step_record(rows[0]), float(rows[0]["remaining"])) if rows else None

    async def finish_tasks(self, batch: Sequence[TaskOutcome]) -> list[bool]:
        if not batch:
            return []
        keep = _first_of_each(batch, lambda o: (o.task_id, o.attempt, o.scheduler))
        os_ = [batch[i] for i in keep]
        params = {
            "task_id": [o.task_id for o in os_],
            "attempt": [o.attempt for o in os_],
            "scheduler": [o.scheduler for o in os_],
            "state": [str(o.state) for o in os_],
            "held_as": [str(o.held_as) for o in os_],
            "result": [o.result for o in os_],
            "error": [o.error for o in os_],
            "ord": keep,
        }
        notices = _Notices()
        async with self._transaction() as conn:
            rows = await self._rows(conn, Q["finish_tasks"], params)
            applied = {r["ord"]: TaskState(r["process_state"]) for r in rows}
            done = [i in applied for i in range(len(batch))]
            ids = [o.task_id for o, ok in zip(batch, done, strict=True) if ok]
            if ids:
                notices.listed(CHANNEL_TASK_DONE, ids)
            if TaskState.COMPENSATING in applied.values():
                notices.tasks()
            if ids:
                await notices.send(conn)
        notices.publish(self)
        return done

    # -- the agents -----------------------------------------------------------------------
    async def claim_requests(
        self,
        instance: str,
        agent: str,
        operations: Sequence[str],
        limit: int,
        limits: Mapping[str, OpLimit] | None = None,
    ) -> list[Request]:
        if limit <= 0 or not operations:
            return []
        limits = {op: lim for op, lim in (limits or {}).items() if op in operations}
        params: dict[str, Any] = {"agent": agent, "operations": list(operations)}
        if limits:
            rows = await self._claim_limited(instance, params, limits, limit)
        else:
            params.update(instance=instance, limit=limit)
            rows = await self._read(Q["claim_requests"], params)
        rows.sort(key=lambda r: (-r["priority"], r["dispatched_at"]))
        return [_request(r) for r in rows]

    async def _claim_limited(
        self, instance: str, params: dict[str, Any], limits: dict[str, OpLimit], limit: int
    ) -> list[DictRow]:
        rated = {op: lim.per for op, lim in limits.items() if lim.rate is not None}
        async with self._transaction() as conn:
            await conn.execute(Q["limits_lock"], {"agent": params["agent"]})
            found = await self._queue(conn, Q["limited_candidates"], {**params, "scan": SCAN})
            running = await self._queue(conn, Q["running_counts"], params)
            started = await self._queue(
                conn,
                Q["start_counts"],
                {"agent": params["agent"], "rated": list(rated), "per": list(rated.values())},
            )
            candidates = await found.fetchall()
            chosen = pick_within_limits(
                [(r["operation"], r["limit_key"]) for r in candidates],
                limits,
                {(r["operation"], r["limit_key"]): r["n"] for r in await running.fetchall()},
                {(r["operation"], r["limit_key"]): r["n"] for r in await started.fetchall()},
                limit,
            )
            if not chosen:
                return []
            picked = [candidates[i] for i in chosen]
            return await self._rows(
                conn,
                Q["claim_chosen"],
                {
                    "task_id": [r["task_id"] for r in picked],
                    "seq": [r["seq"] for r in picked],
                    "instance": instance,
                    "rated": list(rated),
                },
            )

    async def hand_back(self, batch: Sequence[RequestHandback]) -> list[bool]:
        if not batch:
            return []
        params = {
            "task_id": [h.task_id for h in batch],
            "seq": [h.seq for h in batch],
            "attempt": [h.attempt for h in batch],
            "instance": [h.agent_instance for h in batch],
            "reason": [h.reason for h in batch],
            "ord": list(range(len(batch))),
        }
        notices = _Notices()
        async with self._transaction() as conn:
            rows = await self._rows(conn, Q["hand_back"], params)
            if rows:
                notices.requests(sorted({r["agent"] for r in rows}))
                await notices.send(conn)
        notices.publish(self)
        back = {r["ord"] for r in rows}
        return [i in back for i in range(len(batch))]

    async def heartbeat_step(
        self, task_id: str, seq: int, attempt: int, instance: str, detail: str | None
    ) -> float | None:
        params = {
            "task_id": task_id,
            "seq": seq,
            "attempt": attempt,
            "instance": instance,
            "detail": detail,
        }
        rows = await self._read(Q["heartbeat_step"], params)
        return float(rows[0]["remaining"]) if rows else None

    async def beat(self, beats: Sequence[AgentBeat], ttl: float) -> None:
        if not beats:
            return
        params = {
            "instance": [b.instance for b in beats],
            "agent": [b.agent for b in beats],
            "operations": [orjson.dumps(list(b.operations)).decode() for b in beats],
            "capacity": [b.capacity for b in beats],
            "inflight": [b.inflight for b in beats],
            "breaker": [b.breaker for b in beats],
            "breaker_detail": [orjson.dumps(b.breaker_detail).decode() for b in beats],
            "ttl": float(ttl),
        }
        async with self._connection() as conn:
            await conn.execute(Q["agent_beat"], params)

    async def leave(self, instance: str, agents: Sequence[str]) -> None:
        async with self._connection() as conn:
            await conn.execute(Q["agent_leave"], {"instance": instance, "agents": list(agents)})

    async def agent_room(self) -> int | None:
        [row] = await self._read(Q["agent_room"], {})
        return None if row["capacity"] is None else int(row["capacity"] - row["open"])

    async def list_agents(self) -> list[AgentInstance]:
        return [
            AgentInstance(
                instance=r["instance"],
                agent=r["agent"],
                operations=tuple(loads(r["operations"])),
                capacity=r["capacity"],
                inflight=r["inflight"],
                breaker=r["breaker"],
                breaker_detail=loads(r["breaker_detail"]),
                started_at=r["started_at"],
                heartbeat_at=r["heartbeat_at"],
                expires_at=r["expires_at"],
                alive=r["alive"],
            )
            for r in await self._read(Q["list_agents"], {})
        ]

    async def complete_steps(self, batch: Sequence[StepOutcome]) -> list[bool]:
        if not batch:
            return []
        keep = _first_of_each(batch, lambda o: (o.task_id, o.seq, o.attempt, o.agent_instance))
        os_ = [batch[i] for i in keep]
        params = {
            "task_id": [o.task_id for o in os_],
            "seq": [o.seq for o in os_],
            "attempt": [o.attempt for o in os_],
            "instance": [o.agent_instance for o in os_],
            "state": [str(o.state) for o in os_],
            "result": [o.result for o in os_],
            "error": [o.error for o in os_],
            "tries": [o.tries for o in os_],
            "ord": keep,
        }
        notices = _Notices()
        async with self._transaction() as conn:
            applied = {r["ord"] for r in await self._rows(conn, Q["complete_steps"], params)}
            done = [i in applied for i in range(len(batch))]
            keys = [step_key(o.task_id, o.seq) for o, ok in zip(batch, done, strict=True) if ok]
            if keys:
                notices.listed(CHANNEL_RESULTS, keys)
                await notices.send(conn)
        notices.publish(self)
        return done

    # -- the supervisor -------------------------------------------------------------------
    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        rows = await self._read(
            Q["acquire_lease"], {"name": name, "holder": holder, "ttl": float(ttl)}
        )
        return int(rows[0]["term"]) if rows else None

    async def end_stalled_sessions(self) -> int:
        rows = await self._read(
            Q["end_stalled_sessions"],
            {"application_name": self.application_name, "stalled": STALLED},
        )
        ended = [r["pid"] for r in rows if r["ended"]]
        if ended:
            logger.warning(
                "ended %d session(s) stalled for over %.0f s mid-transaction (backend pids %s)",
                len(ended),
                STALLED,
                ", ".join(map(str, ended)),
            )
        return len(ended)

    async def release_lease(self, name: str, holder: str) -> None:
        async with self._connection() as conn:
            await conn.execute(Q["release_lease"], {"name": name, "holder": holder})

    async def sweep(
        self,
        *,
        lease: str,
        holder: str,
        term: int,
        limit: int,
        backoff_initial: float,
        backoff_maximum: float,
    ) -> list[Expired]:
        if limit <= 0:
            return []
        expired: list[Expired] = []
        notices = _Notices()
        async with self._transaction() as conn:
            # The lease row stays locked until commit: a takeover waits for this sweep.
            held = await self._queue(
                conn, Q["lock_lease"], {"name": lease, "holder": holder, "term": term}
            )
            steps = await self._queue(conn, Q["expired_steps"], {"limit": limit})
            tasks = await self._queue(conn, Q["expired_tasks"], {"limit": limit})
            if not await held.fetchall():
                return []
            found: dict[str, DictRow] = {}
            for r in [*await steps.fetchall(), *await tasks.fetchall()]:
                found.setdefault(r["task_id"], r)
            rows = list(found.values())[:limit]
            if not rows:
                return []
            ids = [r["task_id"] for r in rows]
            compensable = {
                r["task_id"] for r in await self._rows(conn, Q["compensable"], {"task_ids": ids})
            }
            plans = [
                next_after_expiry(
                    TaskState(r["process_state"]),
                    r["on_failure"],
                    r["failure_count"] + 1,
                    r["max_failures"],
                    r["task_id"] in compensable,
                )
                for r in rows
            ]
            counts = [r["failure_count"] + 1 for r in rows]
            params = {
                "task_id": [r["task_id"] for r in rows],
                "attempt": [r["attempt"] for r in rows],
                "seq": [r["seq"] for r in rows],
                "held_as": [r["process_state"] for r in rows],
                "state": [str(p[0]) for p in plans],
                "failure_count": [p[1] for p in plans],
                "count": counts,
                "error": [
                    expiry_error(n, r["seq"]) if p[2] else None
                    for r, p, n in zip(rows, plans, counts, strict=True)
                ],
                "backoff": [
                    min(backoff_maximum, backoff_initial * 2 ** min(n - 1, 60)) for n in counts
                ],
                "finished": [p[0] in FINISHED_TASK_STATES for p in plans],
                "alert": [
                    (
                        None
                        if not p[2]
                        else "max_failures"
                        if r["process_state"] == TaskState.PROCESSING
                        else "compensation_failed"
                    )
                    for r, p in zip(rows, plans, strict=True)
                ],
                "ord": list(range(len(rows))),
                "holder": holder,
                "term": term,
            }
            for r in await self._rows(conn, Q["reset_tasks"], params):
                expired.append(
                    Expired(
                        task_id=r["task_id"],
                        seq=r["seq"],
                        failure_count=r["failure_count"],
                        process_state=TaskState(r["process_state"]),
                    )
                )
            if any(e.process_state in (TaskState.PENDING, TaskState.COMPENSATING) for e in expired):
                notices.tasks()
            done = [e.task_id for e in expired if e.process_state in FINISHED_TASK_STATES]
            if done:
                notices.listed(CHANNEL_TASK_DONE, done)
            await notices.send(conn)
        notices.publish(self)
        return expired

    async def sweep_steps(
        self, *, lease: str, holder: str, term: int, limit: int, forget_after: float
    ) -> list[StepSwept]:
        if limit <= 0:
            return []
        notices = _Notices()
        params = {
            "limit": limit,
            "holder": holder,
            "term": term,
            "forget_after": float(forget_after),
        }
        async with self._transaction() as conn:
            held = await self._queue(
                conn, Q["lock_lease"], {"name": lease, "holder": holder, "term": term}
            )
            if not await held.fetchall():
                return []
            rows = await self._rows(conn, Q["sweep_steps"], params)
            swept = [
                StepSwept(
                    task_id=r["task_id"],
                    seq=r["seq"],
                    kind=r["kind"],
                    agent=r["agent"],
                    instance=r["locked_by"],
                )
                for r in rows
            ]
            agents = sorted({s.agent for s in swept if s.kind == "reassigned"})
            if agents:
                notices.requests(agents)
                notices.tasks()
            failed = [step_key(s.task_id, s.seq) for s in swept if s.kind != "reassigned"]
            if failed:
                notices.listed(CHANNEL_RESULTS, failed)
            await notices.send(conn)
        notices.publish(self)
        return swept

    # -- wake-ups -------------------------------------------------------------------------
    async def listen(self) -> None:
        """Forward the notifications of other processes to this store's notifier, from now
        on: the first connection is made before returning (StoreError when it fails), and
        a lost one is made again in the background, waiting 0.1 s, doubling up to 5 s."""
        if self._listener is not None:
            return
        self._require()
        try:
            conn = await self._listen_connect()
        except psycopg.Error as exc:
            raise StoreError(f"cannot listen for notifications: {exc}") from exc
        if self._listener is not None:  # another call won the race meanwhile
            await conn.close()
            return
        self._listen_first = conn
        self._listener = asyncio.create_task(self._listen_loop(conn), name="stepwarden-listen")

    async def _listen_connect(self) -> Conn:
        conn = await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, **self.connect_kwargs
        )
        try:
            await conn.execute("; ".join(f"LISTEN {c}" for c in PG_CHANNELS.values()).encode())
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _listen_loop(self, conn: Conn | None) -> None:
        self._listen_first = None  # closed by this loop from now on
        delay = 0.1
        while True:
            try:
                if conn is None:
                    conn = await self._listen_connect()
                    delay = 0.1
                    logger.info("listening for notifications again")
                async for n in conn.notifies():
                    # This process published its own writes already, at their commit.
                    channel = _FROM_PG.get(n.channel)
                    if n.pid in self._own_pids and channel != CHANNEL_OUTBOX:
                        continue
                    if channel is not None:
                        self.notifier.publish(channel, n.payload.split("\n"))
            except (psycopg.Error, OSError) as exc:
                logger.warning("notifications lost (%s); reconnecting in %.1f s", exc, delay)
            except Exception:
                logger.exception("notifications lost; reconnecting in %.1f s", delay)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
                    conn = None
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)

    # -- the dashboard --------------------------------------------------------------------
    async def find_tasks(
        self,
        *,
        state: TaskState | None = None,
        workflow: str | None = None,
        search: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        params = {
            "state": None if state is None else str(state),
            "workflow": workflow,
            "search": search or None,
            "limit": limit,
        }
        rows = await self._read(Q["find_tasks"], params, prepare=False)
        return [task_record(r) for r in rows]

    async def workflow_names(self) -> list[str]:
        return [r["workflow"] for r in await self._read(Q["workflow_names"], {})]

    async def newest_outbox(self, *, channel: str, limit: int) -> list[OutboxMessage]:
        params = {"channel": channel, "limit": limit}
        return [_message(r) for r in await self._read(Q["newest_outbox"], params)]

    async def oldest_pending_age(self) -> float | None:
        [row] = await self._read(Q["oldest_pending"], {})
        return None if row["age"] is None else max(0.0, float(row["age"]))

    async def read_lease(self, name: str) -> LeaseRecord | None:
        rows = await self._read(Q["read_lease"], {"name": name})
        if not rows:
            return None
        row = rows[0]
        return LeaseRecord(
            name=row["name"],
            holder=row["holder"],
            term=int(row["term"]),
            expires_at=row["expires_at"],
            remaining=float(row["remaining"]),
            since_renewed=row["since_renewed"],
        )

    async def activity(self, *, window: float, bucket: float) -> Activity:
        rows = await self._read(Q["activity"], {"window": float(window), "bucket": float(bucket)})
        buckets = [
            ActivityBucket(
                start=datetime.fromtimestamp(r["b"] * bucket, UTC),
                processed=r["processed"],
                failed=r["failed"],
            )
            for r in rows
            if r["b"] is not None
        ]
        return Activity(now=rows[0]["now"], bucket=bucket, buckets=buckets)

    async def step_stats(self) -> list[StepStats]:
        return [
            StepStats(
                agent=r["agent"],
                operation=r["operation"],
                started=r["started"],
                completed=r["completed"],
                failed=r["failed"],
                reassignments=int(r["reassignments"] or 0),
                retried=int(r["retried"] or 0),
                duration_buckets=tuple(int(r[f"b{i}"] or 0) for i in range(len(DURATION_BUCKETS))),
                duration_sum=float(r["duration_sum"]),
            )
            for r in await self._read(Q["step_stats"], {})
        ]

    async def count_events(self, kind: str) -> int:
        [row] = await self._read(Q["count_events"], {"kind": kind})
        return int(row["n"])


async def _insert_tasks(conn: Conn, tasks: Sequence[NewTask]) -> list[bool]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        Q["insert_tasks"],
        {
            "task_id": [t.task_id for t in tasks],
            "workflow": [t.workflow for t in tasks],
            "input": [t.input for t in tasks],
            "priority": [t.priority for t in tasks],
            "complete_within": [float(t.complete_within) for t in tasks],
            "max_failures": [t.max_failures for t in tasks],
            "on_failure": [t.on_failure for t in tasks],
            "reply_to": [t.reply_to for t in tasks],
        },
    )
    inserted = {r["task_id"] for r in await cur.fetchall()}
    created = []
    for t in tasks:
        # A task_id given twice is created once, by its first occurrence.
        created.append(t.task_id in inserted)
        inserted.discard(t.task_id)
    return created


class _PostgresTransaction(Transaction):
    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self.created = False

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        try:
            # Without parameters the text is sent as it is (no `%` placeholder parsing).
            await self._conn.execute(sql, params or None)
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL error: {exc}") from exc

    async def submit(self, tasks: Sequence[NewTask]) -> list[bool]:
        if not tasks:
            return []
        try:
            created = await _insert_tasks(self._conn, tasks)
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL error: {exc}") from exc
        self.created = self.created or any(created)
        return created
