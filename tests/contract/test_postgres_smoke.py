"""A quick self-check of the PostgreSQL store beyond the shared contract: wake-ups across
processes, concurrent migrations, the sweep's plan, batches with duplicates."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import psycopg
import pytest

from stepwarden.errors import ConfigurationError, SchemaVersionError, StoreError
from stepwarden.records import (
    StepDispatch,
    StepOutcome,
    Submission,
    TaskOutcome,
    step_key,
)
from stepwarden.retry import Backoff
from stepwarden.states import StepState, TaskState
from stepwarden.store import (
    CHANNEL_REQUESTS,
    CHANNEL_RESULTS,
    CHANNEL_TASK_DONE,
    CHANNEL_TASKS,
    _sql,
    open_store,
)
from stepwarden.store._flow import Flow, Query, Rows, Wakeups
from stepwarden.store.postgres import STALLED, PostgresStore, _chunks

from ..dispatching import step_dispatch
from ..rawsql import generic_plan


def task(
    task_id: str, *, priority: int = 0, within: float = 30, max_failures: int = 3
) -> Submission:
    return Submission(
        task_id=task_id,
        workflow="wf",
        input='{"n": 1}',
        priority=priority,
        complete_within=within,
        max_failures=max_failures,
    )


def dispatch(task_id: str, attempt: int, seq: int = 1, **kw: object) -> StepDispatch:
    args: dict[str, object] = dict(
        kind="new",
        task_id=task_id,
        task_attempt=attempt,
        scheduler="s1",
        seq=seq,
        name="pay.charge",
        agent="pay",
        operation="charge",
        input='{"amount": 5}',
        priority=0,
        complete_within=10,
    )
    args.update(kw)
    kind = str(args.pop("kind"))
    return step_dispatch(kind, **args)  # type: ignore[arg-type]


def outcome(task_id: str, attempt: int, seq: int = 1, **kw: object) -> StepOutcome:
    args: dict[str, object] = dict(
        task_id=task_id,
        seq=seq,
        attempt=attempt,
        agent_instance="a1",
        state=StepState.COMPLETED,
        result='{"ok": true}',
        error=None,
        tries=1,
    )
    args.update(kw)
    return StepOutcome(**args)  # type: ignore[arg-type]


def one_session(pg_url: str) -> PostgresStore:
    """A store whose every statement runs on one session (a pool of one connection)."""
    return PostgresStore(pg_url + ("&" if "?" in pg_url else "?") + "pool_size=1")


def test_url_options() -> None:
    s = PostgresStore("postgres://u@h:5433/db?pool_size=3&sslmode=disable")
    assert s.pool_size == 3
    assert "pool_size" not in s.conninfo and "sslmode=disable" in s.conninfo
    assert PostgresStore("postgresql://u@h/db").pool_size == 10
    with pytest.raises(ConfigurationError):
        PostgresStore("postgresql://u@h/db?pool_size=zero")


def test_a_multi_host_url_asks_for_the_primary_and_names_each_server() -> None:
    both = PostgresStore("postgresql://u@db1:5432,db2:5433/shop")
    assert both.connect_kwargs["target_session_attrs"] == "read-write"
    assert both._where() == "db1:5432,db2:5433/shop"
    assert PostgresStore("postgresql://u@db1,db2/shop")._where() == "db1:5432,db2:5432/shop"
    chosen = PostgresStore("postgresql://u@db1/shop?target_session_attrs=any")
    assert "target_session_attrs" not in chosen.connect_kwargs


def test_chunks_stay_under_the_limit() -> None:
    items = [f"task-{i:05d}\x1f{i}" for i in range(2000)]
    chunks = _chunks(items)
    assert len(chunks) > 1
    assert all(len(c.encode()) <= 7000 for c in chunks)
    assert [x for c in chunks for x in c.split("\n")] == items


async def test_unreachable_server_is_a_quick_store_error() -> None:
    store = open_store("postgresql://postgres@127.0.0.1:1/test")
    started = time.monotonic()
    with pytest.raises(StoreError, match=r"cannot connect to PostgreSQL at 127\.0\.0\.1:1"):
        await store.open()
    assert time.monotonic() - started < 5
    await store.close()


async def test_concurrent_migrations_and_versions(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("DROP SCHEMA public CASCADE")
        db.execute("CREATE SCHEMA public")
    # Opening without migrating refuses an old schema.
    with pytest.raises(SchemaVersionError, match="older"):
        await PostgresStore(pg_url).open(migrate=False)

    async def migrate(s: PostgresStore) -> int:
        await s.open(migrate=True)
        try:
            return await s.migrate()
        finally:
            await s.close()

    latest = _sql.latest_version("postgres")
    versions = await asyncio.gather(*(migrate(PostgresStore(pg_url)) for _ in range(4)))
    assert versions == [latest] * 4
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("INSERT INTO stepwarden_schema (version, name) VALUES (%s, 'x')", (latest + 1,))
    with pytest.raises(SchemaVersionError, match="newer"):
        await PostgresStore(pg_url).open()


async def test_listen_wakes_another_store(pg_url: str) -> None:
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    await a.open()
    await b.open()
    try:
        await a.listen()
        await a.listen()  # idempotent
        tasks, requests = a.subscribe(CHANNEL_TASKS), a.subscribe(CHANNEL_REQUESTS)
        results, done = a.subscribe(CHANNEL_RESULTS), a.subscribe(CHANNEL_TASK_DONE)
        # A submit is one statement (autocommit) that wakes the schedulers itself: only when
        # a task became pending (not one already there, nor one whose start is delayed).
        assert [a.created for a in await b.submit([task("t1"), task("t2")])] == [True, True]
        assert await tasks.wait(5) == [""]
        later = replace(task("later"), start_after=60)
        assert [a.created for a in await b.submit([task("t1"), later])] == [False, True]
        assert await tasks.wait(0.5) is None
        # Someone waits for t1's result (noted while it is pending), nobody for t2's.
        pending = await a.await_task("t1")
        assert pending is not None and pending.process_state == TaskState.PENDING
        claimed = await b.claim_tasks("s1", ["wf"], 2)
        await b.dispatch_steps([dispatch(c.task.task_id, c.task.attempt) for c in claimed])
        assert await requests.wait(5) == ["pay"]
        reqs = await b.claim_requests("a1", "pay", ["charge"], 10)
        assert len(reqs) == 2
        assert await b.complete_steps([outcome(r.task_id, r.attempt) for r in reqs]) == [True] * 2
        assert sorted(await results.wait(5) or []) == [step_key("t1", 1), step_key("t2", 1)]
        outcomes = [
            TaskOutcome(
                task_id=c.task.task_id,
                attempt=c.task.attempt,
                scheduler="s1",
                state=TaskState.PROCESSED,
                result="1",
                error=None,
            )
            for c in claimed
        ]
        assert await b.finish_tasks(outcomes) == [True, True]
        # Only an end someone waits for is notified.
        assert await done.wait(5) == ["t1"]
        # A store's own writes reach its subscribers once (locally), not again by NOTIFY.
        await a.submit([task("t3")])
        assert await tasks.wait(1) == [""]
        assert await tasks.wait(0.5) is None
        # An application transaction notifies on commit only.
        async with b.transaction() as tx:
            await tx.execute("CREATE TABLE orders (id text primary key)")
            await tx.execute("INSERT INTO orders VALUES (%s)", ["o1"])
            assert [a.created for a in await tx.submit([task("t4")])] == [True]
            assert await tasks.wait(0.3) is None
        assert await tasks.wait(5) == [""]
        with pytest.raises(RuntimeError):
            async with b.transaction() as tx:
                await tx.execute("INSERT INTO orders VALUES (%s)", ["o2"])
                await tx.submit([task("t5")])
                raise RuntimeError
        assert await b.get_task("t5") is None
        with pytest.raises(StoreError):
            async with b.transaction() as tx:
                await tx.execute("INSERT INTO orders VALUES (%s)", ["o1"])
        # The listener comes back after its connection is cut.
        with psycopg.connect(pg_url, autocommit=True) as db:
            cut = db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
            ).fetchall()
        assert cut == [(True,)]
        for _ in range(50):
            await asyncio.sleep(0.1)
            await b.submit([task(f"again-{_}")])
            if await tasks.wait(0.05):
                break
        else:
            raise AssertionError("no wake-up after the listener's connection was cut")
    finally:
        await a.close()
        await b.close()


async def test_claims_carry_steps_and_batches_with_duplicates(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    try:
        assert [a.created for a in await store.submit([task("t1"), task("t1"), task("t2")])] == [
            True,
            False,
            True,
        ]
        [c1, c2] = await store.claim_tasks("s1", ["wf"], 5)
        a1 = c1.task.attempt
        got = await store.dispatch_steps(
            [dispatch("t1", a1), dispatch("t1", a1), dispatch("t1", a1, 2, complete_within=0.05)]
        )
        assert got[0] is not None and got[1] is None and got[2] is not None
        assert got[2].remaining <= 0.05
        await asyncio.sleep(0.1)
        term = await store.acquire_lease("sup", "me", 10)
        assert term is not None
        [e] = await store.sweep(
            lease="sup", holder="me", term=term, limit=10, backoff=Backoff(initial=0, maximum=0)
        )
        assert (e.task_id, e.seq, e.process_state) == ("t1", 2, TaskState.PENDING)
        [again] = await store.claim_tasks("s2", ["wf"], 5)
        assert [s.seq for s in again.steps] == [1, 2]
        a2 = again.task.attempt
        # Adopt step 1 (still in time), re-dispatch step 2 twice in one batch: once applies.
        got = await store.dispatch_steps(
            [
                dispatch("t1", a2, 1, kind="adopt", expected_attempt=1, scheduler="s2"),
                dispatch("t1", a2, 2, kind="redispatch", expected_attempt=1, scheduler="s2"),
                dispatch("t1", a2, 2, kind="redispatch", expected_attempt=1, scheduler="s2"),
                dispatch("t1", a1, 3),  # the old attempt is fenced out
            ]
        )
        assert got[0] is not None and got[0].attempt == 1
        assert got[1] is not None and got[1].attempt == 2
        assert got[2] is None and got[3] is None
        steps = {s.seq: s for s in await store.get_steps("t1")}
        assert steps[1].task_attempt == a2 and steps[2].state == StepState.NOT_STARTED
        reqs = await store.claim_requests("a1", "pay", ["charge"], 10)
        assert sorted((r.seq, r.attempt) for r in reqs) == [(1, 1), (2, 2)]
        failed = outcome("t1", 2, 2, state=StepState.FAILED, result=None, error="no")
        # Written once: the second is the same outcome, taken as recorded.
        assert await store.complete_steps([failed, failed]) == [True, True]
        [ev] = await store.events(task_id="t1", kind="step_failed")
        assert ev.detail == {"seq": 2, "attempt": 2, "error": "no"}
        assert [s.seq for s in await store.finished_steps([("t1", 2), ("t1", 2), ("t1", 1)])] == [2]
        assert [t.task_id for t in await store.list_tasks(state=TaskState.PROCESSING)] == [
            "t1",
            "t2",
        ]
        assert c2.task.task_id == "t2"
        # Of two dispatches of one new step, the one that passes the fence is recorded.
        a = c2.task.attempt
        got = await store.dispatch_steps(
            [dispatch("t2", a, 5, scheduler="other"), dispatch("t2", a, 5), dispatch("t2", a, 5)]
        )
        assert got[0] is None and got[1] is not None and got[2] is None
    finally:
        await store.close()


async def test_lease_takeover_waits_for_a_running_sweep(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    try:
        term = await store.acquire_lease("sup", "a", 0.2)
        assert term is not None
        assert await store.acquire_lease("sup", "a", 0.2) == term
        assert await store.acquire_lease("sup", "b", 0.2) is None
        await asyncio.sleep(0.25)
        assert await store.acquire_lease("sup", "a", 5) == term + 1
        with psycopg.connect(pg_url) as db:  # a transaction holding the lease row
            db.execute("SELECT * FROM stepwarden_leases FOR UPDATE")
            db.execute("UPDATE stepwarden_leases SET expires_at = now()")
            waiting = asyncio.create_task(store.acquire_lease("sup", "b", 5))
            await asyncio.sleep(0.2)
            assert not waiting.done()
        assert await waiting == term + 2
    finally:
        await store.close()


@pytest.mark.parametrize("ended_by", ["apart", "the_try"])
@pytest.mark.parametrize("frozen_in", ["idle_transaction", "pipeline"])
async def test_a_sweeper_frozen_mid_transaction_does_not_block_the_takeover(
    pg_url: str, frozen_in: str, ended_by: str
) -> None:
    """The lease row is locked through a sweep's transaction. A supervisor frozen in the middle
    of one (SIGSTOP, a stalled VM) would block every other supervisor for as long as it stays
    frozen. Frozen between statements, the server ends its transaction by itself; frozen in
    the middle of a pipeline (the server sees a statement under way), the next supervisor to
    try ends its session. Either way the frozen transaction is rolled back."""
    assert STALLED < 30
    store = PostgresStore(pg_url)
    await store.open()
    # A connection made as the store makes its own, frozen once it has locked the lease row.
    frozen = await psycopg.AsyncConnection.connect(store.conninfo, **store.connect_kwargs)
    locked, thaw = asyncio.Event(), asyncio.Event()

    async def sweeper() -> None:
        if frozen_in == "idle_transaction":
            await frozen.execute("SELECT * FROM stepwarden_leases FOR UPDATE")
            locked.set()
            await thaw.wait()
            await frozen.execute("UPDATE stepwarden_leases SET holder = 'a'")
        else:
            await frozen.set_autocommit(True)
            async with frozen.pipeline(), frozen.transaction():
                await frozen.execute("SELECT * FROM stepwarden_leases FOR UPDATE")
                await frozen.execute("SELECT 1")  # sent: the server waits for what follows
                locked.set()
                await thaw.wait()
                await frozen.execute("UPDATE stepwarden_leases SET holder = 'a'")

    async def take_over() -> int | None:
        while True:
            try:
                if ended_by == "the_try":  # the supervisor's: stalled sessions ended in it
                    tried = await store.try_lease("sup", "b", 60)
                    if tried.term is None:  # the row still locked: tried again soon
                        assert tried.lapses_in is not None and tried.lapses_in < 1
                        await asyncio.sleep(tried.lapses_in)
                        continue
                    return tried.term
                await store.end_stalled_sessions()
                return await store.acquire_lease("sup", "b", 60)
            except StoreError:  # lock_timeout: the row is still locked; try again
                continue

    try:
        term = await store.acquire_lease("sup", "a", 0)  # lapsed at once: b may take it
        assert term is not None
        frozen_task = asyncio.create_task(sweeper())
        await locked.wait()
        await _until_the_server_runs(pg_url, frozen.pgconn.backend_pid, frozen_in)
        # Without the timeouts this waits for as long as the frozen one sleeps.
        assert await asyncio.wait_for(take_over(), timeout=60) == term + 1
        thaw.set()
        with pytest.raises(psycopg.Error, match="terminat"):  # its session was ended
            await frozen_task
        assert await store.acquire_lease("sup", "a", 5) is None  # b holds it
        assert await store.acquire_lease("sup", "b", 60) == term + 1
    finally:
        await frozen.close()
        await store.close()


async def _until_the_server_runs(pg_url: str, pid: int, frozen_in: str) -> None:
    """Until the frozen session's statements have reached the server: a pipeline's are sent
    without waiting for their results, so the row lock may not be taken yet when its last
    execute returns. Done when the server names the frozen session's last statement."""
    last = "SELECT 1" if frozen_in == "pipeline" else "SELECT * FROM stepwarden_leases FOR UPDATE"
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as db:
        async with asyncio.timeout(30):
            while True:
                row = await (
                    await db.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,))
                ).fetchone()
                if row is not None and row[0] == last:
                    return
                await asyncio.sleep(0.01)


