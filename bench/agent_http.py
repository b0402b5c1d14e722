"""One agent call over HTTP against one in process, on stepwarden-postgres.

The workflow `bench.agent_http_app:one` has one step, `svc.echo`, a trivial operation. The
same workload runs twice on fresh databases, the same run:

- "in process": one `stepwarden worker` runs every role, its agent among them;
- "over HTTP": one `stepwarden worker --roles scheduler,supervisor` (the workflows), a
  `stepwarden dashboard` serving the agent protocol (`--api-tokens`), and one
  `stepwarden worker --agent-url` serving `svc` over HTTP with a client's token (no store).

Measured each time: the latency of a workflow submitted and awaited alone (`n_latency` one
after another: p50/p99, submit to result), and the calls per second of `n` workflows
submitted in batches then waited for (one call each). The difference is what a call over
HTTP costs beyond one made in the scheduler's process: a claim, an answer and a wake-up
over HTTP, each a request to the server, which does the store's work for the agent.

    python -m bench.agent_http [--n 2000] [--latency-n 200] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import httpx

from stepwarden import _tokens

from .common import Resources, log, log_contains, percentile
from .systems import _bin, _wait_ready

APP = "bench.agent_http_app:app"
MODES = ("in_process", "over_http")
BATCH = 100
TIMEOUT = 120.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(res: Resources, mode: str, url: str, run: int, log_dir: Path) -> list[Any]:
    """The processes of `mode` on the store `url`, once they run."""
    worker = [_bin("stepwarden"), "--store", url, "--log-level", "info", "worker", APP]
    if mode == "in_process":
        children = [res.spawn(f"agent-http-{run}-worker", worker, log_dir=log_dir)]
        _wait_ready(children, lambda c: log_contains(c, " running "), "the worker")
        return children
    token, client = _tokens.new_client("bench", ["agent:svc"])
    tokens = res.temp_dir(f"agent-http-{run}") / "api-tokens"
    tokens.write_text(client.line() + "\n")
    tokens.chmod(0o600)
    port = _free_port()
    env = {"STEPWARDEN_DASHBOARD_TOKEN": "bench-dashboard-token-0123456789"}
    server = res.spawn(
        f"agent-http-{run}-server",
        [_bin("stepwarden"), "--store", url, "dashboard", APP, "--port", str(port),
         "--api-tokens", str(tokens)],
        env=env,
        log_dir=log_dir,
    )  # fmt: skip
    children = [
        server,
        res.spawn(
            f"agent-http-{run}-scheduler",
            [*worker, "--roles", "scheduler,supervisor"],
            log_dir=log_dir,
        ),
    ]
    base = f"http://127.0.0.1:{port}"
    _wait_ready([server], lambda c: _answers(base), "the server")
    agent = res.spawn(
        f"agent-http-{run}-agent",
        [_bin("stepwarden"), "worker", APP, "--agent-url", base],
        env={"STEPWARDEN_AGENT_TOKEN": token},
        log_dir=log_dir,
    )
    children.append(agent)
    _wait_ready(children[1:], lambda c: log_contains(c, " running "), "the workers")
    return children


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/api/v1/openapi.json", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


async def _measure(url: str, n: int, n_latency: int) -> dict[str, Any]:
    from . import agent_http_app

    app = agent_http_app.app
    app.store_url = url
    try:
        for i in range(5):  # warm: connections, plans, the agent's first claim
            warm = await app.submit_async("one", i, task_id=f"w-{i}")
            await app.result_async(warm, timeout=TIMEOUT)
        seconds = []
        for i in range(n_latency):
            start = time.perf_counter()
            task = await app.submit_async("one", i, task_id=f"l-{i}")
            await app.result_async(task, timeout=TIMEOUT)
            seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
        for first in range(0, n, BATCH):
            ids = range(first, min(n, first + BATCH))
            batch = [app.new_task("one", i, task_id=f"t-{i}") for i in ids]
            await app.submit_many_async(batch)
        for i in range(n):
            await app.result_async(f"t-{i}", timeout=TIMEOUT)
        total = time.perf_counter() - start
    finally:
        await app.aclose()
    return {
        "latency_p50_ms": round(percentile(seconds, 50) * 1000, 2),
        "latency_p99_ms": round(percentile(seconds, 99) * 1000, 2),
        "calls_per_s": round(n / total, 1),
    }


def run(res: Resources, *, n: int, n_latency: int, runs: int, log_dir: Path) -> dict[str, Any]:
    """Each mode `runs` times, alternating; the medians and each run's figures."""
    found: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    errors: list[str] = []
    for run_no in range(runs):
        for mode in MODES:
            url = res.create_database(f"agenthttp{run_no}{mode[:2]}")
            children: list[Any] = []
            try:
                children = _start(res, mode, url, run_no, log_dir)
                figures = asyncio.run(_measure(url, n, n_latency))
                log(f"agent call {mode} run {run_no + 1}/{runs}: {figures}")
                found[mode].append(figures)
            except Exception as exc:  # a failed run is reported, the others still count
                errors.append(f"{mode} run {run_no + 1}: {exc!r}")
                traceback.print_exc()
            finally:
                res.stop_all(children)
    out: dict[str, Any] = {"n": n, "latency_n": n_latency, "runs": found, "errors": errors}
    for mode, figures in found.items():
        if figures:
            out[mode] = {
                key: sorted(f[key] for f in figures)[len(figures) // 2]
                for key in ("latency_p50_ms", "latency_p99_ms", "calls_per_s")
            }
    return out


def table_lines(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"One agent call over HTTP against one in process (stepwarden-postgres; the workflow's "
        f"one step; latency: {result['latency_n']} workflows submitted and awaited one after "
        f"another, submit to result; calls/s: {result['n']} workflows in batches of {BATCH})",
    ]
    head = f"{'agent':<12} {'latency p50 ms':>14} {'p99 ms':>8} {'calls/s':>9}"
    lines += [head, "-" * len(head)]
    for mode in MODES:
        f = result.get(mode)
        if f:
            lines.append(
                f"{mode.replace('_', ' '):<12} {f['latency_p50_ms']:>14.2f} "
                f"{f['latency_p99_ms']:>8.2f} {f['calls_per_s']:>9,.1f}"
            )
    a, b = result.get("in_process"), result.get("over_http")
    if a and b:
        lines.append(
            f"{'HTTP / proc':<12} {b['latency_p50_ms'] / a['latency_p50_ms']:>13.2f}x "
            f"{b['latency_p99_ms'] / a['latency_p99_ms']:>7.2f}x "
            f"{b['calls_per_s'] / a['calls_per_s']:>8.2f}x"
        )
    for error in result.get("errors", []):
        lines.append(f"FAILED: {error}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--latency-n", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="the PostgreSQL server [$BENCH_POSTGRES_URL or postgresql://postgres@127.0.0.1:5432/postgres]",
    )
    args = parser.parse_args(argv)
    res = Resources(admin_url=args.admin_url)
    try:
        log_dir = res.temp_dir("agent-http-logs")
        result = run(res, n=args.n, n_latency=args.latency_n, runs=args.runs, log_dir=log_dir)
    finally:
        res.close()
    print("\n".join(table_lines(result)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
