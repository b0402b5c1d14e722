"""The fair share of claims across tenants, measured at the store (no workers: what a
scheduler's claim takes, and what it costs):

- shares: tenant A submits 10,000 tasks in batches, then B 2,000; claims of 10 at a time
  until B's are all claimed: B's share of the claims while both had tasks waiting (its
  weight 1 to A's 1, then, with the same backlogs again, 1 to A's 3);
- cost: the median time of a claim of 10 with `--pending` tasks waiting over `--tenants`
  tenants, against the same over one tenant (the claim reads an index either way).

    python -m bench.fair_claims --store sqlite --pending 100000 --tenants 1000
    python -m bench.fair_claims --store postgres --pending 1000000 --tenants 10000

`--store postgres` makes a database of its own on `--admin-url` (dropped after)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections import Counter
from typing import Any

import psycopg

from stepwarden.records import Submission
from stepwarden.store import Store, open_one

ADMIN = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _task(tenant: str, n: int) -> Submission:
    return Submission(workflow="wf", input="null", task_id=f"{tenant}-{n}-{uuid.uuid4().hex[:8]}",
                      complete_within=3600.0, max_failures=3, tenant=tenant)  # fmt: skip


async def _shares(store: Store, weight_a: float) -> float:
    await store.set_tenant_weight("a", weight_a)
    for start in range(0, 10_000, 500):
        await store.submit([_task("a", start + i) for i in range(500)])
    for start in range(0, 2_000, 500):
        await store.submit([_task("b", start + i) for i in range(500)])
    got: Counter[str] = Counter()
    while got["b"] < 2_000:
        claimed = await store.claim_tasks("bench", ["wf"], 10)
        got.update(c.task.tenant or "" for c in claimed)
    return got["b"] / (got["a"] + got["b"])


def _fill(url: str, pending: int, tenants: int) -> None:
    """`pending` tasks over `tenants` tenants, written by SQL (a submit's rows, faster)."""
    if url.startswith("sqlite"):
        db = sqlite3.connect(url.removeprefix("sqlite:///"))
        db.execute("DELETE FROM stepwarden_tasks")
        db.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
            " INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state,"
            " max_failures, complete_within, created_at, updated_at, eligible_at, ranked_at,"
            " tenant) SELECT 'p' || i, 'wf', 'null', 'pending', 3, 3600, 0, 0, 0, i,"
            " 't' || (i % ?) FROM n",
            (pending, tenants),
        )
        db.commit()
        db.execute("ANALYZE")
        db.close()
        return
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("TRUNCATE stepwarden_tasks CASCADE")
        db.execute(
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, ranked_at, tenant) SELECT 'p' || i, 'wf', 'null', 'pending', 3,"
            " 3600, now() - make_interval(secs => i), 't' || mod(i, %s)"
            " FROM generate_series(1, %s) i",
            (tenants, pending),
        )
        db.execute("VACUUM ANALYZE stepwarden_tasks")


async def _claim_cost(store: Store, url: str, pending: int, tenants: int) -> float:
    _fill(url, pending, tenants)
    times = []
    for _ in range(50):
        started = time.perf_counter()
        await store.claim_tasks("bench", ["wf"], 10)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def run(url: str, pending: int, tenants: int) -> dict[str, Any]:
    store = open_one(url)
    await store.open()
    try:
        even = await _shares(store, 1)
        _fill(url, 0, 1)
        weighted = await _shares(store, 3)
        one = await _claim_cost(store, url, pending, 1)
        many = await _claim_cost(store, url, pending, tenants)
    finally:
        await store.close()
    return {"b_share_1_1": even, "b_share_3_1": weighted, "claim_ms_one_tenant": one,
            f"claim_ms_{tenants}_tenants": many}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=1_000)
    parser.add_argument("--admin-url", default=ADMIN)
    args = parser.parse_args()
    if args.store == "sqlite":
        with tempfile.TemporaryDirectory(prefix="swbench_fair_") as folder:
            found = asyncio.run(run(f"sqlite:///{folder}/fair.db", args.pending, args.tenants))
    else:
        name = f"swbench_fair_{os.getpid()}"
        with psycopg.connect(args.admin_url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        try:
            url = args.admin_url.rsplit("/", 1)[0] + f"/{name}"
            found = asyncio.run(run(url, args.pending, args.tenants))
        finally:
            with psycopg.connect(args.admin_url, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    for key, value in found.items():
        print(f"{key:<28} {value:.3f}")


if __name__ == "__main__":
    main()
