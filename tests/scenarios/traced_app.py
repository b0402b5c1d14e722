"""The application of the traces' scenario test, run in real worker processes.

    STEPWARDEN_STORE=... TRACED_SPANS=/tmp/spans.jsonl TRACED_DIR=/tmp/marks \\
        stepwarden --app tests.scenarios.traced_app:app worker

With TRACED_SPANS set, the process configures OpenTelemetry's SDK at import: each span, once
it ends, is written at once (a SimpleSpanProcessor: a SIGKILL loses only the spans still
open) as one JSON line appended to that file, with the process's pid (`JsonLines`).

The workflow `traced` takes three steps (`first`, `second`, `third`) with a durable timer
between the second and the third. `second`, at its first attempt, writes the file `second`
in TRACED_DIR and then never answers: the test kills its process there.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import stepwarden as sw

STORE_ENV = "STEPWARDEN_STORE"
SPANS_ENV = "TRACED_SPANS"
DIR_ENV = "TRACED_DIR"
#: Never opened: the test process builds its own App with `build_app(url)`.
DEFAULT_STORE = "sqlite:///stepwarden-traced.db"


class JsonLines(SpanExporter):
    """Finished spans as JSON lines appended to a file, one write each (the ids in hex)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = b"".join(orjson.dumps(_json(s)) + b"\n" for s in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines)
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _json(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_id": None if span.parent is None else format(span.parent.span_id, "016x"),
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
        "events": [e.name for e in span.events],
        "links": [
            [format(link.context.trace_id, "032x"), format(link.context.span_id, "016x")]
            for link in span.links
        ],
        "status": span.status.status_code.name,
        "process": os.getpid(),
    }


def configure_sdk() -> None:
    path = os.environ.get(SPANS_ENV)
    if path:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(JsonLines(path)))
        trace.set_tracer_provider(provider)


def build_app(store: str) -> sw.App:
    app = sw.App("traced", store=store)
    svc = app.agent("svc")

    @svc.operation
    async def first(call: sw.Call, order: Any) -> int:
        return os.getpid()

    @svc.operation
    async def second(call: sw.Call, order: Any) -> int:
        if call.attempt == 1:
            (Path(os.environ[DIR_ENV]) / "second").write_text(str(os.getpid()))
            await asyncio.Event().wait()  # until this process is killed
        return os.getpid()

    @svc.operation
    async def third(call: sw.Call, order: Any) -> int:
        return os.getpid()

    @app.workflow(complete_within=timedelta(seconds=30))
    async def traced(ctx: sw.Context, order: Any) -> list[int]:
        a = await ctx.step(first, order)
        b = await ctx.step(second, order)
        await ctx.sleep(timedelta(milliseconds=300))
        return [a, b, await ctx.step(third, order)]

    return app


configure_sdk()
app = build_app(os.environ.get(STORE_ENV, DEFAULT_STORE))
