"""One trace across processes, a SIGKILL, a retry and a durable timer: a task submitted inside
a FastAPI request (instrumented by opentelemetry-instrumentation-fastapi) is followed through
its steps in two worker processes, each writing its finished spans as JSON lines
(`traced_app.JsonLines`), and the parent and link relations hold across them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson
import pytest
from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import TracerProvider

from ..tracing_support import Rec, named, one, records, sdk
from . import traced_app
from .harness import Cluster

pytestmark = pytest.mark.slow

APP = "tests.scenarios.traced_app:app"
QUICK = (
    "--scheduler-heartbeat", "0.2", "--scheduler-gone-after", "1",
    "--agent-heartbeat", "0.2", "--agent-gone-after", "1",
)  # fmt: skip


async def _submit_in_a_request(store_url: str, provider: TracerProvider) -> str:
    """POST /orders/order-1 to a FastAPI service (instrumented) whose endpoint submits."""
    app = traced_app.build_app(store_url)
    api = FastAPI()

    @api.post("/orders/{order_id}")
    async def order(order_id: str) -> dict[str, str]:
        task_id = await app.submit_async("traced", {"id": order_id}, task_id=order_id)
        return {"task_id": task_id}

    FastAPIInstrumentor.instrument_app(api, tracer_provider=provider)
    async with app:
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop.test") as client:
            answer = await client.post("/orders/order-1")
    answer.raise_for_status()
    return str(answer.json()["task_id"])


def _written(path: Path) -> list[Rec]:
    """The spans the workers have written so far (a line still being written is left out)."""
    if not path.exists():
        return []
    spans = []
    for line in path.read_bytes().split(b"\n")[:-1]:
        s = orjson.loads(line)
        spans.append(
            Rec(
                name=s["name"],
                trace_id=s["trace_id"],
                span_id=s["span_id"],
                parent_id=s["parent_id"],
                kind=s["kind"],
                attributes=s["attributes"],
                events=s["events"],
                links=[(t, i) for t, i in s["links"]],
                status=s["status"],
                process=s["process"],
            )
        )
    return spans


def _span_id(stored: str | None) -> str:
    assert stored is not None
    return str(orjson.loads(stored)["traceparent"].split("-")[2])


def test_one_trace_from_a_web_request_through_two_workers_a_kill_a_retry_and_a_sleep(
    cluster: Cluster, tmp_path: Path
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {traced_app.SPANS_ENV: str(spans_file), traced_app.DIR_ENV: str(marks)}
    a = cluster.start("worker-a", *QUICK, env=env, app=APP)
    with sdk() as (provider, exporter):
        task_id = asyncio.run(_submit_in_a_request(cluster.store_url, provider))
        here = records(exporter.get_finished_spans())
    app = traced_app.build_app(cluster.store_url)
    try:
        cluster.wait_until(
            (marks / "second").exists, "worker-a to call the second step", task_ids=(task_id,)
        )
        steps = {s.seq: s for s in app.show(task_id).steps}
        first_dispatch_of_second = _span_id(steps[2].trace_context)
        cluster.kill(a)
        # The run worker-a held when it was killed (its first, or a later one when its hold
        # ran out on a busy machine and it claimed the task again): its span never ended.
        killed_run = _span_id(app.status(task_id).run_trace)
        b = cluster.start("worker-b", *QUICK, env=env, app=APP)
        result = app.result(task_id, timeout=60)
        assert result == [a.pid, b.pid, b.pid]

        def last_run_written() -> list[Rec] | None:
            """Every span the assertions read: the last run's, and the sweeps' of the kill."""
            written = _written(spans_file)
            ended = [s.attr("stepwarden.outcome") for s in named(written, "run ")]
            released = named(written, f"release {task_id}")
            reassigned = named(written, "reassigned step 2")
            sweeps = {s.span_id for s in named(written, "supervisor sweep")}
            done = "processed" in ended and named(written, "call svc.third")
            swept = released and reassigned
            kept = all(s.parent_id in sweeps for s in released + reassigned)
            return written if done and swept and kept else None

        spans = cluster.wait_until(
            last_run_written, "worker-b's spans of the last run", task_ids=(task_id,)
        )
        task = app.status(task_id)
    finally:
        app.close()

    # The web request's span is the submit's parent; every span of the task is in its trace.
    [request] = [s for s in here if s.kind == "SERVER"]
    assert request.name == "POST /orders/{order_id}"
    submit = one(here, "submit traced")
    assert submit.parent_id == request.span_id
    assert submit.attr("stepwarden.task_id") == task_id
    trace_id = request.trace_id
    # worker-b's supervisor released the task of the killed worker and reassigned its step:
    # spans of its sweeps, each a trace of its own.
    released = one(spans, f"release {task_id}")
    assert released.attr("stepwarden.scheduler").endswith(str(cluster.procs[0].instance()))
    reassigned = one(spans, f"reassigned step 2 of {task_id}")
    sweeps = {s.span_id: s for s in named(spans, "supervisor sweep")}
    assert released.parent_id in sweeps and reassigned.parent_id in sweeps
    spans = [s for s in spans if s.name.startswith(("run ", "dispatch ", "call "))]
    assert {s.trace_id for s in spans} == {trace_id}, cluster.why("one trace", task_id)
    assert _span_id(task.trace_context) == submit.span_id

    # worker-a: the first run's first step (its run's span was open when it was killed).
    of_a = [s for s in spans if s.process == a.pid]
    of_b = [s for s in spans if s.process == b.pid]
    assert of_a and of_b and len(of_a) + len(of_b) == len(spans)
    dispatch_first = one(of_a, "dispatch svc.first")
    call_first = one(of_a, "call svc.first")
    assert call_first.parent_id == dispatch_first.span_id
    first_run = dispatch_first.parent_id
    assert first_run not in {s.span_id for s in spans}  # worker-a's first run never ended
    assert not named(of_a, "run ")  # still open when the process was killed

    # worker-b: a run after the kill linked to worker-a's last run, then one after the timer
    # linked to it (more if the store's timing made a run stop early: each links to the last).
    runs = sorted(named(of_b, "run traced"), key=lambda s: int(s.attr("stepwarden.task_attempt")))
    assert len(runs) >= 2, [r.attributes for r in runs]
    assert killed_run not in {s.span_id for s in spans}  # open when it was killed
    previous = killed_run
    for run in runs:
        assert run.parent_id == submit.span_id
        assert run.links == [(trace_id, previous)]
        previous = run.span_id
    assert runs[-1].attr("stepwarden.outcome") == "processed"
    assert "waiting" in [r.attr("stepwarden.outcome") for r in runs]
    assert _span_id(task.run_trace) == runs[-1].span_id

    # The second step retried in worker-b (attempt 2, the same idempotency key), under a
    # dispatch of worker-a's run or of its own, and the third step under the last run.
    run_ids = {r.span_id for r in runs}
    retried = one(of_b, "call svc.second")
    assert retried.attr("stepwarden.attempt") == 2
    assert retried.attr("stepwarden.idempotency_key") == f"{task_id}/2"
    dispatches_of_second = {s.span_id for s in named(of_b, "dispatch svc.second")}
    assert all(s.parent_id in run_ids for s in named(of_b, "dispatch svc.second"))
    assert retried.parent_id in dispatches_of_second | {first_dispatch_of_second}
    call_third = one(of_b, "call svc.third")
    dispatch_third = one(of_b, "dispatch svc.third")
    assert call_third.parent_id == dispatch_third.span_id
    assert dispatch_third.parent_id == runs[-1].span_id
