"""What a submit of one task costs at the store, one at a time, back to back (no workers):
of a tenant that has tasks waiting already, of a new tenant each time, and of one tenant
from 8 submitters at once (their submits per second). A submit that makes a task pending
notes its tenant among those with work waiting (migration 0023): this measures that note.

    python -m bench.tenant_submits --store postgres
    python -m bench.tenant_submits --store sqlite

`--store postgres` makes a database of its own on `--admin-url` (dropped after)."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

import psycopg

from stepwarden.records import Submission
from stepwarden.store import Store, open_one

ADMIN = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _task(tenant: str) -> Submission:
    return Submission(workflow="wf", input="null", task_id=uuid.uuid4().hex,
                      complete_within=3600.0, max_failures=3, tenant=tenant)  # fmt: skip


async def _one_at_a_time(store: Store, n: int, tenant_of: Any) -> float:
    times = []
    for i in range(n):
        task = _task(tenant_of(i))
        started = time.perf_counter()
        await store.submit([task])
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def _side_by_side(store: Store, submitters: int, each: int) -> float:
    async def one() -> None:
        for _ in range(each):
            await store.submit([_task("busy")])

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(submitters)))
    return submitters * each / (time.perf_counter() - started)


async def run(url: str, n: int) -> dict[str, float]:
    store = open_one(url)
    await store.open()
    try:
        await _one_at_a_time(store, 50, lambda i: "warm")
        found = {}
        for r in range(3):
            found[f"same_tenant_ms_{r}"] = await _one_at_a_time(store, n, lambda i: "acme")
            found[f"new_tenant_ms_{r}"] = await _one_at_a_time(store, n, lambda i, r=r: f"t{r}-{i}")
            found[f"one_tenant_8_at_once_per_s_{r}"] = await _side_by_side(store, 8, n // 8)
    finally:
        await store.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--submits", type=int, default=1000)
    parser.add_argument("--admin-url", default=ADMIN)
    args = parser.parse_args()
    if args.store == "sqlite":
        with tempfile.TemporaryDirectory(prefix="swbench_submits_") as folder:
            found = asyncio.run(run(f"sqlite:///{folder}/submits.db", args.submits))
    else:
        name = f"swbench_submits_{os.getpid()}"
        with psycopg.connect(args.admin_url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        try:
            url = args.admin_url.rsplit("/", 1)[0] + f"/{name}"
            found = asyncio.run(run(url, args.submits))
        finally:
            with psycopg.connect(args.admin_url, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    for key, value in found.items():
        print(f"{key:<32} {value:.3f}")


if __name__ == "__main__":
    main()
