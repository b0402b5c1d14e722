"""What the dashboard shows, read from the store as plain data: the JSON API sends it as it
is, the pages render it. Payloads keep their `Secret`s, which every rendering masks."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..app import App
from ..errors import TaskNotFound
from ..records import (
    AgentInstance,
    EventRecord,
    OutboxMessage,
    ScheduleRecord,
    StepRecord,
    TaskRecord,
    VersionBacklog,
    Why,
)
from ..rules import unrunnable
from ..secret import public_name
from ..states import FINISHED_TASK_STATES, TaskState
from ..supervisor import LEASE as SUPERVISOR_LEASE

ALERTS = "alerts"
"""The outbox channel of alerts (written by the database triggers)."""
ACTIVITY_WINDOW = 3600.0
ACTIVITY_BUCKET = 60.0
FAILED_STATES = (TaskState.ERROR, TaskState.COMPENSATION_FAILED)
WHY_PER_STATE = 20
"""The overview counts why tasks wait over the newest tasks of each unfinished state, this
many of each (those waiting for an operator included)."""
WAITING_EVERY = 10.0
"""Seconds the overview's count of why tasks wait is kept before it is read again (the pages
follow the store every second; each count reads why for up to 140 tasks)."""
WAITING_STATES = tuple(s for s in TaskState if s not in FINISHED_TASK_STATES) + FAILED_STATES


def task_summary(t: TaskRecord) -> dict[str, Any]:
    return {
        "task_id": t.task_id,
        "workflow": t.workflow,
        "version": t.version,
        "tenant": t.tenant,
        "process_state": str(t.process_state),
        "failure_count": t.failure_count,
        "compensation_failures": t.compensation_failures,
        "max_failures": t.max_failures,
        "attempt": t.attempt,
        "priority": t.priority,
        "locked_by": t.locked_by,
        "complete_by": t.complete_by,
        "created_at": t.created_at,
        "updated_at": t.updated_at,
        "finished_at": t.finished_at,
        "error": t.error,
        "wake_at": t.wake_at,
        "waiting_for": t.waiting_for,
    }


def task_detail(t: TaskRecord) -> dict[str, Any]:
    return {
        **task_summary(t),
        "input": t.input,
        "result": t.result,
        "complete_within": t.complete_within,
        "on_failure": t.on_failure,
        "reply_to": t.reply_to,
        "parent_id": t.parent_id,
        "parent_position": t.parent_position,
        "tags": dict(t.tags),
    }


def child_dict(t: TaskRecord) -> dict[str, Any]:
    return {
        "task_id": t.task_id,
        "workflow": t.workflow,
        "process_state": str(t.process_state),
        "position": t.parent_position,
        "created_at": t.created_at,
        "finished_at": t.finished_at,
        "error": t.error,
    }


def step_dict(s: StepRecord) -> dict[str, Any]:
    return {
        "seq": s.seq,
        "name": s.name,
        "agent": s.agent,
        "operation": s.operation,
        "state": str(s.state),
        "attempt": s.attempt,
        "task_attempt": s.task_attempt,
        "tries": s.tries,
        "reassignments": s.reassignments,
        "heartbeat_at": s.heartbeat_at,
        "idempotency_key": s.idempotency_key,
        "locked_by": s.locked_by,
        "complete_by": s.complete_by,
        "created_at": s.created_at,
        "claimed_at": s.claimed_at,
        "finished_at": s.finished_at,
        "missed_deadline": _missed(s),
        "input": s.input,
        "result": s.result,
        "error": s.error,
        "compensation": s.compensation,
        "compensates": s.compensates,
        "position": s.position,
    }


def _missed(s: StepRecord) -> bool:
    """Whether the step's complete_by passed before it finished (as far as is known)."""
    if s.finished_at is not None:
        return s.finished_at > s.complete_by
    return False


def event_dict(e: EventRecord) -> dict[str, Any]:
    return {"id": e.id, "at": e.at, "kind": e.kind, "detail": e.detail}


