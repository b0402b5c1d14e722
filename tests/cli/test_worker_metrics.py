"""A real `stepwarden worker --metrics-port 0 --log-format json` process runs a known workload
(`metrics_app`): its /metrics, scraped with httpx, counts each thing exactly, and each line
of its log is a JSON object, those about a task carrying the task's fields."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .helpers import REPO, STEPWARDEN, assert_ok, invoke, process_env, sql

APP = "tests.cli.metrics_app:app"
ORDERS = 3
LISTENING = re.compile(r"metrics at (http://\S+/metrics)")


class Worker:
    """A worker process whose log (stderr) is read as it comes, line by line."""

    def __init__(self, store_url: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [STEPWARDEN, "--store", store_url, *args],
            cwd=REPO,
            env=process_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def until(self, what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
        """`check()`'s first true answer, polled; fails if the worker exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            assert self.proc.poll() is None, "\n".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"{what}: not within {timeout}s\n" + "\n".join(self.lines[-50:]))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


@pytest.fixture
def worker_of() -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(store_url: str, *args: str) -> Worker:
        w = Worker(store_url, *args)
        started.append(w)
        return w

    yield start
    for w in started:
        if w.proc.poll() is None:  # only when a test failed half-way
            w.proc.kill()
            w.proc.wait()
        w._reader.join(timeout=10)
        if w.proc.stderr is not None:
            w.proc.stderr.close()


def _submit(url: str, workflow: str, value: str, task_id: str, *args: str) -> None:
    assert_ok(
        invoke(
            "--app", APP, "--store", url, "submit", workflow, value, f"--task-id={task_id}", *args
        )
    )  # fmt: skip


# Whose each order is: a tenant the worker names in its metrics, one it does not, none.
TENANTS = {1: ("--tenant=acme",), 2: ("--tenant=globex",)}


