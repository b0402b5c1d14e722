"""/metrics: the store-wide figures in Prometheus's text format, read at scrape time.

Only what is true of the store now: tasks per state (pending ones are the queue; waiting ones
wait for a timer, an event or a child), the oldest pending task's age, the supervisor's lease,
the relay's backlog (its oldest message's age) and the agent registry. What happens (steps
started, completed, failed, retried, deadlines missed, call times) is counted by the workers
that do it (`stepwarden.metrics`, `stepwarden worker --metrics-port`): counted from the rows
kept, such counts would drop when retention deletes rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..app import App
from ..breaker import CLOSED, HALF_OPEN, OPEN
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

    lease = await store.read_lease(SUPERVISOR_LEASE)
    out.append(
        GaugeMetricFamily(
            "stepwarden_supervisor_lease_remaining_seconds",
            "Seconds the supervisor leader's lease has left (negative once lapsed).",
            value=lease.remaining if lease else float("-inf"),
        )
    )
    backlog = await store.relay_backlog()
    out.append(
        GaugeMetricFamily(
            "stepwarden_relay_lag_seconds",
            "Seconds since the oldest status message for a broker not yet delivered by the "
            "relay was written (0 when none waits).",
            value=max((b.lag for b in backlog), default=0.0),
        )
    )
    out.append(
        GaugeMetricFamily(
            "stepwarden_relay_pending",
            "Status messages for a broker the relay has yet to deliver.",
            value=sum(b.pending for b in backlog),
        )
    )
    out.extend(await _agent_families(app))
    return out


async def _agent_families(app: App) -> list[Metric]:
    """From the agent registry: each instance's breaker, calls in flight and capacity."""
    labels = ["agent", "stepwarden_instance"]  # `instance` is the scrape target's own label
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


async def render(app: App) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(await families(app)))
    return generate_latest(registry)
