"""How long a step whose agent process was SIGKILLed takes to complete elsewhere (stepwarden);
and, below, a killed scheduler, a killed supervisor leader's worker, and a database outage.

Three worker processes: two run only the agents, one the scheduler and the supervisor
(`stepwarden worker --roles ...`, the CLI's defaults otherwise: supervisor interval 1 s,
backoff 0.5 s). A `hold_order` task's one step (complete_within = BENCH_HOLD_STEP_WITHIN,
2 s) blocks in whichever agent claims it until a marker file exists; the benchmark SIGKILLs
that process, creates the marker, and waits for the task to finish. The step cannot complete
elsewhere before its complete_by passes (the pattern's rule: the killed agent might still be
working), so the figure is that deadline plus the recovery's own delay, reported apart."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from .common import Resources, log, log_contains, median, wait_for
from .systems import _bin

HOLD_STEP_WITHIN = 2.0


def _worker_command(url: str) -> list[str]:
    """`stepwarden worker` of the benchmark's workload on `url` (add --roles to it)."""
    return [_bin("stepwarden"), "--store", url, "--log-level", "info", "worker",
            "bench.workload:app"]  # fmt: skip


def _epoch(value: Any) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def recovery_once(res: Resources, *, postgres: bool, log_dir: Path, run: int) -> dict[str, Any]:
    from . import workload

    workdir = res.temp_dir(f"recovery-{run}")
    url = res.create_database(f"rec{run}") if postgres else f"sqlite:///{workdir / 'store.db'}"
    env = {"PYTHONUNBUFFERED": "1", "BENCH_HOLD_STEP_WITHIN": str(HOLD_STEP_WITHIN)}
    store_name = "postgres" if postgres else "sqlite"
    base = _worker_command(url)
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


# -- a killed scheduler ---------------------------------------------------------------------

SCHEDULER_TASKS = 100
GONE_AFTER = 5.0
"""The CLI's --scheduler-gone-after (the goal: all resumed within it plus 2 s)."""


def _instance(child: Any) -> str:
    found = re.search(r"worker ([0-9a-f]+) running", child.log_path.read_text(errors="replace"))
    if found is None:
        raise RuntimeError(f"{child.name} has not started")
    return f"scheduler-{found.group(1)}"


def scheduler_kill_once(
    res: Resources, *, postgres: bool, log_dir: Path, run: int
) -> dict[str, Any]:
    """A scheduler holding SCHEDULER_TASKS tasks (each waiting on a step that a gate keeps
    open) is SIGKILLed while a second scheduler runs; the gate opens; the figure is the time
    from the kill until every task is processed, by the store's clock."""
    from . import workload

    workdir = res.temp_dir(f"schedkill-{run}")
    url = res.create_database(f"sk{run}") if postgres else f"sqlite:///{workdir / 'store.db'}"
    store_name = "postgres" if postgres else "sqlite"
    base = _worker_command(url)
    children = []
    loop = asyncio.new_event_loop()
    app = workload.app
    try:
        app.store_url = url
        loop.run_until_complete(app.store())
        for roles in ("scheduler", "agents,supervisor"):
            children.append(
                res.spawn(
                    f"schedkill-{store_name}-{run}-{roles.replace(',', '+')}",
                    [*base, "--roles", roles],
                    env={"PYTHONUNBUFFERED": "1"},
                    log_dir=log_dir,
                )
            )
        wait_for(
            lambda: all(log_contains(c, " running ") for c in children),
            timeout=60,
            what="the workers",
            children=children,
        )
        doomed = children[0]
        holder = _instance(doomed)
        tasks = [
            workload.app.new_task("gate_order", {"dir": str(workdir)}, task_id=f"gate-{i}")
            for i in range(SCHEDULER_TASKS)
        ]
        loop.run_until_complete(app.submit_many_async(tasks))

        def held() -> bool:
            found = loop.run_until_complete(app.tasks_async(limit=SCHEDULER_TASKS))
            return sum(t.locked_by == holder for t in found) == SCHEDULER_TASKS

        wait_for(held, timeout=60, what="the first scheduler to hold every task", children=children)
        survivor = res.spawn(
            f"schedkill-{store_name}-{run}-scheduler2",
            [*base, "--roles", "scheduler"],
            env={"PYTHONUNBUFFERED": "1"},
            log_dir=log_dir,
        )
        children.append(survivor)
        wait_for(
            lambda: log_contains(survivor, " running "),
            timeout=60,
            what="the second scheduler",
            children=children[1:],
        )
        killed_at = time.time()
        os.kill(doomed.pid, signal.SIGKILL)
        (workdir / "open").touch()
        done = [loop.run_until_complete(app.result_async(t.task_id, timeout=120)) for t in tasks]
        finished = loop.run_until_complete(app.tasks_async(limit=SCHEDULER_TASKS))
        last = max(_epoch(t.finished_at) for t in finished)
        failures = sum(t.failure_count for t in finished)
        if len(done) != SCHEDULER_TASKS or failures:
            raise RuntimeError(f"unexpected recovery: {len(done)} done, {failures} failures")
        return {"kill_to_all_done_s": round(last - killed_at, 3), "failures": failures}
    finally:
        loop.run_until_complete(app.aclose())
        loop.close()
        res.stop_all(children)
        if postgres:
            res.drop_database(url)
        res.remove_path(workdir)


