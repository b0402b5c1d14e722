"""The metrics and logs operators read: the Grafana dashboard of docs/ queries only metrics
the engine exports (a worker's or the dashboard's), a worker's registry is its own, its
/metrics server answers as Prometheus expects, and the JSON log is one object a line."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import orjson
from opentelemetry import trace
from prometheus_client.core import Metric

import stepwarden as sw
from stepwarden import _logs
from stepwarden.dashboard._metrics import families as dashboard_families
from stepwarden.destinations import Destinations
from stepwarden.metrics import Metrics, serve

GRAFANA = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "stepwarden.json"
NAME = re.compile(r"\bstepwarden_[a-z0-9_]+\b")


def _sample_names(families: list[Metric]) -> set[str]:
    """The names of the series a family exports, by its type (whether or not it has
    samples yet: a labelled counter has none before its first count)."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_count", "_sum"),
        "info": ("_info",),
    }
    return {f.name + s for f in families for s in suffixes.get(f.type, ("",))}


class _Agent:
    def calls_in_flight(self) -> int:
        return 2

    def slots_free(self) -> int:
        return 8

    def breaker_state(self) -> str:
        return "open"


class _Supervisor:
    def leads(self) -> bool:
        return True


class _Scheduler:
    def tasks_held(self) -> int:
        return 3


def _worker_metrics() -> Metrics:
    m = Metrics()
    m.watch_agent("payments", _Agent())
    m.watch_scheduler(_Scheduler())
    m.watch_supervisor(_Supervisor())
    m.describe_worker("abc", ["agents", "scheduler", "supervisor"])
    return m


def _queries(node: Any) -> list[str]:
    """Every PromQL text of the dashboard: panel targets and template variable queries."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            promql = key in ("expr", "definition") or (key == "query" and "(" in str(value))
            if promql and isinstance(value, str):
                found.append(value)
            else:
                found.extend(_queries(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_queries(item))
    return found


async def test_every_metric_the_grafana_dashboard_queries_is_exported(tmp_path: Path) -> None:
    dashboard = json.loads(GRAFANA.read_text())
    queries = _queries(dashboard)
    panels = dashboard["panels"]
    assert panels and all(p["targets"] for p in panels)
    assert len(queries) >= len(panels)

    exported = _sample_names(list(_worker_metrics().registry.collect()))
    async with sw.App("grafana", store=f"sqlite:///{tmp_path / 'g.db'}") as app:
        exported |= _sample_names(await dashboard_families(app))

    named = {name for q in queries for name in NAME.findall(q)}
    assert named, queries
    assert named <= exported, sorted(named - exported)
    # Every kind of figure the worker exports is on the dashboard.
    worker = {n.rsplit("_", 1)[0] if n.endswith(("_bucket", "_count", "_sum")) else n
              for n in _sample_names(list(_worker_metrics().registry.collect()))}  # fmt: skip
    shown = {n.removesuffix("_bucket") for n in named}
    assert worker - {"stepwarden_worker_info"} <= shown | {"stepwarden_worker_info"}, sorted(
        worker - shown
    )


async def test_the_dashboard_shows_the_relays_backlog_and_its_oldest_messages_age(
    tmp_path: Path,
) -> None:
    """No worker runs: the status message a task's submit writes for a broker waits, and the
    dashboard's gauges show it and its age, growing; none waits on a store without any."""

    def gauges(families: list[Metric]) -> dict[str, float]:
        wanted = ("stepwarden_relay_lag_seconds", "stepwarden_relay_pending")
        return {s.name: s.value for f in families for s in f.samples if s.name in wanted}

    listed = Destinations.parse("own amqp://127.0.0.1:5999 *")
    async with sw.App(
        "relayed", store=f"sqlite:///{tmp_path / 'r.db'}", destinations=listed
    ) as app:

        @app.workflow()
        async def one(ctx: sw.Context, x: int) -> int:
            return x

        assert gauges(await dashboard_families(app)) == {
            "stepwarden_relay_lag_seconds": 0.0,
            "stepwarden_relay_pending": 0.0,
        }
        await app.submit_async(one, 1, reply_to="amqp://127.0.0.1:5999/replies")
        deadline = asyncio.get_running_loop().time() + 30
        while (seen := gauges(await dashboard_families(app)))["stepwarden_relay_lag_seconds"] <= 0:
            assert asyncio.get_running_loop().time() < deadline, seen
            await asyncio.sleep(0.05)
        assert seen["stepwarden_relay_pending"] == 1, seen


def test_each_worker_has_a_registry_of_its_own() -> None:
    a, b = Metrics(), Metrics()
    a.tasks_claimed(["order", "order"])
    b.tasks_claimed(["order"])
    assert a.registry is not b.registry
    assert a.registry.get_sample_value("stepwarden_tasks_claimed_total", {"workflow": "order"}) == 2
    assert b.registry.get_sample_value("stepwarden_tasks_claimed_total", {"workflow": "order"}) == 1


