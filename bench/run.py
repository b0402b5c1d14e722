"""The benchmark: stepwarden (SQLite with its wake-ups and polling only, PostgreSQL, and
on one or two shards of servers of its own), DBOS, Celery and procrastinate on the same
"order" workload, in the same run, so that the figures are read as ratios; then
stepwarden's fan-out, recoveries and sweep.

    python -m bench [--quick] [--only stepwarden-postgres,celery] [--n 2000] [--runs 3]

See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import psycopg

from . import agent_http as agent_http_mod
from . import fair_share as fair_share_mod
from . import fanout as fanout_mod
from . import idle_fleet as idle_fleet_mod
from . import recovery as recovery_mod
from . import submit_rtt as rtt_mod
from . import sweep as sweep_mod
from . import tracing as tracing_mod
from .common import (
    RESULTS,
    CpuMeter,
    Interrupted,
    Resources,
    RssSampler,
    Server,
    cannot_make_clusters,
    install_signal_handlers,
    log,
    median,
    percentile,
    postgres_server,
    redis_server,
    servers,
    wait_no_backends,
    xact_commit,
)
from .systems import (
    SUBMITTERS,
    VARIANTS,
    Celery,
    Dbos,
    Procrastinate,
    Stepwarden,
    StepwardenShards,
    System,
    Throughput,
    shard_system_name,
)

SHARD_SYSTEMS = (shard_system_name(1), shard_system_name(2))
"""stepwarden on servers of the benchmark's own: a store of one database, a store of two
shards (`StepwardenShards`); compared with each other (`shards`), not with the peers."""
SYSTEMS = (
    "stepwarden-sqlite",
    "stepwarden-sqlite-poll",
    "stepwarden-postgres",
    *SHARD_SYSTEMS,
    "dbos",
    "celery",
    "procrastinate",
)
BASE = "stepwarden-postgres"
PEERS = ("stepwarden-sqlite", "stepwarden-sqlite-poll", "dbos", "celery", "procrastinate")
WAKE, POLL = "stepwarden-sqlite", "stepwarden-sqlite-poll"
"""SQLite with its wake-ups between processes (datagrams, the default) and with polling only
(`?wake=off`): W1 and W2 of both, side by side in `sqlite_wakeups`."""

GOAL: dict[str, tuple[str, float]] = {
    "wf_per_s": (">=", 1000.0),
    "commits_per_wf": ("<=", 3.0),
    "p50_ms": ("<=", 10.0),
    "p99_ms": ("<=", 20.0),
    "single_x_celery": (">=", 3.0),
    "single_x_procrastinate": (">=", 3.0),
    "concurrent_wf_per_s": (">=", 1000.0),
    "single_cpu_x_batched": ("<=", 2.0),
    "single_commits_per_wf": ("<=", 6.0),
}
"""stepwarden on PostgreSQL, against each goal: W1 batched (wf/s, commits per workflow), W2
(p50, p99), W1 one at a time against Celery and procrastinate in the same run (wf/s ratio),
W1 with 16 submitters (wf/s), CPU per workflow one at a time against batched, and commits
per workflow one at a time."""

REFERENCE = {
    "dbos": {"wf_per_s": 47.0, "p50_ms": 62.0, "p99_ms": 118.0},
    "celery": {"wf_per_s": 83.0, "p50_ms": 18.0, "p99_ms": 38.0},
    "procrastinate": {"wf_per_s": 88.0, "p50_ms": 27.0, "p99_ms": 48.0},
}
"""The peers' figures measured earlier on a machine of this kind (2 cores): a run whose peers
are far from these ran on a busier or a different machine."""

W2_WARMUP = 5
"""Workflows run before W2's samples (not counted): imports, connections, caches."""

PACKAGES = (
    "stepwarden",
    "dbos",
    "celery",
    "kombu",
    "redis",
    "procrastinate",
    "psycopg",
    "psycopg-pool",
    "SQLAlchemy",
    "psutil",
    "py-spy",
)


VARIANT_KEY = {"batch": "w1", "single": "w1_single", "concurrent": "w1_concurrent"}
"""Where each W1 variant's figures go in a system's JSON."""


def variant_label(variant: str, submitters: int) -> str:
    return {
        "batch": "batched",
        "single": "one at a time",
        "concurrent": f"{submitters} submitters",
    }[variant]


@dataclass
class Outcome:
    """What was measured of one system."""

    system: System
    variants: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {v: [] for v in VARIANTS}
    )
    """W1's runs by variant ("batch" is W1 as it always was)."""
    w2: list[list[float]] = field(default_factory=list)
    w2_rss: list[dict[str, Any]] = field(default_factory=list)
    idle: dict[str, Any] | None = None
    idle_rate: dict[str, Any] | None = None
    """The shard systems: what idle workers cost per second (`idle_rate_phase`)."""
    errors: list[str] = field(default_factory=list)
    failed: dict[str, list[str]] = field(default_factory=dict)
    """The errors by phase ("w1", "w1_single", "w1_concurrent", "w2", "idle"): a phase that
    failed is not run again; the others go on."""

    @property
    def w1(self) -> list[dict[str, Any]]:
        return self.variants["batch"]


# -- the phases ---------------------------------------------------------------------------
def _commits_before(res: Resources, system: System) -> list[int] | None:
    """The commit count of each of the system's PostgreSQL databases (None: it has none)."""
    system.close_client()
    databases = system.postgres_databases()
    if not databases:
        return None
    counts = []
    for admin_url, db_url in databases:
        wait_no_backends(admin_url, db_url)
        counts.append(xact_commit(admin_url, db_url))
    return counts


def _commits_after(res: Resources, system: System, before: list[int] | None) -> list[int] | None:
    """The commits of each database since `before`."""
    system.close_client()
    databases = system.postgres_databases()
    if before is None or len(databases) != len(before):
        return None
    counts = []
    for (admin_url, db_url), was in zip(databases, before, strict=True):
        wait_no_backends(admin_url, db_url)
        counts.append(xact_commit(admin_url, db_url) - was)
    return counts


def _mb(value: float) -> float:
    return round(value / 2**20, 1)


def idle_phase(res: Resources, system: System) -> dict[str, Any]:
    """Start the workers, connect the client, stop: the commits a W1 phase makes besides its
    workflows (startup, registration, shutdown), subtracted from W1's count."""
    system.prepare(-1)
    try:
        before = _commits_before(res, system)
        children = system.start_workers("idle")
        try:
            system.open_client()
        finally:
            system.stop_workers(children)
        commits = _commits_after(res, system, before)
        out: dict[str, Any] = {"commits": None if commits is None else sum(commits)}
        if commits is not None and len(commits) > 1:
            out["commits_by_database"] = commits
        return out
    finally:
        system.cleanup()


IDLE_SECONDS = 10.0
"""How long the idle-rate phase (`idle_rate_phase`) lets the workers run with nothing to do."""


def idle_rate_phase(
    res: Resources, system: System, seconds: float = IDLE_SECONDS
) -> dict[str, Any]:
    """What running workers cost with nothing to do, per second: started, the client
    connected, `seconds` of waiting, stopped; the commits of that phase less the idle
    phase's (started and stopped at once), divided by `seconds`, for the whole store and
    each database (shard); the server CPU over the wait (each server's too)."""
    system.prepare(-2)
    try:
        before = _commits_before(res, system)
        server = server_of(res, system)
        children = system.start_workers("idlerate")
        try:
            system.open_client()
            meter = CpuMeter([c.pid for c in children], server=server)
            meter.start()
            time.sleep(seconds)
            cpu = meter.stop()
        finally:
            system.stop_workers(children)
        commits = _commits_after(res, system, before)
        return {"seconds": seconds, "commits": commits, "cpu_s": cpu}
    finally:
        system.cleanup()


