"""Real worker processes for the scenario tests: start, kill, wait for conditions, read state.

Every process logs to a file in the test's tmp_path; a wait that times out, and the assertions
that use `Cluster.why`, carry the tail of those logs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit

import psycopg

import stepwarden as sw
from stepwarden.records import TaskRecord

from . import scenario_app

ROOT = Path(__file__).resolve().parents[2]
APP_REF = "tests.scenarios.scenario_app:app"
T = TypeVar("T")

#: Short intervals so that each recovery takes a fraction of a second.
FAST = (
    "--poll-interval", "0.05",
    "--supervisor-interval", "0.2",
    "--lease-ttl", "1",
    "--backoff-initial", "0.1",
    "--backoff-max", "0.5",
    "--drain-timeout", "10",
)  # fmt: skip
PROCESSED = sw.TaskState.PROCESSED
COMPLETED = sw.StepState.COMPLETED
FINISHED = (PROCESSED, sw.TaskState.ERROR)
LOG_TAIL = 4000


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    expect_alive: bool = True

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def instance(self) -> str | None:
        """The worker's instance id, once it has logged that it runs."""
        found = re.search(r"worker ([0-9a-f]+) running", self.log())
        return found.group(1) if found else None


@dataclass
class Cluster:
    """The processes of one scenario, the side database, and a view of the store."""

    store_url: str
    workdir: Path
    procs: list[Proc] = field(default_factory=list)
    _app: sw.App | None = None

    def __post_init__(self) -> None:
        self.side_db = self.workdir / "side.db"
        scenario_app.init_side_db(self.side_db)
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWARDEN_")}
        env.update(
            {
                scenario_app.STORE_ENV: self.store_url,
                scenario_app.SIDE_ENV: str(self.side_db),
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.env = env

    # -- processes ------------------------------------------------------------------------
    def start(
        self,
        name: str,
        *worker_args: str,
        ready: bool = True,
        env: dict[str, str] | None = None,
        app: str = APP_REF,
        store: str | None = None,
        prefix: Sequence[str] = (),
    ) -> Proc:
        """Start `stepwarden worker` of `app` (the scenario App unless named) with these
        arguments (after the FAST defaults) and extra environment variables, on `store`
        (the cluster's, unless named: the same database by another address), its command
        run by `prefix` if given (`ip netns exec NAME`, which execs it: the pid is the
        worker's); wait until it runs when `ready`."""
        cmd = [
            *prefix,
            sys.executable, "-c", "from stepwarden.cli import main; main()",
            "--app", app,
            "--store", store or self.store_url,
            "worker", *FAST, *worker_args,
        ]  # fmt: skip
        log_path = self.workdir / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by close()
        popen = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**self.env, **({scenario_app.STORE_ENV: store} if store else {}), **(env or {})},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        proc = Proc(name, popen, log_path, log_file)
        self.procs.append(proc)
        if ready:
            self.wait_until(proc.instance, f"{name} (pid {proc.pid}) to start", timeout=30)
        return proc

    def kill(self, proc: Proc) -> None:
        """SIGKILL, and reap it."""
        proc.expect_alive = False
        os.kill(proc.pid, signal.SIGKILL)
        proc.popen.wait(timeout=10)

    def pause(self, proc: Proc) -> None:
        """SIGSTOP: the process is frozen mid-whatever, as by a long GC pause or a VM stall;
        on SQLite, between two of its writes. SQLite has one writer at a time: a process
        frozen holding the file's write lock keeps every other process from writing until
        it thaws (docs/concepts/stores.md), which is not what a test of a frozen process is
        about, so a freeze that caught it mid-write is thawed and tried again."""
        deadline = time.monotonic() + 30
        while True:
            os.kill(proc.pid, signal.SIGSTOP)
            if not self._sqlite_write_locked():
                return
            os.kill(proc.pid, signal.SIGCONT)
            assert time.monotonic() < deadline, f"{proc.name} always froze mid-write"

    def _sqlite_write_locked(self) -> bool:
        """Whether a process holds the SQLite store's write lock now (False on PostgreSQL)."""
        if not self.store_url.startswith("sqlite:"):
            return False
        path = urlsplit(self.store_url).path[1:]
        with contextlib.closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as db:
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return True
            db.execute("ROLLBACK")
            return False

    def resume(self, proc: Proc) -> None:
        """SIGCONT: the frozen process carries on where it was."""
        os.kill(proc.pid, signal.SIGCONT)

    def terminate(self, proc: Proc) -> None:
        """SIGTERM: the worker drains and exits by itself."""
        proc.expect_alive = False
        os.kill(proc.pid, signal.SIGTERM)

    def close(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)
            proc.log_file.close()
        if self._app is not None:
            self._app.close()
            self._app = None

    # -- waiting and explaining -----------------------------------------------------------
    def logs(self) -> str:
        parts = []
        for proc in self.procs:
            text = proc.log()
            code = proc.popen.poll()
            state = "running" if code is None else f"exited {code}"
            parts.append(
                f"==== log of {proc.name} (pid {proc.pid}, {state}), last {LOG_TAIL} chars ====\n"
                + text[-LOG_TAIL:]
            )
        return "\n".join(parts)

    def why(self, what: str = "", *task_ids: str) -> str:
        """An assertion message: `what`, the tasks' state and the processes' logs."""
        parts = [what]
        for task_id in task_ids:
            parts.append(self.describe(task_id))
        parts.append(self.logs())
        return "\n".join(parts)

    def describe(self, task_id: str) -> str:
        try:
            view = self.app.show(task_id)
        except Exception as exc:
            return f"task {task_id}: cannot read it ({exc!r})"
        t = view.task
        lines = [
            f"task {t.task_id}: {t.process_state} attempt {t.attempt} "
            f"failure_count {t.failure_count} locked_by {t.locked_by} error {t.error!r}"
        ]
        lines += [
            f"  step {s.seq} {s.state} attempt {s.attempt} tries {s.tries} "
            f"key {s.idempotency_key} locked_by {s.locked_by} result {s.result!r} "
            f"error {s.error!r}"
            for s in view.steps
        ]
        lines += [f"  event {e.kind} {e.detail}" for e in view.events]
        return "\n".join(lines)

    def wait_until(
        self,
        predicate: Callable[[], T | None],
        what: str,
        *,
        timeout: float = 30.0,
        task_ids: tuple[str, ...] = (),
    ) -> T:
        """Poll `predicate` until it returns something truthy, and return that. Fails with the
        logs when `timeout` passes, or at once when a process that should run has died."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            dead = [p for p in self.procs if p.expect_alive and p.popen.poll() is not None]
            if dead:
                names = ", ".join(f"{p.name} (exit {p.popen.returncode})" for p in dead)
                raise AssertionError(self.why(f"{names} died while waiting for {what}", *task_ids))
            if time.monotonic() > deadline:
                raise AssertionError(
                    self.why(f"timed out after {timeout}s waiting for {what}", *task_ids)
                )
            time.sleep(0.02)

    # -- the store and the side database --------------------------------------------------
    @property
    def app(self) -> sw.App:
        """The scenario App on this store, for the test process (submit, status, show)."""
        if self._app is None:
            self._app = scenario_app.build_app(self.store_url)
        return self._app

    def submit(self, task_id: str, steps: list[dict[str, Any]], workflow: str = "steps") -> str:
        return self.app.submit(workflow, {"steps": steps}, task_id=task_id)

    def status(self, task_id: str) -> TaskRecord:
        return self.app.status(task_id)

    def wait_finished(self, task_id: str, timeout: float = 30.0) -> TaskRecord:
        def finished() -> TaskRecord | None:
            task = self.status(task_id)
            return task if task.process_state in FINISHED else None

        return self.wait_until(
            finished, f"task {task_id} to finish", timeout=timeout, task_ids=(task_id,)
        )

    def calls(self, **where: Any) -> list[dict[str, Any]]:
        return scenario_app.side_rows(self.side_db, "calls", **where)

    def effects(self, **where: Any) -> list[dict[str, Any]]:
        return scenario_app.side_rows(self.side_db, "effects", **where)

    def runs(self, **where: Any) -> list[dict[str, Any]]:
        return scenario_app.side_rows(self.side_db, "runs", **where)

    def lease(self, name: str = "supervisor") -> tuple[str, int] | None:
        """The lease row as the store holds it: (holder, term), None before any is taken."""
        sql = "SELECT holder, term FROM stepwarden_leases WHERE name = "
        if self.store_url.startswith("sqlite:"):
            path = urlsplit(self.store_url).path[1:]
            with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
                row = conn.execute(sql + "?", (name,)).fetchone()
        else:
            with psycopg.connect(self.store_url) as conn:
                row = conn.execute(sql + "%s", (name,)).fetchone()
        return (str(row[0]), int(row[1])) if row else None
