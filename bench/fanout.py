"""The fan-out: one task whose workflow (`bench.workload.fan_out`) runs N steps side by side
with `ctx.gather`, on stepwarden's two stores, with the same worker processes as W1.

Each run: a fresh store; the workers started; one task submitted through the client
(`App.submit_async`); the harness reads the task's row every POLL seconds (and how many of
its steps are recorded and completed every PROGRESS_EVERY seconds) until it is processed;
the workers stopped. The figure is the store's finished_at of the task less the time of the
submit, as W1 takes it. On PostgreSQL, the commits of the phase are counted as W1's are
(`pg_stat_database.xact_commit` once every session has ended, less the harness's own
queries, less the idle phase's commits), per step. Once the commits are read, the steps'
timestamps say how many transactions dispatched, claimed and completed them: each store
stamps every row a transaction writes with the same time (PostgreSQL `now()`, SQLite one
clock reading per transaction), so the distinct `dispatched_at` of the task's steps are its
dispatch transactions.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from .common import (
    Child,
    CpuMeter,
    Resources,
    RssSampler,
    median,
    wait_no_backends,
    xact_commit,
)
from .systems import Stepwarden

TIMEOUT = 600.0
"""Seconds the harness waits for the fan-out task (the workflow's complete_within is
bench.workload.FANOUT_WITHIN, longer)."""
POLL = 0.05
"""Seconds between the harness's reads of the task's row."""
PROGRESS_EVERY = 0.5
"""Seconds between the harness's counts of the task's steps (recorded, completed)."""
FAILED_STATES = ("error", "compensating", "compensated", "compensation_failed", "cancelled")


class _Reader:
    """The harness's queries on the system's store, with `?` placeholders on either store."""

    def __init__(self, system: Stepwarden) -> None:
        self.postgres = system.postgres
        self._pg: psycopg.Connection[Any] | None = None
        self._lite: sqlite3.Connection | None = None
        if self.postgres:
            self._pg = psycopg.connect(system.url, autocommit=True)
        else:
            self._lite = sqlite3.connect(system.path, timeout=30)

    def epoch(self, column: str) -> str:
        """A timestamp column as seconds since the epoch."""
        return f"extract(epoch FROM {column})::float8" if self.postgres else column

    def __call__(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        if self._pg is not None:
            return self._pg.execute(sql.replace("?", "%s"), params).fetchall()
        assert self._lite is not None
        return self._lite.execute(sql, params).fetchall()

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
        if self._lite is not None:
            self._lite.close()


@contextlib.contextmanager
def _reader(system: Stepwarden) -> Iterator[_Reader]:
    reader = _Reader(system)
    try:
        yield reader
    finally:
        reader.close()


def _commits(res: Resources, system: Stepwarden) -> int | None:
    """The database's commit count once every session to it has ended (None on SQLite)."""
    system.close_client()
    if not system.postgres or system.db_url is None:
        return None
    wait_no_backends(res.admin_url, system.db_url)
    return xact_commit(res.admin_url, system.db_url)


def _wait_processed(
    system: Stepwarden, task_id: str, n: int, children: Sequence[Child], started: float
) -> tuple[float, Any, int, list[list[float]]]:
    """Read the task until it is processed: its finished_at (epoch), its result, the
    queries run, and the progress samples [seconds, steps recorded, steps completed]."""
    queries = 0
    progress: list[list[float]] = []
    next_progress = time.perf_counter()
    deadline = time.monotonic() + TIMEOUT
    with _reader(system) as query:
        while True:
            now = time.perf_counter()
            if now >= next_progress:
                queries += 1
                recorded, completed = query(
                    "SELECT count(*), count(*) FILTER (WHERE state = 'completed')"
                    " FROM stepwarden_steps WHERE task_id = ?",
                    (task_id,),
                )[0]
                progress.append([round(now - started, 2), recorded, completed])
                next_progress = now + PROGRESS_EVERY
            queries += 1
            rows = query(
                f"SELECT process_state, {query.epoch('finished_at')}, result, error"
                " FROM stepwarden_tasks WHERE task_id = ?",
                (task_id,),
            )
            state, finished_at, result, error = rows[0] if rows else (None, None, None, None)
            if state == "processed":
                if isinstance(result, str):
                    result = json.loads(result)
                return float(finished_at), result, queries, progress
            if state in FAILED_STATES:
                raise RuntimeError(f"the fan-out task ended {state}: {error}")
            for child in children:
                if not child.alive():
                    raise RuntimeError(
                        f"{child.name} exited ({child.popen.returncode}) during the fan-out:\n"
                        + child.tail()
                    )
            if time.monotonic() > deadline:
                done = (
                    f"{progress[-1][2]:,.0f}/{n:,} steps completed at the last count"
                    if progress
                    else ""
                )
                raise TimeoutError(f"the fan-out task not processed after {TIMEOUT:g} s; {done}")
            time.sleep(POLL)


