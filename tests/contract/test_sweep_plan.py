"""The supervisor's sweep reads the expiry indexes, not the whole store: its cost follows the
number of expired records, not the number of tasks kept."""

from __future__ import annotations

import sqlite3

from stepwarden.store import _sql

FINISHED = 20_000


def test_sqlite_sweep_uses_the_expiry_indexes(sqlite_url: str) -> None:
    import asyncio

    from stepwarden.store import open_store

    async def migrate() -> None:
        store = open_store(sqlite_url)
        await store.open()
        await store.close()

    asyncio.run(migrate())
    db = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    db.executemany(
        "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
        " complete_within, eligible_at, created_at, updated_at) "
        "VALUES (?, 'wf', '{}', 'processed', 3, 30, 0, 0, 0)",
        ((f"t{i}",) for i in range(FINISHED)),
    )
    queries = _sql.queries("sqlite")
    for name, index in [
        ("expired_tasks", "stepwarden_tasks_expiry"),
        ("expired_steps", "stepwarden_steps_expiry"),
    ]:
        plan = " | ".join(
            row[3]
            for row in db.execute(
                "EXPLAIN QUERY PLAN " + queries[name], {"now": 1e12, "limit": 100}
            )
        )
        assert index in plan, plan
        assert "SCAN stepwarden_tasks" not in plan.replace("USING INDEX", ""), plan


def test_postgres_sweep_reads_what_is_expired_not_the_store(pg_url: str) -> None:
    """The pages a sweep reads follow the expired records, not the finished ones."""
    import psycopg
    from psycopg.rows import TupleRow

    expired = 100
    queries = _sql.queries("postgres")

    def add_finished(db: psycopg.Connection[TupleRow], first: int, n: int) -> None:
        db.execute(
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, eligible_at, created_at, updated_at, attempt) "
            "SELECT 'f' || i, 'wf', '{}', 'processed', 3, 30, now(), now(), now(), 1"
            " FROM generate_series(%s::int, %s::int) AS i",
            (first, first + n - 1),
        )
        db.execute(
            "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
            " task_attempt, priority, complete_by, idempotency_key, input, created_at,"
            " dispatched_at) "
            "SELECT 'f' || i, 1, 'a.op', 'a', 'op', 'completed', 1, 1, 0,"
            " now() - interval '1 minute', 'f' || i || '/1', '[]', now(), now()"
            " FROM generate_series(%s::int, %s::int) AS i",
            (first, first + n - 1),
        )
        db.execute("ANALYZE")

    def pages_read(db: psycopg.Connection[TupleRow]) -> dict[str, int]:
        read = {}
        for name in ("expired_tasks", "expired_steps"):
            explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + queries[name]
            row = db.execute(explain, {"limit": 1000}).fetchone()
            assert row is not None
            plan = row[0][0]["Plan"]
            assert plan["Actual Rows"] == expired, plan
            assert "Seq Scan" not in str(plan), plan
            read[name] = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        return read

    with psycopg.connect(pg_url, autocommit=True) as db:
        # `expired` processing tasks (held) whose complete_by passed, each with an open step whose
        # complete_by passed, among FINISHED finished tasks with a completed step each.
        db.execute(
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, eligible_at, created_at, updated_at, attempt, complete_by,"
            " locked_by) "
            "SELECT 'x' || i, 'wf', '{}', 'processing', 3, 30, now(), now(), now(), 1,"
            " now() - interval '1 minute', 's1' FROM generate_series(1, %s::int) AS i",
            (expired,),
        )
        db.execute(
            "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
            " task_attempt, priority, complete_by, idempotency_key, input, created_at,"
            " dispatched_at) "
            "SELECT 'x' || i, 1, 'a.op', 'a', 'op', 'running', 1, 1, 0,"
            " now() - interval '1 minute', 'x' || i || '/1', '[]', now(), now()"
            " FROM generate_series(1, %s::int) AS i",
            (expired,),
        )
        add_finished(db, 1, FINISHED)
        small = pages_read(db)
        add_finished(db, FINISHED + 1, 4 * FINISHED)
        large = pages_read(db)
        row = db.execute(
            "SELECT sum(relpages) FROM pg_class"
            " WHERE relname IN ('stepwarden_tasks', 'stepwarden_steps')"
        ).fetchone()
        assert row is not None
        table_pages = int(row[0])
    for name in small:
        # A few pages per expired record (an index walk, one task looked up by its key, whose
        # B-tree may gain a level as the store grows); nothing that scales with finished tasks.
        assert small[name] <= 5 * expired + 10, (name, small)
        assert large[name] <= 5 * expired + 10, (name, large)
        assert large[name] < table_pages / 4, (name, large, table_pages)