# -- the supervisor leader's own worker killed -----------------------------------------------

LEASE_TTL = 5.0
"""The CLI's --lease-ttl by default (max(5, 3 x the 1 s interval))."""


def _leads(url: str, supervisor: str) -> bool:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT holder FROM stepwarden_leases WHERE name = 'supervisor' AND expires_at > now()"
        ).fetchone()
    return row is not None and row[0] == supervisor


def _sqlite_leads(path: Path, supervisor: str) -> bool:
    import sqlite3

    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        row = conn.execute(
            "SELECT holder FROM stepwarden_leases WHERE name = 'supervisor' AND expires_at > ?",
            (time.time(),),
        ).fetchone()
    return row is not None and row[0] == supervisor


def leader_kill_once(res: Resources, *, postgres: bool, log_dir: Path, run: int) -> dict[str, Any]:
    """Two workers with every role (the CLI's defaults): the first leads the supervisors and
    holds SCHEDULER_TASKS tasks, each waiting on a step that a gate keeps open, run by its own
    agents; the second, started then, has run for longer than its grace (the longer
    gone-after) when the first is SIGKILLed; the gate opens; the figure is the time from the
    kill until every task is processed, by the store's clock."""
    from . import workload

    workdir = res.temp_dir(f"leaderkill-{run}")
    url = res.create_database(f"lk{run}") if postgres else f"sqlite:///{workdir / 'store.db'}"
    store_name = "postgres" if postgres else "sqlite"
    base = _worker_command(url)
    children = []
    loop = asyncio.new_event_loop()
    app = workload.app
    try:
        app.store_url = url
        loop.run_until_complete(app.store())

        def spawn(name: str) -> Any:
            child = res.spawn(
                f"leaderkill-{store_name}-{run}-{name}",
                base,
                env={"PYTHONUNBUFFERED": "1"},
                log_dir=log_dir,
            )
            children.append(child)
            wait_for(
                lambda: log_contains(child, " running "),
                timeout=60,
                what=f"the {name} worker",
                children=children,
            )
            return child

        doomed = spawn("leader")
        leader = "supervisor-" + _instance(doomed).removeprefix("scheduler-")
        leads = (
            (lambda: _leads(url, leader))
            if postgres
            else (lambda: _sqlite_leads(workdir / "store.db", leader))
        )
        wait_for(leads, timeout=60, what="the first worker to lead", children=children)
        holder = _instance(doomed)
        tasks = [
            workload.app.new_task("gate_order", {"dir": str(workdir)}, task_id=f"lead-{i}")
            for i in range(SCHEDULER_TASKS)
        ]
        loop.run_until_complete(app.submit_many_async(tasks))

        def held() -> bool:
            found = loop.run_until_complete(app.tasks_async(limit=SCHEDULER_TASKS))
            return sum(t.locked_by == holder for t in found) == SCHEDULER_TASKS

        wait_for(held, timeout=60, what="the leader's worker to hold every task", children=children)
        survivor = spawn("standby")
        standby = _instance(survivor)

        def standby_past_its_grace() -> bool:
            rows = loop.run_until_complete(app.scheduler_instances_async())
            return any(
                s.instance == standby
                and (s.heartbeat_at - s.started_at).total_seconds() > GONE_AFTER + 0.5
                for s in rows
            )

        wait_for(standby_past_its_grace, timeout=60, what="the standby's grace", children=children)
        if not leads():
            raise RuntimeError("the first worker no longer leads")
        killed_at = time.time()
        os.kill(doomed.pid, signal.SIGKILL)
        (workdir / "open").touch()
        done = [loop.run_until_complete(app.result_async(t.task_id, timeout=120)) for t in tasks]
        finished = loop.run_until_complete(app.tasks_async(limit=SCHEDULER_TASKS))
        last = max(_epoch(t.finished_at) for t in finished)
        failures = sum(t.failure_count for t in finished)
        if len(done) != SCHEDULER_TASKS or failures:
            raise RuntimeError(f"unexpected recovery: {len(done)} done, {failures} failures")
        return {
            "kill_to_all_done_s": round(last - killed_at, 3),
            "failures": failures,
        }
    finally:
        loop.run_until_complete(app.aclose())
        loop.close()
        res.stop_all(children)
        if postgres:
            res.drop_database(url)
        res.remove_path(workdir)


