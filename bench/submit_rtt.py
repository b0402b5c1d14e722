"""One `App.submit_async` round trip on stepwarden-postgres: with no worker running, with
the two W1 workers running idle, and with the workers running W1 one at a time.

Each run, on a fresh database with the client connected (5 submits first, not counted):

- "no_workers_back_to_back": `n` submits, each right after the one before, no worker
  running (nobody takes the tasks);
- "no_workers": `n` submits, each GAP seconds after the one before, no worker running;
- then W1's two workers start and process those tasks; after a second without work,
  "workers_idle": `n` submits, each made once the previous task is processed (the harness
  reads its row every 5 ms from a connection of its own) and GAP seconds more have passed,
  so that every submit finds the workers idle (their polls, heartbeats, supervisor ticks
  and LISTEN only); the workers stop.

A submit made after the client slept is slower than one made right after another (the
process and its connection are cold; the machine's other work has run meanwhile; the
longer the sleep, the slower): so the idle workers' figure is compared with "no_workers",
the same GAP before each submit, and W1 one at a time's
(`w1_single.submit_call` of stepwarden-postgres: every submit of its runs, back to back,
while the workers process the ones before) with "no_workers_back_to_back". Each figure is
the time of the `await app.submit_async(...)` alone, in the client's event loop.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from .common import Resources, log, percentile
from .systems import AsyncSubmit, Stepwarden, submit_each

WARMUP = 5
POLL = 0.005
"""Seconds between the harness's reads of the last submitted task (idle condition)."""
GAP = 0.05
"""Seconds the client sleeps before each paced submit (after the previous submit; with
workers, after the previous task was processed)."""
TIMEOUT = 60.0
CONDITIONS = ("no_workers_back_to_back", "no_workers", "workers_idle")


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


def _paced(
    each: AsyncSubmit, start: int, n: int, after: Callable[[str], None] | None = None
) -> list[float]:
    """n submits, each after `after(previous task's id)` (when given) and GAP seconds."""
    out: list[float] = []
    for i in range(start, start + n):
        time.sleep(GAP)
        out += submit_each(each, 1, 1, start=i)
        if after is not None:
            after(f"o{i}")
    return out


def once(res: Resources, system: Stepwarden, n: int, run: int) -> dict[str, list[float]]:
    """One run: the submit times (seconds) of each condition."""
    system.prepare(run)
    try:
        each = system.one_submitter()
        submit_each(each, WARMUP, 1, start=900_000)
        back_to_back = submit_each(each, n, 1, start=0)
        paced = _paced(each, 100_000, n)
        children = system.start_workers(f"rtt{run}")
        try:
            with psycopg.connect(system.url, autocommit=True) as db:
                backlog = [
                    f"o{i}"
                    for i in (
                        *range(900_000, 900_000 + WARMUP),
                        *range(n),
                        *range(100_000, 100_000 + n),
                    )
                ]
                _wait_processed(db, backlog, "the tasks submitted with no worker")
                time.sleep(1.0)

                def processed(task_id: str) -> None:
                    _wait_processed(db, [task_id], f"task {task_id}")
                    for child in children:
                        if not child.alive():
                            raise RuntimeError(f"{child.name} exited:\n{child.tail()}")

                idle = _paced(each, 200_000, n, processed)
        finally:
            system.stop_workers(children)
        return {"no_workers_back_to_back": back_to_back, "no_workers": paced, "workers_idle": idle}
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
    pooled: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    medians: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    errors: list[str] = []
    for r in range(args.runs):
        log(
            f"stepwarden-postgres: submit round trip run {r + 1}/{args.runs}, {args.rtt_n} "
            "submits with no worker (back to back, paced), then with idle workers (paced)"
        )
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
            "stepwarden-postgres: submit_async p50 with no worker "
            f"{medians['no_workers_back_to_back'][-1]:.2f} ms back to back, "
            f"{medians['no_workers'][-1]:.2f} ms paced; with idle workers "
            f"{medians['workers_idle'][-1]:.2f} ms paced"
        )
    out: dict[str, Any] = {
        "system": "stepwarden-postgres",
        "call": "App.submit_async",
        "paced_gap_s": GAP,
    }
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

    def fig(key: str) -> str:
        s = rtt.get(key)
        if not s:
            return "-"
        return (
            f"{s['p50_ms']:.2f} ms (p90 {s['p90_ms']:.2f}, p99 {s['p99_ms']:.2f}; "
            f"{s['n']:,} submits)"
        )

    gap = rtt.get("paced_gap_s", GAP)
    lines = [
        "",
        "submit_async round trip (stepwarden-postgres, median of one await app.submit_async):",
        f"  back to back:              no worker running {fig('no_workers_back_to_back')}",
        f"                             2 workers running W1 one at a time "
        f"{fig('during_w1_single')}",
        f"  {gap * 1000:g} ms after the last:      no worker running {fig('no_workers')}",
        f"                             2 workers idle (and the last task processed) "
        f"{fig('workers_idle')}",
    ]
    if rtt.get("errors"):
        lines.append("submit round trip FAILED: " + "; ".join(rtt["errors"]))
    return lines
