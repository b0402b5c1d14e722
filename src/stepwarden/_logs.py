"""What a log line is about, and the log as one JSON object a line (`JsonFormatter`,
`stepwarden --log-format json`).

The actors say which task a line is about once, where they start working on it, through a
context variable: a task's drive for the lines of its run (`about_task`: task_id, workflow,
attempt of the task), an agent's serving of a step for the lines of its call
(`about_step`: task_id, workflow, step, seq, attempt of the step). asyncio copies the
context into the tasks started from there, so every line logged on their behalf carries the
fields, without a change to the log calls; a call may name them too, with `extra=`. The text
log (`_text.EscapingFormatter`) shows the message alone, as before.

OpenTelemetry is optional: when its API is installed and a span is current, a line carries
its `trace_id` and `span_id` (hexadecimal, as W3C trace context writes them).
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import orjson

from ._text import MAX_LOG_LINE, cut, escape_json

FIELDS = ("task_id", "workflow", "step", "seq", "attempt")
"""The fields of a line about a task (those unknown where it is logged are left out)."""

_ABOUT: ContextVar[dict[str, Any] | None] = ContextVar("stepwarden_log_about", default=None)

try:
    _trace: Any = importlib.import_module("opentelemetry.trace")
except ImportError:  # the API is an option
    _trace = None


def about_task(task_id: str, workflow: str, attempt: int) -> None:
    """The lines logged from here on in this asyncio task (and those it starts) are about
    this run of a task (`attempt`: the task's)."""
    _ABOUT.set({"task_id": task_id, "workflow": workflow, "attempt": attempt})


def about_step(task_id: str, workflow: str | None, step: str, seq: int, attempt: int) -> None:
    """The lines logged from here on in this asyncio task are about this call of a step
    (`step`: agent.operation; `attempt`: the step's dispatch)."""
    fields: dict[str, Any] = {"task_id": task_id, "step": step, "seq": seq, "attempt": attempt}
    if workflow is not None:
        fields["workflow"] = workflow
    _ABOUT.set(fields)


def about() -> dict[str, Any]:
    """The fields of the task the current context is about (empty: none)."""
    return dict(_ABOUT.get() or {})


def trace_ids() -> dict[str, str]:
    """The current OpenTelemetry span's trace_id and span_id, when there is one."""
    if _trace is None:
        return {}
    context = _trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


class Quiet:
    """At most one line of a kind every `every` seconds: `admit(kind)` says whether to log it
    now, with how many of its kind were held back since the last one (the next line says
    so), or None to hold it back. Its memory is bounded: past `kinds` kinds, those quiet no
    longer are forgotten."""

    def __init__(
        self, every: float, *, kinds: int = 1000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every = every
        self.kinds = kinds
        self.clock = clock
        self._quiet: dict[str, tuple[float, int]] = {}

    def admit(self, kind: str) -> int | None:
        now = self.clock()
        until, held = self._quiet.get(kind, (0.0, 0))
        if now < until:
            self._quiet[kind] = (until, held + 1)
            return None
        if len(self._quiet) >= self.kinds:
            self._quiet = {k: v for k, v in self._quiet.items() if v[0] > now}
        self._quiet[kind] = (now + self.every, 0)
        return held


class JsonFormatter(logging.Formatter):
    """One JSON object a line: `time` (ISO 8601, UTC), `level`, `logger`, `message`, then,
    on a line about a task, `task_id`, `workflow`, `step`, `seq`, `attempt` (those known),
    `trace_id` and `span_id` while an OpenTelemetry span is current, and `exception` (its
    traceback) when there is one. A message or traceback is cut as the text log cuts it, and
    every character that would change how the line is shown is a JSON escape."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": cut(record.getMessage(), MAX_LOG_LINE),
        }
        about = _ABOUT.get() or {}
        named = record.__dict__.get("task_id")
        if named is None or named == about.get("task_id"):
            doc.update(about)  # a line that names another task is not about this one
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                doc[name] = value
        doc.update(trace_ids())
        if record.exc_info:
            doc["exception"] = cut(self.formatException(record.exc_info), 4 * MAX_LOG_LINE)
        elif record.exc_text:
            doc["exception"] = cut(record.exc_text, 4 * MAX_LOG_LINE)
        if record.stack_info:
            doc["stack"] = cut(self.formatStack(record.stack_info), 4 * MAX_LOG_LINE)
        return escape_json(orjson.dumps(doc, default=str).decode())
