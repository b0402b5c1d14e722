"""The Store: the only door to the database.

Every method is one transaction. Writes that change a task or step state are conditional
updates naming the expected state and attempt (the fencing token), and report whether they
took effect. Methods that take a sequence apply a batch in a single commit, so that many
concurrent workflows share one commit (group commit).

The methods are written here once, whatever the database: reads as one named query and a
row mapper (`_rows.py`), writes as flows (`policy/`, a module per role) that decide with
the engine's rules (`rules.py`). A dialect (`sqlite.py`, `postgres.py`) is a driver: it
connects, runs named queries (`sql/<dialect>/queries.sql`), drives a flow in one
transaction, and carries the wake-ups to other processes where its database can.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import orjson

from .._aio import first
from .._batch import Batcher
from .._json import holds_secret, tags_text
from ..errors import (
    ConfigurationError,
    KeyringError,
    SchemaVersionError,
    TaskNotFound,
    TransientStoreError,
)
from ..records import (
    ActionOutcome,
    Activity,
    AgentBeat,
    AgentInstance,
    CallStop,
    ClaimedTask,
    DispatchedStep,
    EventBeyond,
    EventBounds,
    EventPage,
    EventRecord,
    Expired,
    LeaseRecord,
    LeaseTry,
    OperatorAction,
    OpLimit,
    OutboxMessage,
    ParkRequest,
    Redrive,
    RelayBacklog,
    Released,
    Request,
    RequestHandback,
    SchedulerBeat,
    ScheduleRecord,
    SchedulerInstance,
    ScheduleSpec,
    SendOutcome,
    StepDispatch,
    StepFacts,
    StepOutcome,
    StepRecord,
    StepStats,
    StepSwept,
    Submission,
    Submitted,
    SweepRound,
    TaskFacts,
    TaskFilter,
    TaskOutcome,
    TaskRecord,
    TenantWeight,
    TicksMade,
    VersionBacklog,
    WaitOutcome,
    WaitRecord,
    WaitRequest,
    Woke,
)
from ..retry import Backoff, retried, within_tries
from ..rules import await_first, await_next
from ..sealing import Keyring, input_digest
from ..states import StepState, TaskState
from . import _rows, _sql, policy, reseal
from ._flow import Flow, FlowFn, Query, Rows, Wakeups
from .reseal import Cursor, Round

T = TypeVar("T")
BEAT_GATHER = 0.01
"""Seconds the registry beats of one process wait for each other (`Store._beats`)."""
DIGEST_BATCH = 500
"""Tasks given their input's digest in one transaction, when a store is migrated."""
WHY_HELD_BY = 20
"""The tasks named, at most, as holding an operation's concurrency (`Store.why_facts`)."""


def _one(query: Query) -> Flow[Rows]:
    [rows] = yield [query]
    return rows


def _all(queries: list[Query]) -> Flow[list[Rows]]:
    return (yield queries)


class Subscription:
    """Wake-ups for one channel. Payloads pile up between waits; `wait` drains them."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._payloads: list[str] = []

    def push(self, payloads: Sequence[str]) -> None:
        self._payloads.extend(payloads)
        self._event.set()

    async def wait(self, timeout: float) -> list[str] | None:
        """Payloads received since the last call, or None when `timeout` passed first."""
        if not self._event.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._event.wait()
            except TimeoutError:
                return None
        self._event.clear()
        payloads, self._payloads = self._payloads, []
        return payloads


class Notifier:
    """In-process fan-out of wake-ups; stores feed it after each commit."""

    def __init__(self) -> None:
        self._subscribers: dict[str, list[Subscription]] = {}

    def subscribe(self, channel: str, sub: Subscription | None = None) -> Subscription:
        """A new subscription to `channel`, or `sub` (one that other notifiers feed too)."""
        sub = sub or Subscription()
        self._subscribers.setdefault(channel, []).append(sub)
        return sub

    def unsubscribe(self, channel: str, sub: Subscription) -> None:
        subs = self._subscribers.get(channel, [])
        if sub in subs:
            subs.remove(sub)

    def publish(self, channel: str, payloads: Sequence[str]) -> None:
        for sub in self._subscribers.get(channel, ()):
            sub.push(payloads)

    def publish_all(self, wake: Wakeups) -> None:
        for channel, payloads in wake.due:
            self.publish(channel, payloads)


class Transaction(abc.ABC):
    """An open transaction in which the application writes its own rows and submits tasks,
    so that both commit together or neither does."""

    def __init__(self, store: Store) -> None:
        self.wake = Wakeups()
        """The wake-ups owed once this transaction commits."""
        self.store = store

    @abc.abstractmethod
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one SQL statement of the application's own, in the driver's parameter style
        (`?` for SQLite, `%s` for PostgreSQL)."""

    @abc.abstractmethod
    async def _run(self, flow: FlowFn[T]) -> T:
        """Drive a flow inside this transaction."""

    async def submit(self, tasks: Sequence[Submission]) -> list[Submitted]:
        """Record tasks in this transaction: each created, or the same submit as the task of
        its id, or a conflict with it (`policy.submit`)."""
        self.store.refuse_plain(t.input for t in tasks)
        return await self._run(partial(policy.submit, tasks, self.store.keys))

    async def send_event(
        self,
        task_id: str,
        name: str,
        payload: str,
        event_id: str,
        bounds: EventBounds | None = None,
    ) -> SendOutcome | TaskState | EventBeyond | None:
        """Send an event in this transaction (see `Store.send_event`)."""
        self.store.refuse_plain([payload])
        event = (task_id, name, payload, event_id, bounds or EventBounds())
        return await self._run(partial(policy.send_event, *event))


