"""The fair claim of an agent's requests reads the index of migration 0024, never the queue:
its walk of the tenants probes (agent, operation, tenant) once a tenant, and each tenant's
share (or, within limits, its candidates) is read in rank order through (agent, operation,
tenant, ranked_at), stopping at its count. No sequential scan of the steps, and no sort of
them: what is sorted is the claim's few candidates (or the tenants found)."""

from __future__ import annotations

import asyncio
import re
import sqlite3

import psycopg

from stepwarden.store import _sql, open_store

from ..rawsql import custom_plan, generic_plan

TENANTS = 200
QUEUED = 20_000
KEPT = 20_000
PARAMS = {
    "instance": "a1",
    "agent": "pay",
    "operations": ["charge"],
    "limit": 10,
    "scan": 100,
    "tenants": ["t1", "t2"],
    "counts": [5, 5],
}
NAMES = ("fair_request_tenants", "claim_fair_requests", "limited_fair_candidates")
SORTED_STEPS = re.compile(r"Sort .*\n(\s*Sort Key: .*\n)?\s*->  \w[\w ]* on stepwarden_steps")


def test_postgres_fair_claims_of_requests_read_the_tenants_index(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute(
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, tenant) SELECT 't' || i, 'wf', '{}', 'processing', 3, 30,"
            " 't' || i FROM generate_series(0, %s - 1) i",
            (TENANTS,),
        )
        # Queued requests of many tenants, of this agent's operation and of others, and the
        # steps of the past.
        db.execute(
            "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
            " task_attempt, priority, complete_by, idempotency_key, input, ranked_at, tenant)"
            " SELECT 't' || mod(i, %s), i, 'n', CASE WHEN mod(i, 3) = 0 THEN 'ship' ELSE 'pay'"
            " END, CASE WHEN mod(i, 5) = 0 THEN 'refund' ELSE 'charge' END,"
            " CASE WHEN i <= %s THEN 'not_started' ELSE 'completed' END, 1, 1, mod(i, 20),"
            " now() + interval '1 minute', 'k', '{}', now() - make_interval(secs => mod(i, 20)),"
            " 't' || mod(i, %s) FROM generate_series(1, %s) i",
            (TENANTS, QUEUED, TENANTS, QUEUED + KEPT),
        )
        db.execute("ANALYZE")
        queries = _sql.queries("postgres")
        for name in NAMES:
            for plan in (
                custom_plan(db, queries[name], PARAMS),
                generic_plan(db, queries[name], PARAMS),
            ):
                assert "using stepwarden_steps_fair on stepwarden_steps" in plan, (name, plan)
                assert "Seq Scan on stepwarden_steps" not in plan, (name, plan)
                assert not SORTED_STEPS.search(plan), (name, plan)


def test_sqlite_fair_claims_of_requests_read_the_tenants_index(sqlite_url: str) -> None:
    async def migrate() -> None:
        store = open_store(sqlite_url)
        await store.open()
        await store.close()

    asyncio.run(migrate())
    db = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    queries = _sql.queries("sqlite")
    params = {
        **PARAMS,
        "now": 1e12,
        "operations": '["charge"]',
        "tenants": '["t1", "t2"]',
        "counts": "[5, 5]",
    }
    for name in NAMES:
        rows = db.execute("EXPLAIN QUERY PLAN " + queries[name], params).fetchall()
        plan = " | ".join(row[3] for row in rows)
        assert "USING INDEX stepwarden_steps_fair" in plan or (
            "USING COVERING INDEX stepwarden_steps_fair" in plan
        ), (name, plan)
        assert not re.search(r"SCAN (s|x|stepwarden_steps)\b(?! USING)", plan), (name, plan)
