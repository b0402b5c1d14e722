"""The HTML pages: Jinja templates (autoescaped) and the inline SVG charts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

import jinja2

from .. import _json
from ..states import TaskState
from ._data import age, since

STATE_ORDER = [str(s) for s in TaskState]


def _payload(value: Any) -> str:
    """JSON for a person, secrets masked (as `stepwarden show` prints it)."""
    return _json.display(value, indent=True)


def _ts(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _iso(value: datetime | None) -> str:
    return value.isoformat(timespec="milliseconds") if value else ""


def _quote(value: str) -> str:
    """A path segment: `.` and `..` written with %2E, or a browser would resolve them away."""
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


def _query(**params: Any) -> str:
    return urlencode({k: v for k, v in params.items() if v not in (None, "")})


ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("stepwarden.dashboard", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters.update(compact=_json.display, payload=_payload, ts=_ts, iso=_iso, q=_quote, age=age)
ENV.globals.update(states=STATE_ORDER, since=since, query=_query)


def render(template: str, **context: Any) -> str:
    return ENV.get_template(template).render(**context)


# -- charts ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    kind: str
    title: str


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    labels: list[tuple[float, float, str]]
    """(x, y, text) of the axis labels."""
    lines: list[tuple[float, float, float, float, str]]
    """(x1, y1, x2, y2, kind) of the axes and marks."""


def activity_chart(activity: dict[str, Any], width: int = 720, height: int = 160) -> Chart:
    """Tasks processed (up) and step failures (down) per bucket over the window."""
    bucket = float(activity["bucket"])
    n = max(1, round(float(activity["window"]) / bucket))
    now: datetime = activity["now"]
    last = int(now.timestamp() // bucket)
    counts = {int(b["start"].timestamp() // bucket): b for b in activity["buckets"]}
    rows = [counts.get(last - n + 1 + i) for i in range(n)]
    top = max([1, *(r["processed"] for r in rows if r)])
    bottom = max([1, *(r["failed"] for r in rows if r)])
    left, right, pad = 40.0, 8.0, 14.0
    mid = pad + (height - 2 * pad) * top / (top + bottom)
    scale = (height - 2 * pad) / (top + bottom)
    step = (width - left - right) / n
    bars: list[Bar] = []
    for i, r in enumerate(rows):
        if r is None:
            continue
        x = left + i * step
        start = r["start"].strftime("%H:%M")
        if r["processed"]:
            h = r["processed"] * scale
            title = f"{start}: {r['processed']} processed"
            bars.append(Bar(x, mid - h, max(1.0, step - 1), h, "processed", title))
        if r["failed"]:
            h = r["failed"] * scale
            title = f"{start}: {r['failed']} step failures"
            bars.append(Bar(x, mid, max(1.0, step - 1), h, "failed", title))
    labels = [
        (left - 4, pad + 4, str(top)),
        (left - 4, height - pad, str(bottom)),
        (left, height - 2, f"-{age(float(activity['window']))}"),
        (width - right, height - 2, "now"),
    ]
    lines = [(left, mid, width - right, mid, "axis")]
    return Chart(width, height, bars, labels, lines)


def step_timeline(task: dict[str, Any], steps: list[dict[str, Any]], now: datetime) -> Chart:
    """Each step as a row: queued (dispatched to claimed), running (claimed to finished or
    now), and its complete_by as a mark."""
    row, left, right, top = 22.0, 4.0, 8.0, 18.0
    width = 720
    height = int(top + row * max(1, len(steps)) + 6)
    start: datetime = task["created_at"]
    ends = [now if task["finished_at"] is None else task["finished_at"]]
    for s in steps:
        ends.extend(t for t in (s["finished_at"], s["complete_by"]) if t is not None)
    end = max(ends)
    total = max((end - start).total_seconds(), 0.001)

    def x(t: datetime) -> float:
        return left + (width - left - right) * max(0.0, (t - start).total_seconds()) / total

    bars: list[Bar] = []
    lines: list[tuple[float, float, float, float, str]] = []
    for i, s in enumerate(steps):
        y = top + i * row
        created, claimed, finished = s["created_at"], s["claimed_at"], s["finished_at"]
        if claimed is None:
            stop = finished or now
            title = f"step {s['seq']} queued"
            bars.append(Bar(x(created), y + 4, max(2.0, x(stop) - x(created)), 12, "queued", title))
        else:
            bars.append(
                Bar(x(created), y + 4, max(1.0, x(claimed) - x(created)), 12, "queued", "queued")
            )
            stop = finished or now
            title = f"step {s['seq']} {s['name']}: {s['state']}"
            run = max(2.0, x(stop) - x(claimed))
            bars.append(Bar(x(claimed), y + 2, run, 16, s["state"], title))
        cb = x(s["complete_by"])
        mark = "deadline-missed" if s["missed_deadline"] else "deadline"
        lines.append((cb, y, cb, y + row - 2, mark))
    labels: list[tuple[float, float, str]] = [
        (left, 12, _ts(start)),
        (width - right, 12, _ts(end)),
    ]
    return Chart(width, height, bars, labels, lines)