def _idle_rate(idle: dict[str, Any] | None, rate: dict[str, Any] | None) -> dict[str, Any] | None:
    """Commits per second of idle workers (less the commits of starting and stopping), and
    the server's CPU per second, for the store and each database."""
    if not rate or not rate.get("commits"):
        return None
    seconds = rate["seconds"]
    idle = idle or {}
    base = idle.get("commits_by_database") or [idle.get("commits") or 0]
    if len(base) != len(rate["commits"]):
        return None
    each = [round((c - b) / seconds, 1) for c, b in zip(rate["commits"], base, strict=True)]
    cpu = rate["cpu_s"]
    out: dict[str, Any] = {
        "seconds": seconds,
        "commits_per_s": round(sum(each), 1),
        "workers_cpu_ms_per_s": round(cpu["workers_s"] / seconds * 1000, 1),
    }
    if len(each) > 1:
        out["commits_per_s_by_database"] = each
    if "server_s" in cpu:
        out["server_cpu_ms_per_s"] = round(cpu["server_s"] / seconds * 1000, 1)
    if "server_parts_s" in cpu:
        out["server_cpu_ms_per_s_by_server"] = [
            round(x / seconds * 1000, 1) for x in cpu["server_parts_s"]
        ]
    return out


def server_of(res: Resources, system: System) -> Server | None:
    """The system's store server, for its CPU time (None: SQLite, or not on this machine)."""
    try:
        if system.server == "postgresql":
            # Each server once: shards on servers of their own are several.
            found = [postgres_server(admin, db) for admin, db in system.postgres_databases()]
            if any(s is None for s in found):
                return None
            return servers([s for s in found if s is not None])
        if system.server == "redis" and isinstance(system, Celery):
            return redis_server(system.redis_url)
    except Exception as exc:
        log(f"{system.name}: cannot find its server's processes ({exc}): no server CPU")
    return None


def latency_stats(seconds: Sequence[float]) -> dict[str, Any]:
    """Percentiles of submit calls, in ms."""
    return {
        "n": len(seconds),
        "p50_ms": round(percentile(seconds, 50) * 1000, 3),
        "p90_ms": round(percentile(seconds, 90) * 1000, 3),
        "p99_ms": round(percentile(seconds, 99) * 1000, 3),
        "mean_ms": round(sum(seconds) / len(seconds) * 1000, 3),
        "max_ms": round(max(seconds) * 1000, 3),
    }


def w1_phase(
    res: Resources,
    system: System,
    n: int,
    run: int,
    variant: str = "batch",
    submitters: int = SUBMITTERS,
) -> dict[str, Any]:
    """One W1 run of the variant on a fresh store: the workers started, the n workflows
    submitted the variant's way, waited for; CPU of the workers, the client (this process
    less the RSS sampler's thread), the store's server and the machine over submit + wait;
    the commits of the whole phase (workers start -> stop)."""
    system.prepare(run)
    try:
        before = _commits_before(res, system)
        server = server_of(res, system)
        children = system.start_workers(f"w1{variant[0]}r{run}")
        try:
            system.watch(children)
            pids = [c.pid for c in children]
            with RssSampler(pids, interval=0.2) as rss:
                meter = CpuMeter(pids, server=server, harness_cpu=lambda: rss.thread_cpu_s)
                meter.start()
                tp: Throughput = system.around_throughput(
                    children, lambda: system.throughput(n, variant, submitters)
                )
                cpu = meter.stop()
        finally:
            system.watch([])
            system.stop_workers(children)
        raw = _commits_after(res, system, before)
        out: dict[str, Any] = {
            "n": n,
            "variant": variant,
            "elapsed_s": round(tp.elapsed, 3),
            "wf_per_s": round(n / tp.elapsed, 1),
            "submit_s": round(tp.submit_seconds, 3),
            "peak_rss_workers_mb": _mb(rss.peak_total),
            "peak_rss_one_worker_mb": _mb(rss.peak_each),
            "cpu_s": cpu,
        }
        if variant == "concurrent":
            out["submitters"] = submitters
        if tp.submit_latencies:
            out["submit_call"] = latency_stats(tp.submit_latencies)
            out["_submit_latencies"] = tp.submit_latencies  # pooled in the summary, not saved
        if raw is not None:
            out["commits_raw"] = sum(raw)
            out["harness_queries"] = tp.harness_queries
            if len(raw) > 1:
                out["commits_raw_by_database"] = raw
        return out
    finally:
        system.cleanup()


def w2_phase(
    res: Resources, system: System, n: int, run: int
) -> tuple[list[float], dict[str, Any]]:
    system.prepare(run)
    try:
        system.close_client()
        children = system.start_workers(f"w2r{run}")
        try:
            with RssSampler([c.pid for c in children], interval=0.2) as rss:
                system.latency(W2_WARMUP, offset=1_000_000 + run * 1000)
                samples = system.latency(n, offset=run * 10_000)
        finally:
            system.stop_workers(children)
        extra: dict[str, Any] = {
            "peak_rss_workers_mb": _mb(rss.peak_total),
            "peak_rss_one_worker_mb": _mb(rss.peak_each),
        }
        breakdown = system.latency_breakdown()
        if breakdown:
            extra["breakdown_ms"] = breakdown
        return samples, extra
    finally:
        system.cleanup()


def _guarded(outcome: Outcome, what: str, fn: Callable[[], Any], phase: str = "") -> Any:
    """Run one phase; an Exception is recorded (under `phase`, which is then not run again)
    and the benchmark goes on with the next."""
    try:
        return fn()
    except Exception as exc:
        message = f"{outcome.system.name} {what}: {type(exc).__name__}: {exc}"
        log(f"FAILED {message}")
        traceback.print_exc(file=sys.stderr)
        outcome.errors.append(message)
        outcome.failed.setdefault(phase or what, []).append(message)
        with contextlib.suppress(Exception):
            outcome.system.cleanup()
        return None


# -- summaries ----------------------------------------------------------------------------
def _commits_per_wf(run: dict[str, Any], idle: dict[str, Any] | None) -> float | None:
    if "commits_raw" not in run:
        return None
    idle_commits = (idle or {}).get("commits") or 0
    return round((run["commits_raw"] - run["harness_queries"] - idle_commits) / run["n"], 2)


def _commits_per_wf_by_database(
    run: dict[str, Any], idle: dict[str, Any] | None
) -> list[float] | None:
    """A store on several databases (shards): each one's commits per workflow of the whole
    run (less its share of the harness's queries, which poll every database alike, and less
    its idle phase's commits)."""
    raw = run.get("commits_raw_by_database")
    if not raw:
        return None
    idle_each = (idle or {}).get("commits_by_database") or [0] * len(raw)
    share = run["harness_queries"] / len(raw)
    return [round((c - share - i) / run["n"], 2) for c, i in zip(raw, idle_each, strict=True)]


CPU_PARTS = ("workers", "client", "server", "server_db_backends")
"""The parts of CPU per workflow (`<part>_s` in a run's cpu_s); "total" is workers + client +
server (the store's server, where it has one: not SQLite)."""