def _states(url: str) -> dict[str, str]:
    return dict(sql(url, "SELECT task_id, process_state FROM stepwarden_tasks"))


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_a_worker_counts_a_known_workload_and_logs_it_as_json(
    store_url: str, worker_of: Callable[..., Worker]
) -> None:
    assert_ok(invoke("--store", store_url, "migrate"))
    w = worker_of(
        store_url,
        "--log-format=json",
        "--log-level=debug",
        "worker",
        APP,
        "--metrics-port=0",
        "--metrics-tenants=acme",
        "--poll-interval=0.02",
        "--supervisor-interval=0.05",
        "--agent-concurrency=10",
    )
    found = w.until("the metrics' address", lambda: _listening(w.lines))
    metrics_url = found.group(1)

    for n in range(1, ORDERS + 1):
        _submit(store_url, "order", f'{{"n": {n}}}', f"order-{n}", *TENANTS.get(n, ()))
    _submit(store_url, "doomed", '"x"', "doomed-1")
    _submit(store_url, "patient", '"p"', "patient-1")
    waiting = "SELECT waiting_for FROM stepwarden_tasks WHERE task_id = 'patient-1'"
    # The event is sent once the task waits for it (after its timer): so its run is known.
    w.until("patient-1 waits for the event", lambda: sql(store_url, waiting) == [("event:go",)])
    assert_ok(invoke("--store", store_url, "send", "patient-1", "go", '{"by": "ana"}'))

    expected = {
        **{f"order-{n}": "processed" for n in range(1, ORDERS + 1)},
        "doomed-1": "compensated",
        "patient-1": "processed",
    }
    w.until("every task finished", lambda: _states(store_url) == expected)

    def value(samples: dict[Any, float], name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def settled() -> dict[Any, float] | None:
        # Each count is made once what it counts is recorded: the drives and calls have ended.
        samples = _scrape(metrics_url)
        idle = (
            value(samples, "stepwarden_scheduler_tasks_held") == 0
            and value(samples, "stepwarden_agent_calls_in_flight", agent="shop") == 0
            and value(samples, "stepwarden_steps_completed_total", **shop("release")) == 1
        )
        return samples if idle else None

    def shop(operation: str) -> dict[str, str]:
        return {"agent": "shop", "operation": operation}

    m = w.until("the worker idle", settled)
    counts = {
        ("stepwarden_tasks_claimed_total", "order"): ORDERS,
        ("stepwarden_tasks_claimed_total", "doomed"): 2,  # forward, then compensating
        ("stepwarden_tasks_claimed_total", "patient"): 3,  # start, after the timer, the event
        ("stepwarden_tasks_processed_total", "order"): ORDERS,
        ("stepwarden_tasks_processed_total", "patient"): 1,
        ("stepwarden_tasks_processed_total", "doomed"): 0,
        ("stepwarden_tasks_failed_total", "doomed"): 1,
        ("stepwarden_tasks_failed_total", "order"): 0,
        ("stepwarden_events_received_total", "patient"): 1,
        ("stepwarden_timers_fired_total", "patient"): 1,
        ("stepwarden_waits_timed_out_total", "patient"): 0,
    }
    for (name, workflow), n in counts.items():
        assert value(m, name, workflow=workflow) == n, (name, workflow)
    compensated = {"workflow": "doomed", "outcome": "compensated"}
    assert value(m, "stepwarden_tasks_compensated_total", **compensated) == 1
    steps = {
        # operation: (started, completed, failed, retried)
        "reserve": (ORDERS + 2, ORDERS + 2, 0, 0),
        "charge": (ORDERS, ORDERS, 0, 1),
        "refuse": (1, 0, 1, 0),
        "release": (1, 1, 0, 0),
    }
    for op, (started, completed, failed, retried) in steps.items():
        assert value(m, "stepwarden_steps_started_total", **shop(op)) == started, op
        assert value(m, "stepwarden_steps_completed_total", **shop(op)) == completed, op
        assert value(m, "stepwarden_steps_failed_total", **shop(op)) == failed, op
        assert value(m, "stepwarden_steps_retried_total", **shop(op)) == retried, op
        assert value(m, "stepwarden_steps_handed_back_total", **shop(op)) == 0, op
        # Every call claimed (or handed over in process) had its queue wait measured.
        assert value(m, "stepwarden_queue_wait_seconds_count", **shop(op)) == started, op
    tries = {("charge", "ok"): ORDERS, ("charge", "error"): 1, ("refuse", "error"): 1}
    for (op, outcome), n in tries.items():
        labels = {**shop(op), "outcome": outcome}
        assert value(m, "stepwarden_step_call_seconds_count", **labels) == n, (op, outcome)
    assert value(m, "stepwarden_steps_expired_total") == 0
    assert value(m, "stepwarden_alerts_total", reason="task_error") == 1
    assert sum(v for (name, _), v in m.items() if name == "stepwarden_alerts_total") == 1
    runs = {
        ("order", "processed"): ORDERS,
        ("doomed", "failed"): 1,
        ("doomed", "compensated"): 1,
        ("patient", "waiting"): 2,
        ("patient", "processed"): 1,
    }
    for (workflow, outcome), n in runs.items():
        labels = {"workflow": workflow, "outcome": outcome}
        assert value(m, "stepwarden_task_run_seconds_count", **labels) == n, labels
    # The tenant label names only the tenant the worker was told to: globex is one of the
    # others, and the tasks of no tenant are counted apart.
    by_tenant = {
        labels: v
        for (name, labels), v in m.items()
        if name == "stepwarden_tenant_tasks_ended_total"
    }
    assert by_tenant == {
        (("state", "processed"), ("tenant", "acme")): 1,
        (("state", "processed"), ("tenant", "_other")): 1,
        (("state", "processed"), ("tenant", "_none")): ORDERS - 2 + 1,  # order-3, patient
        (("state", "error"), ("tenant", "_none")): 1,  # doomed-1 failed, then
        (("state", "compensated"), ("tenant", "_none")): 1,  # was compensated
    }
    assert value(m, "stepwarden_store_write_seconds_count") > 0
    assert value(m, "stepwarden_agent_slots_free", agent="shop") == 10
    assert value(m, "stepwarden_agent_breaker", agent="shop", state="closed") == 1
    assert value(m, "stepwarden_agent_breaker", agent="shop", state="open") == 0
    assert value(m, "stepwarden_supervisor_leader") == 1
    # No label holds a task id.
    for _, labels in m:
        assert not any(v in expected for _, v in labels), labels

    assert w.stop() == 0
    _check_json_log(w.lines, expected)


def _listening(lines: list[str]) -> re.Match[str] | None:
    for line in list(lines):
        found = LISTENING.search(line)
        if found:
            return found
    return None


def _check_json_log(lines: list[str], tasks: dict[str, str]) -> None:
    records = [orjson.loads(line) for line in lines]  # every line is one JSON object
    for r in records:
        assert {"time", "level", "logger", "message"} <= r.keys(), r
        assert isinstance(r["message"], str)
    workflow_of = {t: t.split("-")[0] for t in tasks}

    # The application's own lines, logged inside its operations, carry the step's fields.
    calls = [r for r in records if r["logger"] == "metrics_app"]
    assert len(calls) == ORDERS + 2 + ORDERS + 1 + 1 + 1  # reserve, charge (+1 try), ...
    for r in calls:
        assert r["task_id"] in tasks, r
        assert r["workflow"] == workflow_of[r["task_id"]], r
        assert r["step"].startswith("shop."), r
        assert isinstance(r["seq"], int) and isinstance(r["attempt"], int), r
    [retry] = [r for r in calls if r["message"] == "charging, try 2"]
    assert (retry["task_id"], retry["step"], retry["seq"], retry["attempt"]) == (
        "order-1",
        "shop.charge",
        2,
        1,
    )
    # The engine's lines about a task carry its fields too: the task's run's, the call's.
    about = [
        r
        for r in records
        if r["logger"].startswith("stepwarden.")
        and any(re.search(rf"\b{re.escape(t)}\b", r["message"]) for t in tasks)
    ]
    assert any(r["logger"] == "stepwarden.scheduler" for r in about), about
    assert any(r["logger"] == "stepwarden.agent" for r in about), about
    assert any(r["logger"] == "stepwarden.supervisor" for r in about), about
    for r in about:
        assert r.get("task_id") in tasks, r
        assert r["task_id"] in r["message"], r
        if r["logger"] in ("stepwarden.scheduler", "stepwarden.agent"):
            assert r["workflow"] == workflow_of[r["task_id"]], r
            assert isinstance(r["attempt"], int), r


def test_a_metrics_port_taken_is_refused_in_one_line(store_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # Given through the environment variables, as a deployment would.
        env = {"STEPWARDEN_METRICS_PORT": str(port), "STEPWARDEN_METRICS_HOST": "127.0.0.1"}
        done = subprocess.run(
            [STEPWARDEN, "--store", store_url, "worker", APP],
            cwd=REPO,
            env=process_env(env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    line = done.stderr.rstrip("\n").splitlines()[-1]
    assert line.startswith(f"Error: --metrics-port: cannot listen on 127.0.0.1 port {port}"), line
    assert "Traceback" not in done.stderr
