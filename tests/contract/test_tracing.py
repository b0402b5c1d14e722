"""OpenTelemetry traces in one process, on each store, with the SDK's in-memory exporter: a
task is one trace, its submit's; each run a span under the submit linked to the run before
it; each dispatch a span under its run; each call under its dispatch, current while the
operation runs; and the trace context stored with the task and its steps (none when tracing
is off)."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

import stepwarden as sw
from stepwarden import tracing

from ..support.worker import running
from ..tracing_support import Rec, named, one, records, sdk

WITHIN = timedelta(seconds=30)


def traceparent(stored: str | None) -> tuple[str, str]:
    """The (trace id, span id) a stored trace context names."""
    assert stored is not None
    _, trace_id, span_id, _ = orjson.loads(stored)["traceparent"].split("-")
    return trace_id, span_id


async def finished(exporter: Any, prefix: str, count: int) -> list[Rec]:
    """The finished spans once `count` of them are named `prefix...` (a run's span ends just
    after its task's end is recorded, which is what a result waits for)."""
    async with asyncio.timeout(20):
        while True:
            spans = records(exporter.get_finished_spans())
            if len(named(spans, prefix)) >= count:
                return spans
            await asyncio.sleep(0.02)


async def test_a_task_is_one_trace_from_its_submit_through_its_runs_dispatches_and_calls(
    store_url: str,
) -> None:
    with sdk() as (provider, exporter):
        app = sw.App("traced", store=store_url)
        svc = app.agent("svc", retry=sw.Retry(max_attempts=3, initial=0.001, maximum=0.01))
        tried: set[str] = set()

        @svc.operation
        async def first(call: sw.Call, x: int) -> int:
            if call.idempotency_key not in tried:
                tried.add(call.idempotency_key)
                raise ConnectionError("the service blinked")
            return x + 1

        @svc.operation
        def second(call: sw.Call, x: int) -> int:  # sync: in a thread, the context copied
            span = tracing.current_span()
            assert span is not None
            return x * 2

        @app.workflow(complete_within=WITHIN)
        async def flow(ctx: sw.Context, x: int) -> int:
            a = await ctx.step(first, x)
            await ctx.sleep(timedelta(milliseconds=100))
            return int(await ctx.step(second, a))

        async with app, running(app):
            with provider.get_tracer("test").start_as_current_span("request") as request:
                task_id = await app.submit_async(flow, 1, task_id="t-1")
            assert await app.result_async(task_id, timeout=30) == 4
            spans = await finished(exporter, "run ", 2)
            task = await app.status_async(task_id)
            steps = await (await app.store()).get_steps(task_id)

    trace_id = format(request.get_span_context().trace_id, "032x")
    # The supervisor's sweep that woke the task is a trace of its own.
    sweep = one(spans, "supervisor sweep")
    wake = one(spans, "wake t-1")
    assert wake.parent_id == sweep.span_id
    assert wake.attr("stepwarden.waited_for") == "timer"
    spans = [s for s in spans if s.trace_id != sweep.trace_id]
    assert {s.trace_id for s in spans} == {trace_id}, [s.name for s in spans]

    submit = one(spans, "submit flow")
    assert submit.kind == "PRODUCER"
    assert submit.parent_id == format(request.get_span_context().span_id, "016x")
    assert submit.attr("stepwarden.task_id") == task_id
    assert submit.attr("stepwarden.outcome") == "created"
    assert traceparent(task.trace_context) == (trace_id, submit.span_id)

    runs = named(spans, "run flow")
    first_run, second_run = sorted(runs, key=lambda s: int(s.attr("stepwarden.task_attempt")))
    for run in (first_run, second_run):
        assert run.kind == "CONSUMER"
        assert run.parent_id == submit.span_id
        assert run.attr("stepwarden.workflow") == "flow"
        assert run.attr("stepwarden.version") == 1
    assert first_run.attr("stepwarden.outcome") == "waiting"
    assert second_run.attr("stepwarden.outcome") == "processed"
    assert first_run.links == []
    assert second_run.links == [(trace_id, first_run.span_id)]
    assert traceparent(task.run_trace) == (trace_id, second_run.span_id)

    dispatches = {s.attr("stepwarden.seq"): s for s in named(spans, "dispatch ")}
    calls = {s.attr("stepwarden.seq"): s for s in named(spans, "call ")}
    first_step, second_step = sorted(steps, key=lambda s: s.seq)  # the timer is between
    assert dispatches[first_step.seq].parent_id == first_run.span_id
    assert dispatches[second_step.seq].parent_id == second_run.span_id
    for step in steps:
        dispatch, call = dispatches[step.seq], calls[step.seq]
        assert traceparent(step.trace_context) == (trace_id, dispatch.span_id)
        assert dispatch.kind == "PRODUCER"
        assert dispatch.attr("stepwarden.outcome") == "completed"
        assert dispatch.attr("stepwarden.idempotency_key") == f"{task_id}/{step.seq}"
        assert call.kind == "CONSUMER"
        assert call.parent_id == dispatch.span_id
        assert call.attr("stepwarden.task_id") == task_id
        assert call.attr("stepwarden.attempt") == 1
        assert call.attr("stepwarden.idempotency_key") == f"{task_id}/{step.seq}"
        assert call.attr("stepwarden.agent_instance")
        assert call.attr("stepwarden.outcome") == "completed"
        assert call.attr("messaging.system") == "stepwarden"
        assert call.attr("code.function.name").endswith(step.operation)
    # The first call failed once: an exception event, then a retry, then its answer.
    assert calls[first_step.seq].events == ["exception", "stepwarden.retry"]
    assert calls[first_step.seq].attr("stepwarden.tries") == 2
    assert calls[second_step.seq].events == []


async def test_untraced_a_task_stores_no_trace_context_and_makes_no_span(
    store_url: str,
) -> None:
    assert not tracing.active()
    app = sw.App("plain", store=store_url)
    svc = app.agent("svc")

    @svc.operation
    async def echo(call: sw.Call, x: int) -> int:
        assert tracing.current_span() is None
        return x

    @app.workflow(complete_within=WITHIN)
    async def flow(ctx: sw.Context, x: int) -> int:
        return int(await ctx.step(echo, x))

    async with app, running(app):
        task_id = await app.submit_async(flow, 3)
        assert await app.result_async(task_id, timeout=30) == 3
        task = await app.status_async(task_id)
        [step] = await (await app.store()).get_steps(task_id)
    assert (task.trace_context, task.run_trace, step.trace_context) == (None, None, None)


async def test_submits_in_a_transaction_and_in_a_batch_are_traced(store_url: str) -> None:
    with sdk() as (_, exporter):
        app = sw.App("batch", store=store_url)

        @app.workflow(complete_within=WITHIN)
        async def flow(ctx: sw.Context, x: int) -> int:
            return x

        async with app:
            async with app.transaction() as tx:
                await tx.submit(flow, 1, task_id="in-tx")
            created = await app.submit_many_async(
                [app.new_task(flow, n, task_id=f"many-{n}") for n in range(3)]
            )
            assert [a.created for a in created] == [True, True, True]
            tasks = {t: await app.status_async(t) for t in ("in-tx", "many-0", "many-2")}
        spans = records(exporter.get_finished_spans())
    submits = named(spans, "submit flow")
    assert len(submits) == 2
    [in_tx] = [s for s in submits if s.attr("stepwarden.task_id") == "in-tx"]
    [many] = [s for s in submits if s.attr("stepwarden.task_id") is None]
    assert in_tx.attr("stepwarden.task_id") == "in-tx"
    assert traceparent(tasks["in-tx"].trace_context) == (in_tx.trace_id, in_tx.span_id)
    assert many.attr("messaging.batch.message_count") == 3
    assert many.attr("stepwarden.created") == 3
    for t in ("many-0", "many-2"):
        assert traceparent(tasks[t].trace_context) == (many.trace_id, many.span_id)


async def test_a_failed_task_is_compensated_under_its_trace(store_url: str) -> None:
    with sdk() as (_, exporter):
        app = sw.App("undo", store=store_url)
        svc = app.agent("svc")

        @svc.operation
        async def reserve(call: sw.Call, x: int) -> int:
            return x

        @svc.operation
        async def release(call: sw.Call, x: int) -> int:
            return x

        @svc.operation
        async def charge(call: sw.Call, x: int) -> int:
            raise sw.PermanentError("card declined")

        @app.workflow(complete_within=WITHIN)
        async def order(ctx: sw.Context, x: int) -> int:
            await ctx.step(reserve, x, compensate=release)
            return int(await ctx.step(charge, x))

        async with app, running(app):
            task_id = await app.submit_async(order, 1)
            with pytest.raises(sw.TaskFailed):
                await app.result_async(task_id, timeout=30)
            spans = await finished(exporter, "compensate order", 1)
    submit = one(spans, "submit order")
    run = one(spans, "run order")
    undo = one(spans, "compensate order")
    assert {s.trace_id for s in spans} == {submit.trace_id}
    assert run.parent_id == undo.parent_id == submit.span_id
    assert undo.links == [(run.trace_id, run.span_id)]
    assert run.attr("stepwarden.outcome") == "failed"  # then compensating, by on_failure
    assert run.status == "ERROR"
    assert undo.attr("stepwarden.outcome") == "compensated"
    failed = one(spans, "call svc.charge")
    assert failed.status == "ERROR"
    assert failed.attr("stepwarden.outcome") == "failed"
    assert "exception" in failed.events
    assert one(spans, "dispatch svc.charge").status == "ERROR"
    assert one(spans, "call svc.release").parent_id == one(spans, "dispatch compensate").span_id


class _Headers(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A local HTTP server that keeps the headers of each request it receives."""
    seen: list[dict[str, str]] = []
    handler = type("Handler", (_Headers,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/charge", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


async def test_an_operations_instrumented_http_call_joins_its_call_span(
    store_url: str, receiver: tuple[str, list[dict[str, str]]]
) -> None:
    url, seen = receiver
    with sdk() as (_, exporter):
        app = sw.App("http", store=store_url)
        svc = app.agent("svc")

        @svc.operation
        async def charge(call: sw.Call, target: str) -> int:
            async with httpx.AsyncClient() as client:
                HTTPXClientInstrumentor.instrument_client(client)
                answer = await client.get(target, headers={"Idempotency-Key": call.idempotency_key})
            return answer.status_code

        @app.workflow(complete_within=WITHIN)
        async def pay(ctx: sw.Context, target: str) -> int:
            return int(await ctx.step(charge, target))

        async with app, running(app):
            task_id = await app.submit_async(pay, url)
            assert await app.result_async(task_id, timeout=30) == 200
            spans = await finished(exporter, "run pay", 1)
    [headers] = seen
    _, trace_id, span_id, _ = headers["traceparent"].split("-")
    call = one(spans, "call svc.charge")
    [client] = [s for s in spans if s.span_id == span_id]
    assert client.kind == "CLIENT"
    assert client.parent_id == call.span_id
    assert trace_id == call.trace_id == one(spans, "submit pay").trace_id


async def test_a_child_task_is_traced_under_its_parents_run(store_url: str) -> None:
    with sdk() as (_, exporter):
        app = sw.App("family", store=store_url)
        svc = app.agent("svc")

        @svc.operation
        async def work(call: sw.Call, x: int) -> int:
            return x

        @app.workflow(complete_within=WITHIN)
        async def kid(ctx: sw.Context, x: int) -> int:
            return int(await ctx.step(work, x))

        @app.workflow(complete_within=WITHIN)
        async def parent(ctx: sw.Context, x: int) -> int:
            return int(await ctx.child(kid, x)) + 1

        async with app, running(app):
            task_id = await app.submit_async(parent, 1)
            assert await app.result_async(task_id, timeout=30) == 2
            spans = await finished(exporter, "run parent", 2)
    submit = one(spans, "submit parent")
    parent_runs = named(spans, "run parent")
    [first] = [r for r in parent_runs if r.attr("stepwarden.task_attempt") == 1]
    child_run = one(spans, "run kid")
    assert child_run.attr("stepwarden.task_id") == f"{task_id}:1"
    assert child_run.parent_id == first.span_id
    assert {s.trace_id for s in (*parent_runs, child_run)} == {submit.trace_id}
    assert one(spans, "call svc.work").trace_id == submit.trace_id


async def test_a_cancelled_call_says_so_on_its_span(store_url: str) -> None:
    with sdk() as (_, exporter):
        app = sw.App("cancel", store=store_url)
        svc = app.agent("svc", retry=sw.Retry(max_attempts=1))
        started = asyncio.Event()

        @svc.operation
        async def wait_long(call: sw.Call, x: int) -> int:
            started.set()
            await asyncio.Event().wait()  # until the cancel reaches the call
            return x

        @app.workflow(complete_within=timedelta(seconds=60))
        async def long(ctx: sw.Context, x: int) -> int:
            return int(await ctx.step(wait_long, x))

        async with app, running(app):
            task_id = await app.submit_async(long, 1)
            async with asyncio.timeout(20):
                await started.wait()
            assert await app.cancel_async(task_id, reason="not needed") == sw.TaskState.CANCELLED
            spans = await finished(exporter, "call svc.wait_long", 1)
    call = one(spans, "call svc.wait_long")
    assert call.attr("stepwarden.outcome") == "cancelled"
    assert call.events == ["stepwarden.cancelled"]
