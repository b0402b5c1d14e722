"""The App of the upgrade test of compensation, and the script that made its fixture.

`mid_compensation.sql` is a SQLite store left by the engine of commit 3efd364 (before
compensation ran as a workflow through the Context), killed in the middle of a compensation:

    PYTHONPATH=<a checkout of 3efd364>/src:. python -m tests.upgrade.saga_app tests/upgrade \
        postgresql://postgres@127.0.0.1:5432/postgres

ran from the repository's root. For each store it runs a worker (every role) in a child
process on a new store, submits the order "o1", whose third step fails for good; the task is
compensating: the refund of its charge completes, then the release of its reservation starts,
and the child is killed (SIGKILL) while that release is called. The store is then written as
SQL (SQLite: `iterdump`, `mid_compensation.sqlite.sql`; PostgreSQL: `pg_dump --inserts`, of a
database made for it and dropped after, `mid_compensation.postgres.sql`), with what each
operation did in the killed process (`mid_compensation.<store>.json`, the effects a test adds
to those of its own run).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import stepwarden as sw

ORDER = "o1"
STARTED = "release-started"
"""The file the release writes in the child's directory as it starts (then it hangs)."""


class SagaApp:
    """reserve (undone by release) -> charge (undone by refund) -> ship (fails for good)."""

    def __init__(self, store_url: str, *, hang_in: Path | None = None) -> None:
        self.app = sw.App("saga", store=store_url)
        self.effects: Counter[str] = Counter()
        self.undoes: dict[str, list[str | None]] = {}
        inventory = self.app.agent("inventory")
        payments = self.app.agent("payments")
        shipping = self.app.agent("shipping")

        def effect(name: str, call: sw.Call) -> None:
            self.effects[name] += 1
            self.undoes.setdefault(name, []).append(call.compensates_key)

        @inventory.operation
        async def reserve(call: sw.Call, order: dict[str, Any]) -> str:
            effect("reserve", call)
            return "reserved"

        @inventory.operation
        async def release(call: sw.Call, order: dict[str, Any]) -> str:
            if hang_in is not None:
                (hang_in / STARTED).write_text(call.idempotency_key)
                await asyncio.Event().wait()  # killed here
            effect("release", call)
            return "released"

        @payments.operation
        async def charge(call: sw.Call, order: dict[str, Any]) -> str:
            effect("charge", call)
            return "charged"

        @payments.operation
        async def refund(call: sw.Call, order: dict[str, Any]) -> str:
            effect("refund", call)
            return "refunded"

        @shipping.operation
        async def ship(call: sw.Call, order: dict[str, Any]) -> str:
            raise sw.PermanentError("no courier")

        @self.app.workflow(complete_within=timedelta(seconds=30), max_failures=3)
        async def order(ctx: sw.Context, order: dict[str, Any]) -> str:
            await ctx.step(inventory.reserve, order, compensate=inventory.release)
            await ctx.step(payments.charge, order, compensate=payments.refund)
            await ctx.step(shipping.ship, order)
            return "done"

        self.order = order


async def _child(store_url: str, workdir: Path) -> None:
    """The worker killed mid-compensation: it writes what its operations did as they do it."""
    saga = SagaApp(store_url, hang_in=workdir)
    options = sw.WorkerOptions(poll_interval=0.05, supervisor_interval=0.2)
    worker = sw.Worker(saga.app, options)
    run = asyncio.create_task(worker.run())
    await saga.app.submit_async(saga.order, {"id": 1}, task_id=ORDER)
    while True:
        (workdir / "effects.json").write_text(json.dumps(saga.effects))
        await asyncio.sleep(0.01)
        if run.done():
            run.result()


def _killed_mid_compensation(store_url: str, workdir: Path) -> dict[str, int]:
    """Run the child on `store_url` until the release starts, kill it: its effects."""
    for name in (STARTED, "effects.json"):
        (workdir / name).unlink(missing_ok=True)
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.upgrade.saga_app", "--child", store_url, str(workdir)]
    )
    deadline = time.monotonic() + 60
    while not (workdir / STARTED).exists():
        if time.monotonic() > deadline or child.poll() is not None:
            child.kill()
            raise SystemExit("the release never started")
        time.sleep(0.01)
    time.sleep(0.2)  # the effects' file written since
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    effects: dict[str, int] = json.loads((workdir / "effects.json").read_text())
    for name in (STARTED, "effects.json"):
        (workdir / name).unlink(missing_ok=True)
    return effects


def main(out: Path, admin_url: str) -> None:
    workdir = out / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "store.db"
    effects = _killed_mid_compensation(f"sqlite:///{db}", workdir)
    with sqlite3.connect(db) as conn:
        dump = "\n".join(conn.iterdump())
    (out / "mid_compensation.sqlite.sql").write_text(dump + "\n")
    (out / "mid_compensation.sqlite.json").write_text(json.dumps(effects, sort_keys=True) + "\n")
    for name in ("store.db", "store.db-wal", "store.db-shm"):
        (workdir / name).unlink(missing_ok=True)

    import psycopg

    name = f"sw_fixture_{os.getpid()}"
    base = admin_url.rsplit("/", 1)[0]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        effects = _killed_mid_compensation(f"{base}/{name}", workdir)
        dump = subprocess.run(
            ["pg_dump", "--inserts", "--no-owner", "--no-privileges", f"{base}/{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    # Without psql's meta-commands (`\\restrict`): a test runs the SQL through a driver.
    plain = [line for line in dump.splitlines() if not line.startswith("\\")]
    (out / "mid_compensation.postgres.sql").write_text("\n".join(plain) + "\n")
    (out / "mid_compensation.postgres.json").write_text(json.dumps(effects, sort_keys=True) + "\n")
    workdir.rmdir()


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        asyncio.run(_child(sys.argv[2], Path(sys.argv[3])))
    else:
        main(Path(sys.argv[1]), sys.argv[2])
