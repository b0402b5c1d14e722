"""The fair claim reads the index of migration 0021, never the pending set: its walk of the
tenants probes (workflow, version, tenant) once a tenant, and each tenant's share is read
in rank order through (workflow, version, tenant, ranked_at), stopping at its count. No
sequential scan of the tasks, and no sort of them: what is sorted is the claim's few
candidates (or the tenants found)."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from typing import Any

import psycopg

from stepwarden.store import _sql, open_store

from ..rawsql import generic_plan

TENANTS = 200
PENDING = 20_000
PARAMS = {
    "scheduler": "s1",
    "workflows": ["wf"],
    "versions": [1],
    "limit": 10,
    "tenants": ["t1", "t2"],
    "counts": [5, 5],
}
SORTED_TASKS = re.compile(r"Sort .*\n(\s*Sort Key: .*\n)?\s*->  \w[\w ]* on stepwarden_tasks")


def test_postgres_fair_claims_read_the_tenants_index(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute(
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, priority, ranked_at, tenant) SELECT 'p' || i, 'wf', '{}',"
            " 'pending', 3, 30, mod(i, 20), now() - make_interval(secs => mod(i, 20)),"
            " 't' || mod(i, %s) FROM generate_series(1, %s) i",
            (TENANTS, PENDING),
        )
        db.execute("ANALYZE")
        queries = _sql.queries("postgres")
        for name in ("fair_tenants", "claim_fair"):
            for plan in (_plan(db, queries[name], PARAMS), generic_plan(db, queries[name], PARAMS)):
                assert "using stepwarden_tasks_fair on stepwarden_tasks" in plan, (name, plan)
                assert "Seq Scan on stepwarden_tasks" not in plan, (name, plan)
                assert not SORTED_TASKS.search(plan), (name, plan)


def _plan(db: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> str:
    return "\n".join(r[0] for r in db.execute("EXPLAIN " + query, params).fetchall())


def test_sqlite_fair_claims_read_the_tenants_index(sqlite_url: str) -> None:
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
        "workflows": '["wf"]',
        "versions": "[1]",
        "tenants": '["t1", "t2"]',
        "counts": "[5, 5]",
    }
    for name in ("fair_tenants", "claim_fair"):
        rows = db.execute("EXPLAIN QUERY PLAN " + queries[name], params).fetchall()
        plan = " | ".join(row[3] for row in rows)
        assert "USING INDEX stepwarden_tasks_fair" in plan or (
            "USING COVERING INDEX stepwarden_tasks_fair" in plan
        ), (name, plan)
        assert not re.search(r"SCAN (t|x|stepwarden_tasks)\b(?! USING)", plan), (name, plan)
