"""Idle fleet: what idle `stepwarden worker` processes cost the database, by fleet size.

1, 10 and 40 workers (`--idle-fleet-sizes`) of `bench.workload:app` (every role, the
engine's defaults), with nothing to do, on a PostgreSQL server of the benchmark's own
(`Resources.own_cluster`: forty workers would take most of a shared server's connections,
and its CPU is then theirs alone), one fresh database each, started `WAVE` (5) at a time.
For each size:

- **transactions**: `pg_stat_database` (xact_commit + xact_rollback) of the database, read
  once every session to it has ended (PostgreSQL counts a session's transactions for certain
  only then), over a run that leaves the workers idle for `--idle-fleet-seconds` (30) and
  less a run that stops them as soon as they are all running (the cost of starting and
  stopping), divided by the seconds between;
- **connections**: the sessions connected to the database at the end of the idle window;
- **server CPU**: the CPU seconds of the server's processes (its postmaster and every child:
  nobody else uses it) over the idle window, per second.

The one worker of a fleet of one holds the supervisors' lease: its figures are the leader's.
A fleet of N adds N - 1 workers that are not the leader; each of their figures is
(fleet of N - fleet of 1) / (N - 1). Connections per worker are the fleet's divided by N.

`--idle-fleet-before REF` (a git revision, `main` by default) runs the same with the
engine of that revision first (its `src/` exported with `git archive` into a temporary
directory, put first on the workers' PYTHONPATH), so that both figures come from one run on
one server. `python -m bench.idle_fleet` runs it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from .common import (
    ROOT,
    Child,
    CpuMeter,
    Resources,
    database_name,
    log,
    postgres_server,
    wait_for,
    wait_no_backends,
)

SIZES = (1, 10, 40)
SECONDS = 30.0
"""Seconds the fleet is left idle (after every worker runs, and `SETTLE` more)."""
SETTLE = 30.0
"""Seconds after the last worker runs before the window opens: the start's burst of
connections and registrations has passed (the pool closes one unused connection every 10 s)."""
WAVE = 5
"""Workers started at once, each wave running before the next starts: forty Python
processes started together on a small machine take their CPU from each other for seconds,
and each one's calls then wait long enough on one another to open more connections."""
GOALS = {"leader_tps": 5.0, "worker_tps": 1.0, "worker_connections": 2.0}


def _transactions(admin_url: str, db_url: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            (database_name(db_url),),
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _sessions(admin_url: str, db_url: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database_name(db_url),),
        ).fetchone()
    return int(row[0]) if row else 0


