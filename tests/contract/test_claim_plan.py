"""Claims read the claim indexes, in the order of their rank (priority with aging), not the
store: a scheduler's claim walks (workflow, version, ranked_at), an agent's (agent,
ranked_at), whatever else the tables hold."""

from __future__ import annotations

import asyncio
import re
import sqlite3

import psycopg

from stepwarden.store import _sql, open_store

from ..rawsql import custom_plan, generic_plan

KEPT = 20_000
WAITING = 3_000
TASKS = {"scheduler": "s1", "workflows": ["wf"], "versions": [1], "limit": 10}
REQUESTS = {"instance": "a1", "agent": "pay", "operations": ["charge"], "limit": 10, "scan": 100}


def test_postgres_claims_read_the_claim_indexes_in_rank_order(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute(
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, finished_at) SELECT 'old' || i, 'wf', '{}', 'processed', 3, 30,"
            " now() FROM generate_series(1, %s) i",
            (KEPT,),
        )
        # Waiting for a claim: tasks of this workflow and of another, of every priority,
        # and the requests of two agents.
        db.execute(
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, priority, ranked_at) SELECT 'p' || i,"
            " CASE WHEN mod(i, 2) = 0 THEN 'wf' ELSE 'other' END, '{}', 'pending', 3, 30,"
            " mod(i, 20), now() - make_interval(secs => mod(i, 20))"
            " FROM generate_series(1, %s) i",
            (WAITING,),
        )
        db.execute(
            "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
            " task_attempt, priority, complete_by, idempotency_key, input, ranked_at)"
            " SELECT 'old' || i, 1, 'n', CASE WHEN mod(i, 2) = 0 THEN 'pay' ELSE 'ship' END,"
            " 'charge', CASE WHEN i <= %s THEN 'not_started' ELSE 'completed' END, 1, 1,"
            " mod(i, 20), now() + interval '1 minute', 'k', '{}',"
            " now() - make_interval(secs => mod(i, 20))"
            " FROM generate_series(1, %s) i",
            (WAITING, KEPT),
        )
        db.execute("ANALYZE")
        queries = _sql.queries("postgres")
        for name, params, table, index in [
            ("claim_tasks", TASKS, "stepwarden_tasks", "stepwarden_tasks_pending"),
            ("claim_tasks", TASKS, "stepwarden_tasks", "stepwarden_tasks_compensate"),
            ("claim_requests", REQUESTS, "stepwarden_steps", "stepwarden_steps_requests"),
            ("limited_candidates", REQUESTS, "stepwarden_steps", "stepwarden_steps_requests"),
        ]:
            # The plan PostgreSQL makes for the call, and the generic one it keeps for all.
            for plan in (
                custom_plan(db, queries[name], params),
                generic_plan(db, queries[name], params),
            ):
                # The walk of the index gives the rank's order: it stops at the limit, unsorted.
                walk = rf"Limit .*\n\s*->  LockRows .*\n\s*->  Index Scan using {index} on {table}"
                assert re.search(walk, plan), (name, plan)
                assert f"Seq Scan on {table}" not in plan, (name, plan)


def test_sqlite_claims_read_the_claim_indexes_in_rank_order(sqlite_url: str) -> None:
    async def migrate() -> None:
        store = open_store(sqlite_url)
        await store.open()
        await store.close()

    asyncio.run(migrate())
    db = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    queries = _sql.queries("sqlite")
    params = {**TASKS, **REQUESTS, "now": 1e12, "workflows": '["wf"]', "versions": "[1]"}
    params["operations"] = '["charge"]'
    for name, index in [
        ("claim_tasks", "stepwarden_tasks_pending"),
        ("claim_tasks", "stepwarden_tasks_compensate"),
        ("claim_requests", "stepwarden_steps_requests"),
        ("limited_candidates", "stepwarden_steps_requests"),
    ]:
        rows = db.execute("EXPLAIN QUERY PLAN " + queries[name], params)
        plan = " | ".join(row[3] for row in rows)
        assert f"USING INDEX {index}" in plan, (name, plan)
        # Each walk of an index is in rank order: only the few candidates of a claim of
        # tasks (pending and compensating) are sorted together.
        walks = plan.split("SCAN candidates")[0]
        assert "TEMP B-TREE FOR ORDER BY" not in walks, (name, plan)
