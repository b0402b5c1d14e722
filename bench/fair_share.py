"""The fair share of claims across tenants, end to end: the same two worker processes as W1
(`stepwarden worker bench.workload:app`, engine defaults), the "order" workflow, tasks
submitted under a tenant by the client (`App.submit_many_async` / `App.submit_async` with
`tenant=`), weights set by the command line (`stepwarden tenants weight NAME W`). Each run
on a fresh store. What is measured is read back through the public API (`App.tasks_async`:
each task's created_at and finished_at, by the store's clock), not from the claim.

- **shares**: tenant A submits `a_n` tasks (10,000) in batches of 100; one second after A's
  first batch, B submits `b_n` (2,000) the same way, from the same client. B's share of the
  tasks finished while both had work: from B's first task finished to B's last (A still
  had tasks left then, or the figure says not), with weights 1:1, then A 3 : B 1.
- **latency**: A floods as above; one second after, B submits `latency_n` (200) tasks one
  at a time at a steady rate (`rate` a second, each call awaited, not each result), A's
  flood still waiting. B's latency (its task's created_at -> finished_at) p50 and p99,
  against B alone on an idle engine (the same submits, no A), and against the same run
  without fairness: B's tasks under A's tenant, so that the claim orders them by rank
  among A's (B waits behind the flood).
- **W1 by tenants**: W1 (bench/run.py's `w1_phase`: N "order" workflows, batched and one
  at a time) with its tasks spread over `tenants` tenants (workflow i under tenant i mod k),
  beside the same with every task under one tenant; the two in another order each run.

    python -m bench.fair_share [--store postgres,sqlite] [--fair-a-n 10000] [--quick] ...

`make bench` runs it for the stepwarden stores chosen (`--no-fair-share` skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .common import Resources, log, median, percentile
from .systems import SUBMIT_BATCH, AsyncSubmit, Stepwarden, _bin
from .workload import order_input

STORES = {"postgres": "stepwarden-postgres", "sqlite": "stepwarden-sqlite"}
B_AFTER = 1.0
"""Seconds between A's first submit and B's."""
TIMEOUT = 600.0
WARMUP = 5
"""Orders of no tenant run and awaited once the workers run, before a measurement (not
counted): the workers' first claims and connections, as W2's warm-up."""


# -- the client: submit under tenants, read the tasks back ---------------------------------
async def _flood(app: Any, tenant: str, prefix: str, n: int, after: float) -> float:
    """Submit n orders in batches of SUBMIT_BATCH under `tenant`; when the first was sent."""
    await asyncio.sleep(after)
    started = time.time()
    for first in range(0, n, SUBMIT_BATCH):
        batch = [
            app.new_task("order", order_input(i), task_id=f"{prefix}{i}", tenant=tenant)
            for i in range(first, min(n, first + SUBMIT_BATCH))
        ]
        await app.submit_many_async(batch)
    return started


async def _steady(app: Any, tenant: str, prefix: str, n: int, rate: float, after: float) -> float:
    """Submit n orders one at a time, the i-th at `after + i / rate` s (each call awaited;
    a call that runs late makes the next one go at once)."""
    await asyncio.sleep(after)
    loop = asyncio.get_running_loop()
    started, t0 = time.time(), loop.time()
    for i in range(n):
        wait = t0 + i / rate - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        await app.submit_async("order", order_input(i), task_id=f"{prefix}{i}", tenant=tenant)
    return started


async def _finished(app: Any, total: int) -> list[tuple[str, float, float]]:
    """(task id, created_at, finished_at) of every task, in seconds by the store's clock."""
    found = []
    for t in await app.tasks_async(limit=total + 100):
        if t.process_state != "processed" or t.finished_at is None:
            raise RuntimeError(f"task {t.task_id} is {t.process_state}, not processed")
        found.append((t.task_id, t.created_at.timestamp(), t.finished_at.timestamp()))
    if len(found) != total:
        raise RuntimeError(f"{len(found)} tasks in the store, {total} submitted")
    return found


async def _warm(app: Any) -> None:
    """WARMUP orders of no tenant, each awaited: the workers' first claims, connections."""
    for i in range(WARMUP):
        task = await app.submit_async("order", order_input(i), task_id=f"w{i}")
        await app.result_async(task, timeout=TIMEOUT)