def _export(ref: str, into: Path) -> Path:
    """The engine's source at `ref`, exported into `into`: the directory to put first on
    PYTHONPATH."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "src/stepwarden"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def _life(
    res: Resources,
    admin_url: str,
    n: int,
    idle: float,
    src: Path | None,
    log_dir: Path,
    tag: str,
) -> dict[str, Any]:
    """One fleet of `n` on a fresh database: started, idle for `idle` seconds (0: stopped
    once all run), stopped; its transactions, and over the window its connections and the
    server's CPU."""
    url = res.create_database(f"idle{tag}", admin_url=admin_url)
    paths = [str(src)] if src else []
    paths += [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    base = [sys.executable, "-m", "stepwarden", "--store", url]
    subprocess.run(
        [*base, "--app", "bench.workload:app", "migrate"],
        check=True, capture_output=True, cwd=ROOT, env={**os.environ, **env},
    )  # fmt: skip
    wait_no_backends(admin_url, url)
    before = _transactions(admin_url, url)
    children: list[Child] = []
    figures: dict[str, Any] = {}
    try:
        for first in range(0, n, WAVE):  # a wave at a time, as a fleet rolls out
            wave = [
                res.spawn(
                    f"idlefleet-{tag}-{i}",
                    [*base, "--log-level", "info", "worker", "bench.workload:app"],
                    env=env,
                    log_dir=log_dir,
                )
                for i in range(first, min(n, first + WAVE))
            ]
            children += wave
            wait_for(
                lambda w=wave: all(  # type: ignore[misc]
                    " running " in c.log_path.read_text(errors="replace") for c in w
                ),
                timeout=60,
                what=f"idle workers {first + 1}-{first + len(wave)} of {n} to run",
                children=children,
            )
        if idle > 0:
            time.sleep(SETTLE)  # the window's start: a length of time, what is measured
            meter = CpuMeter([c.pid for c in children], server=postgres_server(admin_url, url))
            meter.start()
            time.sleep(idle)
            cpu = meter.stop()
            figures["connections"] = _sessions(admin_url, url)
            figures["server_cpu_ms_per_s"] = round(1000 * cpu.get("server_s", 0.0) / idle, 2)
            figures["workers_cpu_ms_per_s"] = round(1000 * cpu["workers_s"] / idle, 2)
    finally:
        res.stop_all(children, timeout=60)
    wait_no_backends(admin_url, url, timeout=60)
    figures["transactions"] = _transactions(admin_url, url) - before
    res.drop_database(url, admin_url=admin_url)
    return figures


def fleet(
    res: Resources, admin_url: str, n: int, seconds: float, src: Path | None, log_dir: Path,
    tag: str,
) -> dict[str, Any]:  # fmt: skip
    """A fleet of `n`: its idle transactions a second (the long life less the short one),
    connections and server CPU."""
    short = _life(res, admin_url, n, 0.0, src, log_dir, f"{tag}s{n}")
    long = _life(res, admin_url, n, seconds, src, log_dir, f"{tag}l{n}")
    tps = (long["transactions"] - short["transactions"]) / (seconds + SETTLE)
    return {
        "workers": n,
        "tps": round(tps, 2),
        "connections": long["connections"],
        "server_cpu_ms_per_s": long["server_cpu_ms_per_s"],
        "workers_cpu_ms_per_s": long["workers_cpu_ms_per_s"],
        "transactions_start_stop": short["transactions"],
    }


def per_worker(fleets: list[dict[str, Any]]) -> dict[str, Any]:
    """The leader's figures (the fleet of one) and each other worker's, for each size."""
    one = next((f for f in fleets if f["workers"] == 1), None)
    out: dict[str, Any] = {"fleets": fleets}
    if one is None:
        return out
    out["leader"] = {
        "tps": one["tps"],
        "connections": one["connections"],
        "server_cpu_ms_per_s": one["server_cpu_ms_per_s"],
    }
    out["others"] = {
        str(f["workers"]): {
            "tps": round((f["tps"] - one["tps"]) / (f["workers"] - 1), 2),
            "connections": round(f["connections"] / f["workers"], 2),
            "server_cpu_ms_per_s": round(
                (f["server_cpu_ms_per_s"] - one["server_cpu_ms_per_s"]) / (f["workers"] - 1), 2
            ),
        }
        for f in fleets
        if f["workers"] > 1
    }
    return out


def run(
    res: Resources,
    *,
    sizes: tuple[int, ...] = SIZES,
    seconds: float = SECONDS,
    before: str | None = "main",
    log_dir: Path,
) -> dict[str, Any]:
    """Each engine (that of `before`, then this one) with each fleet size, on one server of
    the benchmark's own."""
    cluster = res.own_cluster(0)
    result: dict[str, Any] = {
        "seconds": seconds,
        "settle_s": SETTLE,
        "goals": GOALS,
        "server_max_connections": cluster.settings.get("max_connections"),
    }
    engines: list[tuple[str, Path | None]] = []
    with tempfile.TemporaryDirectory(prefix="swbench-idle-") as tmp:
        if before:
            engines.append((f"before ({before})", _export(before, Path(tmp))))
            result["before_commit"] = _commit(before)
        engines.append(("after", None))
        result["after_commit"] = _commit("HEAD")
        for i, (name, src) in enumerate(engines):
            fleets = []
            for n in sizes:
                log(f"idle fleet ({name}): {n} worker(s)")
                try:
                    fleets.append(fleet(res, cluster.admin_url, n, seconds, src, log_dir, f"e{i}"))
                except Exception as exc:  # a fleet that fails is said, the others go on
                    log(f"FAILED idle fleet ({name}) of {n}: {exc}")
                    fleets.append({"workers": n, "error": f"{type(exc).__name__}: {exc}"})
            result[name] = per_worker([f for f in fleets if "error" not in f])
            result[name]["errors"] = [f for f in fleets if "error" in f]
    return result


def _commit(ref: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", ref],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def table_lines(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Idle fleet (stepwarden-postgres, a server of the benchmark's own; idle "
        f"{result['seconds']:g} s after {result['settle_s']:g} s settling; the leader is the "
        f"fleet of one, each other worker its share of the fleet beyond it)",
    ]
    head = (
        f"{'engine':<22} {'workers':>7} {'tx/s':>8} {'conns':>6} {'server ms/s':>11} "
        f"{'leader tx/s':>11} {'tx/s each':>9} {'conns each':>10} {'server ms/s each':>16}"
    )
    lines += [head, "-" * len(head)]
    for name, got in result.items():
        if not isinstance(got, dict) or "fleets" not in got:
            continue
        others = got.get("others", {})
        for f in got["fleets"]:
            o = others.get(str(f["workers"]), {})
            lines.append(
                f"{name:<22} {f['workers']:>7} {f['tps']:>8.2f} {f['connections']:>6} "
                f"{f['server_cpu_ms_per_s']:>11.2f} "
                f"{got.get('leader', {}).get('tps', float('nan')):>11.2f} "
                f"{o.get('tps', float('nan')):>9.2f} {o.get('connections', float('nan')):>10.2f} "
                f"{o.get('server_cpu_ms_per_s', float('nan')):>16.2f}"
            )
        for e in got.get("errors", []):
            lines.append(f"{name:<22} {e['workers']:>7} FAILED {e['error']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle_fleet", description=__doc__)
    p.add_argument("--admin-url", default=os.environ.get(
        "BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))  # fmt: skip
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--seconds", type=float, default=SECONDS)
    p.add_argument("--before", default="main", help="a git revision; '' runs this one alone")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    res = Resources(args.admin_url)
    try:
        log_dir = res.temp_dir("idle-fleet")
        result = run(
            res,
            sizes=tuple(int(x) for x in args.sizes.split(",") if x),
            seconds=args.seconds,
            before=args.before or None,
            log_dir=log_dir,
        )
    finally:
        res.close()
    print("\n".join(table_lines(result)))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