def _cpu_per_wf(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """CPU seconds per workflow: each part the median of the runs' (its CPU over submit +
    wait, divided by N); the total the sum of the workers', client's and server's medians."""
    out: dict[str, Any] = {}
    for part in CPU_PARTS:
        values = [r["cpu_s"][f"{part}_s"] / r["n"] for r in runs if f"{part}_s" in r["cpu_s"]]
        out[f"{part}_s"] = round(median(values), 6) if values else None
    out["total_s"] = round(sum(out[f"{p}_s"] or 0.0 for p in ("workers", "client", "server")), 6)
    with_parts = [r for r in runs if "server_parts_s" in r["cpu_s"]]
    if with_parts:  # each server of a store on several (shards): its own median
        out["server_parts_s"] = [
            round(median([r["cpu_s"]["server_parts_s"][i] / r["n"] for r in with_parts]), 6)
            for i in range(len(with_parts[0]["cpu_s"]["server_parts_s"]))
        ]
    kinds = {r["cpu_s"].get("server") for r in runs}
    out["server"] = kinds.pop() if len(kinds) == 1 else None
    return out


def summarise_variant(
    runs: list[dict[str, Any]], idle: dict[str, Any] | None, errors: list[str]
) -> dict[str, Any]:
    """One W1 variant of one system: the median of its runs."""
    out: dict[str, Any] = {}
    if errors:
        out["errors"] = errors
    if not runs:
        return out
    pooled: list[float] = []
    for run in runs:
        per_wf = _commits_per_wf(run, idle)
        if per_wf is not None:
            run["commits_per_wf"] = per_wf
        each_db = _commits_per_wf_by_database(run, idle)
        if each_db is not None:
            run["commits_per_wf_by_database"] = each_db
        pooled += run.pop("_submit_latencies", [])
    rates = [r["wf_per_s"] for r in runs]
    out.update(
        {
            "variant": runs[0].get("variant", "batch"),
            "wf_per_s": round(median(rates), 1),
            "wf_per_s_runs": rates,
            "cpu_s_per_wf": _cpu_per_wf(runs),
        }
    )
    if "submitters" in runs[0]:
        out["submitters"] = runs[0]["submitters"]
    per_wf_runs = [r["commits_per_wf"] for r in runs if "commits_per_wf" in r]
    if per_wf_runs:
        out["commits_per_wf"] = round(median(per_wf_runs), 2)
    by_database = [
        r["commits_per_wf_by_database"] for r in runs if "commits_per_wf_by_database" in r
    ]
    if by_database:
        out["commits_per_wf_by_database"] = [
            round(median([b[i] for b in by_database]), 2) for i in range(len(by_database[0]))
        ]
    if pooled:
        out["submit_call"] = latency_stats(pooled)
    out["runs"] = runs
    return out


def summarise(outcome: Outcome) -> dict[str, Any]:
    s = outcome.system
    out: dict[str, Any] = {"store": s.store, **s.describe()}
    if outcome.errors:
        out["errors"] = outcome.errors
    for variant, key in VARIANT_KEY.items():
        runs = outcome.variants[variant]
        errors = outcome.failed.get(key, [])
        if runs or errors:
            out[key] = summarise_variant(runs, outcome.idle, errors)
    if outcome.w1:
        per_wf_runs = [r["commits_per_wf"] for r in outcome.w1 if "commits_per_wf" in r]
        if per_wf_runs:
            out["commits_per_wf"] = round(median(per_wf_runs), 2)
    if outcome.idle is not None:
        out["commits_idle_phase"] = outcome.idle.get("commits")
    rate = _idle_rate(outcome.idle, outcome.idle_rate)
    if rate is not None:
        out["idle_workers"] = rate
    if outcome.w2:
        pooled = [x for run in outcome.w2 for x in run]
        out["w2"] = {
            "n_per_run": len(outcome.w2[0]),
            "runs": len(outcome.w2),
            "p50_ms": round(percentile(pooled, 50) * 1000, 2),
            "p99_ms": round(percentile(pooled, 99) * 1000, 2),
            "mean_ms": round(sum(pooled) / len(pooled) * 1000, 2),
            "max_ms": round(max(pooled) * 1000, 2),
            "per_run": [
                {
                    "p50_ms": round(percentile(r, 50) * 1000, 2),
                    "p99_ms": round(percentile(r, 99) * 1000, 2),
                    **({"breakdown_ms": x["breakdown_ms"]} if "breakdown_ms" in x else {}),
                }
                for r, x in zip(outcome.w2, outcome.w2_rss, strict=True)
            ],
        }
    # RSS as before: W1 batched and W2 (the other variants' runs have theirs in the JSON).
    rss = [r["peak_rss_workers_mb"] for r in outcome.w1] + [
        r["peak_rss_workers_mb"] for r in outcome.w2_rss
    ]
    if rss:
        out["peak_rss_workers_mb"] = max(rss)
        out["peak_rss_one_worker_mb"] = max(
            [r["peak_rss_one_worker_mb"] for r in outcome.w1]
            + [r["peak_rss_one_worker_mb"] for r in outcome.w2_rss]
        )
    return out


def _fig(summary: dict[str, Any], key: str) -> float | None:
    if key == "wf_per_s":
        return summary.get("w1", {}).get("wf_per_s")
    if key in ("p50_ms", "p99_ms"):
        return summary.get("w2", {}).get(key)
    return summary.get(key)


def ratios(systems: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """stepwarden-postgres's figure divided by each peer's."""
    base = systems.get(BASE)
    out: dict[str, dict[str, float | None]] = {}
    if base is None:
        return out
    for name, peer in systems.items():
        if name == BASE or name in SHARD_SYSTEMS:
            continue
        row: dict[str, float | None] = {}
        for key in ("wf_per_s", "p50_ms", "p99_ms", "commits_per_wf", "peak_rss_workers_mb"):
            a, b = _fig(base, key), _fig(peer, key)
            row[key] = round(a / b, 3) if a is not None and b else None
        out[name] = row
    return out


def variant_ratios(
    systems: dict[str, dict[str, Any]],
) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per W1 variant, stepwarden-postgres's wf/s, CPU per workflow (total) and commits per
    workflow divided by each peer's."""
    base = systems.get(BASE)
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    if base is None:
        return out
    for key in VARIANT_KEY.values():
        mine = base.get(key)
        if not mine or "wf_per_s" not in mine:
            continue
        rows: dict[str, dict[str, float | None]] = {}
        for name, peer in systems.items():
            theirs = peer.get(key)
            if name in (BASE, *SHARD_SYSTEMS) or not theirs or "wf_per_s" not in theirs:
                continue
            pairs = {
                "wf_per_s": (mine["wf_per_s"], theirs["wf_per_s"]),
                "cpu_s_per_wf": (
                    mine["cpu_s_per_wf"]["total_s"],
                    theirs["cpu_s_per_wf"]["total_s"],
                ),
                "commits_per_wf": (mine.get("commits_per_wf"), theirs.get("commits_per_wf")),
            }
            rows[name] = {
                k: round(a / b, 3) if a is not None and b else None for k, (a, b) in pairs.items()
            }
        out[key] = rows
    return out


def shards_summary(systems: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Two shards against one, on servers of the benchmark's own alike: for each W1 variant,
    the two-shard figure divided by the one-shard one (wf/s, commits and CPU per workflow:
    total and the servers')."""
    one, two = (systems.get(n) for n in SHARD_SYSTEMS)
    if not one or not two:
        return None
    out: dict[str, Any] = {"placement": {n: systems[n].get("placement") for n in SHARD_SYSTEMS}}
    for variant, key in VARIANT_KEY.items():
        a, b = one.get(key) or {}, two.get(key) or {}
        if "wf_per_s" not in a or "wf_per_s" not in b:
            continue

        def ratio(x: float | None, y: float | None) -> float | None:
            return round(x / y, 3) if x is not None and y else None

        out[variant] = {
            "wf_per_s_x": ratio(b["wf_per_s"], a["wf_per_s"]),
            "commits_per_wf_x": ratio(b.get("commits_per_wf"), a.get("commits_per_wf")),
            "cpu_total_per_wf_x": ratio(b["cpu_s_per_wf"]["total_s"], a["cpu_s_per_wf"]["total_s"]),
            "cpu_server_per_wf_x": ratio(
                b["cpu_s_per_wf"]["server_s"], a["cpu_s_per_wf"]["server_s"]
            ),
        }
    return out


def _each(values: Sequence[float] | None) -> str:
    """Each database's (server's) figure in brackets: " (1.2 + 3.4)"; "" for none."""
    return " (" + " + ".join(f"{v:.1f}" for v in values) + ")" if values else ""


def shards_table_lines(result: dict[str, Any]) -> list[str]:
    """One shard and two on servers of the benchmark's own, stepwarden-postgres beside them."""
    summary = result.get("shards")
    if not summary:
        return []
    settings = result.get("settings", {})
    systems = result["systems"]
    lines = [
        "",
        f"Shards: W1 ({settings.get('w1_n')} workflows, median of {settings.get('runs')} "
        f"run(s)) with {settings.get('workers_per_system')} worker processes on "
        + "; ".join(f"{n}: {summary['placement'][n]}" for n in SHARD_SYSTEMS)
        + f". {BASE} (the shared server) beside them. commits/wf and server CPU ms/wf: the "
        "whole store's, and each shard's (its server's) in brackets",
    ]
    head = (
        f"{'system':<28} {'submitting':<14} {'wf/s':>8} {'(runs)':<22} "
        f"{'commits/wf':<18} {'server ms/wf':<20} {'total ms/wf':>11}"
    )
    lines += [head, "-" * len(head)]
    for name in (BASE, *SHARD_SYSTEMS):
        s = systems.get(name)
        if not s:
            continue
        first = True
        for variant in settings.get("w1_variants", ["batch"]):
            v = s.get(VARIANT_KEY[variant]) or {}
            who = name if first else ""
            first = False
            label = variant_label(variant, settings.get("submitters", SUBMITTERS))
            if "wf_per_s" not in v:
                lines.append(f"{who:<28} {label:<14} {'-':>8}")
                continue
            cpu = v["cpu_s_per_wf"]
            runs = "(" + ", ".join(f"{r:,.0f}" for r in v["wf_per_s_runs"]) + ")"
            commits = _f(v.get("commits_per_wf"), "{:.2f}")
            by_database = v.get("commits_per_wf_by_database")
            if by_database:
                commits += " (" + " + ".join(f"{c:.2f}" for c in by_database) + ")"
            server = _ms(cpu.get("server_s"))
            if cpu.get("server_parts_s"):
                server += " (" + " + ".join(_ms(c) for c in cpu["server_parts_s"]) + ")"
            lines.append(
                f"{who:<28} {label:<14} {v['wf_per_s']:>8,.1f} {runs:<22} {commits:<18} "
                f"{server:<20} {_ms(cpu['total_s']):>11}"
            )
    for name in SHARD_SYSTEMS:
        idle = (systems.get(name) or {}).get("idle_workers")
        if not idle:
            continue
        commits = f"{idle['commits_per_s']:.1f}" + _each(idle.get("commits_per_s_by_database"))
        server = _f(idle.get("server_cpu_ms_per_s")) + _each(
            idle.get("server_cpu_ms_per_s_by_server")
        )
        lines.append(
            f"  {name}, workers idle {idle['seconds']:g} s: {commits} commits/s, server CPU "
            f"{server} ms/s, workers' CPU {idle['workers_cpu_ms_per_s']:.1f} ms/s"
        )
    for variant in settings.get("w1_variants", ["batch"]):
        r = summary.get(variant)
        if not r:
            continue
        lines.append(
            f"  2 shards / 1, {variant_label(variant, settings.get('submitters', SUBMITTERS))}: "
            f"wf/s x{_f(r['wf_per_s_x'], '{:.2f}')}, commits/wf "
            f"x{_f(r['commits_per_wf_x'], '{:.2f}')}, server CPU/wf "
            f"x{_f(r['cpu_server_per_wf_x'], '{:.2f}')}, total CPU/wf "
            f"x{_f(r['cpu_total_per_wf_x'], '{:.2f}')}"
        )
    return lines


def _goal_figure(systems: dict[str, dict[str, Any]], key: str) -> float | None:
    base = systems[BASE]

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    def single(system: dict[str, Any] | None, what: str = "wf_per_s") -> Any:
        return ((system or {}).get(VARIANT_KEY["single"]) or {}).get(what)

    if key.startswith("single_x_"):
        return ratio(single(base), single(systems.get(key.removeprefix("single_x_"))))
    if key == "concurrent_wf_per_s":
        return (base.get(VARIANT_KEY["concurrent"]) or {}).get("wf_per_s")
    if key == "single_cpu_x_batched":
        cpu = single(base, "cpu_s_per_wf") or {}
        batched = (base.get(VARIANT_KEY["batch"]) or {}).get("cpu_s_per_wf") or {}
        return ratio(cpu.get("total_s"), batched.get("total_s"))
    if key == "single_commits_per_wf":
        return single(base, "commits_per_wf")  # type: ignore[no-any-return]
    return _fig(base, key)


def goal_check(systems: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    if systems.get(BASE) is None:
        return None
    out: dict[str, Any] = {}
    for key, (way, target) in GOAL.items():
        value = _goal_figure(systems, key)
        met = None if value is None else (value >= target if way == ">=" else value <= target)
        out[key] = {"goal": target, "way": way, "measured": value, "met": met}
    return out


def sqlite_wakeups(systems: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """SQLite with its wake-ups (stepwarden-sqlite) beside SQLite polling only
    (stepwarden-sqlite-poll): W2's p50 and p99, and the wf/s of each W1 variant run, with
    wake-ups / polling only (None: a side did not run or failed)."""
    wake, poll = systems.get(WAKE), systems.get(POLL)
    if wake is None or poll is None:
        return None
    figures = {
        "w2_p50_ms": ("w2", "p50_ms"),
        "w2_p99_ms": ("w2", "p99_ms"),
        **{f"{key}_wf_per_s": (key, "wf_per_s") for key in VARIANT_KEY.values()},
    }
    out: dict[str, Any] = {}
    for name, (part, key) in figures.items():
        a, b = ((s.get(part) or {}).get(key) for s in (wake, poll))
        if a is None and b is None:
            continue
        out[name] = {
            "wake_ups": a,
            "poll_only": b,
            "wake_ups_x_poll_only": round(a / b, 3) if a is not None and b else None,
        }
    return out


SQLITE_WAKEUPS_LABEL = {
    "w2_p50_ms": "W2 p50 ms",
    "w2_p99_ms": "W2 p99 ms",
    "w1_wf_per_s": "W1 batched wf/s",
    "w1_single_wf_per_s": "W1 one at a time wf/s",
    "w1_concurrent_wf_per_s": "W1 {submitters} submitters wf/s",
}


def sqlite_wakeups_lines(result: dict[str, Any]) -> list[str]:
    """SQLite's wake-ups against polling only, side by side."""
    rows = result.get("sqlite_wakeups")
    if not rows:
        return []
    submitters = result.get("settings", {}).get("submitters", SUBMITTERS)
    lines = [
        "",
        f"SQLite: wake-ups between processes ({WAKE}) against polling only every 0.05 s "
        f"({POLL}, ?wake=off); ms: <1 is less with wake-ups, wf/s: >1 is faster",
    ]
    head = f"{'':<26} {'wake-ups':>10} {'poll only':>10} {'wake-ups / poll only':>21}"
    lines += [head, "-" * len(head)]
    for key, r in rows.items():
        label = SQLITE_WAKEUPS_LABEL.get(key, key).format(submitters=submitters)
        fmt = "{:,.2f}" if key.startswith("w2_") else "{:,.1f}"
        lines.append(
            f"{label:<26} {_f(r['wake_ups'], fmt):>10} {_f(r['poll_only'], fmt):>10} "
            f"{_f(r['wake_ups_x_poll_only'], 'x{:.2f}'):>21}"
        )
    return lines


# -- the table ----------------------------------------------------------------------------
def _f(value: Any, fmt: str = "{:,.1f}") -> str:
    if value is None:
        return "-"
    return fmt.format(value)


def table(result: dict[str, Any]) -> str:
    systems = result["systems"]
    lines = []
    head = (
        f"{'system':<28} {'store':<11} {'W1 wf/s':>9} {'(runs)':<22} {'W2 p50 ms':>9} "
        f"{'p99 ms':>8} {'commits/wf':>10} {'RSS MB':>8}"
    )
    lines += [head, "-" * len(head)]
    for name, s in systems.items():
        runs = s.get("w1", {}).get("wf_per_s_runs")
        lines.append(
            f"{name:<28} {s['store']:<11} {_f(_fig(s, 'wf_per_s')):>9} "
            f"{'(' + ', '.join(f'{r:,.0f}' for r in runs) + ')' if runs else '':<22} "
            f"{_f(_fig(s, 'p50_ms')):>9} {_f(_fig(s, 'p99_ms')):>8} "
            f"{_f(s.get('commits_per_wf'), '{:.2f}'):>10} "
            f"{_f(s.get('peak_rss_workers_mb')):>8}" + ("   FAILED" if s.get("errors") else "")
        )
    if result.get("ratios"):
        lines += ["", f"{BASE} / peer (wf/s: >1 is faster; ms, commits, RSS: <1 is less)"]
        for name, r in result["ratios"].items():
            lines.append(
                f"  vs {name:<22} wf/s x{_f(r['wf_per_s'], '{:.2f}')}   "
                f"p50 x{_f(r['p50_ms'], '{:.2f}')}   p99 x{_f(r['p99_ms'], '{:.2f}')}   "
                f"commits x{_f(r['commits_per_wf'], '{:.2f}')}   "
                f"RSS x{_f(r['peak_rss_workers_mb'], '{:.2f}')}"
            )
    if result.get("reference"):
        lines += [
            "reference (measured earlier on this kind of machine): "
            + "; ".join(
                f"{name} {r['wf_per_s']:g} wf/s, {r['p50_ms']:g}/{r['p99_ms']:g} ms"
                for name, r in result["reference"].items()
            )
        ]
    if result.get("goal"):
        lines += ["", f"goals ({BASE}):"]
        for key, g in result["goal"].items():
            mark = {True: "met", False: "NOT met", None: "-"}[g["met"]]
            way = g.get("way", ">=" if key == "wf_per_s" else "<=")
            lines.append(
                f"  {key:<24} {_f(g['measured'], '{:,.2f}'):>10}  ({way} {g['goal']:g}: {mark})"
            )
    lines += variants_table_lines(result)
    lines += sqlite_wakeups_lines(result)
    lines += shards_table_lines(result)
    if result.get("submit_rtt"):
        lines += rtt_mod.table_lines(result["submit_rtt"])
    if result.get("agent_http"):
        lines += agent_http_mod.table_lines(result["agent_http"])
    if result.get("idle_fleet"):
        lines += idle_fleet_mod.table_lines(result["idle_fleet"])
    if result.get("fanout"):
        settings = result.get("settings", {})
        lines += fanout_mod.table_lines(
            result["fanout"], settings.get("fanout_n", 0), settings.get("runs", 0)
        )
        lines.append("")
    if result.get("fair_share"):
        lines += fair_share_mod.table_lines(result["fair_share"])
        lines.append("")
    for name, kinds in result.get("recovery", {}).items():
        for kind, rec in kinds.items():
            if "error" in rec:
                lines.append(f"recovery ({name}, {kind}): FAILED {rec['error']}")
            elif kind == "agent":
                lines.append(
                    f"recovery ({name}): SIGKILLed agent's step done elsewhere "
                    f"{rec['kill_to_done_s_median']:.2f} s after the kill (median of "
                    f"{len(rec['runs'])}); {rec['after_deadline_s_median']:.2f} s after its "
                    f"complete_by ({rec['step_complete_within_s']:g} s step deadline)"
                )
            elif kind == "leader":
                lines.append(
                    f"recovery ({name}): SIGKILLed supervisor leader's worker (every role): "
                    f"{rec['tasks']} tasks all done {rec['kill_to_all_done_s_median']:.2f} s "
                    f"after the kill (median of {len(rec['runs'])}; goal <= {rec['goal_s']:g} s: "
                    f"max(lease {rec['lease_ttl_s']:g} s, gone-after {rec['gone_after_s']:g} s)"
                    " + 2 s)"
                )
            elif kind == "scheduler":
                lines.append(
                    f"recovery ({name}): SIGKILLed scheduler's {rec['tasks']} tasks all done "
                    f"{rec['kill_to_all_done_s_median']:.2f} s after the kill (median of "
                    f"{len(rec['runs'])}; goal <= {rec['goal_s']:g} s: gone-after "
                    f"{rec['gone_after_s']:g} s + 2 s)"
                )
            else:
                lines.append(
                    f"recovery ({name}): PostgreSQL stopped {rec['outage_s']:g} s with "
                    f"{rec['tasks']} tasks under way: first write "
                    f"{rec['back_to_first_write_s_median']:.2f} s, all done "
                    f"{rec['back_to_all_done_s_median']:.2f} s after it started again (median "
                    f"of {len(rec['runs'])}; goals <= {rec['first_write_goal_s']:g} s, <= "
                    f"{rec['goal_s']:g} s)"
                )
    for name, sw in result.get("sweep", {}).items():
        if "error" in sw:
            lines.append(f"sweep ({name}): FAILED {sw['error']}")
            continue
        if "waiting_tasks" in sw:
            lines.append(
                f"wake-up ({name}): {sw['waiting_tasks']:,} waiting + {sw['due_tasks']} due "
                f"tasks: {sw['wake_ms']:.1f} ms (median of {len(sw['wake_ms_runs'])}), "
                f"nothing due {sw['empty_wake_ms_median']:.1f} ms; load {sw['load']}"
            )
            continue
        lines.append(
            f"sweep ({name}): {sw['finished_tasks']:,} finished + {sw['expired_tasks']} "
            f"expired tasks: sweep {sw['sweep_ms']:.1f} ms (median of {len(sw['sweep_ms_runs'])})"
            f", empty sweep {sw['empty_sweep_ms_median']:.1f} ms; load {sw['load']}"
        )
    m = result.get("machine", {})
    lines.append(
        f"machine: {m.get('cpus')} cpus, load average {m.get('load_average_at_start')} at "
        f"start, {m.get('load_average_at_end')} at end"
        + (
            "; the engine's source changed during the run"
            if result.get("engine_src_changed_during_run")
            else ""
        )
    )
    return "\n".join(lines)


def _ms(seconds: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if seconds is None else fmt.format(seconds * 1000)


def variants_table_lines(result: dict[str, Any]) -> list[str]:
    """W1's variants: a section of their own, with stepwarden-postgres's ratios."""
    settings = result.get("settings", {})
    variants = settings.get("w1_variants", ["batch"])
    submitters = settings.get("submitters", SUBMITTERS)
    if variants == ["batch"]:
        return []
    lines = [
        "",
        f"W1 by way of submitting: the same {settings.get('w1_n')} workflows and workers, "
        f"median of {settings.get('runs')} run(s). CPU ms per workflow over submit + wait: "
        "workers, client (the benchmark's process), server (PostgreSQL: all the server's "
        "processes, other users' too, and in brackets its backends of the system's "
        "database; Redis: redis-server), total = workers + client + server; commits/wf on "
        "PostgreSQL (less the idle phase); submit p50: one submit call, ms",
    ]
    head = (
        f"{'system':<28} {'submitting':<14} {'wf/s':>8} {'(runs)':<22} {'workers':>8} "
        f"{'client':>7} {'server (own db)':>16} {'total':>7} {'commits/wf':>10} "
        f"{'submit p50':>10}"
    )
    lines += [head, "-" * len(head)]
    for name, s in result["systems"].items():
        first = True
        for variant in variants:
            v = s.get(VARIANT_KEY[variant])
            label = variant_label(variant, submitters)
            who = name if first else ""
            first = False
            if not v:
                lines.append(f"{who:<28} {label:<14} {'-':>8}")
                continue
            failed = "   FAILED: " + "; ".join(v["errors"]) if v.get("errors") else ""
            if "wf_per_s" not in v:
                lines.append(f"{who:<28} {label:<14} {'-':>8}{failed}")
                continue
            cpu = v["cpu_s_per_wf"]
            runs = "(" + ", ".join(f"{r:,.0f}" for r in v["wf_per_s_runs"]) + ")"
            server = _ms(cpu["server_s"])
            if cpu.get("server_db_backends_s") is not None:
                server += f" ({_ms(cpu['server_db_backends_s'])})"
            call = v.get("submit_call", {}).get("p50_ms")
            lines.append(
                f"{who:<28} {label:<14} {v['wf_per_s']:>8,.1f} {runs:<22} "
                f"{_ms(cpu['workers_s']):>8} {_ms(cpu['client_s']):>7} {server:>16} "
                f"{_ms(cpu['total_s']):>7} {_f(v.get('commits_per_wf'), '{:.2f}'):>10} "
                f"{_f(call, '{:.2f}'):>10}{failed}"
            )
    ratios = result.get("variant_ratios") or {}
    if any(ratios.values()):
        lines += [
            "",
            f"{BASE} / peer by way of submitting (wf/s: >1 is faster; CPU per workflow "
            "(total) and commits/wf: <1 is less)",
        ]
        peers = [n for n in result["systems"] if n not in (BASE, *SHARD_SYSTEMS)]
        for peer in peers:
            parts = []
            for variant in variants:
                r = ratios.get(VARIANT_KEY[variant], {}).get(peer)
                label = variant_label(variant, submitters)
                if r is None:
                    parts.append(f"{label}: -")
                    continue
                part = (
                    f"{label}: wf/s x{_f(r['wf_per_s'], '{:.2f}')}, "
                    f"CPU x{_f(r['cpu_s_per_wf'], '{:.2f}')}"
                )
                if r.get("commits_per_wf") is not None:
                    part += f", commits x{r['commits_per_wf']:.2f}"
                parts.append(part)
            lines.append(f"  vs {peer:<22} " + " | ".join(parts))
    return lines


# -- the machine ----------------------------------------------------------------------------
def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown-cpu"


def machine(admin_url: str) -> dict[str, Any]:
    """What the figures were measured on; no host name."""
    pg = None
    with contextlib.suppress(Exception), psycopg.connect(admin_url, autocommit=True) as db:
        row = db.execute("SHOW server_version").fetchone()
        pg = row[0] if row else None
    mem = psutil.virtual_memory().total
    out = {
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(mem / 2**30, 1),
        "python": platform.python_version(),
        "postgresql": pg,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    with contextlib.suppress(Exception):
        import redis

        client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        out["redis"] = client.info("server").get("redis_version")
        client.close()
    return out


def machine_slug(m: dict[str, Any]) -> str:
    pg = (m.get("postgresql") or "").split(".")[0].split()[0]
    parts = [
        platform.system(),
        m["arch"],
        f"{m['cpus']}cpu",
        f"{round(m['memory_gib'])}gib",
        _cpu_model(),
        f"pg{pg}" if pg else "",
    ]
    return "-".join(p for p in (_slug(x) for x in parts) if p)


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    with contextlib.suppress(Exception):
        root = Path(__file__).resolve().parents[1]
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return head + ("+uncommitted-src" if dirty else "")
    return None


def src_digest() -> str:
    """A digest of the engine's source as the workers import it (an editable install reads
    src/ at each start: a change during the run shows here)."""
    import hashlib

    import stepwarden

    digest = hashlib.sha256()
    root = Path(stepwarden.__file__).parent
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".sql"):
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


# -- main ---------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke check: small N, one run")
    p.add_argument(
        "--only",
        default=",".join(SYSTEMS),
        help=f"comma-separated systems (default: all): {', '.join(SYSTEMS)}; "
        "'stepwarden' means every stepwarden one (both stores, and SQLite polling only)",
    )
    p.add_argument("--n", type=int, default=None, help="W1 workflows per run [2000; quick 200]")
    p.add_argument(
        "--latency-n", type=int, default=None, help="W2 workflows per run [200; quick 50]"
    )
    p.add_argument("--runs", type=int, default=None, help="runs of W1 and W2 [3; quick 1]")
    p.add_argument(
        "--w1-variants",
        default=",".join(VARIANTS),
        help="W1's ways of submitting, comma-separated (default: all): batch (batches of 100 "
        "where the system can batch), single (one workflow per call, each awaited before the "
        "next), concurrent (--submitters submitters, each one workflow per call)",
    )
    p.add_argument(
        "--submitters",
        type=int,
        default=SUBMITTERS,
        help=f"concurrent submitters of W1's 'concurrent' variant [{SUBMITTERS}]",
    )
    p.add_argument(
        "--rtt-n",
        type=int,
        default=None,
        help="submits per condition of the submit round trip (stepwarden-postgres) [200; quick 50]",
    )
    p.add_argument(
        "--no-submit-rtt",
        action="store_true",
        help="skip the submit round trip (stepwarden-postgres with no worker, idle workers)",
    )
    p.add_argument(
        "--no-agent-http",
        action="store_true",
        help="skip one agent call over HTTP against one in process (bench/agent_http.py)",
    )
    p.add_argument(
        "--no-idle-fleet",
        action="store_true",
        help="skip the idle fleet (bench/idle_fleet.py: 1, 10, 40 idle workers)",
    )
    p.add_argument(
        "--idle-fleet-sizes",
        default=",".join(map(str, idle_fleet_mod.SIZES)),
        help="the idle fleet's sizes [1,10,40]",
    )
    p.add_argument(
        "--idle-fleet-before",
        default="main",
        help="the git revision whose engine the idle fleet runs first, for the figures before "
        "('' runs this checkout's alone) [main]",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes per system [2]")
    p.add_argument(
        "--sweep-finished",
        type=int,
        default=None,
        help="finished tasks in the store for the sweep [1,000,000; quick 100,000]",
    )
    p.add_argument("--sweep-expired", type=int, default=100, help="expired tasks [100]")
    p.add_argument("--sweep-sqlite", action="store_true", help="also time the sweep on SQLite")
    p.add_argument(
        "--no-sweep-cache",
        action="store_true",
        help="load the sweep's database anew and drop it after (default: keep a template "
        "database on the server and copy it)",
    )
    p.add_argument(
        "--fanout-n",
        type=int,
        default=None,
        help="steps of the fan-out task (ctx.gather) [10,000; quick 1,000]",
    )
    p.add_argument("--no-fanout", action="store_true", help="skip the fan-out measurement")
    p.add_argument(
        "--no-tracing",
        action="store_true",
        help="skip the tracing cost (W1 one at a time and W2 of stepwarden-postgres, traced "
        "four ways: bench/tracing.py)",
    )
    p.add_argument(
        "--no-fair-share",
        action="store_true",
        help="skip the fair share of claims across tenants, end to end (bench/fair_share.py)",
    )
    fair_share_mod.add_arguments(p)
    p.add_argument("--no-sweep", action="store_true", help="skip the sweep measurement")
    p.add_argument("--no-recovery", action="store_true", help="skip the recovery measurement")
    p.add_argument(
        "--profile",
        metavar="PATH",
        default=None,
        help="after the measurements, one more W1 of stepwarden-postgres under py-spy; its "
        "summary is written to PATH",
    )
    p.add_argument(
        "--profile-variant",
        choices=["batch", "single", "concurrent"],
        default="batch",
        help="the way of submitting of the profiled W1 [batch]",
    )
    p.add_argument(
        "--admin-url",
        default=os.environ.get(
            "BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="a PostgreSQL database from which the benchmark creates and drops its own "
        "[$BENCH_POSTGRES_URL or postgresql://postgres@127.0.0.1:5432/postgres]",
    )
    p.add_argument(
        "--redis-url",
        default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"),
        help="a Redis database given to the benchmark alone: it is FLUSHed "
        "[$BENCH_REDIS_URL or redis://127.0.0.1:6379/13]",
    )
    p.add_argument(
        "--shard-servers",
        choices=["auto", "own", "shared"],
        default="auto",
        help=f"where {' and '.join(SHARD_SYSTEMS)} keep their databases: own (PostgreSQL "
        "servers the benchmark makes with pg_createcluster, one per shard, each with the "
        "shared server's settings; needs root and Debian's postgresql-common), shared "
        "(databases of the --admin-url server), auto (own where it can) [auto]",
    )
    p.add_argument("--out", type=Path, default=RESULTS, help="where results are written")
    args = p.parse_args(argv)
    chosen: list[str] = []
    for item in (x.strip() for x in args.only.split(",") if x.strip()):
        names = (
            [s for s in SYSTEMS if s.startswith("stepwarden")] if item == "stepwarden" else [item]
        )
        for name in names:
            if name not in SYSTEMS:
                p.error(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
            if name not in chosen:
                chosen.append(name)
    args.systems = [s for s in SYSTEMS if s in chosen]
    variants = [v.strip() for v in args.w1_variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            p.error(f"unknown W1 variant {v!r}; choose from {', '.join(VARIANTS)}")
    if not variants:
        p.error("--w1-variants names none")
    args.variants = [v for v in VARIANTS if v in variants]
    if args.submitters < 1:
        p.error("--submitters must be at least 1")
    args.rtt_n = args.rtt_n or (50 if args.quick else 200)
    args.n = args.n or (200 if args.quick else 2000)
    args.latency_n = args.latency_n or (50 if args.quick else 200)
    args.runs = args.runs or (1 if args.quick else 3)
    args.sweep_finished = args.sweep_finished or (100_000 if args.quick else 1_000_000)
    args.fanout_n = args.fanout_n or (1_000 if args.quick else 10_000)
    fair_share_mod.settle_arguments(args, args.quick)
    why = cannot_make_clusters()
    if args.shard_servers == "own" and why is not None:
        p.error(f"--shard-servers own: {why}")
    args.own_shard_servers = args.shard_servers == "own" or (
        args.shard_servers == "auto" and why is None
    )
    if args.shard_servers == "auto" and why is not None and set(SHARD_SYSTEMS) & set(chosen):
        log(f"the shards are databases of the shared server: {why}")
    return args


def make_system(
    name: str, res: Resources, workers: int, log_dir: Path, *, own_servers: bool = True
) -> System:
    if name in SHARD_SYSTEMS:
        return StepwardenShards(
            res,
            workers=workers,
            log_dir=log_dir,
            shards=SHARD_SYSTEMS.index(name) + 1,
            own_servers=own_servers,
        )
    if name == "stepwarden-sqlite":
        return Stepwarden(res, workers=workers, log_dir=log_dir, postgres=False)
    if name == "stepwarden-sqlite-poll":
        return Stepwarden(res, workers=workers, log_dir=log_dir, postgres=False, wake=False)
    if name == "stepwarden-postgres":
        return Stepwarden(res, workers=workers, log_dir=log_dir, postgres=True)
    if name == "dbos":
        return Dbos(res, workers=workers, log_dir=log_dir)
    if name == "celery":
        return Celery(res, workers=workers, log_dir=log_dir)
    if name == "procrastinate":
        return Procrastinate(res, workers=workers, log_dir=log_dir)
    raise ValueError(name)


def measure(args: argparse.Namespace, res: Resources, log_dir: Path) -> dict[str, Outcome]:
    outcomes = {
        name: Outcome(
            make_system(name, res, args.workers, log_dir, own_servers=args.own_shard_servers)
        )
        for name in args.systems
    }
    try:
        return _measure(args, res, outcomes)
    finally:
        res.drop_clusters()  # the shard systems' servers: done with them


def _measure(
    args: argparse.Namespace, res: Resources, outcomes: dict[str, Outcome]
) -> dict[str, Outcome]:
    for name, outcome in outcomes.items():
        if outcome.system.postgres:
            log(f"{name}: idle phase (the commits of starting and stopping)")
            outcome.idle = _guarded(
                outcome, "idle phase", lambda o=outcome: idle_phase(res, o.system), "idle"
            )
            if name in SHARD_SYSTEMS and outcome.idle is not None:
                log(f"{name}: the workers idle for {IDLE_SECONDS:g} s (commits and CPU per second)")
                outcome.idle_rate = _guarded(
                    outcome,
                    "idle rate",
                    lambda o=outcome: idle_rate_phase(res, o.system),
                    "idle_rate",
                )
    for run in range(args.runs):
        # Each run takes the systems in another order, so that none is always first or last.
        names = list(outcomes)
        names = names[run % len(names) :] + names[: run % len(names)]
        for name in names:
            outcome = outcomes[name]
            if "idle" in outcome.failed:
                continue  # its commit counts would mean nothing; the error says why
            for variant in args.variants:
                key = VARIANT_KEY[variant]
                if key in outcome.failed:
                    continue
                label = variant_label(variant, args.submitters)
                log(f"{name}: W1 {label} run {run + 1}/{args.runs}, {args.n} workflows")
                w1 = _guarded(
                    outcome,
                    f"W1 {label} run {run + 1}",
                    lambda o=outcome, r=run, v=variant: w1_phase(
                        res, o.system, args.n, r, v, args.submitters
                    ),
                    key,
                )
                if w1 is None:
                    continue
                outcome.variants[variant].append(w1)
                call = w1.get("submit_call")
                log(
                    f"{name}: W1 {label} {w1['wf_per_s']:,.1f} wf/s ({w1['elapsed_s']:.2f} s)"
                    + (f", submit call p50 {call['p50_ms']:.2f} ms" if call else "")
                )
            if "w2" in outcome.failed:
                continue
            log(f"{name}: W2 run {run + 1}/{args.runs}, {args.latency_n} workflows one by one")
            w2 = _guarded(
                outcome,
                f"W2 run {run + 1}",
                lambda o=outcome, r=run: w2_phase(res, o.system, args.latency_n, r),
                "w2",
            )
            if w2 is None:
                continue
            samples, rss = w2
            outcome.w2.append(samples)
            outcome.w2_rss.append(rss)
            log(
                f"{name}: W2 p50 {percentile(samples, 50) * 1000:.1f} ms, "
                f"p99 {percentile(samples, 99) * 1000:.1f} ms"
            )
    return outcomes


def run_fanout(
    args: argparse.Namespace, res: Resources, log_dir: Path, outcomes: dict[str, Outcome]
) -> dict[str, Any]:
    """The fan-out on each stepwarden store, `args.runs` times, each on a fresh store, the
    stores in another order each run; the commits per step less the idle phase's (the one
    measured before W1, or one of its own)."""
    names = [n for n in ("stepwarden-sqlite", "stepwarden-postgres") if n in args.systems]
    systems = {n: make_system(n, res, args.workers, log_dir) for n in names}
    idle: dict[str, int | None] = {}
    errors: dict[str, list[str]] = {n: [] for n in names}
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for name, system in systems.items():
        if not system.postgres:
            continue
        known = outcomes[name].idle if name in outcomes else None
        if known is None or known.get("commits") is None:
            log(f"{name}: idle phase for the fan-out (the commits of starting and stopping)")
            try:
                known = idle_phase(res, system)
            except Exception as exc:
                log(f"FAILED {name} fan-out idle phase: {exc}")
                traceback.print_exc(file=sys.stderr)
                errors[name].append(f"idle phase: {type(exc).__name__}: {exc}")
                continue
        idle[name] = known.get("commits")
    for run in range(args.runs):
        order = names[run % len(names) :] + names[: run % len(names)] if names else []
        for name in order:
            if errors[name]:
                continue
            log(f"{name}: fan-out run {run + 1}/{args.runs}, one task of {args.fanout_n:,} steps")
            system = systems[name]
            assert isinstance(system, Stepwarden)
            try:
                one = fanout_mod.fanout_once(res, system, args.fanout_n, run)
            except Exception as exc:
                log(f"FAILED {name} fan-out run {run + 1}: {type(exc).__name__}: {exc}")
                traceback.print_exc(file=sys.stderr)
                errors[name].append(f"run {run + 1}: {type(exc).__name__}: {exc}")
                with contextlib.suppress(Exception):
                    system.cleanup()
                continue
            runs[name].append(one)
            log(
                f"{name}: fan-out {one['elapsed_s']:.2f} s, {one['steps_per_s']:,.0f} steps/s, "
                f"{one['dispatch_txns']} dispatch transactions"
            )
    return {n: fanout_mod.summarise(runs[n], idle.get(n), errors[n]) for n in names}


def run_tracing(args: argparse.Namespace, res: Resources, log_dir: Path) -> dict[str, Any]:
    """The tracing cost (`bench/tracing.py`): for each run, each mode in another order, W1
    one at a time then W2 on stepwarden-postgres, its workers and this client traced that
    way; the client untraced again at the end."""
    modes = list(tracing_mod.MODES)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    try:
        for run in range(args.runs):
            for mode in modes[run % len(modes) :] + modes[: run % len(modes)]:
                system = Stepwarden(
                    res, workers=args.workers, log_dir=log_dir, postgres=True, tracing=mode
                )
                tracing_mod.configure(mode)
                one: dict[str, Any] = {"errors": []}
                try:
                    log(f"tracing {mode}: W1 one at a time run {run + 1}/{args.runs}, n={args.n}")
                    one["w1"] = w1_phase(res, system, args.n, run, "single")
                    log(f"tracing {mode}: W2 run {run + 1}/{args.runs}, n={args.latency_n}")
                    one["w2"], _ = w2_phase(res, system, args.latency_n, run)
                    log(
                        f"tracing {mode}: W1 one at a time {one['w1']['wf_per_s']:,.1f} wf/s, "
                        f"W2 p50 {percentile(one['w2'], 50) * 1000:.1f} ms"
                    )
                except Exception as exc:
                    log(f"FAILED tracing {mode} run {run + 1}: {type(exc).__name__}: {exc}")
                    traceback.print_exc(file=sys.stderr)
                    one["errors"].append(f"run {run + 1}: {type(exc).__name__}: {exc}")
                    with contextlib.suppress(Exception):
                        system.cleanup()
                finally:
                    system.close_client()
                runs[mode].append(one)
    finally:
        tracing_mod.configure("api")  # as the process started: the API, no SDK
    return tracing_mod.summarise(runs)


def run_recovery(args: argparse.Namespace, res: Resources, log_dir: Path) -> dict[str, Any]:
    """Four recoveries: a SIGKILLed agent's step (`agent`), a SIGKILLed scheduler's tasks
    (`scheduler`), the tasks of the supervisor leader's own worker SIGKILLed (`leader`), and
    PostgreSQL stopped mid-run (`outage`, on PostgreSQL only)."""
    out: dict[str, Any] = {}
    for name in ("stepwarden-postgres", "stepwarden-sqlite"):
        if name not in args.systems:
            continue
        postgres = name.endswith("postgres")
        common = {"res": res, "runs": args.runs, "log_dir": log_dir}
        kinds: list[tuple[str, str, Callable[[], dict[str, Any]]]] = [
            ("agent", "a SIGKILLed agent's step",
             functools.partial(recovery_mod.recovery, postgres=postgres, **common)),
            ("scheduler", "a SIGKILLed scheduler's tasks",
             functools.partial(recovery_mod.scheduler_recovery, postgres=postgres, **common)),
            ("leader", "the SIGKILLed supervisor leader's worker's tasks",
             functools.partial(recovery_mod.leader_recovery, postgres=postgres, **common)),
        ]  # fmt: skip
        if postgres:
            kinds.append(
                ("outage", "PostgreSQL stopped mid-run",
                 functools.partial(recovery_mod.outage_recovery, **common))
            )  # fmt: skip
        out[name] = {}
        for kind, what, measure in kinds:
            log(f"{name}: recovery of {what}")
            try:
                out[name][kind] = measure()
            except Exception as exc:
                log(f"FAILED {name} recovery ({kind}): {exc}")
                traceback.print_exc(file=sys.stderr)
                out[name][kind] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def run_sweep(args: argparse.Namespace, res: Resources) -> dict[str, Any]:
    out: dict[str, Any] = {}
    jobs: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    if "stepwarden-postgres" in args.systems:
        jobs.append(
            (
                "stepwarden-postgres",
                lambda: sweep_mod.sweep_postgres(
                    res,
                    args.sweep_finished,
                    args.sweep_expired,
                    runs=args.runs,
                    cache=not args.no_sweep_cache,
                ),
            )
        )
    if args.sweep_sqlite and "stepwarden-sqlite" in args.systems:
        jobs.append(
            (
                "stepwarden-sqlite",
                lambda: sweep_mod.sweep_sqlite(
                    res, args.sweep_finished, args.sweep_expired, runs=args.runs
                ),
            )
        )
    if "stepwarden-postgres" in args.systems:
        jobs.append(
            (
                "stepwarden-postgres waiting",
                lambda: sweep_mod.wake_postgres(
                    res, args.sweep_finished, args.sweep_expired, runs=args.runs
                ),
            )
        )
    for name, job in jobs:
        log(f"{name}: sweep among {args.sweep_finished:,} finished (or waiting) tasks")
        try:
            out[name] = job()
        except Exception as exc:
            log(f"FAILED {name} sweep: {exc}")
            traceback.print_exc(file=sys.stderr)
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def run_profile(args: argparse.Namespace, res: Resources, log_dir: Path) -> dict[str, Any]:
    from . import profile

    return profile.profile_w1(res, args, log_dir, Path(args.profile))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    res = Resources(admin_url=args.admin_url, redis_url=args.redis_url)
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    ok = False
    log_dir = res.temp_dir("logs")
    try:
        for name in res.drop_stale_databases():
            log(f"dropped {name}, left by an earlier benchmark that was killed")
        for name in res.drop_stale_clusters():
            log(f"dropped PostgreSQL server {name}, left by an earlier benchmark that was killed")
        m = machine(args.admin_url)
        commit, src_at_start = git_commit(), src_digest()
        log(
            f"systems {', '.join(args.systems)}; W1 n={args.n}, W2 n={args.latency_n}, "
            f"runs={args.runs}, {args.workers} worker processes each; "
            f"load average {m['load_average_at_start']}"
        )
        outcomes = measure(args, res, log_dir)
        systems = {name: summarise(o) for name, o in outcomes.items()}
        result: dict[str, Any] = {
            "started": started.isoformat(timespec="seconds"),
            "git_commit": commit,
            "engine_src_digest": src_at_start,
            "machine": m,
            "versions": versions(),
            "settings": {
                "quick": args.quick,
                "systems": args.systems,
                "w1_n": args.n,
                "w2_n": args.latency_n,
                "w2_warmup": W2_WARMUP,
                "runs": args.runs,
                "workers_per_system": args.workers,
                "w1_variants": args.variants,
                "submitters": args.submitters,
                "submit_rtt_n": None if args.no_submit_rtt else args.rtt_n,
                "fanout_n": None if args.no_fanout else args.fanout_n,
                "shard_servers": "own" if args.own_shard_servers else "shared",
            },
            "systems": systems,
        }
        result["ratios"] = ratios(systems)
        result["variant_ratios"] = variant_ratios(systems)
        result["goal"] = goal_check(systems)
        wakeups = sqlite_wakeups(systems)
        if wakeups is not None:
            result["sqlite_wakeups"] = wakeups
        result["shards"] = shards_summary(systems)
        result["reference"] = {k: v for k, v in REFERENCE.items() if k in systems}
        if not args.no_submit_rtt and BASE in args.systems:
            result["submit_rtt"] = rtt_mod.run(
                res, args, log_dir, systems[BASE].get("w1_single", {}).get("submit_call")
            )
        if not args.no_agent_http and BASE in args.systems:
            result["agent_http"] = agent_http_mod.run(
                res,
                n=200 if args.quick else args.n,
                n_latency=50 if args.quick else 200,
                runs=1 if args.quick else args.runs,
                log_dir=log_dir,
            )
        if not args.no_idle_fleet and BASE in args.systems:
            result["idle_fleet"] = idle_fleet_mod.run(
                res,
                sizes=tuple(int(x) for x in args.idle_fleet_sizes.split(",") if x),
                seconds=10.0 if args.quick else idle_fleet_mod.SECONDS,
                before=args.idle_fleet_before or None,
                log_dir=log_dir,
            )
        if not args.no_fanout:
            result["fanout"] = run_fanout(args, res, log_dir, outcomes)
        if not args.no_tracing:
            result["tracing"] = run_tracing(args, res, log_dir)
        fair_stores = [
            store for store, name in fair_share_mod.STORES.items() if name in args.systems
        ]
        if not args.no_fair_share and fair_stores:
            result["fair_share"] = fair_share_mod.run(res, args, fair_stores, log_dir)
        if not args.no_recovery:
            result["recovery"] = run_recovery(args, res, log_dir)
        if not args.no_sweep:
            result["sweep"] = run_sweep(args, res)
        if args.profile:
            result["profile"] = run_profile(args, res, log_dir)
        result["duration_s"] = round(time.perf_counter() - t0, 1)
        m["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if src_digest() != src_at_start:
            result["engine_src_changed_during_run"] = True
            log("the engine's source changed during the run: its figures mix versions")
        write_results(args, result)
        print()
        print(table(result))
        if "tracing" in result:
            print()
            print(tracing_mod.table(result["tracing"]))
        failed = (
            [n for n, s in systems.items() if s.get("errors")]
            + [f"fanout/{n}" for n, v in result.get("fanout", {}).items() if v.get("errors")]
            + (["submit_rtt"] if result.get("submit_rtt", {}).get("errors") else [])
            + (["agent_http"] if result.get("agent_http", {}).get("errors") else [])
            + [
                f"idle_fleet/{name}"
                for name, v in result.get("idle_fleet", {}).items()
                if isinstance(v, dict) and v.get("errors")
            ]
            + [f"tracing/{n}" for n, v in result.get("tracing", {}).items() if v["errors"]]
            + [
                f"fair_share/{n}"
                for n, v in result.get("fair_share", {}).items()
                if n != "settings" and v.get("errors")
            ]
            + [f"sweep/{n}" for n, v in result.get("sweep", {}).items() if "error" in v]
            + [
                f"recovery/{n}/{kind}"
                for n, kinds in result.get("recovery", {}).items()
                for kind, v in kinds.items()
                if "error" in v
            ]
        )
        if failed:
            log(f"failed: {', '.join(failed)}; worker logs kept in {log_dir}")
            return 1
        ok = True
        return 0
    except (KeyboardInterrupt, Interrupted) as exc:
        log(f"interrupted ({type(exc).__name__} {exc}): stopping everything")
        return 130
    finally:
        if not ok and log_dir.exists():
            res.paths.remove(log_dir)  # kept for a look; bench/results/tmp/ is not committed
        res.close()
        log(f"done in {time.perf_counter() - t0:.0f} s")


def write_results(args: argparse.Namespace, result: dict[str, Any]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2) + "\n"
    latest = args.out / "latest.json"
    latest.write_text(text)
    log(f"wrote {latest}")
    if args.quick or args.systems != list(SYSTEMS) or args.runs < 3:
        log("not a complete run (--quick, --only or fewer than 3 runs): no dated results file")
        return
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    dated = args.out / f"{day}-{machine_slug(result['machine'])}.json"
    dated.write_text(text)
    log(f"wrote {dated}")


if __name__ == "__main__":
    sys.exit(main())