def test_the_gauges_are_read_at_each_scrape() -> None:
    m = _worker_metrics()
    r = m.registry
    assert r.get_sample_value("stepwarden_agent_calls_in_flight", {"agent": "payments"}) == 2
    assert r.get_sample_value("stepwarden_agent_slots_free", {"agent": "payments"}) == 8
    breaker = {"agent": "payments", "state": "open"}
    assert r.get_sample_value("stepwarden_agent_breaker", breaker) == 1
    assert r.get_sample_value("stepwarden_agent_breaker", {**breaker, "state": "closed"}) == 0
    assert r.get_sample_value("stepwarden_supervisor_leader") == 1
    assert r.get_sample_value("stepwarden_scheduler_tasks_held") == 3
    info = {"stepwarden_instance": "abc", "roles": "agents,scheduler,supervisor"}
    assert r.get_sample_value("stepwarden_worker_info", info) == 1


async def test_the_metrics_server_answers_get_metrics_only() -> None:
    m = _worker_metrics()
    m.step_claimed("payments", "charge", 0.2)
    server = await serve(m, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            ok = await client.get("/metrics")
            assert ok.status_code == 200
            assert ok.headers["content-type"].startswith("text/plain; version=")
            line = 'stepwarden_steps_started_total{agent="payments",operation="charge"} 1.0'
            assert line in ok.text.splitlines()
            assert (await client.get("/")).status_code == 404
            assert (await client.post("/metrics")).status_code == 405
            head = await client.head("/metrics")
            assert head.status_code == 200 and head.content == b""
    finally:
        server.close()
        await server.wait_closed()


def _json_lines(run: Any) -> list[dict[str, Any]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(sw.JsonFormatter())
    log = logging.getLogger("tests.json_log")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        run(log)
    finally:
        log.removeHandler(handler)
    text = out.getvalue()
    assert text.endswith("\n")
    return [orjson.loads(line) for line in text.splitlines()]


async def test_a_json_line_carries_the_task_its_context_is_about() -> None:
    async def drive(log: logging.Logger) -> None:
        _logs.about_task("order-42", "process_order", 3)
        log.info("driving %s", "order-42")

    async def call(log: logging.Logger) -> None:
        _logs.about_step("order-42", "process_order", "payments.charge", 2, 1)
        log.warning("charging\nFORGED line \x1b[31m\u202e")

    [outside] = _json_lines(lambda log: log.info("about nothing"))
    assert set(outside) == {"time", "level", "logger", "message"}
    assert outside["level"] == "INFO" and outside["logger"] == "tests.json_log"
    assert outside["time"].endswith("+00:00")

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(sw.JsonFormatter())
    log = logging.getLogger("tests.json_log.tasks")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        await asyncio.create_task(drive(log))
        await asyncio.create_task(call(log))
        log.info("after them")  # their context stayed in their tasks
    finally:
        log.removeHandler(handler)
    raw = out.getvalue().splitlines()
    collected: list[dict[str, Any]] = [orjson.loads(line) for line in raw]
    assert len(raw) == 3  # the newline in the message is an escape, not a forged line
    run_line, call_line, after = collected
    assert {k: run_line[k] for k in ("task_id", "workflow", "attempt")} == {
        "task_id": "order-42",
        "workflow": "process_order",
        "attempt": 3,
    }
    assert "step" not in run_line and "seq" not in run_line
    assert {k: call_line[k] for k in _logs.FIELDS} == {
        "task_id": "order-42",
        "workflow": "process_order",
        "step": "payments.charge",
        "seq": 2,
        "attempt": 1,
    }
    assert call_line["message"] == "charging\nFORGED line \x1b[31m\u202e"
    assert "\\u202e" in raw[1] and "\x1b" not in raw[1]
    assert "task_id" not in after


def test_a_json_line_names_the_current_span() -> None:
    context = trace.SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=trace.TraceFlags(1),
    )
    with trace.use_span(trace.NonRecordingSpan(context)):
        [line] = _json_lines(lambda log: log.info("in a span"))
    assert line["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert line["span_id"] == "00f067aa0ba902b7"
    [outside] = _json_lines(lambda log: log.info("outside"))
    assert "trace_id" not in outside


def test_a_json_line_keeps_the_traceback_in_one_field() -> None:
    def run(log: logging.Logger) -> None:
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            log.exception("it failed")

    [line] = _json_lines(run)
    assert line["level"] == "ERROR"
    assert "ValueError: bad" in line["exception"]


async def test_a_flush_shared_by_two_tasks_runs_about_neither() -> None:
    """A group commit serves whoever submits: its lines are not about the first submitter's
    task (the flush runs in a context of its own)."""
    from stepwarden._batch import Batcher

    seen: list[dict[str, Any]] = []

    async def flush(items: Any) -> list[int]:
        seen.append(_logs.about())
        return [len(seen)] * len(items)

    batcher: Batcher[str, int] = Batcher(flush)

    async def drive(task_id: str) -> int:
        _logs.about_task(task_id, "wf", 1)
        return await batcher.submit(task_id)

    await asyncio.gather(drive("A"), drive("B"))
    assert seen == [{}]


def test_a_line_naming_another_task_takes_nothing_from_the_context() -> None:
    async def run() -> str:
        _logs.about_task("A", "wf-a", 3)
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "task B: set aside", (), None)
        record.task_id = "B"
        return _logs.JsonFormatter().format(record)

    line = json.loads(asyncio.run(run()))
    assert line["task_id"] == "B" and "workflow" not in line and "attempt" not in line