def alert_dict(m: OutboxMessage) -> dict[str, Any]:
    return {
        "id": m.id,
        "task_id": m.task_id,
        "kind": m.kind,
        "detail": m.detail,
        "at": m.at,
        "attempts": m.attempts,
        "delivered_to": [public_name(n) for n in m.delivered_to],
    }


def backlog_dict(b: VersionBacklog) -> dict[str, Any]:
    return {
        "workflow": b.workflow,
        "version": b.version,
        "pending": b.pending,
        "compensating": b.compensating,
        "oldest_created_at": b.oldest,
    }


def schedule_dict(s: ScheduleRecord) -> dict[str, Any]:
    return {
        "name": s.name,
        "workflow": s.workflow,
        "cron": s.cron,
        "every": s.every,
        "timezone": s.timezone,
        "catch_up": s.catch_up,
        "paused": s.paused,
        "next_at": s.next_at,
        "last_tick": s.last_tick,
        "input": s.input,
    }


def agent_dict(a: AgentInstance) -> dict[str, Any]:
    return {
        "instance": a.instance,
        "agent": a.agent,
        "operations": list(a.operations),
        "capacity": a.capacity,
        "inflight": a.inflight,
        "breaker": a.breaker,
        "breaker_detail": a.breaker_detail,
        "started_at": a.started_at,
        "heartbeat_at": a.heartbeat_at,
        "expires_at": a.expires_at,
        "alive": a.alive,
    }


def why_dict(why: Why) -> dict[str, Any]:
    """Why a task waits, as plain data (the gates' enums as their values)."""
    return dataclasses.asdict(why)


def waiting_counts(found: list[Why]) -> list[dict[str, Any]]:
    """The reasons that hold these tasks in the end (`Why.holding`), counted by reason, the
    task's workflow and, for a step's reason, the step's agent: most first, each with the
    earliest `since` and `until` of its tasks."""
    groups: dict[tuple[str, str, str | None], dict[str, Any]] = {}
    for why in found:
        g = why.holding
        from_step = bool(why.steps) and g is why.steps[0].gate
        agent = why.steps[0].agent if from_step else None
        key = (str(g.reason), why.workflow, agent)
        entry = groups.setdefault(
            key,
            {
                "reason": str(g.reason),
                "workflow": why.workflow,
                "agent": agent,
                "tasks": 0,
                "since": None,
                "until": None,
                "example": why.task_id,
            },
        )
        entry["tasks"] += 1
        for when in ("since", "until"):
            value = getattr(g, when)
            if value is not None and (entry[when] is None or value < entry[when]):
                entry[when] = value
    return sorted(groups.values(), key=lambda e: (-e["tasks"], e["reason"], e["workflow"]))


