"""A fair claim reads indexes, never the pending set nor every tenant: it reads the tenants
of least pass from the table of the tenants with work waiting (migration 0023) through its
index on (workflow, version, pass, tenant), probes the index of migration 0021 once for each
of them (has it pending tasks?), and reads each tenant's share in rank order through
(workflow, version, tenant, ranked_at), stopping at its count; its writes to that table
(the passes moved up, the rows of tenants gone idle held and deleted) find their rows by key.
No sequential scan of the tasks or of the tenants waiting, and no sort of them: what is
sorted is the claim's few candidates."""

from __future__ import annotations

import asyncio
import re
import sqlite3

import psycopg

from stepwarden.store import _sql, open_store

from ..rawsql import custom_plan, generic_plan

TENANTS = 2_000
PENDING = 20_000
PARAMS = {
    "scheduler": "s1",
    "workflows": ["wf"],
    "versions": [1],
    "limit": 10,
    "scan": 18,
    "tenants": ["t1", "t2"],
    "counts": [5, 5],
    "tenant": ["t1", "t2"],
    "workflow": ["wf", "wf"],
    "version": [1, 1],
}
QUERIES = (
    "fair_tenants",
    "claim_fair",
    "lift_tenant_work",
    "hold_idle_tenant_work",
    "drop_idle_tenant_work",
)
TABLES = r"(stepwarden_tasks|stepwarden_tenant_work)\b"
SORTED = re.compile(r"Sort .*\n(\s*Sort Key: .*\n)?\s*->  \w[\w ]* on " + TABLES)


def test_postgres_fair_claims_read_the_indexes(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as db:
        # Pending tasks over many tenants (the submits' trigger writes the tenants waiting),
        # some of them claimed for before (their passes, some behind the clock).
        db.execute(
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, priority, ranked_at, tenant) SELECT 'p' || i, 'wf', '{}',"
            " 'pending', 3, 30, mod(i, 20), now() - make_interval(secs => mod(i, 20)),"
            " 't' || mod(i, %s) FROM generate_series(1, %s) i",
            (TENANTS, PENDING),
        )
        db.execute(
            "INSERT INTO stepwarden_tenants (tenant, pass) SELECT 't' || i, mod(i, 7)"
            " FROM generate_series(1, %s, 3) i",
            (TENANTS,),
        )
        db.execute("UPDATE stepwarden_fair_clock SET vtime = 3")
        db.execute("ANALYZE")
        waiting = db.execute("SELECT count(*) FROM stepwarden_tenant_work").fetchone()
        assert waiting == (TENANTS,)
        queries = _sql.queries("postgres")
        for name in QUERIES:
            for plan in (
                custom_plan(db, queries[name], PARAMS),
                generic_plan(db, queries[name], PARAMS),
            ):
                assert not re.search(r"Seq Scan on " + TABLES, plan), (name, plan)
                assert not SORTED.search(plan), (name, plan)
                if name == "fair_tenants":
                    assert "using stepwarden_tenant_work_pass on stepwarden_tenant_work" in plan
                if name in ("fair_tenants", "claim_fair", "drop_idle_tenant_work"):
                    assert "stepwarden_tasks_fair on stepwarden_tasks" in plan, (name, plan)


def test_sqlite_fair_claims_read_the_indexes(sqlite_url: str) -> None:
    async def migrate() -> None:
        store = open_store(sqlite_url)
        await store.open()
        await store.close()

    asyncio.run(migrate())
    db = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    db.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
        " INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
        " complete_within, created_at, updated_at, eligible_at, priority, ranked_at, tenant)"
        " SELECT 'p' || i, 'wf', 'null', 'pending', 3, 30, 0, 0, 0, i % 20, i % 20,"
        " 't' || (i % ?) FROM n",
        (PENDING, TENANTS),
    )
    db.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 3 FROM n WHERE i + 3 < ?)"
        " INSERT INTO stepwarden_tenants (tenant, pass) SELECT 't' || i, i % 7 FROM n",
        (TENANTS,),
    )
    db.execute("UPDATE stepwarden_fair_clock SET vtime = 3")
    db.commit()
    db.execute("ANALYZE")
    assert db.execute("SELECT count(*) FROM stepwarden_tenant_work").fetchone() == (TENANTS,)
    queries = _sql.queries("sqlite")
    params = {k: f"{v}".replace("'", '"') if isinstance(v, list) else v for k, v in PARAMS.items()}
    for name in QUERIES:
        rows = db.execute("EXPLAIN QUERY PLAN " + queries[name], {**params, "now": 1e12})
        plan = " | ".join(row[3] for row in rows.fetchall())
        # A table of these two read without an index (its aliases: t, x, k).
        assert not re.search(r"SCAN (t|x|k|" + TABLES[1:-3] + r")\b(?! USING)", plan), (
            name,
            plan,
        )
        if name != "claim_fair":  # claim_fair sorts its candidates, a share of each tenant
            assert "USE TEMP B-TREE FOR ORDER BY" not in plan, (name, plan)
        if name == "fair_tenants":
            assert "USING COVERING INDEX stepwarden_tenant_work_pass" in plan, plan
        if name in ("fair_tenants", "claim_fair", "drop_idle_tenant_work"):
            assert "USING INDEX stepwarden_tasks_fair" in plan or (
                "USING COVERING INDEX stepwarden_tasks_fair" in plan
            ), (name, plan)
    db.close()
