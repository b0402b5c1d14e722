"""Crash soak: the orders example under random SIGKILLs and payment faults, then checked.

Schedulers, agents and supervisors run as separate processes (several of each). Every
`--kill-every` seconds (jittered) a random one of them is killed with SIGKILL and a
replacement of the same role started. The payment service answers 503s, answers late, drops
answers after charging, goes down for a while and crashes (and is restarted). Optionally the
database connections are all cut mid-run (`--cut-connections`, PostgreSQL) or the PostgreSQL
server restarted (`--restart-db`, by hand: it restarts the local cluster).

Afterwards it checks what stepwarden promises:
- the set of task ids in equals the set out: every order's task is processed, or compensated
  (its charge refunded, its reservation released);
- each idempotency key's effect was applied once at the payment service, and an order is
  left charged if and only if it was processed;
- no two schedulers held a task at once, and nothing was written under a stale hold: database
  triggers record every claim, every release and every step dispatch, and each dispatch must
  fall inside the hold of the attempt it names, each claim after the release of the one
  before.

    python -m tests.soak.soak --store sqlite:///soak.db --orders 2000 --kill-every 3
    python -m tests.soak.soak --store postgresql://postgres@127.0.0.1/soak --json

It prints a summary (one JSON object with --json) and exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples.orders import payment_service
from examples.orders.demo import (
    FINISHED,
    ROOT,
    Processes,
    free_port,
    make_orders,
    wait_for_service,
)
from stepwarden import EventRefused, TaskState

ROLES = ("scheduler", "agents", "supervisor")
GOOD = ("processed", "compensated")

AUDIT_SQLITE = """
CREATE TABLE soak_audit (id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT, what TEXT,
                         attempt INTEGER, seq INTEGER, who TEXT);
CREATE TRIGGER soak_claim AFTER UPDATE OF attempt ON stepwarden_tasks
WHEN NEW.attempt <> OLD.attempt
BEGIN
    INSERT INTO soak_audit (task_id, what, attempt, who)
    VALUES (NEW.task_id, 'claim', NEW.attempt, NEW.locked_by);
END;
CREATE TRIGGER soak_release AFTER UPDATE OF locked_by ON stepwarden_tasks
WHEN OLD.locked_by IS NOT NULL AND NEW.locked_by IS NULL
BEGIN
    INSERT INTO soak_audit (task_id, what, attempt, who)
    VALUES (NEW.task_id, 'release', OLD.attempt, OLD.locked_by);
END;
CREATE TRIGGER soak_dispatch AFTER INSERT ON stepwarden_steps
BEGIN
    INSERT INTO soak_audit (task_id, what, attempt, seq)
    VALUES (NEW.task_id, 'dispatch', NEW.task_attempt, NEW.seq);
END;
CREATE TRIGGER soak_redispatch AFTER UPDATE OF task_attempt, attempt ON stepwarden_steps
WHEN (NEW.task_attempt <> OLD.task_attempt OR NEW.attempt <> OLD.attempt)
     AND NEW.reassignments = OLD.reassignments
BEGIN
    INSERT INTO soak_audit (task_id, what, attempt, seq)
    VALUES (NEW.task_id, 'dispatch', NEW.task_attempt, NEW.seq);
END;
CREATE TRIGGER soak_requeue AFTER UPDATE OF reassignments ON stepwarden_steps
WHEN NEW.reassignments <> OLD.reassignments
BEGIN
    INSERT INTO soak_audit (task_id, what, attempt, seq)
    VALUES (NEW.task_id, 'requeue', NEW.task_attempt, NEW.seq);
END;
"""

AUDIT_POSTGRES = """
CREATE TABLE soak_audit (id bigserial PRIMARY KEY, task_id text, what text, attempt int,
                         seq int, who text);
CREATE FUNCTION soak_task() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.attempt <> OLD.attempt THEN
        INSERT INTO soak_audit (task_id, what, attempt, who)
        VALUES (NEW.task_id, 'claim', NEW.attempt, NEW.locked_by);
    ELSIF OLD.locked_by IS NOT NULL AND NEW.locked_by IS NULL THEN
        INSERT INTO soak_audit (task_id, what, attempt, who)
        VALUES (NEW.task_id, 'release', OLD.attempt, OLD.locked_by);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER soak_task AFTER UPDATE ON stepwarden_tasks
