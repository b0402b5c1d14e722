"""A worker's metrics for Prometheus: counted by its actors as things happen, served at
`/metrics` (`stepwarden worker --metrics-port`).

Each `Worker` has its own `Metrics`, with a registry of its own (never the process-wide
default one), so that several workers or Apps in one process, and tests, do not mix their
counts. The actors count with one line per event (`metrics.step_completed(...)`); what is
true now (calls in flight, free slots, breakers, the supervisor's lead) is read from the
actors at each scrape, in the event loop that runs them (`serve`).

The names follow Prometheus's conventions: the `stepwarden_` prefix, the unit in the name
(`_seconds`), `_total` on counters; the labels are few-valued (workflow, agent, operation,
outcome, reason), never a task id. The store-wide figures (tasks per state, the oldest
pending task, the agent registry) are the dashboard's `/metrics`, read from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest as _render
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger("stepwarden.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
BREAKER_STATES = ("closed", "open", "half_open")
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (seconds) of the histograms of calls, queue waits and task runs."""
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
"""Upper bounds (seconds) of the store write latency histogram."""
READ_TIMEOUT = 10.0
"""Seconds a scrape's request may take to arrive."""


class AgentGauges(Protocol):
    """What an agent instance (`runner.AgentRunner`) says of itself at a scrape."""

    def calls_in_flight(self) -> int: ...
    def slots_free(self) -> int: ...
    def breaker_state(self) -> str: ...


class SchedulerGauges(Protocol):
    def tasks_held(self) -> int: ...


class SupervisorGauges(Protocol):
    def leads(self) -> bool: ...


OTHER_TENANT = "_other"
"""The `tenant` label of a task whose tenant the worker was not told to name."""
NO_TENANT = "_none"
"""The `tenant` label of a task of no tenant."""