def _step_figures(system: Stepwarden, task_id: str) -> dict[str, Any]:
    """What the store's timestamps say of the task's steps (read after the commit count)."""
    with _reader(system) as query:
        (count, dispatches, claims, completions, again, first_d, last_d, last_f) = query(
            "SELECT count(*), count(DISTINCT dispatched_at), count(DISTINCT claimed_at),"
            " count(DISTINCT finished_at), count(*) FILTER (WHERE attempt > 1),"
            f" {query.epoch('min(dispatched_at)')}, {query.epoch('max(dispatched_at)')},"
            f" {query.epoch('max(finished_at)')}"
            " FROM stepwarden_steps WHERE task_id = ?",
            (task_id,),
        )[0]
        created, finished = query(
            f"SELECT {query.epoch('created_at')}, {query.epoch('finished_at')}"
            " FROM stepwarden_tasks"
            " WHERE task_id = ?",
            (task_id,),
        )[0]

    def gap(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(float(b) - float(a), 3)

    return {
        "steps_recorded": count,
        "dispatch_txns": dispatches,
        "claim_txns": claims,
        "complete_txns": completions,
        "redispatched_steps": again,
        "timeline_s": {
            "created_to_first_dispatch": gap(created, first_d),
            "first_to_last_dispatch": gap(first_d, last_d),
            "last_dispatch_to_last_step_finished": gap(last_d, last_f),
            "last_step_finished_to_task_finished": gap(last_f, finished),
        },
    }


def fanout_once(res: Resources, system: Stepwarden, n: int, run: int) -> dict[str, Any]:
    """One fan-out of n steps on a fresh store (see the module's docstring)."""
    task_id = f"fan{run}"
    system.prepare(run)
    try:
        before = _commits(res, system)
        children = system.start_workers(f"fanout{run}")
        try:
            pids = [c.pid for c in children]
            meter = CpuMeter(pids)
            with RssSampler(pids, interval=0.2) as rss:
                meter.start()
                system.open_client()
                started = time.perf_counter()
                t0 = time.time()
                system.submit("fan_out", {"n": n}, task_id=task_id)
                submit_s = time.perf_counter() - started
                finished_at, result, queries, progress = _wait_processed(
                    system, task_id, n, children, started
                )
                seen_s = time.perf_counter() - started
                cpu = meter.stop()
        finally:
            system.stop_workers(children)
        after = _commits(res, system)
        if not isinstance(result, dict) or result.get("steps") != n or not result["in_order"]:
            raise RuntimeError(f"unexpected result of the fan-out task: {result}")
        elapsed = finished_at - t0
        out: dict[str, Any] = {
            "n": n,
            "elapsed_s": round(elapsed, 3),
            "steps_per_s": round(n / elapsed, 1),
            "seen_s": round(seen_s, 3),
            "submit_s": round(submit_s, 3),
            "peak_rss_workers_mb": round(rss.peak_total / 2**20, 1),
            "peak_rss_one_worker_mb": round(rss.peak_each / 2**20, 1),
            "cpu_s": cpu,
        }
        if before is not None and after is not None:
            out["commits_raw"] = after - before
            out["harness_queries"] = queries
        out.update(_step_figures(system, task_id))
        out["progress"] = progress
        return out
    finally:
        system.cleanup()


def summarise(
    runs: list[dict[str, Any]], idle_commits: int | None, errors: list[str]
) -> dict[str, Any]:
    """The median of the runs (commits per step less the idle phase's commits)."""
    out: dict[str, Any] = {}
    if errors:
        out["errors"] = errors
    if not runs:
        return out
    for r in runs:
        if "commits_raw" in r:
            r["commits_per_step"] = round(
                (r["commits_raw"] - r["harness_queries"] - (idle_commits or 0)) / r["n"], 3
            )
    out.update(
        {
            "n": runs[0]["n"],
            "elapsed_s": round(median([r["elapsed_s"] for r in runs]), 3),
            "elapsed_s_runs": [r["elapsed_s"] for r in runs],
            "steps_per_s": round(median([r["steps_per_s"] for r in runs]), 1),
            "dispatch_txns": median([r["dispatch_txns"] for r in runs]),
            "claim_txns": median([r["claim_txns"] for r in runs]),
            "complete_txns": median([r["complete_txns"] for r in runs]),
            "peak_rss_workers_mb": max(r["peak_rss_workers_mb"] for r in runs),
            "peak_rss_one_worker_mb": max(r["peak_rss_one_worker_mb"] for r in runs),
        }
    )
    per_step = [r["commits_per_step"] for r in runs if "commits_per_step" in r]
    if per_step:
        out["commits_per_step"] = round(median(per_step), 3)
        out["commits_idle_phase"] = idle_commits
    out["runs"] = runs
    return out


def _f(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def table_lines(fanout: dict[str, Any], n: int, runs: int) -> list[str]:
    """The fan-out's section of the printed table."""
    lines = [
        "",
        f"fan-out: one task, ctx.gather of {n:,} steps (median of {runs} run(s); txns: "
        "dispatch/claim/complete transactions, by the steps' timestamps)",
    ]
    head = (
        f"{'system':<20} {'seconds':>9} {'steps/s':>9} {'commits/step':>12} "
        f"{'txns d/c/f':>16} {'RSS MB':>8}"
    )
    lines += [head, "-" * len(head)]
    for name, s in fanout.items():
        failed = "   FAILED " + "; ".join(s["errors"]) if s.get("errors") else ""
        if "elapsed_s" not in s:
            lines.append(f"{name:<20}{failed}")
            continue
        txns = f"{s['dispatch_txns']:g}/{s['claim_txns']:g}/{s['complete_txns']:g}"
        lines.append(
            f"{name:<20} {s['elapsed_s']:>9.2f} {s['steps_per_s']:>9,.0f} "
            f"{_f(s.get('commits_per_step'), '{:.3f}'):>12} {txns:>16} "
            f"{s['peak_rss_workers_mb']:>8.1f}{failed}"
        )
    for name, s in fanout.items():
        per_step = s.get("commits_per_step")
        if per_step is not None:
            verdict = (
                "below 1: the fan-out stays within the store's batching"
                if per_step < 1
                else "NOT below 1: the fan-out does not stay within the store's batching"
            )
            lines.append(f"fan-out commits per step ({name}): {per_step:.3f} ({verdict})")
    return lines