def leader_recovery(res: Resources, *, postgres: bool, runs: int, log_dir: Path) -> dict[str, Any]:
    samples = []
    for run in range(runs):
        sample = leader_kill_once(res, postgres=postgres, log_dir=log_dir, run=run)
        log(f"leader kill/{'postgres' if postgres else 'sqlite'} run {run + 1}: {sample}")
        samples.append(sample)
    return {
        "kill_to_all_done_s_median": round(median([s["kill_to_all_done_s"] for s in samples]), 3),
        "tasks": SCHEDULER_TASKS,
        "gone_after_s": GONE_AFTER,
        "lease_ttl_s": LEASE_TTL,
        "goal_s": max(GONE_AFTER, LEASE_TTL) + 2,
        "runs": samples,
    }


# -- a database outage ----------------------------------------------------------------------

OUTAGE = 10.0
OUTAGE_TASKS = 200
"""Tasks in flight when the database stops: each one's step is held open until then (two
agent processes serve 100 calls each at once)."""


def _ctl(*args: str) -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", *args],
        check=True,
        capture_output=True,
        timeout=120,
    )


def outage_once(res: Resources, *, log_dir: Path, run: int) -> dict[str, Any]:
    """PostgreSQL (a server of the benchmark's own, on another port: the shared one is never
    stopped) stops for OUTAGE seconds while two workers hold OUTAGE_TASKS tasks whose steps
    are running; the steps return while it is down (their outcomes cannot be written); the
    figures are the times from its restart (the server's own start time) until the first
    step's outcome is written and until every task is processed, by the store's clock."""
    from . import workload

    name = f"swb{os.getpid()}r{run}"
    workdir = res.temp_dir(f"outage-{run}")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    subprocess.run(
        [
            "pg_createcluster",
            "15",
            name,
            "-p",
            str(port),
            "--start",
            "--",
            "--auth-host=trust",
            "--auth-local=trust",
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    base = _worker_command(url)
    children = []
    loop = asyncio.new_event_loop()
    app = workload.app
    try:
        app.store_url = url
        loop.run_until_complete(app.store())
        for i in range(2):
            children.append(
                res.spawn(
                    f"outage-{run}-worker{i}", base, env={"PYTHONUNBUFFERED": "1"}, log_dir=log_dir
                )
            )
        wait_for(
            lambda: all(log_contains(c, " running ") for c in children),
            timeout=60,
            what="the workers",
            children=children,
        )
        tasks = [
            workload.app.new_task("gate_order", {"dir": str(workdir)}, task_id=f"o-{i}")
            for i in range(OUTAGE_TASKS)
        ]
        loop.run_until_complete(app.submit_many_async(tasks))

        def running() -> bool:
            steps = loop.run_until_complete(app.tasks_async(state="processing", limit=OUTAGE_TASKS))
            return len(steps) == OUTAGE_TASKS

        wait_for(running, timeout=60, what="every task to be under way", children=children)
        _ctl("15", name, "stop", "-m", "fast")
        (workdir / "open").touch()  # the calls return while the database is down
        time.sleep(OUTAGE)
        _ctl("15", name, "start")
        done = [loop.run_until_complete(app.result_async(t.task_id, timeout=120)) for t in tasks]
        finished = loop.run_until_complete(app.tasks_async(limit=OUTAGE_TASKS))
        last = max(_epoch(t.finished_at) for t in finished)
        back_at, first = _back_and_first_write(url)
        return {
            "back_to_first_write_s": round(first - back_at, 3),
            "back_to_all_done_s": round(last - back_at, 3),
            "processed": len(done),
            "failures": sum(t.failure_count for t in finished),
        }
    finally:
        loop.run_until_complete(app.aclose())
        loop.close()
        res.stop_all(children)
        subprocess.run(["pg_dropcluster", "15", name, "--stop"], capture_output=True, timeout=120)
        res.remove_path(workdir)


def _back_and_first_write(url: str) -> tuple[float, float]:
    """When the server started again, and when the first step's outcome after that was
    written (both by its clock)."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM pg_postmaster_start_time())::float8,"
            " extract(epoch FROM min(finished_at))::float8 FROM stepwarden_steps"
            " WHERE finished_at >= pg_postmaster_start_time()"
        ).fetchone()
    if row is None or row[1] is None:
        raise RuntimeError("no step finished after the restart")
    return float(row[0]), float(row[1])


def scheduler_recovery(
    res: Resources, *, postgres: bool, runs: int, log_dir: Path
) -> dict[str, Any]:
    samples = []
    for run in range(runs):
        sample = scheduler_kill_once(res, postgres=postgres, log_dir=log_dir, run=run)
        log(f"scheduler kill/{'postgres' if postgres else 'sqlite'} run {run + 1}: {sample}")
        samples.append(sample)
    return {
        "kill_to_all_done_s_median": round(median([s["kill_to_all_done_s"] for s in samples]), 3),
        "tasks": SCHEDULER_TASKS,
        "gone_after_s": GONE_AFTER,
        "goal_s": GONE_AFTER + 2,
        "runs": samples,
    }


def outage_recovery(res: Resources, *, runs: int, log_dir: Path) -> dict[str, Any]:
    samples = []
    for run in range(runs):
        sample = outage_once(res, log_dir=log_dir, run=run)
        log(f"database outage run {run + 1}: {sample}")
        samples.append(sample)
    return {
        "back_to_first_write_s_median": round(
            median([s["back_to_first_write_s"] for s in samples]), 3
        ),
        "back_to_all_done_s_median": round(median([s["back_to_all_done_s"] for s in samples]), 3),
        "tasks": OUTAGE_TASKS,
        "outage_s": OUTAGE,
        "first_write_goal_s": 1.0,
        "goal_s": 3.0,
        "runs": samples,
    }