class Metrics:
    """The metrics of one worker (its scheduler, agent instances and supervisor), in a
    registry of its own (`registry`)."""

    def __init__(self, tenants: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        wf, step = ["workflow"], ["agent", "operation"]
        self.tenants = frozenset(tenants)
        """The tenants `stepwarden_tenant_tasks_ended` names (`tenant_label`)."""
        self._tenant_tasks_ended = Counter(
            "stepwarden_tenant_tasks_ended",
            "Tasks whose outcome this worker's scheduler recorded, by tenant: one named in "
            f"the worker's --metrics-tenants, {OTHER_TENANT} for any other, {NO_TENANT} for "
            "a task of none (state: processed; error when its workflow failed, then compensated or "
            "compensation_failed when its compensation ended).",
            ["tenant", "state"],
            registry=r,
        )
        self._tasks_claimed = Counter(
            "stepwarden_tasks_claimed", "Tasks claimed by this worker's scheduler.", wf,
            registry=r,
        )  # fmt: skip
        self._tasks_processed = Counter(
            "stepwarden_tasks_processed",
            "Tasks whose workflow returned, recorded processed by this worker's scheduler.",
            wf,
            registry=r,
        )
        self._tasks_failed = Counter(
            "stepwarden_tasks_failed",
            "Tasks whose workflow failed (a permanent error, an exception), recorded by this "
            "worker's scheduler: then compensated, or in error, by their on_failure.",
            wf,
            registry=r,
        )
        self._tasks_compensated = Counter(
            "stepwarden_tasks_compensated",
            "Compensations that ended, recorded by this worker's scheduler "
            "(outcome: compensated or compensation_failed).",
            [*wf, "outcome"],
            registry=r,
        )
        self._tasks_expired = Counter(
            "stepwarden_tasks_expired",
            "Held tasks whose complete_by passed, recovered by this worker's supervisor "
            "(state: where each went).",
            ["state"],
            registry=r,
        )
        self._steps_started = Counter(
            "stepwarden_steps_started",
            "Step calls begun by this worker's agent instances (one per dispatch served).",
            step,
            registry=r,
        )
        self._steps_completed = Counter(
            "stepwarden_steps_completed",
            "Steps recorded completed by this worker's agent instances.",
            step,
            registry=r,
        )
        self._steps_failed = Counter(
            "stepwarden_steps_failed",
            "Steps recorded failed (a permanent error) by this worker's agent instances.",
            step,
            registry=r,
        )
        self._steps_retried = Counter(
            "stepwarden_steps_retried",
            "Tries of a step after a transient failure, by this worker's agent instances.",
            step,
            registry=r,
        )
        self._steps_handed_back = Counter(
            "stepwarden_steps_handed_back",
            "Steps handed back to the queue by this worker's agent instances (breaker open).",
            step,
            registry=r,
        )
        self._steps_expired = Counter(
            "stepwarden_steps_expired",
            "Tasks recovered by this worker's supervisor because a step's complete_by passed.",
            registry=r,
        )
        self._steps_swept = Counter(
            "stepwarden_steps_swept",
            "Steps this worker's supervisor reassigned (their agent instance gone) or failed "
            "(past their pick-up or total timeout), by kind: reassigned, pickup, total.",
            ["kind"],
            registry=r,
        )
        self._events_received = Counter(
            "stepwarden_events_received",
            "Events taken by a wait of a workflow run by this worker.",
            wf,
            registry=r,
        )
        self._timers_fired = Counter(
            "stepwarden_timers_fired",
            "Durable timers (ctx.sleep, ctx.sleep_until) ended in a workflow run by this worker.",
            wf,
            registry=r,
        )
        self._waits_timed_out = Counter(
            "stepwarden_waits_timed_out",
            "Waits for an event that timed out, in a workflow run by this worker.",
            wf,
            registry=r,
        )
        self._alerts = Counter(
            "stepwarden_alerts",
            "Alerts raised by this worker's scheduler and supervisor, by reason.",
            ["reason"],
            registry=r,
        )
        self._call_seconds = Histogram(
            "stepwarden_step_call_seconds",
            "Time of each try of a step's operation (outcome: ok, error, timeout, cancelled).",
            [*step, "outcome"],
            registry=r,
            buckets=CALL_BUCKETS,
        )
        self._queue_wait_seconds = Histogram(
            "stepwarden_queue_wait_seconds",
            "Time from a step's dispatch (or re-dispatch) to the claim by an agent instance of "
            "this worker that began calling it, by the store's clock (0 for a step handed "
            "over in process; a step handed back counts from its dispatch, once).",
            step,
            registry=r,
            buckets=CALL_BUCKETS,
        )
        self._task_run_seconds = Histogram(
            "stepwarden_task_run_seconds",
            "Time of each run of a task by this worker's scheduler, from its claim to its end, "
            "wait or stop (outcome: processed, failed, compensated, compensation_failed, "
            "waiting, stopped).",
            [*wf, "outcome"],
            registry=r,
            buckets=CALL_BUCKETS,
        )
        self._store_write_seconds = Histogram(
            "stepwarden_store_write_seconds",
            "Time of each write transaction of this worker's store that committed, from its "
            "connection's turn (a pooled connection taken, SQLite's lock queue reached) to "
            "its commit.",
            registry=r,
            buckets=WRITE_BUCKETS,
        )
        self.observe_write = self._store_write_seconds.observe
        """A store's hook (`Store.write_observer`): seconds one write took."""
        self._live = _Live()
        r.register(self._live)

    # -- what is true now: read from the actors at each scrape ----------------------------
    def watch_agent(self, agent: str, gauges: AgentGauges) -> None:
        self._live.agents.setdefault(agent, []).append(gauges)

    def watch_scheduler(self, gauges: SchedulerGauges) -> None:
        self._live.schedulers.append(gauges)

    def watch_supervisor(self, gauges: SupervisorGauges) -> None:
        self._live.supervisors.append(gauges)

    def describe_worker(self, instance: str, roles: Iterable[str]) -> None:
        # Not `instance`: Prometheus gives every scraped series that label (the target's
        # address) and would rename this one `exported_instance`.
        self._live.info = {"stepwarden_instance": instance, "roles": ",".join(sorted(roles))}

    # -- the scheduler --------------------------------------------------------------------
    def tasks_claimed(self, workflows: Iterable[str]) -> None:
        for workflow in workflows:
            self._tasks_claimed.labels(workflow).inc()

    def tenant_label(self, tenant: str | None) -> str:
        """The `tenant` label of a task's tenant: its name when the worker was given it, else
        OTHER_TENANT (NO_TENANT for a task of none). So the label has at most as many values
        as the operator named, and two more, however many tenants submit."""
        if tenant is None:
            return NO_TENANT
        return tenant if tenant in self.tenants else OTHER_TENANT

    def task_ended(self, workflow: str, state: str, tenant: str | None = None) -> None:
        """A task's outcome recorded by its scheduler (`TaskState` values)."""
        self._tenant_tasks_ended.labels(self.tenant_label(tenant), state).inc()
        if state == "processed":
            self._tasks_processed.labels(workflow).inc()
        elif state == "error":
            self._tasks_failed.labels(workflow).inc()
            self._alerts.labels("task_error").inc()
        elif state in ("compensated", "compensation_failed"):
            self._tasks_compensated.labels(workflow, state).inc()
            if state == "compensation_failed":
                self._alerts.labels("compensation_failed").inc()

    def task_ran(self, workflow: str, outcome: str, seconds: float) -> None:
        self._task_run_seconds.labels(workflow, outcome).observe(seconds)

    def wait_ended(self, workflow: str, kind: str, state: str) -> None:
        """A wait that ended now (not found ended by a replay)."""
        if kind == "timer" and state == "done":
            self._timers_fired.labels(workflow).inc()
        elif kind == "event" and state == "done":
            self._events_received.labels(workflow).inc()
        elif kind == "event" and state == "timed_out":
            self._waits_timed_out.labels(workflow).inc()

    def alert(self, reason: str) -> None:
        self._alerts.labels(reason).inc()

    # -- the agents -----------------------------------------------------------------------
    def step_claimed(self, agent: str, operation: str, queued: float | None) -> None:
        self._steps_started.labels(agent, operation).inc()
        if queued is not None:
            self._queue_wait_seconds.labels(agent, operation).observe(max(0.0, queued))

    def step_tried(self, agent: str, operation: str, outcome: str, seconds: float) -> None:
        self._call_seconds.labels(agent, operation, outcome).observe(seconds)

    def step_retried(self, agent: str, operation: str) -> None:
        self._steps_retried.labels(agent, operation).inc()

    def step_reported(self, agent: str, operation: str, state: str) -> None:
        """An outcome the store recorded (`StepState` values: completed or failed)."""
        counter = self._steps_completed if state == "completed" else self._steps_failed
        counter.labels(agent, operation).inc()

    def step_handed_back(self, agent: str, operation: str) -> None:
        self._steps_handed_back.labels(agent, operation).inc()

    # -- the supervisor -------------------------------------------------------------------
    def expired(self, seq: int | None, state: str, alert: str | None) -> None:
        """A held task the supervisor recovered (`Expired`): its step's complete_by passed
        (`seq`), or its own."""
        if seq is not None:
            self._steps_expired.inc()
        self._tasks_expired.labels(state).inc()
        if alert is not None:
            self._alerts.labels(alert).inc()

    def step_swept(self, kind: str) -> None:
        self._steps_swept.labels(kind).inc()

    # -- reading --------------------------------------------------------------------------
    def render(self) -> bytes:
        """The registry in Prometheus's text format."""
        return _render(self.registry)


class _Live(Collector):
    """The gauges read from the actors at a scrape."""

    def __init__(self) -> None:
        self.agents: dict[str, list[AgentGauges]] = {}
        """Each agent's runners in this worker: one, or one per shard served."""
        self.schedulers: list[SchedulerGauges] = []
        self.supervisors: list[SupervisorGauges] = []
        self.info: dict[str, str] | None = None

    def collect(self) -> Iterator[Metric]:
        inflight = GaugeMetricFamily(
            "stepwarden_agent_calls_in_flight",
            "Calls this worker's agent instance of each agent has in flight.",
            labels=["agent"],
        )
        free = GaugeMetricFamily(
            "stepwarden_agent_slots_free",
            "Calls this worker's agent instance of each agent may start now "
            "(--agent-concurrency less those in flight or being handed over).",
            labels=["agent"],
        )
        breaker = GaugeMetricFamily(
            "stepwarden_agent_breaker",
            "1 for the state this worker's circuit breaker of each agent is in, 0 for the "
            "others (closed, open, half_open); with a store of shards, how many of its "
            "breakers (one per shard served) are in each.",
            labels=["agent", "state"],
        )
        for name, runners in sorted(self.agents.items()):
            inflight.add_metric([name], sum(r.calls_in_flight() for r in runners))
            free.add_metric([name], sum(r.slots_free() for r in runners))
            states = [r.breaker_state() for r in runners]
            for state in BREAKER_STATES:
                breaker.add_metric([name, state], float(states.count(state)))
        yield from (inflight, free, breaker)
        if self.schedulers:
            yield GaugeMetricFamily(
                "stepwarden_scheduler_tasks_held",
                "Tasks this worker's scheduler drives now.",
                value=sum(s.tasks_held() for s in self.schedulers),
            )
        if self.supervisors:
            yield GaugeMetricFamily(
                "stepwarden_supervisor_leader",
                "1 while this worker's supervisor holds the lease (leads), else 0.",
                value=float(any(s.leads() for s in self.supervisors)),
            )
        if self.info is not None:
            yield InfoMetricFamily(
                "stepwarden_worker",
                "This worker: its instance id (stepwarden_instance) and roles.",
                value=self.info,
            )


async def serve(metrics: Metrics, host: str, port: int) -> asyncio.Server:
    """Serve `GET /metrics` on (host, port) in the running event loop (that of the actors
    whose gauges it reads). A port of 0 takes a free one: `server.sockets` says which."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            words = head.split(b"\r\n", 1)[0].split()
            head_only = words[:1] == [b"HEAD"]
            if len(words) != 3 or words[0] not in (b"GET", b"HEAD"):
                status, body, kind = b"405 Method Not Allowed", b"GET /metrics\n", b"text/plain"
            elif words[1].split(b"?", 1)[0] != b"/metrics":
                status, body, kind = b"404 Not Found", b"GET /metrics\n", b"text/plain"
            else:
                status, body, kind = b"200 OK", metrics.render(), CONTENT_TYPE.encode()
            writer.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind
                + b"\r\nContent-Length: " + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + (b"" if head_only else body)
            )  # fmt: skip
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(answer, host, port)