async def _parts(app: Any, ids: Sequence[str]) -> list[dict[str, float]]:
    """Where each task's time went, from its steps (`App.show_async`), in seconds: created
    -> its first step recorded (`to_first_step`: the task waiting for a scheduler's claim,
    and the claim), and its steps' waits in the agents' queue, added up (`steps_queued`:
    each step recorded -> claimed by an agent)."""
    out = []
    for tid in ids:
        view = await app.show_async(tid, events=1)
        steps = sorted(view.steps, key=lambda s: s.seq)
        created = view.task.created_at.timestamp()
        out.append({
            "to_first_step": steps[0].created_at.timestamp() - created,
            "steps_queued": sum(
                s.claimed_at.timestamp() - s.created_at.timestamp()
                for s in steps if s.claimed_at is not None
            ),
        })  # fmt: skip
    return out


def _client_run(system: Stepwarden, work: Callable[[Any], Any]) -> Any:
    """Run `work(app)` on a fresh event loop with the workload's App on the system's store."""
    from . import workload

    async def go() -> Any:
        app = workload.app
        app.store_url = system.url
        try:
            return await work(app)
        finally:
            await app.aclose()

    return asyncio.run(go())


def _set_weight(url: str, tenant: str, weight: float) -> None:
    subprocess.run(
        [_bin("stepwarden"), "--store", url, "tenants", "weight", tenant, f"{weight:g}"],
        check=True,
        capture_output=True,
        timeout=60,
    )


def _run_with_workers(
    system: Stepwarden, run: int, phase: str, submit: Callable[[Any], Any], total: int,
    weights: dict[str, float] | None = None, steps_of: str | None = None,
) -> tuple[Any, list[tuple[str, float, float]], list[dict[str, float]]]:  # fmt: skip
    """A fresh store, the weights set, the workers started and warmed (`WARMUP`);
    `submit(app)`, then wait until `total` tasks are processed; the tasks read back (less
    the warm-up's), and the steps of those whose id starts with `steps_of` (`_parts`);
    everything stopped and dropped."""
    system.prepare(run)
    try:
        system.close_client()
        for tenant, weight in (weights or {}).items():
            _set_weight(system.url, tenant, weight)
        children = system.start_workers(f"{phase}r{run}")
        try:
            system.watch(children)
            _client_run(system, _warm)
            submitted = _client_run(system, submit)
            system.wait_done(total + WARMUP)
        finally:
            system.watch([])
            system.stop_workers(children)
        tasks = _client_run(system, lambda app: _finished(app, total + WARMUP))
        tasks = [t for t in tasks if not t[0].startswith("w")]
        parts = []
        if steps_of is not None:
            ids = [tid for tid, _, _ in tasks if tid.startswith(steps_of)]
            parts = _client_run(system, lambda app: _parts(app, ids))
        return submitted, tasks, parts
    finally:
        system.cleanup()


# -- the measurements ------------------------------------------------------------------------
def shares_once(
    system: Stepwarden, run: int, a_n: int, b_n: int, weight_a: float
) -> dict[str, Any]:
    """A floods, B floods one second later; B's share of the tasks finished while both
    had work (B's first finished -> B's last)."""

    async def submit(app: Any) -> tuple[float, float]:
        a, b = await asyncio.gather(
            _flood(app, "a", "a", a_n, 0.0), _flood(app, "b", "b", b_n, B_AFTER)
        )
        return a, b

    (_a_start, b_start), tasks, _ = _run_with_workers(
        system, run, f"fair{weight_a:g}", submit, a_n + b_n,
        weights={"a": weight_a} if weight_a != 1 else None,
    )  # fmt: skip
    b_done = sorted(f for tid, _, f in tasks if tid.startswith("b"))
    a_done = sorted(f for tid, _, f in tasks if tid.startswith("a"))
    first_b, last_b = b_done[0], b_done[-1]
    end = min(last_b, a_done[-1])
    window = [(tid[0], f) for tid, _, f in tasks if first_b <= f <= end]
    b_in = sum(1 for who, _ in window if who == "b")
    since_submit = [(tid[0], f) for tid, _, f in tasks if b_start <= f <= end]
    return {
        "weight_a": weight_a,
        "b_share": round(b_in / len(window), 4),
        "b_share_since_b_submitted": round(
            sum(1 for who, _ in since_submit if who == "b") / len(since_submit), 4
        ),
        "window_s": round(end - first_b, 3),
        "tasks_in_window": len(window),
        "a_left_at_b_last": sum(1 for f in a_done if f > last_b),
        "b_first_submit_to_first_done_s": round(first_b - b_start, 3),
        "wf_per_s": round((a_n + b_n) / (max(a_done[-1], last_b) - min(a_done[0], first_b)), 1),
    }