async def test_sweep_reads_only_the_expiry_indexes(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute(
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within) SELECT 't' || i, 'wf', '{}', 'processed', 3, 30"
            " FROM generate_series(1, 20000) i"
        )
        db.execute(
            "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
            " task_attempt, priority, complete_by, idempotency_key, input)"
            " SELECT 't' || i, 1, 'n', 'a', 'o', 'completed', 1, 1, 0, now(), 'k', '{}'"
            " FROM generate_series(1, 20000) i"
        )
        # In flight: processing tasks and open steps still in time, and a few expired.
        db.execute(
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, attempt, complete_by) SELECT 'p' || i, 'wf', '{}', 'processing',"
            " 3, 30, 1, now() + make_interval(secs => 30 - (i < 10)::int * 60)"
            " FROM generate_series(1, 2000) i"
        )
        db.execute(
            "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
            " task_attempt, priority, complete_by, idempotency_key, input)"
            " SELECT 'p' || i, 1, 'n', 'a', 'o', 'running', 1, 1, 0,"
            " now() + make_interval(secs => 30 - (i < 20)::int * 60), 'k', '{}'"
            " FROM generate_series(1, 2000) i"
        )
        db.execute("ANALYZE")
        queries = _sql.queries("postgres")
        for name, index in [
            ("expired_tasks", "stepwarden_tasks_expiry"),
            ("expired_steps", "stepwarden_steps_expiry"),
        ]:
            plan = "\n".join(
                r[0] for r in db.execute("EXPLAIN " + queries[name], {"limit": 100}).fetchall()
            )
            assert index in plan, plan
            assert "Seq Scan" not in plan, plan


