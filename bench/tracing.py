"""The cost of OpenTelemetry traces: W1 one at a time and W2 of stepwarden-postgres, with the
workers (and the client that submits) traced four ways, in one run:

- `none`: the engine told that the API is absent (`stepwarden.tracing.API = False`): what it
  costs without tracing at all, the baseline;
- `api`: the API installed, no SDK configured (the API's proxy tracer provider): what an
  application that installs `stepwarden[otel]` and configures nothing pays;
- `drop`: the SDK, a SimpleSpanProcessor and an exporter that drops every span;
- `batch`: the SDK, a BatchSpanProcessor and an exporter that encodes each span as JSON and
  drops it (an exporter's work, without a network).

The workers are separate processes: `bench.workload` (their app module) configures the SDK
at import from BENCH_TRACING (`configure_from_env`); the client is configured in process
before each mode (`configure`). Nothing of this is in the engine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

ENV = "BENCH_TRACING"
MODES: dict[str, str] = {
    "none": "no API: the engine without tracing",
    "api": "the API alone, no SDK",
    "drop": "SDK, SimpleSpanProcessor, an exporter that drops",
    "batch": "SDK, BatchSpanProcessor, an exporter encoding JSON",
}


def configure(mode: str) -> None:
    """Trace this process the way `mode` says (see the module's doc), replacing the tracer
    provider set before (the API sets one per process: the benchmark's client resets the
    API's globals between modes, as OpenTelemetry's own tests do)."""
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    import stepwarden.tracing

    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r}: one of {', '.join(MODES)}")
    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None:
        shutdown()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    stepwarden.tracing.API = mode != "none"
    if mode in ("none", "api"):
        return
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    class Encoding(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            for span in spans:
                span.to_json(indent=None)
            return SpanExportResult.SUCCESS

    made = TracerProvider()
    if mode == "drop":
        made.add_span_processor(SimpleSpanProcessor(Dropping()))
    else:
        made.add_span_processor(BatchSpanProcessor(Encoding()))
    trace.set_tracer_provider(made)


def configure_from_env() -> None:
    """In a worker process (at the import of its app module): the mode BENCH_TRACING names."""
    mode = os.environ.get(ENV)
    if mode:
        configure(mode)


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """By mode: the W1 one-at-a-time figures of each run and their median, the W2
    percentiles over every run's samples."""
    from .common import median, percentile

    out: dict[str, Any] = {}
    for mode, each in runs.items():
        w1 = [r["w1"]["wf_per_s"] for r in each if r.get("w1")]
        samples = [s for r in each for s in r.get("w2", [])]
        out[mode] = {
            "what": MODES[mode],
            "w1_single_wf_per_s_runs": w1,
            "w1_single_wf_per_s": median(w1) if w1 else None,
            "w2_p50_ms": round(percentile(samples, 50) * 1000, 2) if samples else None,
            "w2_p99_ms": round(percentile(samples, 99) * 1000, 2) if samples else None,
            "errors": [e for r in each for e in r.get("errors", [])],
        }
    return out


def table(summary: dict[str, Any]) -> str:
    """The tracing section of the printed table: each mode, and its W1 against `none`'s."""
    base = summary.get("none", {}).get("w1_single_wf_per_s")
    head = (
        f"{'tracing (stepwarden-postgres)':<62} {'W1 one/time':>11} {'vs none':>8} "
        f"{'(runs)':<20} {'W2 p50 ms':>9} {'p99 ms':>7}"
    )
    lines = [head, "-" * len(head)]
    for mode, s in summary.items():
        w1 = s["w1_single_wf_per_s"]
        ratio = f"{w1 / base:.2f}" if w1 and base else "-"
        runs = "(" + ", ".join(f"{r:,.0f}" for r in s["w1_single_wf_per_s_runs"]) + ")"
        lines.append(
            f"{mode + ': ' + s['what']:<62} {w1 or 0:>11,.1f} {ratio:>8} {runs:<20} "
            f"{s['w2_p50_ms'] or 0:>9.2f} {s['w2_p99_ms'] or 0:>7.2f}"
            + (f"  FAILED: {s['errors'][0]}" if s["errors"] else "")
        )
    return "\n".join(lines)
