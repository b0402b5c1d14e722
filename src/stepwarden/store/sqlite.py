"""The embedded store: SQLite in WAL mode, for one machine and any number of processes.

One connection per Store, used from one thread: each Store method runs as a single
transaction in that thread, so a call costs one thread hop, not one per statement. Writes
take the database lock up front (`BEGIN IMMEDIATE`), which makes each claim exclusive across
processes. Times come from this machine's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs, urlsplit

import orjson

from .._json import loads
from ..errors import ConfigurationError, SchemaVersionError, StoreError
from ..states import (
    FINISHED_TASK_STATES,
    StepState,
    TaskState,
    expiry_error,
    next_after_expiry,
)
from . import _sql
from .base import (
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
    pickup_error,
    plan_action,
    step_key,
    total_error,
)

T = TypeVar("T")
Q = _sql.queries("sqlite")
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL", "extra": "EXTRA"}


def _dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _dt_required(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def task_record(row: sqlite3.Row) -> TaskRecord:
    return TaskRecord(
        task_id=row["task_id"],
        workflow=row["workflow"],
        input=loads(row["input"]),
        process_state=TaskState(row["process_state"]),
        locked_by=row["locked_by"],
        complete_by=_dt(row["complete_by"]),
        failure_count=row["failure_count"],
        max_failures=row["max_failures"],
        attempt=row["attempt"],
        priority=row["priority"],
        complete_within=row["complete_within"],
        result=loads(row["result"]),
        error=row["error"],
        created_at=_dt_required(row["created_at"]),
        updated_at=_dt_required(row["updated_at"]),
        finished_at=_dt(row["finished_at"]),
        on_failure=row["on_failure"],
        reply_to=row["reply_to"],
    )


def step_record(row: sqlite3.Row) -> StepRecord:
    return StepRecord(
        task_id=row["task_id"],
        seq=row["seq"],
        name=row["name"],
        agent=row["agent"],
        operation=row["operation"],
        state=StepState(row["state"]),
        attempt=row["attempt"],
        task_attempt=row["task_attempt"],
        complete_by=_dt_required(row["complete_by"]),
        idempotency_key=row["idempotency_key"],
        input=loads(row["input"]),
        result=loads(row["result"]),
        error=row["error"],
        locked_by=row["locked_by"],
        tries=row["tries"],
        created_at=_dt_required(row["created_at"]),
        claimed_at=_dt(row["claimed_at"]),
        finished_at=_dt(row["finished_at"]),
        compensation=row["compensation"],
        compensation_input=loads(row["compensation_input"]),
        compensates=row["compensates"],
        reassignments=row["reassignments"],
        heartbeat=loads(row["heartbeat"]),
        heartbeat_at=_dt(row["heartbeat_at"]),
        limit_key=row["limit_key"],
    )


def _request(r: sqlite3.Row, now: float) -> Request:
    return Request(
        task_id=r["task_id"],
        seq=r["seq"],
        attempt=r["attempt"],
        agent=r["agent"],
        operation=r["operation"],
        input=loads(r["input"]),
        idempotency_key=r["idempotency_key"],
        complete_by=_dt_required(r["complete_by"]),
        remaining=r["complete_by"] - now,
        compensates=r["compensates"],
    )


def _insert_tasks(conn: sqlite3.Connection, tasks: Sequence[NewTask], now: float) -> list[bool]:
    created = []
    for t in tasks:
        cur = conn.execute(
            Q["insert_task"],
            {
                "task_id": t.task_id,
                "workflow": t.workflow,
                "input": t.input,
                "priority": t.priority,
                "complete_within": t.complete_within,
                "max_failures": t.max_failures,
                "on_failure": t.on_failure,
                "reply_to": t.reply_to,
                "now": now,
            },
        )
        created.append(cur.rowcount == 1)
    return created


def _event(
    conn: sqlite3.Connection, task_id: str | None, kind: str, detail: Any, now: float
) -> None:
    conn.execute(
        Q["insert_event"],
        {"task_id": task_id, "kind": kind, "detail": orjson.dumps(detail).decode(), "now": now},
    )


class SQLiteStore(Store):
    dialect = "sqlite"
    default_poll_interval = 0.05

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.path, self.synchronous = self._parse(url)
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = asyncio.Lock()

    @staticmethod
    def _parse(url: str) -> tuple[str, str]:
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
        unknown = set(options) - {"synchronous"}
        if unknown:
            raise ConfigurationError(
                f"unknown SQLite store option(s): {', '.join(sorted(unknown))}"
            )
        sync = options.get("synchronous", "full").lower()
        if sync not in _SYNCHRONOUS:
            raise ConfigurationError(f"synchronous must be one of {', '.join(_SYNCHRONOUS)}")
        return path, _SYNCHRONOUS[sync]

    # -- plumbing -------------------------------------------------------------------------
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
        conn.row_factory = sqlite3.Row
        # Switching a new file to WAL does not wait on the busy handler: when another process
        # opens the same new file at the same moment, try again for a while.
        for delay in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 0.0):
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError:
                if not delay:
                    raise
                time.sleep(delay)
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None or self._executor is None:
            raise StoreError("the store is not open")
        conn = self._conn
        async with self._lock:
            loop = asyncio.get_running_loop()
            try:
                return await loop.run_in_executor(self._executor, fn, conn)
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite error: {exc}") from exc

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def tx(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return await self._run(tx)

    # -- lifecycle ------------------------------------------------------------------------
    async def open(self, *, migrate: bool = True) -> None:
        if self._conn is not None:
            return
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="stepwarden-sqlite")
        loop = asyncio.get_running_loop()
        try:
            self._conn = await loop.run_in_executor(self._executor, self._connect, migrate)
        except sqlite3.Error as exc:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise StoreError(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise
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
        if self._conn is None or self._executor is None:
            return
        conn, executor = self._conn, self._executor
        self._conn = None
        self._executor = None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(executor, conn.close)
        executor.shutdown(wait=True)

    async def schema_version(self) -> int:
        def read(conn: sqlite3.Connection) -> int:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'stepwarden_schema'"
            ).fetchone()
            if not exists:
                return 0
            row = conn.execute("SELECT max(version) FROM stepwarden_schema").fetchone()
            return int(row[0] or 0)

        return await self._run(read)

    async def migrate(self) -> int:
        def apply(conn: sqlite3.Connection) -> int:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS stepwarden_schema "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            current = conn.execute("SELECT max(version) FROM stepwarden_schema").fetchone()[0] or 0
            for m in _sql.migrations(self.dialect):
                if m.version > current:
                    for statement in _statements(m.sql):
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO stepwarden_schema VALUES (?, ?, ?)",
                        (m.version, m.name, time.time()),
                    )
                    current = m.version
            return int(current)

        return await self._write(apply)

    # -- the application ------------------------------------------------------------------
    async def submit(self, tasks: Sequence[NewTask]) -> list[bool]:
        created = await self._write(lambda conn: _insert_tasks(conn, tasks, time.time()))
        if any(created):
            self.notifier.publish(CHANNEL_TASKS, [""])
        return created

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        if self._conn is None or self._executor is None:
            raise StoreError("the store is not open")
        async with self._lock:
            tx = _SQLiteTransaction(self._conn, self._executor)
            await tx.run(lambda conn: conn.execute("BEGIN IMMEDIATE"))
            try:
                yield tx
            except BaseException:
                await tx.run(lambda conn: conn.execute("ROLLBACK"))
                raise
            await tx.run(lambda conn: conn.execute("COMMIT"))
        if tx.created:
            self.notifier.publish(CHANNEL_TASKS, [""])

    async def get_task(self, task_id: str) -> TaskRecord | None:
        def read(conn: sqlite3.Connection) -> TaskRecord | None:
            row = conn.execute(Q["get_task"], {"task_id": task_id}).fetchone()
            return task_record(row) if row else None

        return await self._run(read)

    async def get_steps(self, task_id: str) -> list[StepRecord]:
        def read(conn: sqlite3.Connection) -> list[StepRecord]:
            return [step_record(r) for r in conn.execute(Q["get_steps"], {"task_id": task_id})]

        return await self._run(read)

    async def list_tasks(
        self, *, state: TaskState | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        def read(conn: sqlite3.Connection) -> list[TaskRecord]:
            sql = "SELECT * FROM stepwarden_tasks WHERE 1 = 1"
            params: list[Any] = []
            if state is not None:
                sql += " AND process_state = ?"
                params.append(str(state))
            if workflow is not None:
                sql += " AND workflow = ?"
                params.append(workflow)
            sql += " ORDER BY created_at, task_id LIMIT ?"
            params.append(limit)
            return [task_record(r) for r in conn.execute(sql, params)]

        return await self._run(read)

    async def count_tasks(self) -> dict[TaskState, int]:
        def read(conn: sqlite3.Connection) -> dict[TaskState, int]:
            counts = {s: 0 for s in TaskState}
            for row in conn.execute(Q["count_tasks"]):
                counts[TaskState(row["process_state"])] = row["n"]
            return counts

        return await self._run(read)

    async def record_events(self, events: Sequence[tuple[str | None, str, Any]]) -> None:
        def write(conn: sqlite3.Connection) -> None:
            now = time.time()
            for task_id, kind, detail in events:
                _event(conn, task_id, kind, detail, now)

        if events:
            await self._write(write)

    async def events(
        self, *, task_id: str | None = None, kind: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        def read(conn: sqlite3.Connection) -> list[EventRecord]:
            sql = "SELECT * FROM stepwarden_events WHERE 1 = 1"
            params: list[Any] = []
            if task_id is not None:
                sql += " AND task_id = ?"
                params.append(task_id)
            if kind is not None:
                sql += " AND kind = ?"
                params.append(kind)
            sql += " ORDER BY id LIMIT ?"
            params.append(limit)
            return [
                EventRecord(
                    id=r["id"],
                    task_id=r["task_id"],
                    at=_dt_required(r["at"]),
                    kind=r["kind"],
                    detail=loads(r["detail"]),
                )
                for r in conn.execute(sql, params)
            ]

        return await self._run(read)

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

        def read(conn: sqlite3.Connection) -> list[OutboxMessage]:
            return [_message(r) for r in conn.execute(Q["outbox_read"], params)]

        return await self._run(read)

    async def due_alerts(self, limit: int) -> list[OutboxMessage]:
        def read(conn: sqlite3.Connection) -> list[OutboxMessage]:
            rows = conn.execute(Q["outbox_due"], {"now": time.time(), "limit": limit})
            return [_message(r) for r in rows]

        return await self._run(read)

    async def record_delivery(
        self, message_id: int, delivered_to: Sequence[str], *, done: bool, retry_in: float
    ) -> None:
        params = {
            "id": message_id,
            "delivered_to": orjson.dumps(list(delivered_to)).decode(),
            "done": done,
            "retry_in": retry_in,
            "now": time.time(),
        }
        await self._write(lambda conn: conn.execute(Q["outbox_delivered"], params))

    # -- retention ------------------------------------------------------------------------
    async def purge(self, older_than: float, limit: int) -> int:
        def purge(conn: sqlite3.Connection) -> int:
            params = {"before": time.time() - older_than, "limit": limit}
            ids = [r["task_id"] for r in conn.execute(Q["purge_pick"], params)]
            if ids:
                listed = {"task_ids": orjson.dumps(ids).decode()}
                for query in ("purge_events", "purge_outbox", "purge_tasks"):
                    conn.execute(Q[query], listed)
            return len(ids)

        return await self._write(purge)

    # -- the operator ---------------------------------------------------------------------
    async def operate(self, actions: Sequence[OperatorAction]) -> list[ActionOutcome]:
        def apply(conn: sqlite3.Connection) -> list[ActionOutcome]:
            now = time.time()
            return [_operate(conn, a, now) for a in actions]

        outcomes = await self._write(apply)
        moved = {o.after for o in outcomes if o.applied}
        if moved & {TaskState.PENDING, TaskState.COMPENSATING}:
            self.notifier.publish(CHANNEL_TASKS, [""])
        if moved & FINISHED_TASK_STATES:
            self.notifier.publish(CHANNEL_TASK_DONE, [o.task_id for o in outcomes if o.applied])
        skipped = [
            step_key(a.task_id, a.seq)
            for a, o in zip(actions, outcomes, strict=True)
            if o.applied and a.action == "skip" and a.seq is not None
        ]
        if skipped:
            self.notifier.publish(CHANNEL_RESULTS, skipped)
        return outcomes

    # -- the scheduler --------------------------------------------------------------------
    async def claim_tasks(
        self, scheduler: str, workflows: Sequence[str], limit: int
    ) -> list[ClaimedTask]:
        names = orjson.dumps(list(workflows)).decode()

        def peek(conn: sqlite3.Connection) -> bool:
            return bool(
                conn.execute(Q["any_pending"], {"now": time.time(), "workflows": names}).fetchone()
            )

        if limit <= 0 or not await self._run(peek):
            return []

        def claim(conn: sqlite3.Connection) -> list[ClaimedTask]:
            now = time.time()
            rows = conn.execute(
                Q["claim_tasks"],
                {"scheduler": scheduler, "now": now, "workflows": names, "limit": limit},
            ).fetchall()
            if not rows:
                return []
            ids = orjson.dumps([r["task_id"] for r in rows]).decode()
            steps: dict[str, list[StepRecord]] = {}
            for s in conn.execute(Q["steps_of_tasks"], {"task_ids": ids}):
                steps.setdefault(s["task_id"], []).append(step_record(s))
            claimed = []
            for r in sorted(rows, key=lambda r: (-r["priority"], r["created_at"])):
                task = task_record(r)
                claimed.append(
                    ClaimedTask(
                        task=task,
                        steps=steps.get(task.task_id, []),
                        remaining=r["complete_by"] - now,
                    )
                )
            return claimed

        return await self._write(claim)

    async def dispatch_steps(self, batch: Sequence[StepDispatch]) -> list[DispatchedStep | None]:
        def dispatch(conn: sqlite3.Connection) -> list[DispatchedStep | None]:
            now = time.time()
            out: list[DispatchedStep | None] = []
            for d in batch:
                params: dict[str, Any] = {
                    "task_id": d.task_id,
                    "seq": d.seq,
                    "task_attempt": d.task_attempt,
                    "scheduler": d.scheduler,
                    "complete_within": d.complete_within,
                    "now": now,
                }
                if d.kind == "new":
                    params.update(
                        name=d.name,
                        agent=d.agent,
                        operation=d.operation,
                        priority=d.priority,
                        idempotency_key=f"{d.task_id}/{d.seq}",
                        input=d.input,
                        compensation=d.compensation,
                        compensation_input=d.compensation_input,
                        compensates=d.compensates,
                        pickup_within=d.pickup_within,
                        total_within=d.total_within,
                        limit_key=d.limit_key,
                    )
                    row = conn.execute(Q["dispatch_new"], params).fetchone()
                else:
                    params["expected_attempt"] = d.expected_attempt
                    query = Q["dispatch_again"] if d.kind == "redispatch" else Q["dispatch_adopt"]
                    row = conn.execute(query, params).fetchone()
                out.append(
                    DispatchedStep(
                        task_id=d.task_id,
                        seq=d.seq,
                        attempt=row["attempt"],
                        remaining=row["complete_by"] - now,
                    )
                    if row
                    else None
                )
            return out

        out = await self._write(dispatch)
        agents = sorted(
            {d.agent for d, o in zip(batch, out, strict=True) if o and d.kind != "adopt"}
        )
        if agents:
            self.notifier.publish(CHANNEL_REQUESTS, agents)
        return out

    async def finished_steps(self, keys: Sequence[tuple[str, int]]) -> list[StepRecord]:
        def read(conn: sqlite3.Connection) -> list[StepRecord]:
            found: list[StepRecord] = []
            for i in range(0, len(keys), 500):
                chunk = orjson.dumps([list(k) for k in keys[i : i + 500]]).decode()
                found.extend(
                    step_record(r) for r in conn.execute(Q["finished_steps"], {"keys": chunk})
                )
            return found

        return await self._run(read) if keys else []

    async def read_step(self, task_id: str, seq: int) -> tuple[StepRecord, float] | None:
        def read(conn: sqlite3.Connection) -> tuple[StepRecord, float] | None:
            now = time.time()
            row = conn.execute(Q["read_step"], {"task_id": task_id, "seq": seq}).fetchone()
            return None if row is None else (step_record(row), row["complete_by"] - now)

        return await self._run(read)

    async def finish_tasks(self, batch: Sequence[TaskOutcome]) -> list[bool]:
        def finish(conn: sqlite3.Connection) -> list[TaskState | None]:
            now = time.time()
            done: list[TaskState | None] = []
            for o in batch:
                compensable = o.state == TaskState.ERROR and _compensable(conn, o.task_id)
                row = conn.execute(
                    Q["finish_task"],
                    {
                        "task_id": o.task_id,
                        "attempt": o.attempt,
                        "scheduler": o.scheduler,
                        "state": str(o.state),
                        "held_as": str(o.held_as),
                        "compensable": compensable,
                        "result": o.result,
                        "error": o.error,
                        "now": now,
                    },
                ).fetchone()
                if row is None:
                    done.append(None)
                    continue
                state = TaskState(row["process_state"])
                _close_open_steps(conn, o.task_id, state, now)
                if o.state in (TaskState.ERROR, TaskState.COMPENSATION_FAILED):
                    reason = "task_error" if o.state == TaskState.ERROR else str(o.state)
                    detail = {"reason": reason, "error": o.error, "then": str(state)}
                    _event(conn, o.task_id, "alert", detail, now)
                done.append(state)
            return done

        states = await self._write(finish)
        ids = [o.task_id for o, st in zip(batch, states, strict=True) if st is not None]
        if ids:
            self.notifier.publish(CHANNEL_TASK_DONE, ids)
        if TaskState.COMPENSATING in states:
            self.notifier.publish(CHANNEL_TASKS, [""])
        return [st is not None for st in states]

    # -- the agents -----------------------------------------------------------------------
    async def claim_requests(
        self,
        instance: str,
        agent: str,
        operations: Sequence[str],
        limit: int,
        limits: Mapping[str, OpLimit] | None = None,
    ) -> list[Request]:
        limits = {op: lim for op, lim in (limits or {}).items() if op in operations}
        ops = orjson.dumps(list(operations)).decode()

        def peek(conn: sqlite3.Connection) -> bool:
            params = {"agent": agent, "operations": ops, "now": time.time()}
            return bool(conn.execute(Q["any_request"], params).fetchone())

        if limit <= 0 or not operations or not await self._run(peek):
            return []

        def claim(conn: sqlite3.Connection) -> list[Request]:
            now = time.time()
            params = {"instance": instance, "agent": agent, "operations": ops, "now": now}
            rows = conn.execute(Q["claim_requests"], {**params, "limit": limit}).fetchall()
            rows.sort(key=lambda r: (-r["priority"], r["dispatched_at"]))
            return [_request(r, now) for r in rows]

        def claim_limited(conn: sqlite3.Connection) -> list[Request]:
            # BEGIN IMMEDIATE makes this claim exclusive: the counts hold until commit.
            now = time.time()
            params = {"agent": agent, "operations": ops, "now": now}
            found = conn.execute(Q["limited_candidates"], {**params, "scan": SCAN}).fetchall()
            running = {
                (r["operation"], r["limit_key"]): r["n"]
                for r in conn.execute(Q["running_counts"], params)
            }
            started: dict[tuple[str, str], int] = {}
            for op, lim in limits.items():
                if lim.rate is not None:
                    q = {"agent": agent, "operation": op, "since": now - lim.per}
                    conn.execute(Q["forget_starts"], q)
                    for r in conn.execute(Q["start_counts"], q):
                        started[(op, r["limit_key"])] = r["n"]
            chosen = pick_within_limits(
                [(r["operation"], r["limit_key"]) for r in found], limits, running, started, limit
            )
            out = []
            for i in chosen:
                one = {"instance": instance, "task_id": found[i]["task_id"], "now": now}
                r = conn.execute(Q["claim_one"], {**one, "seq": found[i]["seq"]}).fetchone()
                if r is None:
                    continue
                rated = limits.get(r["operation"])
                if rated is not None and rated.rate is not None:
                    start = {"agent": agent, "operation": r["operation"], "now": now}
                    conn.execute(Q["record_start"], {**start, "limit_key": r["limit_key"] or ""})
                out.append(_request(r, now))
            return out

        return await self._write(claim_limited if limits else claim)

    async def hand_back(self, batch: Sequence[RequestHandback]) -> list[bool]:
        def hand_back(conn: sqlite3.Connection) -> list[str | None]:
            now = time.time()
            out: list[str | None] = []
            for h in batch:
                row = conn.execute(
                    Q["hand_back"],
                    {
                        "task_id": h.task_id,
                        "seq": h.seq,
                        "attempt": h.attempt,
                        "instance": h.agent_instance,
                        "now": now,
                    },
                ).fetchone()
                if row is not None:
                    detail = {
                        "seq": h.seq,
                        "attempt": h.attempt,
                        "from": h.agent_instance,
                        "reason": h.reason,
                    }
                    _event(conn, h.task_id, "handed_back", detail, now)
                out.append(None if row is None else row["agent"])
            return out

        agents = await self._write(hand_back) if batch else []
        if any(agents):
            self.notifier.publish(CHANNEL_REQUESTS, sorted({a for a in agents if a}))
        return [a is not None for a in agents]

    async def heartbeat_step(
        self, task_id: str, seq: int, attempt: int, instance: str, detail: str | None
    ) -> float | None:
        def beat(conn: sqlite3.Connection) -> float | None:
            now = time.time()
            row = conn.execute(
                Q["heartbeat_step"],
                {
                    "task_id": task_id,
                    "seq": seq,
                    "attempt": attempt,
                    "instance": instance,
                    "detail": detail,
                    "now": now,
                },
            ).fetchone()
            return None if row is None else float(row["complete_by"] - now)

        return await self._write(beat)

    async def beat(self, beats: Sequence[AgentBeat], ttl: float) -> None:
        def beat(conn: sqlite3.Connection) -> None:
            now = time.time()
            for b in beats:
                conn.execute(
                    Q["agent_beat"],
                    {
                        "instance": b.instance,
                        "agent": b.agent,
                        "operations": orjson.dumps(list(b.operations)).decode(),
                        "capacity": b.capacity,
                        "inflight": b.inflight,
                        "breaker": b.breaker,
                        "breaker_detail": orjson.dumps(b.breaker_detail).decode(),
                        "now": now,
                        "ttl": ttl,
                    },
                )

        if beats:
            await self._write(beat)

    async def leave(self, instance: str, agents: Sequence[str]) -> None:
        params = {
            "instance": instance,
            "agents": orjson.dumps(list(agents)).decode(),
            "now": time.time(),
        }
        await self._write(lambda conn: conn.execute(Q["agent_leave"], params))

    async def agent_room(self) -> int | None:
        def read(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(Q["agent_room"], {"now": time.time()}).fetchone()
            return None if row["capacity"] is None else int(row["capacity"] - row["open"])

        return await self._run(read)

    async def list_agents(self) -> list[AgentInstance]:
        def read(conn: sqlite3.Connection) -> list[AgentInstance]:
            rows = conn.execute(Q["list_agents"], {"now": time.time()}).fetchall()
            return [
                AgentInstance(
                    instance=r["instance"],
                    agent=r["agent"],
                    operations=tuple(loads(r["operations"])),
                    capacity=r["capacity"],
                    inflight=r["inflight"],
                    breaker=r["breaker"],
                    breaker_detail=loads(r["breaker_detail"]),
                    started_at=_dt_required(r["started_at"]),
                    heartbeat_at=_dt_required(r["heartbeat_at"]),
                    expires_at=_dt_required(r["expires_at"]),
                    alive=bool(r["alive"]),
                )
                for r in rows
            ]

        return await self._run(read)

    async def complete_steps(self, batch: Sequence[StepOutcome]) -> list[bool]:
        def complete(conn: sqlite3.Connection) -> list[bool]:
            now = time.time()
            done = []
            for o in batch:
                cur = conn.execute(
                    Q["complete_step"],
                    {
                        "task_id": o.task_id,
                        "seq": o.seq,
                        "attempt": o.attempt,
                        "instance": o.agent_instance,
                        "state": str(o.state),
                        "result": o.result,
                        "error": o.error,
                        "tries": o.tries,
                        "now": now,
                    },
                )
                ok = cur.rowcount == 1
                if ok and o.state == StepState.FAILED:
                    detail = {"seq": o.seq, "attempt": o.attempt, "error": o.error}
                    _event(conn, o.task_id, "step_failed", detail, now)
                done.append(ok)
            return done

        done = await self._write(complete)
        keys = [step_key(o.task_id, o.seq) for o, ok in zip(batch, done, strict=True) if ok]
        if keys:
            self.notifier.publish(CHANNEL_RESULTS, keys)
        return done

    # -- the supervisor -------------------------------------------------------------------
    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        def acquire(conn: sqlite3.Connection) -> int | None:
            now = time.time()
            row = conn.execute(Q["get_lease"], {"name": name}).fetchone()
            if row is None:
                term = 1
            elif row["holder"] == holder and row["expires_at"] > now:
                term = row["term"]
            elif row["expires_at"] <= now:
                term = row["term"] + 1
            else:
                return None
            conn.execute(
                Q["put_lease"],
                {"name": name, "holder": holder, "term": term, "expires_at": now + ttl, "now": now},
            )
            return int(term)

        return await self._write(acquire)

    async def release_lease(self, name: str, holder: str) -> None:
        await self._write(
            lambda conn: conn.execute(Q["release_lease"], {"name": name, "holder": holder})
        )

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
        def sweep(conn: sqlite3.Connection) -> list[Expired]:
            now = time.time()
            held = {"name": lease, "holder": holder, "term": term, "now": now}
            if not conn.execute(Q["holds_lease"], held).fetchone():
                return []
            found: dict[str, sqlite3.Row] = {}
            for query in ("expired_steps", "expired_tasks"):
                for r in conn.execute(Q[query], {"now": now, "limit": limit}):
                    found.setdefault(r["task_id"], r)
            rows = list(found.values())[:limit]
            by = {"by": holder, "term": term}
            return _reset(conn, rows, now, backoff_initial, backoff_maximum, by)

        expired = await self._write(sweep)
        if any(e.process_state in (TaskState.PENDING, TaskState.COMPENSATING) for e in expired):
            self.notifier.publish(CHANNEL_TASKS, [""])
        done = [e.task_id for e in expired if e.process_state in FINISHED_TASK_STATES]
        if done:
            self.notifier.publish(CHANNEL_TASK_DONE, done)
        return expired

    async def sweep_steps(
        self, *, lease: str, holder: str, term: int, limit: int, forget_after: float
    ) -> list[StepSwept]:
        def sweep(conn: sqlite3.Connection) -> list[StepSwept]:
            now = time.time()
            held = {"name": lease, "holder": holder, "term": term, "now": now}
            if not conn.execute(Q["holds_lease"], held).fetchone():
                return []
            swept: list[StepSwept] = []
            by = {"by": holder, "term": term}
            for r in conn.execute(Q["gone_holders"], {"now": now, "limit": limit}).fetchall():
                key = {"task_id": r["task_id"], "seq": r["seq"], "attempt": r["attempt"]}
                got = conn.execute(
                    Q["reassign_step"], {**key, "instance": r["locked_by"], "now": now}
                ).fetchone()
                if got is None:
                    continue
                release = {"task_id": r["task_id"], "task_attempt": r["task_attempt"], "now": now}
                conn.execute(Q["release_reassigned"], release)
                detail = {"seq": r["seq"], "attempt": got["attempt"], "from": r["locked_by"]}
                _event(conn, r["task_id"], "reassigned", {**detail, **by}, now)
                swept.append(_swept(r, "reassigned"))
            timed_out = [
                (r, "pickup", "not_started", pickup_error(r["pickup_within"]))
                for r in conn.execute(Q["pickup_expired"], {"now": now, "limit": limit})
            ] + [
                (r, "total", r["state"], total_error(r["total"], r["state"], r["attempt"]))
                for r in conn.execute(Q["give_up_expired"], {"now": now, "limit": limit})
            ]
            for r, kind, state, error in timed_out:
                key = {"task_id": r["task_id"], "seq": r["seq"], "attempt": r["attempt"]}
                fail = {**key, "state": state, "error": error, "now": now}
                cur = conn.execute(Q["fail_step"], fail)
                if cur.rowcount != 1:
                    continue
                detail = {"seq": r["seq"], "attempt": r["attempt"], "error": error}
                _event(conn, r["task_id"], "step_failed", {**detail, **by}, now)
                swept.append(_swept(r, kind))
            conn.execute(Q["forget_agents"], {"before": now - forget_after})
            return swept

        swept = await self._write(sweep)
        agents = sorted({s.agent for s in swept if s.kind == "reassigned"})
        if agents:
            self.notifier.publish(CHANNEL_REQUESTS, agents)
            self.notifier.publish(CHANNEL_TASKS, [""])
        failed = [step_key(s.task_id, s.seq) for s in swept if s.kind != "reassigned"]
        if failed:
            self.notifier.publish(CHANNEL_RESULTS, failed)
        return swept

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

        def read(conn: sqlite3.Connection) -> list[TaskRecord]:
            return [task_record(r) for r in conn.execute(Q["find_tasks"], params)]

        return await self._run(read)

    async def workflow_names(self) -> list[str]:
        def read(conn: sqlite3.Connection) -> list[str]:
            return [r["workflow"] for r in conn.execute(Q["workflow_names"])]

        return await self._run(read)

    async def newest_outbox(self, *, channel: str, limit: int) -> list[OutboxMessage]:
        params = {"channel": channel, "limit": limit}

        def read(conn: sqlite3.Connection) -> list[OutboxMessage]:
            return [_message(r) for r in conn.execute(Q["newest_outbox"], params)]

        return await self._run(read)

    async def oldest_pending_age(self) -> float | None:
        def read(conn: sqlite3.Connection) -> float | None:
            oldest = conn.execute(Q["oldest_pending"]).fetchone()["oldest"]
            return None if oldest is None else max(0.0, time.time() - oldest)

        return await self._run(read)

    async def read_lease(self, name: str) -> LeaseRecord | None:
        def read(conn: sqlite3.Connection) -> LeaseRecord | None:
            row = conn.execute(Q["read_lease"], {"name": name}).fetchone()
            if row is None:
                return None
            return LeaseRecord(
                name=row["name"],
                holder=row["holder"],
                term=row["term"],
                expires_at=_dt_required(row["expires_at"]),
                remaining=row["expires_at"] - time.time(),
                since_renewed=(
                    None if row["renewed_at"] is None else time.time() - row["renewed_at"]
                ),
            )

        return await self._run(read)

    async def activity(self, *, window: float, bucket: float) -> Activity:
        def read(conn: sqlite3.Connection) -> Activity:
            now = time.time()
            params = {"since": now - window, "bucket": bucket}
            buckets = [
                ActivityBucket(
                    start=_dt_required(r["b"] * bucket),
                    processed=r["processed"],
                    failed=r["failed"],
                )
                for r in conn.execute(Q["activity"], params)
            ]
            return Activity(now=_dt_required(now), bucket=bucket, buckets=buckets)

        return await self._run(read)

    async def step_stats(self) -> list[StepStats]:
        def read(conn: sqlite3.Connection) -> list[StepStats]:
            return [
                StepStats(
                    agent=r["agent"],
                    operation=r["operation"],
                    started=r["started"],
                    completed=r["completed"],
                    failed=r["failed"],
                    reassignments=int(r["reassignments"] or 0),
                    retried=int(r["retried"] or 0),
                    duration_buckets=tuple(
                        int(r[f"b{i}"] or 0) for i in range(len(DURATION_BUCKETS))
                    ),
                    duration_sum=float(r["duration_sum"]),
                )
                for r in conn.execute(Q["step_stats"])
            ]

        return await self._run(read)

    async def count_events(self, kind: str) -> int:
        def read(conn: sqlite3.Connection) -> int:
            return int(conn.execute(Q["count_events"], {"kind": kind}).fetchone()["n"])

        return await self._run(read)


def _swept(r: sqlite3.Row, kind: Literal["reassigned", "pickup", "total"]) -> StepSwept:
    return StepSwept(
        task_id=r["task_id"], seq=r["seq"], kind=kind, agent=r["agent"], instance=r["locked_by"]
    )


def _reset(
    conn: sqlite3.Connection,
    rows: list[sqlite3.Row],
    now: float,
    initial: float,
    maximum: float,
    by: dict[str, Any],
) -> list[Expired]:
    """Release or give up each expired task; its `expired` event names the supervisor (`by`)
    and the lease term it swept under."""
    expired = []
    for r in rows:
        count = r["failure_count"] + 1
        held_as = TaskState(r["process_state"])
        state, failure_count, alert = next_after_expiry(
            held_as, r["on_failure"], count, r["max_failures"], _compensable(conn, r["task_id"])
        )
        error = expiry_error(count, r["seq"]) if alert else None
        abandon = state != held_as and state not in (TaskState.PENDING, TaskState.PROCESSING)
        got = conn.execute(
            Q["reset_task"],
            {
                "task_id": r["task_id"],
                "attempt": r["attempt"],
                "held_as": str(held_as),
                "state": str(state),
                "failure_count": failure_count,
                "error": error,
                "now": now,
                "finished_at": now if state in FINISHED_TASK_STATES else None,
                "eligible_at": now + min(maximum, initial * 2 ** (count - 1)),
                "wait_open": abandon,
            },
        ).fetchone()
        if got is None:
            continue
        detail = {"seq": r["seq"], "attempt": r["attempt"], "failure_count": count, **by}
        _event(conn, r["task_id"], "expired", detail, now)
        if abandon:
            _close_open_steps(conn, r["task_id"], state, now)
        if alert:
            reason = "max_failures" if held_as == TaskState.PROCESSING else "compensation_failed"
            detail = {"reason": reason, "error": error, "then": str(state)}
            _event(conn, r["task_id"], "alert", detail, now)
        expired.append(
            Expired(task_id=r["task_id"], seq=r["seq"], failure_count=count, process_state=state)
        )
    return expired


def _message(row: sqlite3.Row) -> OutboxMessage:
    return OutboxMessage(
        id=row["id"],
        channel=row["channel"],
        task_id=row["task_id"],
        kind=row["kind"],
        detail=loads(row["detail"]),
        at=_dt_required(row["at"]),
        attempts=row["attempts"],
        delivered_to=tuple(loads(row["delivered_to"])),
    )


def _operate(conn: sqlite3.Connection, action: OperatorAction, now: float) -> ActionOutcome:
    row = conn.execute(Q["op_read_task"], {"task_id": action.task_id}).fetchone()
    if row is None:
        return ActionOutcome(
            task_id=action.task_id,
            applied=False,
            before=None,
            after=None,
            message=f"no task {action.task_id!r}",
        )
    before = TaskState(row["process_state"])
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
            "now": now,
        }
        if conn.execute(Q["op_skip_step"], params).fetchone() is None:
            return ActionOutcome(
                task_id=action.task_id,
                applied=False,
                before=before,
                after=before,
                message=f"task {action.task_id!r} has no step {action.seq} left to complete",
            )
    else:
        moved = conn.execute(
            Q["op_move_task"],
            {
                "task_id": action.task_id,
                "from": str(before),
                "attempt": row["attempt"],
                "to": str(plan.after),
                "reset_failures": plan.reset_failures,
                "wait_open": plan.wait_open,
                "final": plan.final,
                "now": now,
            },
        )
        assert moved.rowcount == 1  # read under the same write lock
        if plan.close_open:
            _close_open_steps(conn, action.task_id, plan.after, now)
        if plan.reopen is not None:
            reopen = {"task_id": action.task_id, "compensations": plan.reopen, "now": now}
            conn.execute(Q["op_reopen_steps"], reopen).fetchall()
    _event(conn, action.task_id, "operator", action_detail(action, plan), now)
    return ActionOutcome(
        task_id=action.task_id, applied=True, before=before, after=plan.after, message="done"
    )


def _compensable(conn: sqlite3.Connection, task_id: str) -> bool:
    return bool(conn.execute(Q["compensable"], {"task_id": task_id}).fetchone()[0])


def _close_open_steps(conn: sqlite3.Connection, task_id: str, state: TaskState, now: float) -> None:
    """A finished task leaves no request behind for an agent to claim."""
    params = {"task_id": task_id, "error": f"abandoned: the task is {state}", "now": now}
    conn.execute(Q["close_open_steps"], params)


def _statements(script: str) -> list[str]:
    """Split a migration script into statements; a trigger's body (BEGIN ... END;) stays
    whole. Comment lines are dropped."""
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


class _SQLiteTransaction(Transaction):
    def __init__(self, conn: sqlite3.Connection, executor: ThreadPoolExecutor) -> None:
        self._conn = conn
        self._executor = executor
        self.created = False

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, self._conn)
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite error: {exc}") from exc

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        await self.run(lambda conn: conn.execute(sql, params))

    async def submit(self, tasks: Sequence[NewTask]) -> list[bool]:
        created = await self.run(lambda conn: _insert_tasks(conn, tasks, time.time()))
        self.created = self.created or any(created)
        return created