def latency_once(
    system: Stepwarden, run: int, mode: str, a_n: int, n: int, rate: float
) -> dict[str, Any]:
    """B's steady submits: beside A's flood (`fair`), alone (`alone`), or beside A's flood
    under A's tenant (`one_tenant`: no fairness between them)."""
    b_tenant = "a" if mode == "one_tenant" else "b"
    flood = 0 if mode == "alone" else a_n

    async def submit(app: Any) -> float:
        jobs = [_steady(app, b_tenant, "b", n, rate, B_AFTER if flood else 0.0)]
        if flood:
            jobs.append(_flood(app, "a", "a", flood, 0.0))
        return (await asyncio.gather(*jobs))[0]  # type: ignore[no-any-return]

    _, tasks, parts = _run_with_workers(
        system, run, f"lat{mode[:3]}", submit, flood + n, steps_of="b"
    )
    b = [(c, f) for tid, c, f in tasks if tid.startswith("b")]
    seconds = sorted(f - c for c, f in b)
    a_done = [f for tid, _, f in tasks if tid.startswith("a")]
    last_b = max(f for _, f in b)
    return {
        "mode": mode,
        "samples": seconds,
        "p50_ms": round(percentile(seconds, 50) * 1000, 1),
        "p99_ms": round(percentile(seconds, 99) * 1000, 1),
        "a_left_at_b_last": sum(1 for f in a_done if f > last_b) if flood else None,
        "parts": parts,
    }


