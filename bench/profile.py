"""One more W1 of stepwarden on PostgreSQL, with every worker under py-spy (sampling,
non-blocking) and the database's active statements sampled from pg_stat_activity; writes a
summary: where the CPU went (workers, client, PostgreSQL), the functions the workers spent
their samples in (by themselves and with what they call), and the statements PostgreSQL was
busy with.

    python -m bench --only stepwarden-postgres --profile /tmp/bench_profile.txt
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from .common import Child, Resources, database_name, log, log_contains, wait_for
from .systems import Stepwarden, Throughput, _bin

RATE = 200
"""py-spy samples per second."""
PG_SAMPLE_INTERVAL = 0.01
TOP = 30


class ActivitySampler:
    """Samples the active statements of one database every PG_SAMPLE_INTERVAL seconds, from
    the admin database (so that nothing is counted in the measured one)."""

    def __init__(self, admin_url: str, db_url: str) -> None:
        self.admin_url = admin_url
        self.name = database_name(db_url)
        self.samples = 0
        self.active = 0
        self.statements: collections.Counter[str] = collections.Counter()
        self.waits: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pg-activity")

    def __enter__(self) -> ActivitySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as db:
            while not self._stop.wait(PG_SAMPLE_INTERVAL):
                rows = db.execute(
                    "SELECT query, coalesce(wait_event_type || ':' || wait_event, 'CPU')"
                    " FROM pg_stat_activity WHERE datname = %s AND state = 'active'"
                    " AND pid <> pg_backend_pid()",
                    (self.name,),
                ).fetchall()
                self.samples += 1
                for query, wait in rows:
                    self.active += 1
                    self.statements[_normalise(query)] += 1
                    self.waits[wait] += 1


def _normalise(query: str) -> str:
    """The statement without its comments and parameters, and its first comment (the
    engine names each statement there)."""
    comments = [ln.strip()[2:].strip() for ln in query.splitlines() if ln.strip().startswith("--")]
    code = " ".join(ln for ln in query.splitlines() if not ln.strip().startswith("--"))
    text = re.sub(r"\$\d+", "$", " ".join(code.split()))[:110]
    return f"{text}  [{comments[0][:70]}]" if comments else text


def _frame(frame: str) -> tuple[str, str]:
    """'func (path/file.py:123)' -> ('func', 'path/file.py')."""
    m = re.match(r"^(.*) \((.*?)(?::\d+)?\)$", frame)
    return (m.group(1), m.group(2)) if m else (frame, "")


def _area(path: str) -> str:
    """Where a frame's code lives: a stepwarden module, or the top-level package or module
    (py-spy names files from their directory on sys.path: psycopg/cursor_async.py)."""
    if path.startswith("<"):
        return path
    parts = path.removesuffix(".py").split("/")
    if "stepwarden" in parts:
        return ".".join(parts[parts.index("stepwarden") :])
    return parts[0]


def summarise_stacks(paths: list[Path]) -> dict[str, Any]:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    areas: collections.Counter[str] = collections.Counter()
    total = 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [f for f in stack.split(";") if f and not f.startswith("process ")]
            if not frames:
                continue
            total += count
            names = []
            for frame in frames:
                func, file = _frame(frame)
                names.append(f"{func} ({file})")
            leaf_func, leaf_file = _frame(frames[-1])
            own[f"{leaf_func} ({leaf_file})"] += count
            areas[_area(leaf_file)] += count
            for name in set(names):
                inclusive[name] += count
    return {"samples": total, "own": own, "inclusive": inclusive, "areas": areas}


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def write_summary(
    out: Path,
    w1: dict[str, Any],
    stacks: dict[str, Any],
    pg: ActivitySampler | None,
    raw: list[Path],
) -> None:
    total = stacks["samples"]
    lines = [
        "stepwarden on PostgreSQL, W1 with py-spy attached to each worker for W1 alone "
        f"({RATE} Hz, non-blocking; profiling slows the workers a little)",
        f"W1: {w1['n']} workflows, {w1['wf_per_s']} wf/s, {w1['elapsed_s']} s",
        "CPU seconds over W1 (wall {wall_s}): workers {workers_s}, client {client_s}, "
        "PostgreSQL {postgres_s}, whole machine {machine_s}".format(**w1["cpu_s"]),
        f"raw stacks (py-spy --format raw): {', '.join(str(p) for p in raw)}",
        "",
        f"worker samples: {total} (CPU only: idle threads are not sampled)",
        "",
        "by where the running code lives (the innermost frame):",
    ]
    for area, count in stacks["areas"].most_common(TOP):
        lines.append(f"  {_pct(count, total)}  {area}")
    lines += ["", "functions, by their own samples:"]
    for name, count in stacks["own"].most_common(TOP):
        lines.append(f"  {_pct(count, total)}  {name}")
    lines += ["", "functions, with what they call (inclusive):"]
    for name, count in stacks["inclusive"].most_common(TOP + 20):
        lines.append(f"  {_pct(count, total)}  {name}")
    if pg is not None:
        lines += [
            "",
            f"PostgreSQL: {pg.samples} samples of pg_stat_activity every "
            f"{PG_SAMPLE_INTERVAL * 1000:g} ms; {pg.active / max(pg.samples, 1):.2f} "
            "statements active on average",
            "  waiting on:",
        ]
        for wait, count in pg.waits.most_common(10):
            lines.append(f"    {_pct(count, pg.active)}  {wait}")
        lines.append("  statements (share of active samples):")
        for query, count in pg.statements.most_common(20):
            lines.append(f"    {_pct(count, pg.active)}  {query}")
    out.write_text("\n".join(lines) + "\n")


def profile_w1(
    res: Resources, args: argparse.Namespace, log_dir: Path, out: Path
) -> dict[str, Any]:
    from .run import w1_phase

    raw_dir = res.temp_dir("profile")
    system = Stepwarden(res, workers=args.workers, log_dir=log_dir, postgres=True)
    raw = [raw_dir / f"worker{i}.txt" for i in range(args.workers)]
    sampler: list[ActivitySampler] = []

    def around(workers: list[Child], measure: Callable[[], Throughput]) -> Throughput:
        # py-spy attaches to the running workers for W1 alone (not their start-up).
        spies = [
            res.spawn(
                f"py-spy-worker{i}",
                [
                    _bin("py-spy"),
                    "record",
                    "--pid",
                    str(worker.pid),
                    "--format",
                    "raw",
                    "--rate",
                    str(RATE),
                    "--nonblocking",
                    "-o",
                    str(raw[i]),
                ],
                log_dir=log_dir,
            )
            for i, worker in enumerate(workers)
        ]
        try:
            wait_for(
                lambda: all(log_contains(s, "Sampling process") for s in spies),
                timeout=30,
                what="py-spy to attach",
                children=spies,
            )
            assert system.db_url is not None
            with ActivitySampler(res.admin_url, system.db_url) as pg:
                sampler.append(pg)
                return measure()
        finally:
            for spy in spies:  # Ctrl-C: py-spy writes what it sampled and exits
                res.stop(spy, sig=signal.SIGINT, timeout=60)

    system.around_throughput = around  # type: ignore[method-assign]
    variant = args.profile_variant
    log(f"profile: W1 ({variant}) of stepwarden-postgres under py-spy, {args.n} workflows")
    w1 = w1_phase(res, system, args.n, 99, variant, args.submitters)
    stacks = summarise_stacks(raw)
    kept = []
    for path in raw:  # next to the summary: the temporary directory goes at exit
        if path.exists():
            target = out.with_name(f"{out.stem}.{path.stem}.raw.txt")
            shutil.copyfile(path, target)
            kept.append(target)
    write_summary(out, w1, stacks, sampler[0] if sampler else None, kept)
    log(f"profile: summary in {out}")
    res.remove_path(raw_dir)
    return {
        "summary": str(out),
        "w1": w1,
        "top_own": stacks["own"].most_common(10),
        "top_areas": stacks["areas"].most_common(10),
    }
