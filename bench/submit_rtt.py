"""One `App.submit_async` round trip on stepwarden-postgres, in three conditions: no worker
running, the two W1 workers running idle, and the workers running W1 one at a time.

Each run, on a fresh database with the client connected (5 submits first, not counted):
`n` submits back to back with no worker running (nobody takes the tasks); then W1's two
workers start, process those tasks, and after a second without work get `n` submits, each
made once the previous task is processed (the harness reads its row every 5 ms from a
connection of its own, then waits SETTLE seconds more), so that every submit finds the
workers idle (their polls, heartbeats and supervisor ticks only); the workers stop. Each
figure is the time of the `await app.submit_async(...)` alone, in the client's event loop.
The third condition is W1 one at a time itself (`w1_single.submit_call` of
stepwarden-postgres): every submit of its runs, made while the workers process the ones
before.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psycopg

from .common import Resources, log, percentile
from .systems import Stepwarden, submit_each

WARMUP = 5
POLL = 0.005
"""Seconds between the harness's reads of the last submitted task (idle condition)."""
SETTLE = 0.05
"""Seconds waited after that task was processed, before the next submit."""
TIMEOUT = 60.0


def _stats(seconds: list[float]) -> dict[str, Any]:
    return {
        "n": len(seconds),
        "p50_ms": round(percentile(seconds, 50) * 1000, 3),
        "p90_ms": round(percentile(seconds, 90) * 1000, 3),
        "p99_ms": round(percentile(seconds, 99) * 1000, 3),
        "mean_ms": round(sum(seconds) / len(seconds) * 1000, 3),
        "max_ms": round(max(seconds) * 1000, 3),
    }


def _wait_processed(db: psycopg.Connection[Any], task_ids: list[str], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        row = db.execute(
            "SELECT count(*) FILTER (WHERE process_state = 'processed') FROM stepwarden_tasks"
            " WHERE task_id = ANY(%s)",
            (task_ids,),
        ).fetchone()
        if row is not None and int(row[0]) >= len(task_ids):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not processed within {TIMEOUT}s")
        time.sleep(POLL)


def once(res: Resources, system: Stepwarden, n: int, run: int) -> dict[str, list[float]]:
    """One run: the submit times (seconds) with no worker and with idle workers."""
    system.prepare(run)
    try:
        each = system.one_submitter()
        submit_each(each, WARMUP, 1, start=900_000)
        no_workers = submit_each(each, n, 1, start=0)
        children = system.start_workers(f"rtt{run}")
        try:
            idle: list[float] = []
            with psycopg.connect(system.url, autocommit=True) as db:
                backlog = [f"o{i}" for i in (*range(900_000, 900_000 + WARMUP), *range(n))]
                _wait_processed(db, backlog, "the tasks submitted with no worker")
                time.sleep(1.0)
                for i in range(100_000, 100_000 + n):
                    idle += submit_each(each, 1, 1, start=i)
                    _wait_processed(db, [f"o{i}"], f"task o{i}")
                    time.sleep(SETTLE)
                    for child in children:
                        if not child.alive():
                            raise RuntimeError(f"{child.name} exited:\n{child.tail()}")
        finally:
            system.stop_workers(children)
        return {"no_workers": no_workers, "workers_idle": idle}
    finally:
        system.cleanup()


def run(
    res: Resources,
    args: argparse.Namespace,
    log_dir: Path,
    during_w1_single: dict[str, Any] | None,
) -> dict[str, Any]:
    """`args.runs` runs (see the module's docstring); the percentiles of all their submits
    together, each run's median, and W1 one at a time's figure beside them."""
    system = Stepwarden(res, workers=args.workers, log_dir=log_dir, postgres=True)
    pooled: dict[str, list[float]] = {"no_workers": [], "workers_idle": []}
    medians: dict[str, list[float]] = {"no_workers": [], "workers_idle": []}
    errors: list[str] = []
    for r in range(args.runs):
        log(f"stepwarden-postgres: submit round trip run {r + 1}/{args.runs}, {args.rtt_n} "
            "submits with no worker, then with idle workers")  # fmt: skip
        try:
            one = once(res, system, args.rtt_n, r)
        except Exception as exc:
            log(f"FAILED submit round trip run {r + 1}: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stderr)
            errors.append(f"run {r + 1}: {type(exc).__name__}: {exc}")
            with contextlib.suppress(Exception):
                system.cleanup()
            break
        for key, values in one.items():
            pooled[key] += values
            medians[key].append(round(percentile(values, 50) * 1000, 3))
        log(
            f"stepwarden-postgres: submit_async p50 {medians['no_workers'][-1]:.2f} ms with no "
            f"worker, {medians['workers_idle'][-1]:.2f} ms with idle workers"
        )
    out: dict[str, Any] = {"system": "stepwarden-postgres", "call": "App.submit_async"}
    if errors:
        out["errors"] = errors
    for key, values in pooled.items():
        if values:
            out[key] = {**_stats(values), "p50_ms_runs": medians[key]}
    if during_w1_single:
        out["during_w1_single"] = during_w1_single
    return out


def table_lines(rtt: dict[str, Any]) -> list[str]:
    """The submit round trip's lines of the printed table."""
    parts = []
    for key, label in (
        ("no_workers", "no worker running"),
        ("workers_idle", "2 workers idle"),
        ("during_w1_single", "2 workers running W1 one at a time"),
    ):
        s = rtt.get(key)
        if s:
            parts.append(
                f"{label} {s['p50_ms']:.2f} ms (p90 {s['p90_ms']:.2f}, p99 {s['p99_ms']:.2f}; "
                f"{s['n']:,} submits)"
            )
        else:
            parts.append(f"{label} -")
    lines = ["", "submit_async round trip (stepwarden-postgres, median): " + "; ".join(parts)]
    if rtt.get("errors"):
        lines.append("submit round trip FAILED: " + "; ".join(rtt["errors"]))
    return lines
