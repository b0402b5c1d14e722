"""/metrics: the store's figures in Prometheus's text format, read at scrape time.

Counts come from the rows the store keeps: finished tasks (and their steps and events) are
deleted after their retention, so the step and deadline figures are gauges over what is kept,
not counters since the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..app import App
from ..breaker import CLOSED, HALF_OPEN, OPEN
from ..records import DURATION_BUCKETS
from ..states import TaskState
from ..supervisor import LEASE as SUPERVISOR_LEASE

CONTENT_TYPE = CONTENT_TYPE_LATEST
BREAKER_STATES = (CLOSED, OPEN, HALF_OPEN)


class _Families(Collector):
    """Hands the registry the families read beforehand (the store is read asynchronously,
    the registry collects synchronously)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


async def families(app: App) -> list[Metric]:
    store = await app.store()
    out: list[Metric] = []

    tasks = GaugeMetricFamily("stepwarden_tasks", "Tasks by process_state.", labels=["state"])
    counts = await store.count_tasks()
    for state in TaskState:
        tasks.add_metric([str(state)], counts.get(state, 0))
    out.append(tasks)

    age = await store.oldest_pending_age()
    out.append(
        GaugeMetricFamily(
            "stepwarden_oldest_pending_age_seconds",
            "Seconds since the oldest pending task was submitted (0 when none is pending).",
            value=age or 0.0,
        )
    )

    labels = ["agent", "operation"]
    started = GaugeMetricFamily(
        "stepwarden_steps_started", "Steps claimed by an agent, of those kept.", labels=labels
    )
    completed = GaugeMetricFamily(
        "stepwarden_steps_completed", "Steps completed, of those kept.", labels=labels
    )
    failed = GaugeMetricFamily(
        "stepwarden_steps_failed", "Steps failed (or abandoned), of those kept.", labels=labels
    )
    reassigned = GaugeMetricFamily(
        "stepwarden_step_reassignments",
        "Times steps were handed to another agent instance (theirs gone, or its breaker "
        "open), of the steps kept.",
        labels=labels,
    )
    retried = GaugeMetricFamily(
        "stepwarden_steps_retried",
        "Steps dispatched more than once (complete_by passed, or agent gone), of those kept.",
        labels=labels,
    )
    duration = HistogramMetricFamily(
        "stepwarden_step_duration_seconds",
        "Time from claim to completion of the completed steps kept.",
        labels=labels,
    )
    for s in await store.step_stats():
        key = [s.agent, s.operation]
        started.add_metric(key, s.started)
        completed.add_metric(key, s.completed)
        failed.add_metric(key, s.failed)
        reassigned.add_metric(key, s.reassignments)
        retried.add_metric(key, s.retried)
        buckets: list[tuple[str, float]] = [
            (_bound(b), n) for b, n in zip(DURATION_BUCKETS, s.duration_buckets, strict=True)
        ]
        buckets.append(("+Inf", s.completed))
        duration.add_metric(key, buckets, s.duration_sum)
    out.extend([started, completed, failed, reassigned, retried, duration])

    out.append(
        GaugeMetricFamily(
            "stepwarden_deadlines_missed",
            "Deadlines missed: the supervisor's resets of tasks and steps whose complete_by "
            "passed (events of kind 'expired'), of those kept.",
            value=await store.count_events("expired"),
        )
    )

    lease = await store.read_lease(SUPERVISOR_LEASE)
    out.append(
        GaugeMetricFamily(
            "stepwarden_supervisor_lease_remaining_seconds",
            "Seconds the supervisor leader's lease has left (negative once lapsed).",
            value=lease.remaining if lease else float("-inf"),
        )
    )
    out.extend(await _agent_families(app))
    return out


async def _agent_families(app: App) -> list[Metric]:
    """From the agent registry: each instance's breaker, calls in flight and capacity."""
    labels = ["agent", "instance"]
    breaker = GaugeMetricFamily(
        "stepwarden_agent_breaker_state",
        "1 for the state each agent instance's circuit breaker is in, 0 for the others.",
        labels=[*labels, "state"],
    )
    inflight = GaugeMetricFamily(
        "stepwarden_agent_inflight", "Calls an agent instance has in flight.", labels=labels
    )
    capacity = GaugeMetricFamily(
        "stepwarden_agent_capacity", "Calls an agent instance makes at once.", labels=labels
    )
    alive = GaugeMetricFamily(
        "stepwarden_agent_alive",
        "1 while an agent instance's heartbeats arrive, 0 once gone (kept for an hour).",
        labels=labels,
    )
    for a in await app.agent_instances_async():
        key = [a.agent, a.instance]
        for state in BREAKER_STATES:
            breaker.add_metric([*key, state], float(a.breaker == state))
        inflight.add_metric(key, a.inflight)
        capacity.add_metric(key, a.capacity)
        alive.add_metric(key, float(a.alive))
    return [breaker, inflight, capacity, alive]


def _bound(value: float) -> str:
    return repr(float(value))


async def render(app: App) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(await families(app)))
    return generate_latest(registry)
