"""The engine of two revisions, before and after, in back-to-back pairs of one run each.

`python -m bench.ab --before REF` exports the engine of `REF` (its `src/`, with `git archive`,
as `bench.idle_fleet` does) and runs the benchmark's stepwarden-postgres phases (W1 batched and
one at a time, W2, the recoveries) once with that engine first on PYTHONPATH (the benchmark's
process, its client and its workers alike) and once with this checkout's, `--pairs` times,
the side that goes first alternating from pair to pair. Each side's figures are the median of
its runs and the spread (lowest and highest) beside it; a change claims a gain only where the
after side's spread clears the before side's.

The figures: W1 batched and one at a time (workflows per second, CPU ms per workflow in all,
commits per workflow one at a time), W2 p50 and p99 (ms), the wake-up (W2's median of a task's
creation to its first step dispatched: a scheduler woken and claiming it), and the recoveries:
an agent's step, a scheduler's 100 tasks and the supervisor leader's worker, each from its
SIGKILL to done (s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import ROOT, log
from .idle_fleet import _commit, _export

PHASES = [
    "--only", "stepwarden-postgres", "--runs", "1", "--w1-variants", "batch,single",
    "--no-submit-rtt", "--no-agent-http", "--no-idle-fleet", "--no-fanout", "--no-tracing",
    "--no-sweep",
]  # fmt: skip

Figure = Callable[[dict[str, Any]], float | None]


def _get(d: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _sys(*path: str) -> Figure:
    return lambda r: _get(r, "systems", "stepwarden-postgres", *path)


def _ms(f: Figure) -> Figure:
    def get(r: dict[str, Any]) -> float | None:
        v = f(r)
        return None if v is None else v * 1000

    return get


def _recovery(kind: str, key: str) -> Figure:
    return lambda r: _get(r, "recovery", "stepwarden-postgres", kind, key)


FIGURES: list[tuple[str, Figure, bool]] = [
    # (label, how it is read, whether more is better)
    ("W1 batched wf/s", _sys("w1", "wf_per_s"), True),
    ("W1 batched CPU ms/wf", _ms(_sys("w1", "cpu_s_per_wf", "total_s")), False),
    ("W1 one at a time wf/s", _sys("w1_single", "wf_per_s"), True),
    ("W1 one at a time CPU ms/wf", _ms(_sys("w1_single", "cpu_s_per_wf", "total_s")), False),
    ("W1 one at a time commits/wf", _sys("w1_single", "commits_per_wf"), False),
    ("W2 p50 ms", _sys("w2", "p50_ms"), False),
    ("W2 p99 ms", _sys("w2", "p99_ms"), False),
    ("wake-up ms (created -> step 1)", lambda r: _first_breakdown(r), False),
    ("recovery: agent's step s", _recovery("agent", "kill_to_done_s_median"), False),
    ("recovery: scheduler's tasks s", _recovery("scheduler", "kill_to_all_done_s_median"), False),
    ("recovery: leader's worker s", _recovery("leader", "kill_to_all_done_s_median"), False),
]


def _first_breakdown(r: dict[str, Any]) -> float | None:
    runs = _get(r, "systems", "stepwarden-postgres", "w2", "per_run") or []
    got = [x["breakdown_ms"]["created_to_step1_dispatched"] for x in runs if x.get("breakdown_ms")]
    return statistics.median(got) if got else None


def _one(side: str, src: Path | None, extra: list[str], out: Path) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    engine = subprocess.run(
        [sys.executable, "-c", "import stepwarden; print(stepwarden.__file__)"],
        env=env, check=True, capture_output=True, text=True, cwd=ROOT,
    ).stdout.strip()  # fmt: skip
    log(f"{side}: the engine of {engine}")
    done = subprocess.run(
        [sys.executable, "-m", "bench", *PHASES, *extra, "--out", str(out)], env=env, cwd=ROOT
    )
    if not (out / "latest.json").exists():  # it failed before it measured anything
        raise RuntimeError(f"{side}: python -m bench exited {done.returncode}, no results")
    result: dict[str, Any] = json.loads((out / "latest.json").read_text())
    result["engine_file"] = engine
    result["failed"] = [  # a phase that failed gives no figure; its error is kept
        f"recovery/{kind}: {v['error']}"
        for kind, v in (_get(result, "recovery", "stepwarden-postgres") or {}).items()
        if isinstance(v, dict) and "error" in v
    ]
    return result


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per figure and side: the median and the spread of its runs; after / before."""
    out: dict[str, Any] = {}
    for label, read, more_better in FIGURES:
        row: dict[str, Any] = {"more_is_better": more_better}
        for side, results in runs.items():
            got = [v for v in (read(r) for r in results) if v is not None]
            row[side] = (
                {"median": round(statistics.median(got), 3), "low": round(min(got), 3),
                 "high": round(max(got), 3), "runs": [round(v, 3) for v in got]}
                if got else None
            )  # fmt: skip
        b, a = row.get("before"), row.get("after")
        if b and a and b["median"]:
            row["after_x_before"] = round(a["median"] / b["median"], 3)
            overlap = a["low"] <= b["high"] and b["low"] <= a["high"]
            better = a["median"] > b["median"] if more_better else a["median"] < b["median"]
            row["verdict"] = "within the spread" if overlap else ("better" if better else "worse")
        out[label] = row
    return out


def table_lines(result: dict[str, Any]) -> list[str]:
    head = f"{'':<32} {'before':>22} {'after':>22} {'after/before':>12}  verdict"
    lines = [
        f"before {result['before_commit']}, after {result['after_commit']}; "
        f"{result['pairs']} pairs, the first side alternating; median [lowest-highest]",
        head,
        "-" * len(head),
    ]

    def cell(s: dict[str, Any] | None) -> str:
        return f"{s['median']:.2f} [{s['low']:.2f}-{s['high']:.2f}]" if s else "-"

    for label, row in result["figures"].items():
        ratio = row.get("after_x_before")
        lines.append(
            f"{label:<32} {cell(row.get('before')):>22} {cell(row.get('after')):>22} "
            f"{f'x{ratio:.2f}' if ratio else '-':>12}  {row.get('verdict', '-')}"
        )
    for side in ("before", "after"):
        for n, run in enumerate(result["runs"][side]):
            lines += [f"{side}, run {n + 1}: FAILED {f}" for f in run["failed"]]
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the git revision measured before")
    p.add_argument("--pairs", type=int, default=3, help="back-to-back pairs of runs [3]")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ab-latest.json")
    p.add_argument("bench_args", nargs="*", help="more options for python -m bench (after --)")
    args = p.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="swbench-ab-") as tmp:
        src = _export(args.before, Path(tmp))
        sides: list[tuple[str, Path | None]] = [("before", src), ("after", None)]
        for pair in range(args.pairs):
            for side, where in sides if pair % 2 == 0 else sides[::-1]:
                log(f"pair {pair + 1}/{args.pairs}: {side}")
                runs[side].append(_one(side, where, args.bench_args, Path(tmp) / f"{side}{pair}"))
    result = {
        "before_commit": _commit(args.before),
        "after_commit": _commit("HEAD"),
        "pairs": args.pairs,
        "bench_args": [*PHASES, *args.bench_args],
        "figures": summary(runs),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("\n".join(table_lines(result)))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
