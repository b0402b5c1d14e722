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
    for name, index in [("expired_tasks", "stepwarden_tasks_expiry"),
                        ("expired_steps", "stepwarden_steps_expiry")]:
        plan = " | ".join(
            row[3] for row in db.execute(
                "EXPLAIN QUERY PLAN " + queries[name], {"now": 1e12, "limit": 100})
        )
        assert index in plan, plan
        assert "SCAN stepwarden_tasks" not in plan.replace("USING INDEX", ""), plan
