"""`stepwarden worker` as a real process, configured through environment variables: it runs
the roles it is given, `show` reports the task it holds, and SIGTERM drains it within
--drain-timeout and exits 0."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Protocol

import orjson
import pytest

from .helpers import APP, REPO, STEPWARDEN, assert_ok, invoke, process_env


class StartWorker(Protocol):
    def __call__(self, env: dict[str, str], *args: str) -> subprocess.Popen[str]: ...


@pytest.fixture
def start_worker() -> Iterator[StartWorker]:
    started: list[subprocess.Popen[str]] = []

    def start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [STEPWARDEN, "worker", *args],
            cwd=REPO,
            env=process_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:  # only when a test failed half-way
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _submit(url: str, task_id: str, value: str) -> None:
    assert_ok(
        invoke("--app", APP, "--store", url, "submit", "process", value, f"--task-id={task_id}")
    )


def _show(url: str, task_id: str) -> dict[str, Any]:
    data = orjson.loads(assert_ok(invoke("--store", url, "show", task_id, "--json")))
    assert isinstance(data, dict)
    return data


def _wait_until(
    proc: subprocess.Popen[str], check: Callable[[], dict[str, Any] | None], timeout: float = 20
) -> dict[str, Any]:
    """Poll `check` until it returns something, failing if the worker exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"condition not reached within {timeout}s")


def _stop(proc: subprocess.Popen[str]) -> tuple[float, str]:
    """SIGTERM the worker; the seconds it took to exit, and what it logged."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    return time.monotonic() - sent, err


def test_a_scheduler_only_worker_holds_the_task_and_drains_on_sigterm(
    migrated_url: str, start_worker: StartWorker
) -> None:
    _submit(migrated_url, "w-1", "{}")
    proc = start_worker(
        {
            "STEPWARDEN_APP": APP,
            "STEPWARDEN_STORE": migrated_url,
            "STEPWARDEN_ROLES": "scheduler",
            "STEPWARDEN_POLL_INTERVAL": "0.02",
            "STEPWARDEN_DRAIN_TIMEOUT": "0.2",
        }
    )

    def step_dispatched() -> dict[str, Any] | None:
        task = _show(migrated_url, "w-1")
        return task if task["process_state"] == "processing" and task["steps"] else None

    task = _wait_until(proc, step_dispatched)
    # `show` reports who holds the task and until when.
    assert re.fullmatch(r"scheduler-[0-9a-f]+", task["locked_by"]), task["locked_by"]
    assert datetime.fromisoformat(task["complete_by"]) > datetime.fromisoformat(task["created_at"])
    assert task["attempt"] == 1 and task["failure_count"] == 0
    [step] = task["steps"]
    assert (step["state"], step["attempt"], step["idempotency_key"]) == ("not_started", 1, "w-1/1")

    took, log = _stop(proc)
    assert proc.returncode == 0, log
    # The step waits 60 s for an agent; only the 0.2 s drain timeout lets it stop this soon
    # (the default is 30 s).
    assert took < 10, (took, log)
    # Only the role asked for ran; the drain was announced.
    assert re.search(r"worker [0-9a-f]+ running scheduler$", log, re.MULTILINE), log
    assert "SIGTERM received, draining" in log
    # At its drain timeout the scheduler hands the task back at once (no failure counted),
    # for another scheduler to resume; its step stays queued.
    after = _show(migrated_url, "w-1")
    assert (after["process_state"], after["locked_by"], after["failure_count"]) == (
        "pending",
        None,
        0,
    )
    assert after["steps"][0]["state"] == "not_started"
    [released] = [e for e in after["events"] if e["kind"] == "released"]
    assert released["detail"]["reason"] == "drained"
    assert released["detail"]["from"] == task["locked_by"]


def test_a_full_worker_runs_a_submitted_task_and_exits_0_on_sigterm(
    migrated_url: str, start_worker: StartWorker
) -> None:
    # The application as the README writes it (`stepwarden worker shop:app`), the rest from the
    # environment.
    proc = start_worker({"STEPWARDEN_STORE": migrated_url, "STEPWARDEN_POLL_INTERVAL": "0.02"}, APP)
    _submit(migrated_url, "w-2", '{"n": 3}')

    def processed() -> dict[str, Any] | None:
        task = _show(migrated_url, "w-2")
        return task if task["process_state"] == "processed" else None

    task = _wait_until(proc, processed)
    assert task["result"] == {"stamped": {"n": 3}, "key": "w-2/1"}
    assert task["locked_by"] is None and task["steps"][0]["state"] == "completed"
    _, log = _stop(proc)
    assert proc.returncode == 0, log
    assert re.search(r"running agents, scheduler, supervisor$", log, re.MULTILINE), log
    assert "Traceback" not in log


def test_the_application_and_the_log_format_are_taken_after_the_command(
    migrated_url: str, start_worker: StartWorker
) -> None:
    """`stepwarden worker --app M:A --log-format json` works as `stepwarden --app M:A
    --log-format json worker` does (the form the error without an application names)."""
    proc = start_worker(
        {"STEPWARDEN_STORE": migrated_url, "STEPWARDEN_POLL_INTERVAL": "0.02"},
        "--app",
        APP,
        "--log-format",
        "json",
    )
    _submit(migrated_url, "w-3", '{"n": 4}')

    def processed() -> dict[str, Any] | None:
        task = _show(migrated_url, "w-3")
        return task if task["process_state"] == "processed" else None

    _wait_until(proc, processed)
    _, log = _stop(proc)
    assert proc.returncode == 0, log
    records = [orjson.loads(line) for line in log.splitlines()]
    assert any(r["message"].endswith("running agents, scheduler, supervisor") for r in records)
