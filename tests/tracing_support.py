"""OpenTelemetry's SDK for the traces' tests: a tracer provider set for one test and taken
away after it (the API lets a process set its global provider once: the test resets the
API's globals, as OpenTelemetry's own tests do), and finished spans as plain records."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def _reset_globals() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextlib.contextmanager
def sdk() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """This process traced with the SDK, its finished spans kept in memory, until the end of
    the block; then untraced again."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_globals()
    trace.set_tracer_provider(provider)
    try:
        yield provider, exporter
    finally:
        provider.shutdown()
        _reset_globals()


@dataclass(frozen=True)
class Rec:
    """A finished span, as the assertions read it (ids as hex)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: str
    attributes: dict[str, Any]
    events: list[str]
    links: list[tuple[str, str]] = field(default_factory=list)
    status: str = "UNSET"
    process: int | None = None

    def attr(self, name: str) -> Any:
        return self.attributes.get(name)


def record(span: ReadableSpan, process: int | None = None) -> Rec:
    ctx = span.get_span_context()
    assert ctx is not None
    return Rec(
        name=span.name,
        trace_id=format(ctx.trace_id, "032x"),
        span_id=format(ctx.span_id, "016x"),
        parent_id=None if span.parent is None else format(span.parent.span_id, "016x"),
        kind=span.kind.name,
        attributes=dict(span.attributes or {}),
        events=[e.name for e in span.events],
        links=[
            (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"))
            for link in span.links
        ],
        status=span.status.status_code.name,
        process=process,
    )


def records(spans: Sequence[ReadableSpan]) -> list[Rec]:
    return [record(s) for s in spans]


def named(spans: Sequence[Rec], prefix: str) -> list[Rec]:
    return [s for s in spans if s.name.startswith(prefix)]


def one(spans: Sequence[Rec], prefix: str) -> Rec:
    found = named(spans, prefix)
    assert len(found) == 1, (prefix, [s.name for s in spans])
    return found[0]