def test_the_steps_deadline_is_inlined_where_a_complete_by_is_set(pg_url: str) -> None:
    """A step's complete_by is one SQL function (`stepwarden_step_deadline`) that the
    planner inlines: the statements that set it plan its expression as if written out, in
    the generic plans they are kept with too, and no call of a function is made per row."""
    queries = _sql.queries("postgres")
    with psycopg.connect(pg_url, autocommit=True) as db:
        for name in ("dispatch_new", "dispatch_again", "heartbeat_step", "reassign_steps"):
            assert "stepwarden_step_deadline" in queries[name]
            plan = generic_plan(db, queries[name], verbose=True)
            assert "LEAST(" in plan, (name, plan)
            assert "stepwarden_step_deadline(" not in plan, (name, plan)  # no call


async def test_a_workflow_alone_keeps_one_plan_per_statement(pg_url: str) -> None:
    """Workflows submitted one at a time run each statement of their path with one row:
    PostgreSQL keeps one plan for it (a prepared statement's generic plan) instead of
    planning every call, which cost more of the server's time than running the statement."""
    with psycopg.connect(pg_url, autocommit=True) as db:  # statistics of a used store
        db.execute(
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, finished_at) SELECT 'old' || i, 'wf', '{}', 'processed', 3, 30,"
            " now() FROM generate_series(1, 5000) i"
        )
        db.execute(
            "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
            " task_attempt, priority, complete_by, idempotency_key, input) SELECT 'old' || i,"
            " s, 'n', 'a', 'o', 'completed', 1, 1, 0, now(), 'k', '{}'"
            " FROM generate_series(1, 5000) i, generate_series(1, 3) s"
        )
        db.execute("ANALYZE")
    store = one_session(pg_url)  # whose prepared statements the test then reads
    await store.open()
    try:
        for i in range(25):
            [new] = await store.submit([task(f"t{i}")])
            assert new
            [claimed] = await store.claim_tasks("s1", ["wf"], 25)
            attempt = claimed.task.attempt
            assert await store.dispatch_steps([dispatch(f"t{i}", attempt)]) != [None]
            [request] = await store.claim_requests("a1", "pay", ["charge"], 10)
            assert await store.complete_steps([outcome(f"t{i}", request.attempt)]) == [True]
            end = TaskOutcome(
                task_id=f"t{i}", attempt=attempt, scheduler="s1", state=TaskState.PROCESSED,
                result="1", error=None,
            )  # fmt: skip
            assert await store.finish_tasks([end]) == [True]
        assert store._pool is not None
        async with store._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            )
            prepared = await cur.fetchall()
    finally:
        await store.close()
    queries = _sql.queries("postgres")
    for name in (
        "insert_tasks", "claim_tasks", "dispatch_new", "claim_requests", "complete_steps",
        "finish_tasks",
    ):  # fmt: skip
        head = queries[name].splitlines()[0]  # each query opens with its own comment
        [(generic, custom)] = [(g, c) for text, g, c in prepared if text.startswith(head)]
        # Five plans for the call's parameters, then the generic plan, kept.
        assert custom <= 5 and generic >= 10, (name, generic, custom)