FOR EACH ROW EXECUTE FUNCTION soak_task();
CREATE FUNCTION soak_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.reassignments <> OLD.reassignments THEN
        INSERT INTO soak_audit (task_id, what, attempt, seq)
        VALUES (NEW.task_id, 'requeue', NEW.task_attempt, NEW.seq);
    ELSIF TG_OP = 'INSERT' OR NEW.task_attempt <> OLD.task_attempt
          OR NEW.attempt <> OLD.attempt THEN
        INSERT INTO soak_audit (task_id, what, attempt, seq)
        VALUES (NEW.task_id, 'dispatch', NEW.task_attempt, NEW.seq);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER soak_step AFTER INSERT OR UPDATE ON stepwarden_steps
FOR EACH ROW EXECUTE FUNCTION soak_step();
"""


def _sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def install_audit(url: str) -> None:
    if url.startswith("sqlite"):
        with sqlite3.connect(_sqlite_path(url)) as db:
            db.executescript(AUDIT_SQLITE)
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as db:
            db.execute(AUDIT_POSTGRES)


def read_audit(url: str) -> list[tuple[str, str, int, int | None]]:
    query = "SELECT task_id, what, attempt, seq FROM soak_audit ORDER BY id"
    if url.startswith("sqlite"):
        with sqlite3.connect(_sqlite_path(url)) as db:
            return [tuple(r) for r in db.execute(query)]
    import psycopg

    with psycopg.connect(url) as db:
        return [tuple(r) for r in db.execute(query)]


def check_holds(audit: Sequence[tuple[str, str, int, int | None]]) -> list[str]:
    """Each claim follows the release of the hold before it; each dispatch falls inside the
    hold of the attempt it names; a step the supervisor queues again (its agent instance
    gone) names the attempt holding its task, or its task is held by none (the next claim
    adopts it)."""
    problems: list[str] = []
    held: dict[str, int | None] = {}  # the attempt holding each task now, None when free
    for task_id, what, attempt, seq in audit:
        current = held.get(task_id)
        if what == "claim":
            if current is not None:
                problems.append(f"{task_id}: claimed as attempt {attempt} while {current} held it")
            held[task_id] = attempt
        elif what == "release":
            if current != attempt:
                problems.append(f"{task_id}: attempt {attempt} released while {current} held it")
            held[task_id] = None
        elif what == "dispatch" and current != attempt:
            problems.append(
                f"{task_id}: step {seq} dispatched under attempt {attempt} while {current} held it"
            )
        elif what == "requeue" and current not in (attempt, None):
            problems.append(
                f"{task_id}: step {seq} queued again under attempt {attempt} while {current}"
                " held it"
            )
    return problems


def integrity(url: str) -> bool:
    """SQLite: the file passed its integrity check after every kill (some of them landed in
    the middle of a commit). PostgreSQL keeps its own."""
    if not url.startswith("sqlite"):
        return True
    with sqlite3.connect(_sqlite_path(url)) as db:
        return [r[0] for r in db.execute("PRAGMA integrity_check")] == ["ok"]


def _connections_cut(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        row = db.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def _restart_postgres() -> None:
    version = os.listdir("/etc/postgresql")[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
    )


class Soak:
    def __init__(self, args: argparse.Namespace, procs: Processes) -> None:
        self.args = args
        self.procs = procs
        self.rng = random.Random(args.seed)
        self.roles: dict[int, str] = {}
        self.kills: Counter[str] = Counter()
        self.db_cuts = 0

    def start(self, role: str) -> None:
        worker = self.procs.start_worker(role)
        self.roles[worker.pid] = role

    def kill_one(self) -> None:
        alive = [w for w in self.procs.workers if w.poll() is None]
        victim = self.rng.choice(alive)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        role = self.roles[victim.pid]
        self.kills[role] += 1
        self.start(role)

    async def run(self) -> dict[str, Any]:
        from examples.orders import shop  # reads STEPWARDEN_STORE and PAYMENTS_URL

        args = self.args
        orders = make_orders(args.orders, args.declined, args.undeliverable, self.rng)
        store = await shop.app.store()
        await shop.create_orders_table()
        install_audit(args.store)
        for role, count in zip(
            ROLES, (args.schedulers, args.agents, args.supervisors), strict=True
        ):
            for _ in range(count):
                self.start(role)
        started = time.monotonic()
        next_kill = started + args.kill_every
        cut_at = (
            started + args.duration_hint / 2 if (args.cut_connections or args.restart_db) else None
        )
        task_ids: list[str] = []
        done = 0
        while True:
            if self.procs.service_died():
                self.procs.service_restarts += 1
                self.procs.start_service()
            for order in orders[len(task_ids) : len(task_ids) + args.rate // 10]:
                task_ids.append(await shop.place_order(order))
            now = time.monotonic()
            if now >= next_kill:
                self.kill_one()
                next_kill = now + args.kill_every * self.rng.uniform(0.5, 1.5)
            if cut_at is not None and now >= cut_at:
                cut_at = None
                if args.restart_db:
                    _restart_postgres()
                else:
                    _connections_cut(args.store)
                self.db_cuts += 1
            try:
                # Orders over the shop's threshold wait for a person's approval: approve them
                # (once each: the event_id makes a send idempotent).
                for task in await store.list_tasks(state=TaskState.WAITING, limit=1000):
                    with contextlib.suppress(EventRefused):  # finished meanwhile
                        await shop.app.send_event_async(
                            task.task_id, "approved", "soak", event_id=f"approval-{task.task_id}"
                        )
                counts = await store.count_tasks()
                done = sum(counts.get(s, 0) for s in FINISHED)
            except Exception:  # the database is being cut or restarted: ask again
                pass
            if len(task_ids) == len(orders) and done >= len(orders):
                break
            if now - started > args.timeout:
                break
            await asyncio.sleep(0.1)
        elapsed = time.monotonic() - started
        self.procs.stop()
        summary = await self.summarise(store, task_ids, elapsed)
        await shop.app.aclose()
        return summary

    async def summarise(self, store: Any, task_ids: list[str], elapsed: float) -> dict[str, Any]:
        states: Counter[str] = Counter()
        for task in await store.list_tasks(limit=10 * len(task_ids) + 10):
            states[str(task.process_state)] += 1
        stored = {t.task_id for t in await store.list_tasks(limit=10 * len(task_ids) + 10)}
        ledger = payment_service.read_stats(str(self.procs.workdir / "ledger.db"))
        problems = check_holds(read_audit(self.args.store))
        expired = await store.events(kind="expired", limit=10_000_000)
        good = states["processed"] + states["compensated"]
        summary = {
            "store": self.args.store.split(":", 1)[0],
            "tasks": len(task_ids),
            "ids_in_equal_ids_out": stored == set(task_ids),
            "processed": states["processed"],
            "compensated": states["compensated"],
            "other_states": {k: v for k, v in states.items() if k not in GOOD},
            "lost": len(task_ids) - good,
            "kills": dict(self.kills),
            "kills_total": sum(self.kills.values()),
            "payment_service_crashes": self.procs.service_restarts,
            "db_connection_cuts": self.db_cuts,
            "faults_injected": ledger["faults"],
            "deadlines_missed": len(expired),
            "duplicate_effects_prevented": ledger["duplicates_prevented"],
            "duplicate_effects_applied": ledger["orders_charged_twice"]
            + ledger["orders_refunded_twice"],
            "charged_not_processed": ledger["orders_charged_not_refunded"] - states["processed"],
            "store_intact": integrity(self.args.store),
            "hold_violations": len(problems),
            "hold_violation_examples": problems[:5],
            "seconds": round(elapsed, 1),
            "workdir": str(self.procs.workdir),
        }
        summary["ok"] = (
            summary["ids_in_equal_ids_out"]
            and summary["lost"] == 0
            and summary["duplicate_effects_applied"] == 0
            and summary["charged_not_processed"] == 0
            and summary["hold_violations"] == 0
            and summary["store_intact"]
        )
        return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.soak.soak", description=__doc__.split("\n")[0]
    )
    p.add_argument("--store", required=True, help="store URL (a new, empty database)")
    p.add_argument("--orders", type=int, default=2000)
    p.add_argument("--rate", type=int, default=200, help="orders placed per second")
    p.add_argument("--schedulers", type=int, default=2)
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--supervisors", type=int, default=2)
    p.add_argument("--kill-every", type=float, default=3.0, help="seconds between SIGKILLs")
    p.add_argument("--declined", type=float, default=0.03)
    p.add_argument("--undeliverable", type=float, default=0.03)
    p.add_argument("--cut-connections", action="store_true", help="PostgreSQL: cut them all")
    p.add_argument("--restart-db", action="store_true", help="PostgreSQL: restart the server")
    p.add_argument("--duration-hint", type=float, default=20, help="when to cut: half of it")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="stepwarden-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    faults = [
        "--transient", "0.1",
        "--slow", "0.03", "--slow-for", "3",
        "--lost", "0.03",
        "--crash", "0.002",
        "--outage-start", "5", "--outage-for", "2",
    ]  # fmt: skip
    service_args = ["--port", str(port), "--ledger", str(workdir / "ledger.db"), *faults]
    os.environ["STEPWARDEN_STORE"] = args.store
    os.environ["PAYMENTS_URL"] = url
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = Processes(workdir=workdir, env=env, service_args=service_args, seed=args.seed)
    try:
        procs.start_service()
        asyncio.run(wait_for_service(url, procs))
        summary = asyncio.run(Soak(args, procs).run())
    finally:
        procs.stop()
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