class TenantOrders(Stepwarden):
    """W1's stepwarden system whose client submits workflow i under tenant `t{i % k}`."""

    def __init__(self, *args: Any, tenants: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tenants = tenants

    def _tenant(self, i: int) -> str:
        return f"t{i % self.tenants}"

    def batch_submitter(self, n: int) -> Callable[[], None]:
        app = self._client()
        runner = self._runner
        assert runner is not None
        tasks = [
            app.new_task("order", order_input(i), task_id=f"o{i}", tenant=self._tenant(i))
            for i in range(n)
        ]

        async def submit_all() -> None:
            for i in range(0, n, SUBMIT_BATCH):
                await app.submit_many_async(tasks[i : i + SUBMIT_BATCH])

        return lambda: runner.run(submit_all())

    def one_submitter(self) -> AsyncSubmit:
        app = self._client()
        assert self._runner is not None

        async def one(i: int) -> None:
            await app.submit_async("order", order_input(i), task_id=f"o{i}", tenant=self._tenant(i))

        return AsyncSubmit(self._runner, one)


# -- a store's measurements, and all of them ------------------------------------------------
def _guard(errors: list[str], what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # reported; the other measurements go on
        log(f"FAILED fair share {what}: {type(exc).__name__}: {exc}")
        traceback.print_exc(file=sys.stderr)
        errors.append(f"{what}: {type(exc).__name__}: {exc}")
        return None


def run_store(
    res: Resources, store: str, args: argparse.Namespace, log_dir: Path
) -> dict[str, Any]:
    from .run import w1_phase  # bench.run imports this module

    postgres = store == "postgres"
    system = Stepwarden(res, workers=args.workers, log_dir=log_dir, postgres=postgres)
    errors: list[str] = []
    out: dict[str, Any] = {"errors": errors}
    for weight_a in (1.0, 3.0) if "shares" in args.fair_parts else ():
        key = f"shares_{weight_a:g}_1"
        runs = []
        for run in range(args.fair_runs):
            log(f"fair share {store}: A {args.fair_a_n:,} + B {args.fair_b_n:,} one second later, "
                f"weights {weight_a:g}:1, run {run + 1}/{args.fair_runs}")  # fmt: skip
            one = _guard(errors, f"{store} {key} run {run + 1}", functools.partial(
                shares_once, system, run, args.fair_a_n, args.fair_b_n, weight_a))  # fmt: skip
            if one is not None:
                log(f"fair share {store}: B's share {one['b_share']:.3f} over "
                    f"{one['window_s']:.1f} s, {one['a_left_at_b_last']} of A's left")  # fmt: skip
                runs.append(one)
        out[key] = {
            "runs": runs,
            "b_share_median": median([r["b_share"] for r in runs]) if runs else None,
            "expected": round(1 / (1 + weight_a), 4),
        }
    latency: dict[str, Any] = {}
    for mode in ("alone", "fair", "one_tenant") if "latency" in args.fair_parts else ():
        samples: list[float] = []
        parts: list[dict[str, float]] = []
        runs = []
        for run in range(args.fair_runs):
            log(f"fair share {store}: B's {args.fair_latency_n} steady submits "
                f"({args.fair_rate:g}/s), {mode}, run {run + 1}/{args.fair_runs}")  # fmt: skip
            one = _guard(errors, f"{store} latency {mode} run {run + 1}", functools.partial(
                latency_once, system, run, mode, args.fair_a_n, args.fair_latency_n,
                args.fair_rate))  # fmt: skip
            if one is not None:
                samples += one.pop("samples")
                parts += one.pop("parts")
                log(f"fair share {store}: B {mode} p50 {one['p50_ms']:.1f} ms, "
                    f"p99 {one['p99_ms']:.1f} ms")  # fmt: skip
                runs.append(one)
        latency[mode] = {
            "runs": runs,
            "p50_ms": round(percentile(samples, 50) * 1000, 1) if samples else None,
            "p99_ms": round(percentile(samples, 99) * 1000, 1) if samples else None,
            **{
                f"{part}_{q}_ms": round(percentile([p[part] for p in parts], n) * 1000, 1)
                for part in ("to_first_step", "steps_queued")
                for q, n in (("p50", 50), ("p99", 99))
                if parts
            },
        }
    out["latency"] = latency
    w1: dict[str, Any] = {}
    for variant in ("batch", "single") if "w1" in args.fair_parts else ():
        found: dict[str, list[float]] = {"one_tenant": [], "tenants": []}
        for run in range(args.fair_w1_runs):
            order = ["one_tenant", "tenants"] if run % 2 == 0 else ["tenants", "one_tenant"]
            for spread in order:
                k = 1 if spread == "one_tenant" else args.fair_tenants
                tenanted = TenantOrders(
                    res, workers=args.workers, log_dir=log_dir, postgres=postgres, tenants=k
                )
                log(f"fair share {store}: W1 {variant} n={args.fair_w1_n} over {k} tenant(s), "
                    f"run {run + 1}/{args.fair_w1_runs}")  # fmt: skip
                one = _guard(errors, f"{store} W1 {variant} {spread} run {run + 1}",
                             functools.partial(w1_phase, res, tenanted, args.fair_w1_n, run,
                                               variant))  # fmt: skip
                if one is not None:
                    log(f"fair share {store}: W1 {variant} over {k}: {one['wf_per_s']:,.1f} wf/s")
                    found[spread].append(one["wf_per_s"])
        w1[variant] = {
            spread: {"wf_per_s_runs": runs, "wf_per_s": median(runs) if runs else None}
            for spread, runs in found.items()
        }
    out["w1"] = w1
    return out


def run(
    res: Resources, args: argparse.Namespace, stores: Sequence[str], log_dir: Path
) -> dict[str, Any]:
    """Every measurement on each store; the sizes in `settings`."""
    out: dict[str, Any] = {
        "settings": {
            "a_n": args.fair_a_n, "b_n": args.fair_b_n, "b_after_s": B_AFTER,
            "latency_n": args.fair_latency_n, "rate_per_s": args.fair_rate, "w1_n": args.fair_w1_n,
            "tenants": args.fair_tenants, "runs": args.fair_runs, "w1_runs": args.fair_w1_runs,
            "workers": args.workers,
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
    }  # fmt: skip
    for store in stores:
        out[STORES[store]] = run_store(res, store, args, log_dir)
    out["settings"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def table_lines(result: dict[str, Any]) -> list[str]:
    s = result["settings"]
    lines = [
        "",
        f"Fair share of claims across tenants, end to end ({s['workers']} workers; A "
        f"{s['a_n']:,} tasks in batches, B {s['b_n']:,} one second later; B's latency: "
        f"{s['latency_n']} tasks at {s['rate_per_s']:g}/s beside A's flood; W1 n={s['w1_n']} "
        f"over {s['tenants']} tenants, {s['w1_runs']} run(s), the others {s['runs']}; load "
        f"{s['load_average_at_start']} -> {s['load_average_at_end']})",
    ]
    for name, r in result.items():
        if name == "settings":
            continue
        lines.append(f"{name}:")
        for key, label in (("shares_1_1", "1:1"), ("shares_3_1", "A 3 : B 1")):
            sh = r.get(key, {})
            each = ", ".join(
                f"{x['b_share'] * 100:.1f}% over {x['window_s']:.1f} s" for x in sh.get("runs", [])
            )
            lines.append(
                f"  B's share, weights {label:<9} {_pct(sh.get('b_share_median')):>7} "
                f"(expected {_pct(sh.get('expected'))}; runs: {each})"
            )
        lat = r.get("latency", {})
        lines.append(
            "  B's latency p50 / p99 ms: "
            + "; ".join(
                f"{mode.replace('_', ' ')} {_ms(lat.get(mode, {}).get('p50_ms'))} / "
                f"{_ms(lat.get(mode, {}).get('p99_ms'))}"
                for mode in ("alone", "fair", "one_tenant")
            )
        )
        lines.append(
            "  of which p50 / p99 ms, to its first step (the claim's wait) and its steps in "
            "the agents' queue: "
            + "; ".join(
                f"{mode.replace('_', ' ')} {_ms(lat.get(mode, {}).get('to_first_step_p50_ms'))}"
                f" / {_ms(lat.get(mode, {}).get('to_first_step_p99_ms'))} and "
                f"{_ms(lat.get(mode, {}).get('steps_queued_p50_ms'))} / "
                f"{_ms(lat.get(mode, {}).get('steps_queued_p99_ms'))}"
                for mode in ("alone", "fair", "one_tenant")
            )
        )
        for variant, spreads in r.get("w1", {}).items():
            lines.append(
                f"  W1 {variant:<6} wf/s: "
                + "; ".join(
                    f"{spread.replace('_', ' ')} {_ms(v['wf_per_s'])} ("
                    + ", ".join(f"{x:,.0f}" for x in v["wf_per_s_runs"])
                    + ")"
                    for spread, v in spreads.items()
                )
            )
        for error in r.get("errors", []):
            lines.append(f"  FAILED: {error}")
    return lines


PARTS = ("shares", "latency", "w1")
"""What `--fair-parts` may name."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The sizes, shared by `python -m bench` and `python -m bench.fair_share`."""
    p.add_argument("--fair-a-n", type=int, default=None, help="tenant A's flood [10,000]")
    p.add_argument("--fair-b-n", type=int, default=None, help="tenant B's batched tasks [2,000]")
    p.add_argument(
        "--fair-latency-n", type=int, default=None,
        help="B's tasks submitted one at a time for its latency [200]",
    )  # fmt: skip
    p.add_argument(
        "--fair-rate", type=float, default=40.0, help="B's submits a second for its latency [40]"
    )
    p.add_argument(
        "--fair-w1-n", type=int, default=None, help="W1's workflows over tenants [1,000]"
    )
    p.add_argument("--fair-tenants", type=int, default=10, help="W1's tenants [10]")
    p.add_argument(
        "--fair-runs", type=int, default=1, help="runs of the shares and of B's latency [1]"
    )
    p.add_argument(
        "--fair-w1-runs",
        type=int,
        default=None,
        help="runs of W1 over tenants [4; quick 1]: an even number, each side first as often",
    )
    p.add_argument(
        "--fair-parts", default="shares,latency,w1",
        help="what runs, comma-separated: shares, latency, w1 [all three]",
    )  # fmt: skip


def settle_arguments(args: argparse.Namespace, quick: bool = False) -> None:
    """The defaults of the sizes left out (`--quick`: a fifth, one run)."""
    scale = 5 if quick else 1
    args.fair_a_n = args.fair_a_n or 10_000 // scale
    args.fair_b_n = args.fair_b_n or 2_000 // scale
    args.fair_latency_n = args.fair_latency_n or 200 // scale
    args.fair_w1_n = args.fair_w1_n or 1_000 // scale
    args.fair_w1_runs = args.fair_w1_runs or (1 if quick else 4)
    parts = {x.strip() for x in args.fair_parts.split(",") if x.strip()}
    unknown = parts - set(PARTS)
    if unknown or not parts:
        raise SystemExit(f"--fair-parts: {', '.join(sorted(unknown)) or 'none'}: of {PARTS}")
    args.fair_parts = parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="postgres", help="postgres, sqlite, or both [postgres]")
    parser.add_argument("--workers", type=int, default=2)
    add_arguments(parser)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--quick", action="store_true", help="a fifth of the sizes, one run")
    args = parser.parse_args(argv)
    settle_arguments(args, args.quick)
    stores = [x.strip() for x in args.store.split(",") if x.strip()]
    for store in stores:
        if store not in STORES:
            parser.error(f"unknown store {store!r}: postgres or sqlite")
    res = Resources(admin_url=args.admin_url)
    try:
        with contextlib.suppress(Exception):
            res.drop_stale_databases()
        result = run(res, args, stores, res.temp_dir("fair-share-logs"))
    finally:
        res.close()
    print("\n".join(table_lines(result)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    failed = any(r.get("errors") for k, r in result.items() if k != "settings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
