"""OpenTelemetry traces, through the API alone: the one module that imports it.

The SDK and its exporters are the application's choice (`pip install 'stepwarden[otel]'`
brings the API). Without the API, or with no SDK configured (the API's proxy or no-op
tracer provider), `active()` is False and the engine makes no span and stores no trace
context: a drive asks once per run, the agents once per call, and a step costs one branch.

A task's spans share one trace, its submit's:

- `submit WORKFLOW` (PRODUCER): the caller's current span (a web request's) is its parent;
  its W3C trace context is recorded with the task (`TaskRecord.trace_context`);
- `run WORKFLOW` (CONSUMER; `compensate WORKFLOW` for a compensating task): one per run of
  the task by a scheduler, a child of the submit's span; its context is recorded with the
  task (`run_trace`), and the next run (after a wait, an event, a crash) links to it;
- `dispatch AGENT.OPERATION` (PRODUCER): one per step a run writes, a child of the run's
  span, ending with the step's result; its context is recorded with the step;
- `call AGENT.OPERATION` (CONSUMER): one per call of a step by an agent instance, in
  whatever process, a child of the dispatch's span; the operation runs with it as the
  current span, so that its own instrumented calls (httpx, a database client) join it;
- `supervisor sweep`: a supervisor leader's pass that found work, with a child span for
  each task it expired, released or woke.

A stored trace context is a JSON object of the propagator's fields (`traceparent`,
`tracestate`), written only for a span that records.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

try:
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind

    _OFF: tuple[type, ...] = (ProxyTracerProvider, NoOpTracerProvider)
    API = True
except ImportError:  # the engine runs unchanged without the API
    API = False

if TYPE_CHECKING:
    from opentelemetry.context import Context as OtelContext
    from opentelemetry.trace import Link, Span, Tracer, TracerProvider

PREFIX = "stepwarden."
"""The prefix of the engine's own span attributes."""
SYSTEM = "stepwarden"
"""The `messaging.system` of the engine's producer and consumer spans."""

_tracer: tuple[TracerProvider, Tracer] | None = None


def active() -> bool:
    """Whether spans are made: the API is installed and an SDK (a tracer provider other than
    the API's proxy or no-op one) is configured."""
    return API and not isinstance(_trace.get_tracer_provider(), _OFF)


def tracer() -> Tracer:
    """The engine's tracer, from the tracer provider of the moment."""
    global _tracer
    provider = _trace.get_tracer_provider()
    if _tracer is None or _tracer[0] is not provider:
        from importlib.metadata import PackageNotFoundError, version

        try:
            own = version("stepwarden")
        except PackageNotFoundError:  # run from a source tree
            own = None
        _tracer = (provider, provider.get_tracer("stepwarden", own))
    return _tracer[1]


def attributes(**values: Any) -> dict[str, Any]:
    """Span attributes under the engine's prefix, those that are None left out."""
    return {PREFIX + k: v for k, v in values.items() if v is not None}


def parent(stored: str | None) -> OtelContext | None:
    """The context a stored trace context names (its span as the parent), or None."""
    if stored is None:
        return None
    try:
        carrier = orjson.loads(stored)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(carrier, dict):
        return None
    return _propagate.extract({str(k): str(v) for k, v in carrier.items()})


def link(stored: str | None, **attrs: Any) -> list[Link]:
    """A link to the span a stored trace context names (none when it names none)."""
    found = parent(stored)
    if found is None:
        return []
    context = _trace.get_current_span(found).get_span_context()
    if not context.is_valid:
        return []
    return [_trace.Link(context, attributes(**attrs))]


def start(
    name: str,
    *,
    kind: str = "internal",
    parent_of: Span | OtelContext | None = None,
    links: Sequence[Link] = (),
    attrs: Mapping[str, Any] | None = None,
    start_time: int | None = None,
) -> Span:
    """Start a span (ended by the caller), a child of `parent_of` (a span, or a context)
    or else of the current span; `start_time` in nanoseconds since the epoch, else now."""
    context = (
        _trace.set_span_in_context(parent_of) if isinstance(parent_of, _trace.Span) else parent_of
    )
    return tracer().start_span(
        name,
        context=context,
        kind=SpanKind[kind.upper()],
        attributes=dict(attrs or {}),
        links=list(links),
        start_time=start_time,
    )


@contextlib.contextmanager
def span(
    name: str,
    *,
    kind: str = "internal",
    parent_of: Span | OtelContext | None = None,
    links: Sequence[Link] = (),
    attrs: Mapping[str, Any] | None = None,
) -> Iterator[Span]:
    """A span around a block, current inside it: an exception that leaves the block is
    recorded on it and sets its status to error; it ends with the block."""
    made = start(name, kind=kind, parent_of=parent_of, links=links, attrs=attrs)
    try:
        with _trace.use_span(made, end_on_exit=False):
            yield made
    finally:
        made.end()


def stored(span: Span | None) -> str | None:
    """The trace context of a span that records, as JSON text to store; else None."""
    if span is None or not span.is_recording():
        return None
    carrier: dict[str, str] = {}
    _propagate.inject(carrier, context=_trace.set_span_in_context(span))
    return orjson.dumps(carrier).decode() if carrier else None


@contextlib.contextmanager
def current(span: Span | None) -> Iterator[None]:
    """Make `span` the current span inside the block (nothing when None); an exception that
    leaves the block is recorded on it and sets its status to error."""
    if span is None:
        yield
        return
    with _trace.use_span(span, end_on_exit=False):
        yield


def failed(span: Span | None, error: BaseException | str | None) -> None:
    """Set a span's status to error: an exception recorded as its event, or a message."""
    if span is None or error is None:
        return
    if isinstance(error, BaseException):
        span.record_exception(error)
        span.set_status(_trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"[:1000])
    else:
        span.set_status(_trace.StatusCode.ERROR, error[:1000])


def event(span: Span | None, name: str, **attrs: Any) -> None:
    """Add an event (`stepwarden.retry`, ...) to a span, when there is one."""
    if span is not None:
        span.add_event(PREFIX + name, attributes(**attrs))


def current_span() -> Span | None:
    """The current span, when it records (else None)."""
    if not API:
        return None
    span = _trace.get_current_span()
    return span if span.is_recording() else None