class Store(abc.ABC):
    """The durable state store."""

    dialect: str
    default_poll_interval: float
    """Seconds between two reads of a poller whose wake-up did not come."""
    claim_gather: float = 0.0
    """Seconds a scheduler that drives more than one task lets pass between two claims when
    woken: the tasks submitted meanwhile are claimed, and their steps written, together.
    Where every commit waits for the one writer (SQLite), claiming each task as its wake-up
    comes would spend the writer on one task per transaction (tasks submitted one at a time
    went 0.6 times as fast as with polling alone); a scheduler with one task or none to
    drive claims at once, so that a task submitted alone starts at once."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.notifier = Notifier()
        self.lost_at = -math.inf
        """When (monotonic) this process last lost the server: a connection lost, or a probe
        refused while it was out of reach (a driver that can lose it says so)."""
        self._back: asyncio.Event | None = None
        """Set when the store answers again; the calls waiting to be tried again wait on it."""
        self.seals = False
        """Whether secrets are sealed in this store (it knows a key that sealed there):
        read when it opens."""
        self.keys: Keyring | None = None
        """The keyring this process seals and opens secrets with (`sealing`; set by the App
        that opens the store): None where it holds none. Records read carry it: their
        sealed secrets open when revealed."""
        self._beats: Batcher[Query, Rows] = Batcher(self._beat_group, gather=BEAT_GATHER)
        """The registry beats of this process's instances (its scheduler's and agents'),
        written together: one transaction per beat, however many instances beat."""
        self.read_only = False
        """Whether this store only reads (set before it opens, `open_one(read_only=True)`):
        the database refuses every write of its connections (SQLite: `query_only`;
        PostgreSQL: read-only transactions), it is never migrated, and a keyring is only
        checked against the store's checks, never recorded."""
        self.write_observer: Callable[[float], None] | None = None
        """Told the seconds each write transaction took, committed or not (a worker's
        metrics, `Metrics.observe_write`)."""

    # -- the driver -----------------------------------------------------------------------
    @abc.abstractmethod
    async def _fetch(self, query: Query) -> Rows:
        """The rows of one read query, in a transaction of its own."""

    @abc.abstractmethod
    async def _write(self, flow: FlowFn[T]) -> T:
        """Drive a flow in one transaction; on commit, deliver its wake-ups."""

    async def _read(self, query: Query) -> Rows:
        """`_fetch`, tried again after a transient failure (a connection lost, a server
        restarting): a read is always safe to repeat."""
        return await self._again_if_transient(lambda: self._fetch(query))

    async def _again_if_transient(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`, tried again (`retry.TRIES` times in all, a growing delay between, cut
        short when the store answers again) while it fails transiently. Only for calls that
        are safe to repeat."""
        return await retried(
            call,
            lambda _, failures: within_tries(failures),
            on=TransientStoreError,
            wait=self.wait_to_retry,
        )

    async def wait_to_retry(self, seconds: float, stop: asyncio.Event | None = None) -> None:
        """Wait before trying a store call again after a transient failure: `seconds`, or
        less, until the store answers again (a driver that can find the server out of reach
        probes it meanwhile, and says so at once: `_answered`), or until `stop` is set. A
        failure the server answers with (a lock timeout, a serialization failure) waits the
        whole delay."""
        if self._back is None:
            self._back = asyncio.Event()
        waits = [self._back.wait(), asyncio.sleep(seconds)]
        if stop is not None:
            waits.append(stop.wait())
        await first(*waits)

    def _answered(self) -> None:
        """The store answers again: every call waiting to be tried again goes now."""
        back, self._back = self._back, None
        if back is not None:
            back.set()

    def _wrote(self, started: float) -> None:
        """A write transaction begun at `started` (`time.perf_counter()`) has committed (a
        failed one is not timed: one that never reached the server would drag the figures
        down during an outage)."""
        if self.write_observer is not None:
            self.write_observer(time.perf_counter() - started)

    def _lost(self) -> None:
        """The server is out of reach, or was for a moment (said by the driver)."""
        self.lost_at = time.monotonic()

    async def _write_one(self, query: Query) -> Rows:
        """The rows of one write query (a batch query, or a script of the dialect's), in a
        transaction of its own; it wakes no one."""
        return await self._write(lambda wake: _one(query))

    async def _write_alone(self, flow: FlowFn[T]) -> T:
        """Drive a flow whose first query is its write, whose SQL sends the wake-ups it owes
        to other processes itself (PostgreSQL: `pg_notify` in the statement), or that owes
        none to them, and whose later queries may each be a statement of their own (a
        submit's read of the ids it found taken): as `_write`, where the dialect cannot run
        them as statements of their own."""
        return await self._write(flow)

    async def _read_one(self, query: str, /, **params: Any) -> Rows:
        return await self._read(Query(query, params))

    async def _worth_writing(self, query: str, /, **params: Any) -> bool:
        """Whether a claim may find work, read before its write transaction where writes
        wait for each other (SQLite: one writer at a time, so an empty claim would hold the
        lock for nothing). A store whose claims skip the rows others hold claims at once."""
        return True

    # -- lifecycle ------------------------------------------------------------------------
    @abc.abstractmethod
    async def open(self, *, migrate: bool = True) -> None:
        """Connect; apply pending migrations when `migrate`; check the schema version."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def migrate(self) -> int:
        """Apply pending migrations; return the schema version now in place."""

    @abc.abstractmethod
    async def schema_version(self) -> int:
        """The version of the schema in the database, 0 when none."""

    async def _ready(self, migrate: bool) -> None:
        """Once connected: migrate when asked, then check the schema version (closing the
        store when either fails)."""
        try:
            if migrate and self.read_only:
                raise ConfigurationError("a read-only store is not migrated")
            if migrate:
                await self.migrate()
            await self._check_version()
            if migrate:
                await self._fill_digests()
            if self.keys is not None:
                await self._check_keys(self.keys)
            self.seals = bool(await self.sealing_keys())
        except BaseException:
            await self.close()
            raise

    async def _check_keys(self, keys: Keyring) -> None:
        """The keyring against the store's checks: KeyringError when a key of an id the
        store knows is not the one that sealed there (a wrong key); the keyring's current
        key recorded, with its check, when the store does not know it yet."""
        known = {r["key_id"]: r["check_value"] for r in await self._read_one("sealing_keys")}
        if keys.current not in known and not self.read_only:
            check = keys.check()
            await self._write_one(
                Query("add_sealing_key", {"key_id": keys.current, "check_value": check})
            )
            known.update(
                {r["key_id"]: r["check_value"] for r in await self._read_one("sealing_keys")}
            )
        for key_id, check in known.items():
            keys.verify(key_id, check)

    def refuse_plain(self, texts: Iterable[str | None]) -> None:
        """KeyringError where a payload would store a secret plain in a store that seals
        them: this process has no keyring."""
        if self.seals and self.keys is None and any(t and holds_secret(t) for t in texts):
            raise KeyringError(
                "this store seals its secrets, and this process has no keyring to seal this "
                "one: give it the keyring (STEPWARDEN_KEYRING, a file, or STEPWARDEN_KEYS)"
            )

    async def sealing_keys(self) -> list[str]:
        """The ids of the keys that sealed secrets in this store, oldest first (none: it
        holds no sealed value)."""
        return [r["key_id"] for r in await self._read_one("sealing_keys")]

    async def reseal(self, cursor: Cursor, limit: int) -> Round:
        """One round of `stepwarden reseal` (`reseal.py`): the next `limit` rows of a place
        that may hold a secret, their secrets sealed anew under the keyring's current key."""
        keys = self.keys
        if keys is None:
            raise KeyringError("reseal needs a keyring (STEPWARDEN_KEYRING or STEPWARDEN_KEYS)")
        return await self._write(partial(reseal.reseal, cursor, limit, keys))

    async def drop_sealing_keys(self, key_ids: Sequence[str]) -> None:
        """Forget keys that no longer seal anything here (after `stepwarden reseal`)."""
        if key_ids:
            await self._write_one(Query("drop_sealing_keys", {"key_ids": list(key_ids)}))

    async def _fill_digests(self) -> None:
        """Give the tasks stored before migration 0019 their input's digest, a batch at a
        time (the digest is computed here: its key, when it has one, is not in the
        database). Those rows hold no sealed value: their digest is the plain one."""
        after = ""
        while True:
            rows = await self._read_one("inputs_without_digest", after=after, limit=DIGEST_BATCH)
            if not rows:
                return
            each = [
                {"task_id": r["task_id"], "input_digest": input_digest(r["input"])} for r in rows
            ]
            await self._write_one(Query("set_input_digests", each=each))
            after = rows[-1]["task_id"]

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

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the application ------------------------------------------------------------------
    async def submit(self, tasks: Sequence[Submission]) -> list[Submitted]:
        """Record pending tasks: each created, or, under a task_id taken, the same submit
        (same workflow, version, input and client: left as it is) or a conflict
        (`policy.submit`). Tried again after a transient failure: a task whose first try
        committed without its answer arriving is then answered the same submit."""
        self.refuse_plain(t.input for t in tasks)
        return await self._again_if_transient(
            lambda: self._write_alone(partial(policy.submit, tasks, self.keys))
        )

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractAsyncContextManager[Transaction]:
        """An open transaction of the application's (`Transaction`), committed when the
        block ends, rolled back when it raises."""

    async def get_task(self, task_id: str) -> TaskRecord | None:
        rows = await self._read_one("get_task", task_id=task_id)
        return _rows.task_record(rows[0], self.keys) if rows else None

    async def await_task(self, task_id: str, *, created_here: bool = False) -> TaskRecord | None:
        """The task, read so that its end, when it has not ended, wakes this process's
        subscribers of CHANNEL_TASK_DONE (a task's end notifies only those who wait for it):
        its row marked awaited, or its wait noted beside it (rules.await_next); noted before
        the first read when this process has just created it (rules.await_first). Each write
        is a statement of its own, committed before the next read. Safe to repeat."""
        noted = False
        if await_first(created_here=created_here) == "note":
            await self._write_one(Query("note_awaited", {"task_id": task_id}))
            noted = True
        while True:
            rows = await self._read_one("get_task", task_id=task_id)
            row = rows[0] if rows else None
            step = await_next(
                state=None if row is None else TaskState(row["process_state"]),
                held=bool(row and row["locked_by"] is not None),
                awaited=bool(row and row["awaited"]),
                noted=noted,
            )
            if step == "wait":
                return None if row is None else _rows.task_record(row, self.keys)
            if step == "note":
                await self._write_one(Query("note_awaited", {"task_id": task_id}))
                noted = True
                continue
            # The task as marked; no row when it was not (no longer held, or marked already).
            marked = await self._write_one(Query("mark_awaited", {"task_id": task_id}))
            if marked:
                return _rows.task_record(marked[0], self.keys)

    async def get_steps(self, task_id: str) -> list[StepRecord]:
        rows = await self._read_one("get_steps", task_id=task_id)
        return [_rows.step_record(r, self.keys) for r in rows]

    async def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        workflow: str | None = None,
        limit: int = 100,
        version: int | None = None,
        tenant: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> list[TaskRecord]:
        """Tasks, optionally of one state, one workflow, one version and one tenant ("":
        the tasks of none), and having every tag of `tags`, oldest first."""
        match = TaskFilter(
            states=frozenset() if state is None else frozenset({state}),
            workflow=workflow,
            version=version,
            tenant=tenant,
            tags=tags or None,
        )
        return await self.list_matching(match, limit=limit)

    async def list_matching(
        self,
        match: TaskFilter,
        *,
        after: str | None = None,
        limit: int = 100,
        after_at: datetime | None = None,
    ) -> list[TaskRecord]:
        """The tasks `match` matches, oldest first (by created_at, then task id), those after
        the task `after` only (a cursor: the last task of the page before). `after_at` is
        that task's created_at, for a store that does not hold it (a shard); without it, an
        `after` that names no task is TaskNotFound. Tags are read through their index."""
        if after is not None and after_at is None:
            cursor = await self.get_task(after)
            if cursor is None:
                raise TaskNotFound(f"no task {after!r} to list the tasks after")
            after_at = cursor.created_at
        params = {**_filtered(match), "after": after, "after_at": _epoch(after_at)}
        if match.tags:
            looked_up = _tagged(match.tags)  # its tags are in params already
            rows = await self._read_one(
                "list_tagged_tasks",
                **params,
                key=looked_up["key"],
                value=looked_up["value"],
                limit=limit,
            )
        else:
            rows = await self._read_one("list_tasks", **params, limit=limit)
        return [_rows.task_record(r, self.keys) for r in rows]

    async def select_tasks(
        self, match: TaskFilter, *, after: str = "", limit: int = 100
    ) -> list[TaskRecord]:
        """The tasks `match` matches, by task id, those after `after` (a cursor: the last id
        of the batch before; "" from the first)."""
        rows = await self._read_one("select_tasks", **_filtered(match), after=after, limit=limit)
        return [_rows.task_record(r, self.keys) for r in rows]

    async def count_tasks(self) -> dict[TaskState, int]:
        counts = {s: 0 for s in TaskState}
        for row in await self._read_one("count_tasks"):
            counts[TaskState(row["process_state"])] = int(row["n"])
        return counts

    async def client_unfinished(self, client: str) -> int:
        """How many tasks the application API's client `client` submitted that have not
        finished (`submitted_by`)."""
        [row] = await self._read_one("client_unfinished", client=client)
        return int(row["unfinished"])

    async def record_events(self, events: Sequence[tuple[str | None, str, Any]]) -> None:
        """Record (task_id, kind, detail) events; an `alert` also goes to the outbox."""
        if events:
            await self._write_one(policy.record_events(events))

    async def events(
        self, *, task_id: str | None = None, kind: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        """Events, optionally of one task and of one kind, oldest first."""
        rows = await self._read_one("events", task_id=task_id, kind=kind, limit=limit)
        return [_rows.event(r) for r in rows]

    async def history(
        self, task_id: str, *, limit: int = 100, before: int | None = None
    ) -> EventPage:
        """A task's events, newest first: up to `limit` of those with an id below `before`
        (all, when None), and whether older ones exist."""
        rows = await self._read_one("history", task_id=task_id, before=before, limit=limit + 1)
        events = [_rows.event(r) for r in rows[:limit]]
        return EventPage(events=events, more=len(rows) > limit)

    # -- the outbox -----------------------------------------------------------------------
    async def outbox(
        self,
        *,
        channel: str | None = None,
        task_id: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[OutboxMessage]:
        """Messages of a channel and/or a task whose id is above `after`, oldest first."""
        rows = await self._read_one(
            "outbox_read", channel=channel, task_id=task_id, after=after, limit=limit
        )
        return [_rows.message(r, self.keys) for r in rows]

    async def due_alerts(self, limit: int) -> list[OutboxMessage]:
        """Alerts not yet delivered to every sink whose next try is due, oldest first."""
        rows = await self._read_one("outbox_due", limit=limit)
        return [_rows.message(r, self.keys) for r in rows]

    async def record_delivery(
        self, message_id: int, delivered_to: Sequence[str], *, done: bool, retry_in: float
    ) -> None:
        """After a delivery round: the sinks reached so far; done, or due again in
        `retry_in` seconds."""
        await self._write_one(policy.record_delivery(message_id, delivered_to, done, retry_in))

    # -- the relay of status messages to brokers (relay.py) ------------------------------
    async def relay_fence(self, safe: int) -> tuple[int, int | None]:
        """The newest undelivered status message for a broker, and a fence when it is above
        `safe`: once `relay_passed(fence)`, no message up to it is still to be committed."""
        [row] = await self._read_one("relay_fence", safe=safe)
        return int(row["upto"]), None if row["fence"] is None else int(row["fence"])

    async def relay_passed(self, fence: int) -> bool:
        """Whether every transaction of the database older than `fence` has ended."""
        [row] = await self._read_one("relay_passed", fence=fence)
        return bool(row["passed"])

    async def relay_due(self, *, upto: int, tasks: int, limit: int) -> list[OutboxMessage]:
        """Status messages for brokers to deliver now, in id order: those up to `upto` of at
        most `tasks` tasks whose first undelivered message is due."""
        rows = await self._read_one("relay_due", upto=upto, tasks=tasks, limit=limit)
        return [_rows.message(r, self.keys) for r in rows]

    async def relay_delivered(self, message_ids: Sequence[int]) -> None:
        """Record that a broker acknowledged these status messages (those of a task already
        purged, kept until now, are deleted)."""
        if message_ids:
            await self._write_one(policy.relay_delivered(message_ids))

    async def relay_failed(self, message_id: int, error: str, retry_in: float) -> None:
        """Record a failed delivery: the error, and the next try in `retry_in` seconds (the
        task's later messages wait for it)."""
        await self._write_one(policy.relay_failed(message_id, error, retry_in))

    async def relay_refused(self, refused: Sequence[tuple[int, str]]) -> None:
        """Record that the relay never sends these status messages (message id, error):
        their destination is not one it may send to. They are done, not delivered, and no
        longer in the backlog; those of a task already purged are deleted."""
        if refused:
            await self._write_one(policy.relay_refused(refused))

    async def relay_backlog(self) -> list[RelayBacklog]:
        """Per broker destination, what the relay has yet to deliver."""
        return [_rows.relay_backlog(r) for r in await self._read_one("relay_backlog")]

    # -- retention ------------------------------------------------------------------------
    async def purge(self, older_than: float, limit: int, tenant: str | None = None) -> int:
        """Delete up to `limit` finished tasks (processed, compensated, cancelled) that
        finished more than `older_than` seconds ago, of the tenant `tenant` only when given
        ("": the tasks of none), with their steps, events and delivered outbox messages;
        the number deleted. Tasks awaiting an operator are kept."""
        return len(await self._write_one(policy.purge(older_than, limit, tenant)))

    # -- the operator ---------------------------------------------------------------------
    async def operate(self, actions: Sequence[OperatorAction]) -> list[ActionOutcome]:
        """Apply operator actions in one transaction, each a conditional update from the
        state and attempt it reads, recorded as an `operator` event (who, why, from, to)."""
        self.refuse_plain(a.result for a in actions)
        return await self._write(partial(policy.operate, actions))

    async def set_tenant_weight(self, tenant: str, weight: float) -> None:
        """Set a tenant's weight in the fair share of claims (`rules.fair_shares`): every
        scheduler's next claim reads it."""
        await self._write_one(Query("set_tenant_weight", {"tenant": tenant, "weight": weight}))

    async def tenant_weights(self) -> list[TenantWeight]:
        """The tenants' rows of the fair share: those claimed for, and those given a weight."""
        return [
            TenantWeight(
                r["tenant"], float(r["weight"]), float(r["pass"]), float(r["clock"] or 0.0)
            )
            for r in await self._read_one("tenant_weights")
        ]

    # -- the scheduler --------------------------------------------------------------------
    async def claim_tasks(
        self,
        scheduler: str,
        workflows: Sequence[str | tuple[str, int]],
        limit: int,
        *,
        fairly: bool = True,
    ) -> list[ClaimedTask]:
        """Claim up to `limit` eligible tasks of these (workflow, version) pairs (a workflow
        named alone is its version 1), shared among the tenants waiting by their weights
        (`rules.fair_shares`; by rank alone when not `fairly`: `rules.claim_fairly`), by
        priority with aging within each (`rules.head_start`),
        exclusively: pending ones
        become processing, compensating ones not held stay compensating; each gets locked_by,
        a new attempt and complete_by = now + complete_within."""
        if limit <= 0 or not workflows:
            return []
        if not await self._worth_writing("any_pending", **policy.claim_pairs(workflows)):
            return []
        # By rank alone the claim is one statement, which owes no wake-up: on its own, without
        # BEGIN and COMMIT where the dialect can.
        write = self._write if fairly else self._write_alone
        rows = await write(
            lambda wake: policy.claim_fair_tasks(scheduler, workflows, limit, fairly)
        )
        again = policy.replayed(rows)
        step_rows: Rows = []
        wait_rows: Rows = []
        if again:  # read once the claim committed: only the claiming scheduler writes them
            step_rows, wait_rows = [await self._read(q) for q in policy.recorded(again)]
        return policy.claimed(rows, step_rows, wait_rows, self.keys)

    async def dispatch_steps(self, batch: Sequence[StepDispatch]) -> list[DispatchedStep | None]:
        """Record and queue steps (`NewStep`), queue recorded ones again (`Redispatch`) or
        take them over (`Adopt`), each only if its task is still held under the given attempt
        and scheduler (and the step under the expected attempt). None for each dispatch that
        was fenced out."""
        return await self._write(partial(policy.dispatch_steps, batch))

    async def advance(
        self,
        outcomes: Sequence[StepOutcome],
        dispatches: Sequence[StepDispatch],
        finishes: Sequence[TaskOutcome],
    ) -> tuple[list[bool], list[DispatchedStep | None], list[bool]]:
        """A scheduler's group commit: the outcomes of steps its own agent instances called
        (`complete_steps`), then its step dispatches (`dispatch_steps`) and task outcomes
        (`finish_tasks`), in one transaction; those of a task whose outcome here is refused
        are not applied."""
        if not (outcomes or dispatches or finishes):
            return [], [], []
        if policy.advance_alone(outcomes, dispatches, finishes):
            dispatched = await self._write_alone(partial(policy.dispatch_steps, dispatches))
            return [], dispatched, []
        return await self._write(partial(policy.advance, outcomes, dispatches, finishes))

    async def finished_steps(self, keys: Sequence[tuple[str, int]]) -> list[StepRecord]:
        """Of the given (task_id, seq), the steps that are completed or failed."""
        if not keys:
            return []
        each = [{"task_id": task_id, "seq": seq} for task_id, seq in keys]
        rows = await self._read(Query("finished_steps", each=each))
        return [_rows.step_record(r, self.keys) for r in rows]

    async def finish_tasks(self, batch: Sequence[TaskOutcome]) -> list[bool]:
        """End the hold of each task, only if it is still held (`TaskOutcome.held_as`) under
        the given attempt and scheduler: processed; error, with an alert event, which becomes
        compensating (eligible once its open steps' complete_by has passed) unless its
        on_failure is "stop"; compensated; compensation_failed, with an alert event. The
        task's open steps are closed (failed, abandoned)."""
        if not batch:
            return []
        return await self._write(partial(policy.finish_tasks, batch))

    async def read_step(self, task_id: str, seq: int) -> tuple[StepRecord, float] | None:
        """The step and the seconds until its complete_by (by the database clock; negative
        once passed), or None when there is no such step."""
        rows = await self._read_one("read_step", task_id=task_id, seq=seq)
        if not rows:
            return None
        return _rows.step_record(rows[0], self.keys), float(rows[0]["remaining"])

    async def read_held_step(
        self, task_id: str, seq: int, attempt: int, scheduler: str
    ) -> tuple[StepRecord, float, bool] | None:
        """`read_step`, with whether the step's task is still held under `attempt` by
        `scheduler` (processing or compensating): a drive's look at the step it waits for."""
        rows = await self._read_one(
            "read_held_step", task_id=task_id, seq=seq, attempt=attempt, scheduler=scheduler
        )
        if not rows:
            return None
        row = rows[0]
        return _rows.step_record(row, self.keys), float(row["remaining"]), bool(row["held"])

    # -- the scheduler registry -----------------------------------------------------------
    async def beat_schedulers(self, beats: Sequence[SchedulerBeat], ttl: float) -> None:
        """Register or refresh scheduler instances; each is gone `ttl` seconds after its
        last beat (by the database clock). Beats of this process made at about the same
        time, agents' too, are written in one transaction."""
        if beats:
            await self._beats.submit(policy.scheduler_beat(beats, ttl))

    async def _beat_group(self, beats: Sequence[Query]) -> list[Rows]:
        if len(beats) == 1:
            return [await self._write_one(beats[0])]
        return await self._write(lambda wake: _all(list(beats)))

    async def leave_scheduler(self, instance: str) -> None:
        """A scheduler instance stopping: its registry row expires now."""
        await self._write_one(policy.scheduler_leave(instance))

    async def list_schedulers(self) -> list[SchedulerInstance]:
        """The scheduler registry: every instance, alive or gone (for a while), by start."""
        return [_rows.scheduler_instance(r) for r in await self._read_one("list_schedulers")]

    async def version_backlog(self, workflows: Sequence[str] | None = None) -> list[VersionBacklog]:
        """The tasks waiting for a scheduler (pending; compensating, held by none) by
        workflow and version, of these workflows (all, when None), by workflow and version."""
        rows = await self._read_one(
            "version_backlog", workflows=None if workflows is None else list(workflows)
        )
        return [_rows.version_backlog(r) for r in rows]

    async def wait(self, request: WaitRequest) -> WaitOutcome:
        """A workflow's timer, event or child wait at its position: recorded the first time
        (a child wait creates its child task); done (its timer fired, an event taken, its
        child processed), child_failed, timed out, or the task parked until then (waiting,
        released, its complete_by gone), or "blocked" when the request says not to park;
        fenced by the hold and the attempt."""
        return await self._write(partial(policy.wait, request, self.keys))

    async def park(self, request: ParkRequest) -> WaitOutcome:
        """Park a task whose workflow waits in every branch, on its open waits at
        `request.seqs`: "parked" (waiting, released, until the earliest of their wake_at),
        "ready" when one of them can end now (not parked), or "fenced"; one transaction with
        the task's row locked, fenced by the hold and the attempt."""
        return await self._write(partial(policy.park, request))

    async def children(self, task_id: str, *, limit: int = 1000) -> list[TaskRecord]:
        """The tasks `task_id`'s workflow started (`ctx.child`), oldest first."""
        rows = await self._read_one("children_of", task_id=task_id, limit=limit)
        return [_rows.task_record(r, self.keys) for r in rows]

    async def send_event(
        self,
        task_id: str,
        name: str,
        payload: str,
        event_id: str,
        bounds: EventBounds | None = None,
    ) -> SendOutcome | TaskState | EventBeyond | None:
        """Keep an event for the task (once per event_id) and wake it if it waits with an
        open wait for that name, in one transaction; the state of a finished task (nothing
        sent), the bound a new event is beyond (`bounds`, the defaults when None: nothing
        sent), or None when there is no such task."""
        self.refuse_plain([payload])
        event = (task_id, name, payload, event_id, bounds or EventBounds())
        return await self._write(partial(policy.send_event, *event))

    async def waits(self, task_id: str) -> list[WaitRecord]:
        rows = await self._read_one("list_waits", task_id=task_id)
        return [_rows.wait_record(r, self.keys) for r in rows]

    async def release_held(
        self, scheduler: str, only: Collection[tuple[str, int]] | None = None
    ) -> list[Released]:
        """Give back every task `scheduler` holds, or those of `only` (task_id, attempt)
        (processing: pending; compensating: stays, unheld), fenced by its hold and the
        attempt read, with a `released` event each; no failure is counted."""
        return await self._write(partial(policy.release_held, scheduler, only))

    async def held_tasks(self, scheduler: str) -> list[tuple[str, int]]:
        """The tasks `scheduler` holds whose complete_by is still to come, as (task_id,
        attempt)."""
        return policy.held_in_time(await self._read_one("held_by", scheduler=scheduler))

    # -- the agents -----------------------------------------------------------------------
    async def claim_requests(
        self,
        instance: str,
        agent: str,
        operations: Sequence[str],
        limit: int,
        limits: Mapping[str, OpLimit] | None = None,
        *,
        fairly: bool = True,
    ) -> list[Request]:
        """Claim up to `limit` queued requests in time for these operations, shared among
        the tenants waiting by their weights (`rules.fair_shares`, with this agent's passes;
        by rank alone when not `fairly`: `rules.claim_fairly`), by priority with aging
        within each (`rules.head_start`): the steps go from not_started to running,
        locked_by the agent instance. An operation in `limits` is claimed only within them:
        its concurrency and rate across every process (per limit key; claims of one agent's
        limited operations are serialised), and its `room` in this instance; such a claim is
        shared by what it reads, whatever `fairly` says (`policy.claim_within_limits`)."""
        if limit <= 0 or not operations:
            return []
        if not await self._worth_writing("any_request", agent=agent, operations=list(operations)):
            return []
        limits = {op: lim for op, lim in (limits or {}).items() if op in operations}
        if limits:
            flow = partial(policy.claim_within_limits, instance, agent, operations, limit, limits)
            return policy.requests(await self._write(flow), self.keys)
        if fairly:
            fair = partial(policy.claim_fair_requests, instance, agent, operations, limit)
            return policy.requests(await self._write(fair), self.keys)
        # By rank alone the claim is one statement, which owes no wake-up.
        return policy.requests(
            await self._write_one(policy.claim_requests(instance, agent, operations, limit)),
            self.keys,
        )

    async def hand_back(self, batch: Sequence[RequestHandback]) -> list[bool]:
        """Put claimed requests back in the queue for another instance (running ->
        not_started, the same attempt, reassignments + 1), each only if still running under
        the given attempt and instance."""
        return await self._write(partial(policy.hand_back, batch))

    async def note_run(self, task_id: str, attempt: int, scheduler: str, run_trace: str) -> bool:
        """Record the trace context of a run's span (JSON text) with its task, for the next
        run's span to link to; only while `scheduler` holds the task under `attempt`."""
        return bool(await self._write_one(policy.note_run(task_id, attempt, scheduler, run_trace)))

    async def fork(
        self,
        task_id: str,
        new: Submission,
        start: str,
        new_keys_from: int | None,
        detail: dict[str, Any],
        *,
        apply: bool,
    ) -> Redrive:
        """Fork `task_id` as `new` from the place `start`, or, without `apply`, plan it only
        (`policy.fork`)."""
        self.refuse_plain([new.input])
        flow = partial(policy.fork, task_id, new, start, new_keys_from, detail, apply, self.keys)
        return await self._write(flow)

    async def tag_task(
        self, task_id: str, attempt: int, scheduler: str, key: str, value: str
    ) -> bool | str:
        """Tag a task `key` = `value` while `scheduler` holds it under `attempt`
        (`Context.tag`): True when it has the tag now (written only when it had not),
        False when it is not held so, or why the tag is refused (`rules.with_tag`)."""
        return await self._write(partial(policy.tag_task, task_id, attempt, scheduler, key, value))

    async def heartbeat_step(
        self, task_id: str, seq: int, attempt: int, instance: str, detail: str | None
    ) -> float | None:
        """Record a running step's heartbeat (`detail`: JSON text) and extend its
        complete_by to now + its complete_within, never past its task's complete_by nor its
        total timeout; the seconds now left, or None when the step is no longer running
        under this attempt and instance, or its complete_by has passed."""
        rows = await self._write_one(policy.heartbeat_step(task_id, seq, attempt, instance, detail))
        return float(rows[0]["remaining"]) if rows else None

    async def lost_calls(
        self, instance: str, calls: Sequence[tuple[str, int, int]]
    ) -> dict[tuple[str, int, int], str]:
        """Of the calls `instance` makes (task_id, seq, attempt: the steps it claimed), those
        whose step it no longer holds, each with why (`rules.call_lost`: its task cancelled,
        paused or compensating, the step abandoned, dispatched again or reassigned...); one
        query for all of them."""
        if not calls:
            return {}
        return policy.lost(await self._read(policy.call_facts(calls)), calls, instance)

    async def held_steps(self, instance: str, agent: str) -> list[Request]:
        """The steps of `agent` that `instance` holds (the agent instances of one process
        share a name), as the requests it claimed: running, locked by it,
        before their complete_by, for a task whose calls go on (`rules.call_lost`); in
        claim order (priority with aging, `rules.head_start`)."""
        rows = await self._read_one("held_steps", instance=instance, agent=agent)
        return policy.held(rows, instance, self.keys)

    async def stop_calls(self, batch: Sequence[CallStop]) -> list[bool]:
        """Record that these calls of steps their instances no longer hold have ended
        (`rules.plan_call_stopped`), each fenced by the attempt and instance that held the
        step; True for each that wrote something. A compensating task whose abandoned steps'
        calls have all stopped (or passed their complete_by) becomes eligible at once (not
        before its backoff ends)."""
        return await self._write(partial(policy.stop_calls, batch))

    async def beat(self, beats: Sequence[AgentBeat], ttl: float) -> None:
        """Register or refresh agent instances; each is gone `ttl` seconds after its last
        beat (by the database clock). Beats of this process made at about the same time,
        its scheduler's too, are written in one transaction."""
        if beats:
            await self._beats.submit(policy.beat(beats, ttl))

    async def leave(self, instance: str, agents: Sequence[str]) -> None:
        """An instance stopping: its registry rows expire now (its running steps are
        reassigned by the next sweep)."""
        await self._write_one(policy.leave(instance, agents))

    async def list_agents(self) -> list[AgentInstance]:
        """The registry: every agent instance, alive or gone, by agent then start."""
        return [_rows.agent_instance(r) for r in await self._read_one("list_agents")]

    async def client_agents(self, client: str, instance: str, agent: str) -> tuple[int, bool]:
        """The alive agent registrations of the application API's client `client` (its
        instances are named `client/...`), and whether `instance`'s for `agent` is one."""
        [row] = await self._read_one(
            "client_agents", prefix=client + "/", instance=instance, agent=agent
        )
        return int(row["alive"]), bool(row["known"])

    async def agent_room(self) -> int | None:
        """How many more tasks the agents have room for: the capacity of the alive agent
        instances less the held tasks or the steps queued or running (in time), whichever are
        more; None when no agent instance is alive."""
        [row] = await self._read_one("agent_room")
        return None if row["capacity"] is None else int(row["capacity"] - row["open"])

    async def complete_steps(self, batch: Sequence[StepOutcome]) -> list[bool]:
        """Record results, each only if the step is still running under the given attempt,
        locked by the given instance, and its complete_by has not passed."""
        return await self._write(partial(policy.complete_steps, batch))

    # -- the supervisor -------------------------------------------------------------------
    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        """Take or renew the lease `name`; its term when held, None when another holds it.
        The term rises whenever the lease changes hands or lapses; it never falls."""
        return await self._write(partial(policy.acquire_lease, name, holder, ttl))

    async def look_lease(self, name: str, holder: str) -> float | None:
        """A standby's look at the lease `name`, written with the registry beats of this
        process made at about the same time (one transaction): the seconds until the lease
        another holds lapses, or None when `holder` may take it now (`try_lease`). Nothing
        is locked or taken."""
        rows = await self._beats.submit(policy.look_lease(name))
        return policy.lease_lapses(rows, holder)

    async def try_lease(self, name: str, holder: str, ttl: float) -> LeaseTry:
        """`acquire_lease`, and when the lease another holds lapses; the sessions that
        stopped talking mid-transaction are ended first, in the same transaction
        (`end_stalled_sessions`), so that a frozen holder's lock on the lease row does not
        keep it from changing hands."""
        tried, _ = await self._write(partial(policy.try_lease, name, holder, ttl, None))
        return tried

    async def sweep_round(
        self,
        *,
        lease: str,
        holder: str,
        term: int,
        limit: int,
        backoff: Backoff,
        forget_after: float,
        release: bool,
        purge_after: float | None,
        purge_limit: int,
    ) -> SweepRound:
        """Under the lease (holder, term), in one transaction: the first batch of each of
        `release_gone_schedulers` (when `release`), `wake_due`, `create_ticks`,
        `sweep_steps` (reassigning when `release`) and `sweep`, then `purge` (when
        `purge_after` is not None) and `next_expiry`. A sweep whose batch came back full
        goes on by its own method."""
        return await self._write(
            lambda wake: policy.sweep_round(
                lease=lease,
                holder=holder,
                term=term,
                limit=limit,
                backoff=backoff,
                forget_after=forget_after,
                release=release,
                keys=self.keys,
                purge_after=purge_after,
                purge_limit=purge_limit,
                wake=wake,
            )
        )

    async def next_expiry(self, lease: str, holder: str) -> float | None:
        """Seconds until the soonest expiry to come (by the database clock) of a registry row,
        agent or scheduler, and of the lease `lease` when another than `holder` holds it;
        None when none is coming."""
        [row] = await self._read_one("next_expiry", name=lease, holder=holder)
        return None if row["seconds"] is None else float(row["seconds"])

    async def release_lease(self, name: str, holder: str) -> None:
        await self._write_one(policy.release_lease(name, holder))

    async def end_stalled_sessions(self) -> int:
        """End the store sessions of other processes that stopped talking in the middle of a
        transaction (frozen, or stalled), so that their locks do not outlive the freeze; how
        many were ended. A store whose server does this by itself does nothing here."""
        return 0

    async def wake_due(self, *, lease: str, holder: str, term: int, limit: int) -> list[Woke]:
        """Under the lease (holder, term): waiting tasks whose wake_at has come are pending
        again (a `woke` event each). Nothing is written when the lease is no longer held."""
        return await self._write(
            lambda wake: policy.wake_due(
                lease=lease, holder=holder, term=term, limit=limit, wake=wake
            )
        )

    async def store_schedules(self, specs: Sequence[ScheduleSpec]) -> dict[str, str]:
        """Store the application's schedules as declared (a new or re-timed one starts at
        its first tick after now; an operator's pause is kept). Those whose first tick cannot
        be worked out are not stored (the others are): returned by name, with why."""
        if not specs:
            return {}
        self.refuse_plain(s.input for s in specs)
        return await self._write(partial(policy.store_schedules, specs))

    async def create_ticks(self, *, lease: str, holder: str, term: int, limit: int) -> TicksMade:
        """Under the lease (holder, term): the tasks of the schedules' due ticks (the ids of
        those created now); a schedule whose ticks cannot be worked out is set aside
        (paused), and the others go on."""
        return await self._write(
            lambda wake: policy.create_ticks(
                lease=lease, holder=holder, term=term, limit=limit, keys=self.keys, wake=wake
            )
        )

    async def schedules(self) -> list[ScheduleRecord]:
        return [_rows.schedule_record(r, self.keys) for r in await self._read_one("list_schedules")]

    async def pause_schedule(self, name: str, paused: bool) -> bool:
        """Pause or resume a schedule (resumed, it goes on from its first tick after now);
        False when there is none of that name."""
        return await self._write(partial(policy.pause_schedule, name, paused))

    async def release_gone_schedulers(
        self, *, lease: str, holder: str, term: int, limit: int, forget_after: float
    ) -> list[Released]:
        """Under the lease (holder, term): give back the tasks held by scheduler instances
        whose registry row has expired (processing: pending; compensating: stays, unheld),
        each fenced by its attempt and hold, without counting a failure, so that another
        scheduler resumes them at once; forget instances gone for `forget_after` seconds.
        Nothing is written when the lease is no longer held at `term`."""
        return await self._write(
            lambda wake: policy.release_gone_schedulers(
                lease=lease,
                holder=holder,
                term=term,
                limit=limit,
                forget_after=forget_after,
                wake=wake,
            )
        )

    async def sweep(
        self, *, lease: str, holder: str, term: int, limit: int, backoff: Backoff
    ) -> list[Expired]:
        """Under the lease (holder, term), find held tasks whose complete_by passed and open
        steps of the current attempt whose complete_by passed, and recover each as
        `rules.plan_expiry` says: failure_count + 1, released after a backoff, or at
        max_failures given up by its on_failure with an alert. A task that cannot be
        recovered is set aside for an operator, and the others go on. Nothing is written
        when the lease is no longer held at `term`."""
        return await self._write(
            lambda wake: policy.sweep(
                lease=lease, holder=holder, term=term, limit=limit, backoff=backoff, wake=wake
            )
        )

    async def sweep_steps(
        self,
        *,
        lease: str,
        holder: str,
        term: int,
        limit: int,
        forget_after: float,
        reassign: bool = True,
    ) -> list[StepSwept]:
        """Under the lease (holder, term): reassign the running steps of gone agent
        instances (not_started, attempt + 1, reassignments + 1, a full complete_by, named
        after the task's attempt) and release those of their tasks held by a scheduler
        instance found gone (pending, or compensating unheld; failure_count unchanged) for a
        scheduler to take up again at once (an alive holder keeps its task and waits for the
        step); fail the steps no agent claimed within their pick-up timeout and the open
        steps past their total timeout (an open one as abandoned: it may have taken effect),
        and forget instances gone for `forget_after` seconds (without `reassign`, the gone
        instances are left alone). Nothing is written when the lease is no longer held at
        `term`."""
        return await self._write(
            lambda wake: policy.sweep_steps(
                lease=lease,
                holder=holder,
                term=term,
                limit=limit,
                forget_after=forget_after,
                reassign=reassign,
                wake=wake,
            )
        )

    # -- wake-ups -------------------------------------------------------------------------
    def subscribe(self, channel: str) -> Subscription:
        return self.notifier.subscribe(channel)

    def unsubscribe(self, channel: str, sub: Subscription) -> None:
        self.notifier.unsubscribe(channel, sub)

    async def listen(self) -> None:  # noqa: B027 - a store without cross-process wake-ups
        """Start receiving wake-ups from other processes, where the database offers them."""

    @property
    def wakeups_live(self) -> bool:
        """Whether every wake-up of the other processes reaches this process now, so that
        a poller may poll only as a fallback (`_aio.Pace`): PostgreSQL while its LISTEN
        connection is up. Not SQLite's datagrams, which may be dropped (a poll finds what
        they miss), nor a store behind a transaction pooler (no LISTEN)."""
        return False

    # -- the dashboard --------------------------------------------------------------------
    # Read-only queries of the operator's dashboard and its metrics (stepwarden.dashboard).

    async def find_tasks(
        self,
        *,
        state: TaskState | None = None,
        workflow: str | None = None,
        search: str | None = None,
        limit: int = 100,
        version: int | None = None,
        tenant: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> list[TaskRecord]:
        """Tasks newest first, optionally of one state, one workflow, one version and one
        tenant ("": the tasks of none), whose id contains `search`, and having every tag of
        `tags`."""
        filters = {
            "state": None if state is None else str(state),
            "workflow": workflow,
            "version": version,
            "tenant": tenant,
            "search": search or None,
            "limit": limit,
        }
        if tags:
            rows = await self._read_one("find_tagged_tasks", **filters, **_tagged(tags))
        else:
            rows = await self._read_one("find_tasks", **filters)
        return [_rows.task_record(r, self.keys) for r in rows]

    async def workflow_names(self) -> list[str]:
        """The workflows the stored tasks belong to, sorted."""
        return [r["workflow"] for r in await self._read_one("workflow_names")]

    async def newest_outbox(self, *, channel: str, limit: int) -> list[OutboxMessage]:
        """The newest messages of a channel, newest first."""
        rows = await self._read_one("newest_outbox", channel=channel, limit=limit)
        return [_rows.message(r, self.keys) for r in rows]

    async def oldest_pending_age(self) -> float | None:
        """Seconds since the oldest pending task was submitted (by the database clock), or
        None when no task is pending."""
        [row] = await self._read_one("oldest_pending")
        return None if row["age"] is None else max(0.0, float(row["age"]))

    async def read_lease(self, name: str) -> LeaseRecord | None:
        """The lease `name` as it stands, or None when it was never taken."""
        rows = await self._read_one("read_lease", name=name)
        return _rows.lease(rows[0]) if rows else None

    async def activity(self, *, window: float, bucket: float) -> Activity:
        """Tasks processed and step failures (events `step_failed` and `expired`) per
        `bucket` seconds over the last `window` seconds."""
        rows = await self._read_one("activity", window=float(window), bucket=float(bucket))
        return _rows.activity(rows, bucket)

    async def step_stats(self) -> list[StepStats]:
        """For each agent and operation of the stored steps: how many were started
        (claimed), completed, failed and reassigned, and how long the completed ones took."""
        return [_rows.step_stats(r) for r in await self._read_one("step_stats")]

    async def why_facts(
        self, task_id: str, limits: Mapping[tuple[str, str], OpLimit] | None = None
    ) -> tuple[TaskFacts, list[StepFacts]] | None:
        """The facts of why a task waits (`rules.task_gate`) and of each of its open steps
        (`rules.step_gate`), None when there is no such task: the task with its rank, open
        waits, pause and last alert, the registries, and for each open step its place in its
        agent's queue and what takes up its operation's limit (`limits`, by (agent,
        operation), as the App declares them). Several reads, each of the store's clock."""
        rows = await self._read_one("why_task", task_id=task_id)
        if not rows:
            return None
        waits = await self._read_one("why_waits", task_id=task_id)
        marks = await self._read_one("why_marks", task_id=task_id)
        schedulers = await self.list_schedulers()
        task = _rows.task_facts(rows[0], waits, marks, schedulers, self.keys)
        step_rows = await self._read_one("why_steps", task_id=task_id)
        agents = await self.list_agents() if step_rows else []
        steps: list[StepFacts] = []
        for row in step_rows:
            limit = (limits or {}).get((row["agent"], row["operation"]))
            usage = None
            if limit is not None and row["state"] == str(StepState.NOT_STARTED):
                [usage] = await self._read_one(
                    "why_limit",
                    agent=row["agent"],
                    operation=row["operation"],
                    limit_key=row["limit_key"] or "",
                    per=float(limit.per),
                    tasks=WHY_HELD_BY,
                )
            steps.append(_rows.step_facts(row, agents, limit, usage, self.keys))
        return task, steps

    async def stale_tasks(self, workflow: str, after: float, limit: int) -> list[str]:
        """The ids of the unfinished tasks of `workflow` (not those in error) that have not
        moved for `after` seconds and raised no task_stuck alert since, the longest first."""
        rows = await self._read_one("stale_tasks", workflow=workflow, after=after, limit=limit)
        return [r["task_id"] for r in rows]

    async def stuck_alerted(self, task_id: str, wait_reason: str) -> bool:
        """Whether the task raised a task_stuck alert for this reason that holds it."""
        [row] = await self._read_one("stuck_alerted", task_id=task_id, wait_reason=wait_reason)
        return int(row["n"]) > 0

    async def count_events(self, kind: str) -> int:
        """The number of stored events of `kind`."""
        [row] = await self._read_one("count_events", kind=kind)
        return int(row["n"])


def _filtered(match: TaskFilter) -> dict[str, Any]:
    """The parameters of `select_tasks` for a filter: states a JSON array, tags a JSON
    object, times as epochs; None for each not asked."""
    return {
        "states": orjson.dumps(sorted(str(s) for s in match.states)).decode()
        if match.states
        else None,
        "workflow": match.workflow,
        "version": match.version,
        "tenant": match.tenant,
        "error": match.error or None,
        "created_after": _epoch(match.created_after),
        "created_before": _epoch(match.created_before),
        "finished_after": _epoch(match.finished_after),
        "finished_before": _epoch(match.finished_before),
        "tags": tags_text(match.tags) if match.tags else None,
    }


def _epoch(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()


def _tagged(tags: Mapping[str, str]) -> dict[str, str]:
    """The parameters of a read of the tasks having every tag of `tags`: the one it reads
    through the index (`key`, `value`), and all of them (`tags`, a JSON object)."""
    key, value = next(iter(sorted(tags.items())))
    return {"key": key, "value": value, "tags": tags_text(tags)}