async def test_a_write_that_fails_part_way_records_nothing(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A write transaction that fails part way, the database refusing a statement or the
    flow raising, records nothing of what it wrote before, and its session is usable again:
    the next write on it commits. A statement the failure made the server skip as psycopg
    prepared it (its sixth run) is not taken for prepared afterwards: it runs again."""

    def event(detail: str) -> Query:
        return Query("insert_events", each=[{"task_id": None, "kind": "k", "detail": detail}])

    def refused(wake: Wakeups) -> Flow[None]:
        yield [event('"written first"')]
        yield [event("{not json")]  # refused by the database

    def raising(wake: Wakeups) -> Flow[None]:
        yield [event('"written first"')]
        raise RuntimeError("the flow fails")

    def kept(wake: Wakeups) -> Flow[None]:
        yield [event('"kept"')]

    def read(wake: Wakeups) -> Flow[Rows]:
        [rows] = yield [Query("get_task", {"task_id": "none"})]
        return rows

    def refused_before_a_read(wake: Wakeups) -> Flow[None]:
        yield [event("{not json"), Query("get_task", {"task_id": "none"})]

    store = one_session(pg_url)
    await store.open()
    try:
        with pytest.raises(StoreError, match="json"):
            await store._write(refused)
        with pytest.raises(RuntimeError, match="the flow fails"):
            await store._write(raising)
        await store._write(kept)
        assert [e.detail for e in await store.events(kind="k")] == ["kept"]
        for _ in range(5):  # psycopg prepares a statement on its sixth run
            assert await store._write(read) == []
        with pytest.raises(StoreError, match="json"):
            await store._write(refused_before_a_read)
        for _ in range(3):
            assert await store._write(read) == []
    finally:
        await store.close()
    assert not [r for r in caplog.records if r.name.startswith("psycopg")]


async def test_batch_parameters_keep_every_character(pg_url: str) -> None:
    """Batches travel as array literals: quotes, backslashes, braces, commas, the word NULL,
    empty strings and non-ASCII text come back as they went in, and None as NULL."""
    texts = ['{"a": "b\\"c"}', "x,y", " lead", "NULL", "", None, "back\\slash", "é 中 😀", "a}b{"]
    store = PostgresStore(pg_url)
    await store.open()
    try:
        async with store._connection() as conn:
            row = await (
                await conn.execute(
                    "SELECT %(t)s::text[], %(i)s::int[], %(f)s::float8[], %(b)s::bool[],"
                    " %(e)s::text[]",
                    {
                        "t": texts,
                        "i": [1, -2, 2**31 - 1],
                        "f": [0.1, 1e-05],
                        "b": [True, None],
                        "e": [],
                    },
                )
            ).fetchone()
        assert row == (texts, [1, -2, 2**31 - 1], [0.1, 1e-05], [True, None], [])
    finally:
        await store.close()


async def test_callers_at_once_share_one_store_and_one_listener(pg_url: str) -> None:
    """Many waits begun at once (results awaited with gather) open one store and one
    LISTEN connection between them, not one each: the server has room for a hundred."""
    import stepwarden as sw

    app = sw.App("shared", store=pg_url)
    try:
        stores = await asyncio.gather(*(app._listening() for _ in range(40)))
        assert len({id(s) for s in stores}) == 1
        name = pg_url.rsplit("/", 1)[1]
        with psycopg.connect(pg_url) as db:
            row = db.execute(
                "SELECT count(*) FILTER (WHERE query LIKE 'LISTEN%%'), count(*)"
                " FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            ).fetchone()
        assert row is not None
        listeners, sessions = row
        assert listeners == 1, row
        assert sessions <= 1 + 10, row  # the listener and at most the pool's size
    finally:
        await app.aclose()


async def test_a_listener_connected_again_wakes_every_subscriber_and_says_it_listens(
    pg_url: str,
) -> None:
    """While its LISTEN connection is up the store says every wake-up reaches it (its idle
    pollers then poll only as a fallback); once that connection is lost, it says so until it
    listens again, and then wakes every subscriber with an empty wake-up (look at
    everything: notifications sent meanwhile were lost)."""
    store = PostgresStore(pg_url)
    await store.open()
    try:
        assert not store.wakeups_live
        await store.listen()
        tasks, results = store.subscribe(CHANNEL_TASKS), store.subscribe(CHANNEL_RESULTS)
        deadline = time.monotonic() + 10
        while not store.wakeups_live:
            assert time.monotonic() < deadline, "the store never said it listens"
            await asyncio.sleep(0.01)
        with psycopg.connect(pg_url, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname ="
                " current_database() AND query LIKE 'LISTEN %%' AND pid <> pg_backend_pid()"
            ).fetchall()
        assert ended == [(True,)]
        assert await tasks.wait(30) == []
        assert await results.wait(1) == []
        assert store.wakeups_live
    finally:
        await store.close()
    assert not store.wakeups_live
