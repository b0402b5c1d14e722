"""How long a step whose agent process was SIGKILLed takes to complete elsewhere (stepwarden).

Three worker processes: two run only the agents, one the scheduler and the supervisor
(`stepwarden worker --roles ...`, the CLI's defaults otherwise: supervisor interval 1 s,
backoff 0.5 s). A `hold_order` task's one step (complete_within = BENCH_HOLD_STEP_WITHIN,
2 s) blocks in whichever agent claims it until a marker file exists; the benchmark SIGKILLs
that process, creates the marker, and waits for the task to finish. The step cannot complete
elsewhere before its complete_by passes (the pattern's rule: the killed agent might still be
working), so the figure is that deadline plus the recovery's own delay, reported apart."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from .common import Resources, log, log_contains, median, wait_for
from .systems import _bin

HOLD_STEP_WITHIN = 2.0


def _epoch(value: Any) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def recovery_once(res: Resources, *, postgres: bool, log_dir: Path, run: int) -> dict[str, Any]:
    from . import workload

    workdir = res.temp_dir(f"recovery-{run}")
    url = res.create_database(f"rec{run}") if postgres else f"sqlite:///{workdir / 'store.db'}"
    env = {"PYTHONUNBUFFERED": "1", "BENCH_HOLD_STEP_WITHIN": str(HOLD_STEP_WITHIN)}
    store_name = "postgres" if postgres else "sqlite"
    base = [
        _bin("stepwarden"),
        "--store",
        url,
        "--log-level",
        "info",
        "worker",
        "bench.workload:app",
    ]
    children = []
    loop = asyncio.new_event_loop()
    app = workload.app
    try:
        app.store_url = url
        loop.run_until_complete(app.store())  # migrates before the workers start
        for i, roles in enumerate(["agents", "agents", "scheduler,supervisor"]):
            children.append(
                res.spawn(
                    f"recovery-{store_name}-{run}-{roles.replace(',', '+')}{i}",
                    [*base, "--roles", roles],
                    env=env,
                    log_dir=log_dir,
                )
            )
        wait_for(
            lambda: all(log_contains(c, " running ") for c in children),
            timeout=60,
            what="recovery workers",
            children=children,
        )
        agents = {c.pid: c for c in children[:2]}
        task_id = f"hold-{run}"
        loop.run_until_complete(
            app.submit_async("hold_order", {"dir": str(workdir)}, task_id=task_id)
        )
        pid_file = workdir / "pid-1"
        wait_for(pid_file.exists, timeout=30, what="the held step to start", children=children)
        pid = int(pid_file.read_text())
        victim = agents.get(pid)
        if victim is None:
            raise RuntimeError(f"the held step runs in pid {pid}, not in an agent process")
        view = loop.run_until_complete(app.show_async(task_id))
        step_deadline = _epoch(view.steps[0].complete_by)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        (workdir / "release").touch()
        result = loop.run_until_complete(app.result_async(task_id, timeout=120))
        task = loop.run_until_complete(app.status_async(task_id))
        done_at = _epoch(task.finished_at)
        if result["pid"] == pid or result["attempt"] != 2:
            raise RuntimeError(f"unexpected recovery: {result} (killed pid {pid})")
        return {
            "kill_to_done_s": round(done_at - killed_at, 3),
            "deadline_remaining_at_kill_s": round(step_deadline - killed_at, 3),
            "after_deadline_s": round(done_at - step_deadline, 3),
            "attempt": result["attempt"],
        }
    finally:
        loop.run_until_complete(app.aclose())
        loop.close()
        res.stop_all(children)
        if postgres:
            res.drop_database(url)
        res.remove_path(workdir)


def recovery(res: Resources, *, postgres: bool, runs: int, log_dir: Path) -> dict[str, Any]:
    samples = []
    for run in range(runs):
        sample = recovery_once(res, postgres=postgres, log_dir=log_dir, run=run)
        log(f"recovery/{'postgres' if postgres else 'sqlite'} run {run + 1}: {sample}")
        samples.append(sample)
    return {
        "kill_to_done_s_median": round(median([s["kill_to_done_s"] for s in samples]), 3),
        "after_deadline_s_median": round(median([s["after_deadline_s"] for s in samples]), 3),
        "step_complete_within_s": HOLD_STEP_WITHIN,
        "settings": "CLI defaults: --supervisor-interval 1.0, --backoff-initial 0.5, "
        "poll interval 0.5 s (PostgreSQL, with LISTEN/NOTIFY) / 0.05 s (SQLite)",
        "runs": samples,
    }
