"""A real Prometheus (Debian's `prometheus`, on a port of the test's own, its data in the
test's folder) scrapes two workers and the dashboard through a known workload: steps that
complete, one retried, one failed for good and its task compensated, a wait timed out, a
timer and an event, a step past its complete_by, one never picked up, and an agent instance
whose service is down, so that its breaker opens and it hands its step back; alerts are
raised. Then every query of the Grafana dashboard in docs/grafana/ (`$workflow` as `.*`,
`$__rate_interval` as 4 scrape intervals) is evaluated through Prometheus's HTTP API and
returns series; the alerting rules of docs/prometheus/ load and evaluate there, and those
the workload is about are pending. A worker's instance id reaches Prometheus as the label
`stepwarden_instance`: none is renamed `exported_instance`."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import stepwarden as sw

from ..brokers.own import free_port
from .harness import APP_REF, ROOT, Cluster, Proc

GRAFANA = ROOT / "docs" / "grafana" / "stepwarden.json"
ALERTS = ROOT / "docs" / "prometheus" / "alerts.yml"
SCRAPE = 1  # seconds between scrapes
RATE_INTERVAL = f"{4 * SCRAPE}s"
METRICS_AT = re.compile(r"metrics at (http://[^/\s]+)/metrics")
DASHBOARD_AT = re.compile(r"stepwarden dashboard of \S+: (http://[^/\s]+)/")
DASHBOARD_TOKEN = "prometheus-scenario-token-3c9a"
FINISHED = {
    sw.TaskState.PROCESSED,
    sw.TaskState.ERROR,
    sw.TaskState.COMPENSATED,
    sw.TaskState.COMPENSATION_FAILED,
}


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30)
        assert answer.status_code == 200, (expr, answer.text)
        body = answer.json()
        assert body["status"] == "success", (expr, body)
        assert body["data"]["resultType"] == "vector", (expr, body)
        return list(body["data"]["result"])

    def api(self, path: str, **params: str) -> Any:
        answer = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        assert answer.status_code == 200, (path, answer.text)
        return answer.json()["data"]


def _prometheus_config(workers: list[str], dashboard: str) -> dict[str, Any]:
    """Two jobs, as an operator would scrape them: every worker, and the dashboard."""
    return {
        "global": {"scrape_interval": f"{SCRAPE}s", "evaluation_interval": f"{SCRAPE}s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": "workers", "static_configs": [{"targets": workers}]},
            {"job_name": "dashboard", "static_configs": [{"targets": [dashboard]}]},
        ],
    }


@contextlib.contextmanager
def running_prometheus(workdir: Path, config: dict[str, Any]) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: `make packages` installs Debian's package"
    # JSON is YAML: the config file Prometheus reads.
    (workdir / "prometheus.yml").write_text(json.dumps(config, indent=1))
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        # Until its storage is open it answers 503 to queries: wait until it says it is ready.
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/-/ready", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline, "Prometheus not ready within 60 s"
            time.sleep(0.1)
        yield Prometheus(url, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start_dashboard(c: Cluster) -> tuple[Proc, str]:
    """`stepwarden dashboard` of the scenario App on the cluster's store: its address."""
    log_path = c.workdir / "dashboard.log"
    log_file = open(log_path, "ab")  # noqa: SIM115 - closed by the cluster's close()
    popen = subprocess.Popen(
        [
            sys.executable, "-c", "from stepwarden.cli import main; main()",
            "--app", APP_REF, "--store", c.store_url, "dashboard", "--port", "0",
        ],
        cwd=ROOT,
        env={**c.env, "STEPWARDEN_DASHBOARD_TOKEN": DASHBOARD_TOKEN},
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    proc = Proc("dashboard", popen, log_path, log_file)
    c.procs.append(proc)
    found = c.wait_until(lambda: DASHBOARD_AT.search(proc.log()), "the dashboard's address")
    return proc, found.group(1).removeprefix("http://")


def _metrics_target(c: Cluster, worker: Proc) -> str:
    """The host:port of a worker's /metrics (`--metrics-port 0`), as its log names it."""

    def named() -> re.Match[str] | None:
        return METRICS_AT.search(worker.log())

    return c.wait_until(named, f"{worker.name}'s metrics address").group(1).removeprefix("http://")


def _queries(node: Any) -> list[str]:
    """Every `expr` of the Grafana dashboard, wherever it stands."""
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [q for value in node.values() for q in _queries(value)]
    if isinstance(node, list):
        return [q for item in node for q in _queries(item)]
    return []


@pytest.fixture
def sqlite_cluster(sqlite_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(sqlite_url, tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_prometheus_scrapes_a_known_workload_and_every_dashboard_query_returns_series(
    sqlite_cluster: Cluster,
) -> None:
    c = sqlite_cluster
    # a: the scheduler, the supervisor and agent svc; b: agents svc and edge, edge's
    # service down from there (every call raises ConnectionError): its breaker opens.
    a = c.start("a", "--roles", "scheduler,supervisor,agents", "--agents", "svc",
                "--metrics-port", "0")  # fmt: skip
    b = c.start("b", "--roles", "agents", "--agents", "svc,edge", "--metrics-port", "0",
                env={"SCENARIO_DOWN": "1"})  # fmt: skip
    a_target, b_target = (_metrics_target(c, p) for p in (a, b))
    _, dashboard = _start_dashboard(c)
    config = _prometheus_config([a_target, b_target], dashboard)

    with running_prometheus(c.workdir, config) as prom:

        def up() -> list[dict[str, Any]] | None:
            assert prom.proc.poll() is None, prom.log.read_text()
            with contextlib.suppress(httpx.TransportError):
                found = prom.query("up == 1")
                return found if len(found) == 3 else None
            return None

        c.wait_until(up, "Prometheus to scrape the two workers and the dashboard", timeout=60)

        never = str(c.workdir / "never")
        workload: dict[str, list[dict[str, Any]]] = {
            "ok-1": [{}, {}],
            "ok-2": [{"async": True}],
            "retried": [{"fail_times": 1}],
            "declined": [{"undo": {}}, {"permanent": "declined"}],
            "timed-out": [{"wait_event": "never", "timeout": 0.5}],
            "evented": [{"sleep": 0.2}, {"wait_event": "go", "timeout": 60}],
            "late": [
                {"block_until": never, "block_attempts": [1], "block_limit": 4, "within": 1.0}
            ],
            "unpicked": [{"op": "lim.pair", "pickup_within": 1.0}],
            "edge": [{"op": "edge.act", "within": 60}],
        }
        for task_id, steps in workload.items():
            c.submit(task_id, steps)

        def waits_for_go() -> bool:
            return c.status("evented").waiting_for == "event:go"

        c.wait_until(waits_for_go, "evented to wait for its event", task_ids=("evented",))
        c.app.send_event("evented", "go", {"by": "ana"})
        ending = [t for t in workload if t != "edge"]

        def ended() -> bool:
            return all(c.status(t).process_state in FINISHED for t in ending)

        c.wait_until(ended, "the workload's tasks to end", timeout=90, task_ids=tuple(ending))
        states = {t: c.status(t).process_state for t in ending}
        assert states["declined"] == sw.TaskState.COMPENSATED, c.why("", "declined")
        assert states["unpicked"] == sw.TaskState.ERROR, c.why("", "unpicked")

        def handed_back() -> bool:
            return any(e.kind == "handed_back" for e in c.app.show("edge").events)

        c.wait_until(handed_back, "b's breaker to open and hand the step back", task_ids=("edge",))

        # Every query of the Grafana dashboard returns series, once Prometheus has scraped
        # what the workload made (a rate needs two scrapes of a series).
        dashboard_json = json.loads(GRAFANA.read_text())
        queries = _queries(dashboard_json)
        assert len(queries) >= 30, queries
        for query in queries:
            expr = query.replace("$workflow", ".*").replace("$__rate_interval", RATE_INTERVAL)
            assert "$" not in expr, expr
            c.wait_until(functools.partial(prom.query, expr), f"series of {expr}", timeout=60)
        variable = prom.api(
            "label/workflow/values", **{"match[]": "stepwarden_tasks_claimed_total"}
        )
        assert "steps" in variable, variable

        def sample(expr: str) -> dict[tuple[tuple[str, str], ...], float]:
            return {
                tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in prom.query(expr)
            }

        # What the workload did, as Prometheus has it.
        swept = sample("sum by (kind) (stepwarden_steps_swept_total)")
        assert swept.get((("kind", "pickup"),), 0) >= 1, swept
        assert sum(sample("sum(stepwarden_steps_handed_back_total)").values()) >= 1
        assert sum(sample("sum(stepwarden_steps_expired_total)").values()) >= 1
        assert sum(sample("sum(stepwarden_waits_timed_out_total)").values()) == 1
        assert sum(sample("sum(stepwarden_events_received_total)").values()) == 1
        compensated = sample("sum by (outcome) (stepwarden_tasks_compensated_total)")
        assert compensated.get((("outcome", "compensated"),)) == 1, compensated
        alerts = sample("sum by (reason) (stepwarden_alerts_total)")
        assert alerts.get((("reason", "task_error"),), 0) >= 2, alerts
        opened = sample('stepwarden_agent_breaker{agent="edge", state="open"}')
        assert [dict(k)["instance"] for k, v in opened.items() if v == 1] == [b_target], opened

        # The workers' ids are stepwarden_instance; instance stays the target's address.
        info = {
            dict(k)["instance"]: dict(k)["stepwarden_instance"]
            for k in sample("stepwarden_worker_info")
        }
        assert info == {
            a_target: a.instance(),
            b_target: b.instance(),
        }, info
        assert prom.query('{exported_instance!=""}') == []
        agents = sample("stepwarden_agent_alive")
        assert {dict(k)["stepwarden_instance"] for k in agents}, agents
        assert all(dict(k)["instance"] == dashboard for k in agents), agents

        # The shipped alerting rules load, and evaluate without error on these series; the
        # tasks in error and the open breaker have made theirs pending (each has a `for`).
        def evaluated() -> list[dict[str, Any]] | None:
            rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
            # A rule not yet evaluated has Go's zero time as its lastEvaluation.
            done = all(not r["lastEvaluation"].startswith("0001-") for r in rules)
            return rules if rules and done and all(r["health"] == "ok" for r in rules) else None

        rules = c.wait_until(evaluated, "the alerting rules to be evaluated", timeout=60)
        assert {r["name"] for r in rules} == {
            "StepwardenTasksInError",
            "StepwardenSupervisorLeaderStuck",
            "StepwardenOldestPendingTask",
            "StepwardenRelayLag",
            "StepwardenBreakerOpen",
        }
        active = {a["labels"]["alertname"]: a for a in prom.api("alerts")["alerts"]}
        assert {"StepwardenTasksInError", "StepwardenBreakerOpen"} <= set(active), active
        # Nothing has waited five minutes: neither the queue's nor the relay's is pending.
        assert not {"StepwardenOldestPendingTask", "StepwardenRelayLag"} & set(active), active
        assert active["StepwardenBreakerOpen"]["labels"]["instance"] == b_target, active
        assert prom.proc.poll() is None, prom.log.read_text()