@dataclass
class Reader:
    """The dashboard's reads, through the App's store for the running event loop."""

    app: App
    _waiting_read: tuple[float, dict[str, Any]] | None = field(default=None, repr=False)

    async def overview(self) -> dict[str, Any]:
        store = await self.app.store()
        counts = await store.count_tasks()
        lease = await store.read_lease(SUPERVISOR_LEASE)
        activity = await store.activity(window=ACTIVITY_WINDOW, bucket=ACTIVITY_BUCKET)
        failed: list[TaskRecord] = []
        for state in FAILED_STATES:
            failed.extend(await store.find_tasks(state=state, limit=10))
        failed.sort(key=lambda t: t.updated_at, reverse=True)
        runnable = {v for s in await store.list_schedulers() if s.alive for v in s.versions}
        stranded = unrunnable(await store.version_backlog(), runnable)
        return {
            "counts": {str(s): n for s, n in counts.items()},
            "oldest_pending_age": await store.oldest_pending_age(),
            "leader": None
            if lease is None
            else {
                "holder": lease.holder,
                "term": lease.term,
                "expires_at": lease.expires_at,
                "remaining": lease.remaining,
                "last_sweep": lease.since_renewed,
                "live": lease.remaining > 0,
                # A supervisor that stops lets its lease lapse at once (expires_at = epoch).
                "released": lease.expires_at.timestamp() <= 0,
            },
            "activity": {
                "now": activity.now,
                "bucket": activity.bucket,
                "window": ACTIVITY_WINDOW,
                "buckets": [
                    {"start": b.start, "processed": b.processed, "failed": b.failed}
                    for b in activity.buckets
                ],
            },
            "failed_tasks": [task_summary(t) for t in failed[:10]],
            "alerts": [alert_dict(m) for m in await store.newest_outbox(channel=ALERTS, limit=5)],
            "unrunnable": [backlog_dict(b) for b in stranded],
            "relay": [dataclasses.asdict(b) for b in await store.relay_backlog()],
            "waiting": await self._waiting(),
        }

    async def _waiting(self) -> dict[str, Any]:
        """Why the newest unfinished tasks of each state wait, counted (`waiting_counts`),
        as read within the last WAITING_EVERY seconds."""
        if self._waiting_read is not None and time.monotonic() < self._waiting_read[0]:
            return self._waiting_read[1]
        counted = await self._count_waiting()
        self._waiting_read = (time.monotonic() + WAITING_EVERY, counted)
        return counted

    async def _count_waiting(self) -> dict[str, Any]:
        store = await self.app.store()
        found: list[Why] = []
        for state in WAITING_STATES:
            for t in await store.find_tasks(state=state, limit=WHY_PER_STATE):
                try:
                    found.append(await self.app.why_async(t.task_id))
                except TaskNotFound:  # purged meanwhile
                    continue
        return {"looked_at": len(found), "reasons": waiting_counts(found)}

    async def why(self, task_id: str) -> dict[str, Any] | None:
        """Why the task waits, or None when there is no such task."""
        try:
            return why_dict(await self.app.why_async(task_id))
        except TaskNotFound:
            return None

    async def tasks(
        self,
        *,
        state: TaskState | None,
        workflow: str | None,
        search: str | None,
        limit: int,
        version: int | None = None,
        tenant: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        store = await self.app.store()
        found = await store.find_tasks(
            state=state,
            workflow=workflow,
            search=search,
            limit=limit,
            version=version,
            tenant=tenant,
            tags=tags,
        )
        return {
            "tasks": [task_summary(t) for t in found],
            "workflows": await store.workflow_names(),
        }

    async def task(
        self, task_id: str, *, limit: int = 100, before: int | None = None
    ) -> dict[str, Any] | None:
        """The task, its children, its steps and a page of its history: newest first, `limit` events
        older than the event id `before` (the newest when None); `events_before` asks for the
        next page, None when there is none."""
        store = await self.app.store()
        task = await store.get_task(task_id)
        if task is None:
            return None
        steps = await store.get_steps(task_id)
        page = await store.history(task_id, limit=limit, before=before)
        children = await store.children(task_id)
        return {
            "task": task_detail(task),
            "children": [child_dict(c) for c in children],
            "steps": [step_dict(s) for s in steps],
            "events": [event_dict(e) for e in page.events],
            "more_events": page.more,
            "events_before": page.next_before,
        }

    async def agents(self) -> dict[str, Any]:
        """The agent registry (instances gone recently included), with each agent's and
        operation's step figures."""
        instances = await self.app.agent_instances_async()
        stats = await (await self.app.store()).step_stats()
        return {
            "instances": [agent_dict(a) for a in instances],
            "operations": [
                {
                    "agent": s.agent,
                    "operation": s.operation,
                    "started": s.started,
                    "completed": s.completed,
                    "failed": s.failed,
                    "reassignments": s.reassignments,
                }
                for s in stats
            ],
        }

    async def schedules(self) -> dict[str, Any]:
        found = await (await self.app.store()).schedules()
        return {"schedules": [schedule_dict(s) for s in found]}

    async def alerts(self, limit: int) -> dict[str, Any]:
        store = await self.app.store()
        found = await store.newest_outbox(channel=ALERTS, limit=limit)
        return {"alerts": [alert_dict(m) for m in found]}


def age(seconds: float | None) -> str:
    """A duration for a person: 4s, 3m 12s, 2h 5m, 3d 4h."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def since(now: datetime, then: datetime | None) -> str:
    if then is None:
        return "-"
    return age(max(timedelta(0), now - then).total_seconds())
