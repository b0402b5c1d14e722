"""One mapper per record, from a row as either dialect returns it.

Rows are dictionaries of column names; the dialects' queries return the same columns
(computed ones included, such as `remaining`). Times are `datetime`s on PostgreSQL and
seconds since the epoch on SQLite; JSON comes back as its text on both. A payload's sealed
secrets are read bound to the record that holds them (`sealing.Binding`), with the keyring of
the store that read them (`keys`: None where the process holds none), and open when revealed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .._json import loads, tags_of
from ..placement import Generation
from ..records import (
    DURATION_BUCKETS,
    Activity,
    ActivityBucket,
    AgentInstance,
    ChildFact,
    EventRecord,
    Expired,
    LeaseRecord,
    OpLimit,
    OutboxMessage,
    PauseFact,
    RelayBacklog,
    Released,
    Request,
    ScheduleRecord,
    SchedulerInstance,
    ScheduleSpec,
    StepFacts,
    StepRecord,
    StepStats,
    TaskFacts,
    TaskRecord,
    VersionBacklog,
    WaitFact,
    WaitRecord,
    Woke,
)
from ..rules import AlertReason, CallFacts
from ..sealing import Binding, Keyring
from ..secret import stored_name
from ..states import StepState, TaskState

Row = Mapping[str, Any]


def when(value: datetime | float | None) -> datetime | None:
    """A stored time: a datetime (PostgreSQL) or seconds since the epoch (SQLite)."""
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromtimestamp(value, UTC)


def at(value: datetime | float) -> datetime:
    """A stored time that is never null."""
    return value if isinstance(value, datetime) else datetime.fromtimestamp(value, UTC)


def task_record(row: Row, keys: Keyring | None = None) -> TaskRecord:
    task_id = row["task_id"]
    return TaskRecord(
        task_id=task_id,
        workflow=row["workflow"],
        input=loads(row["input"], at=Binding.input(task_id), keys=keys),
        process_state=TaskState(row["process_state"]),
        locked_by=row["locked_by"],
        complete_by=when(row["complete_by"]),
        failure_count=row["failure_count"],
        max_failures=row["max_failures"],
        attempt=row["attempt"],
        priority=row["priority"],
        complete_within=row["complete_within"],
        result=loads(row["result"], at=Binding.result(task_id), keys=keys),
        error=row["error"],
        created_at=at(row["created_at"]),
        updated_at=at(row["updated_at"]),
        finished_at=when(row["finished_at"]),
        on_failure=row["on_failure"],
        reply_to=row["reply_to"],
        compensation_failures=row["compensation_failures"],
        wake_at=when(row["wake_at"]),
        waiting_for=row["waiting_for"],
        version=row["version"],
        parent_id=row["parent_id"],
        parent_position=row["parent_position"],
        trace_context=row.get("trace_context"),
        run_trace=row.get("run_trace"),
        submitted_by=row.get("submitted_by"),
        input_digest=row.get("input_digest"),
        tenant=row.get("tenant") or None,
        tags=tags_of(row.get("tags")),
        keys_of=row.get("keys_of"),
        new_keys_from=row.get("new_keys_from"),
        forked_from=row.get("forked_from"),
    )


def step_record(row: Row, keys: Keyring | None = None) -> StepRecord:
    here = Binding.step(row["task_id"], row["seq"])
    return StepRecord(
        task_id=row["task_id"],
        seq=row["seq"],
        name=row["name"],
        agent=row["agent"],
        operation=row["operation"],
        state=StepState(row["state"]),
        attempt=row["attempt"],
        task_attempt=row["task_attempt"],
        complete_by=at(row["complete_by"]),
        idempotency_key=row["idempotency_key"],
        input=loads(row["input"], at=here, keys=keys),
        result=loads(row["result"], at=here, keys=keys),
        error=row["error"],
        locked_by=row["locked_by"],
        tries=row["tries"],
        created_at=at(row["created_at"]),
        claimed_at=when(row["claimed_at"]),
        finished_at=when(row["finished_at"]),
        compensation=row["compensation"],
        compensation_input=loads(row["compensation_input"], at=here, keys=keys),
        compensates=row["compensates"],
        abandoned=bool(row["abandoned"]),
        reassignments=row["reassignments"],
        heartbeat=loads(row["heartbeat"], at=here, keys=keys),
        heartbeat_at=when(row["heartbeat_at"]),
        limit_key=row["limit_key"],
        complete_within=row["complete_within"],
        position=row["position"],
        call_stopped_at=when(row["call_stopped_at"]),
        trace_context=row.get("trace_context"),
    )


def request(row: Row, keys: Keyring | None = None) -> Request:
    return Request(
        task_id=row["task_id"],
        seq=row["seq"],
        attempt=row["attempt"],
        agent=row["agent"],
        operation=row["operation"],
        input=loads(row["input"], at=Binding.step(row["task_id"], row["seq"]), keys=keys),
        idempotency_key=row["idempotency_key"],
        complete_by=at(row["complete_by"]),
        remaining=float(row["remaining"]),
        compensates=row["compensates"],
        queued=None if row.get("queued") is None else float(row["queued"]),
        workflow=row.get("workflow"),
        trace_context=row.get("trace_context"),
    )


def event(row: Row) -> EventRecord:
    return EventRecord(
        id=row["id"],
        task_id=row["task_id"],
        at=at(row["at"]),
        kind=row["kind"],
        detail=loads(row["detail"]),
    )


def message(row: Row, keys: Keyring | None = None) -> OutboxMessage:
    """A status message of the outbox: the detail of one about a task's state holds its
    result (its secrets bound to the task's result, which it copies)."""
    task_id = row["task_id"]
    return OutboxMessage(
        id=row["id"],
        channel=row["channel"],
        task_id=task_id,
        kind=row["kind"],
        detail=loads(
            row["detail"], at=None if task_id is None else Binding.result(task_id), keys=keys
        ),
        at=at(row["at"]),
        attempts=row["attempts"],
        # A sink stored by an earlier version under a webhook's whole URL is read under the
        # name the sink now has, without the URL's credentials and query.
        delivered_to=tuple(stored_name(n) for n in loads(row["delivered_to"])),
    )


def relay_backlog(row: Row) -> RelayBacklog:
    return RelayBacklog(
        destination=row["channel"],
        pending=int(row["pending"]),
        lag=max(0.0, float(row["lag"] or 0.0)),
        failing=int(row["failing"] or 0),
        attempts=int(row["attempts"] or 0),
        retry_in=None if row["retry_in"] is None else max(0.0, float(row["retry_in"])),
        error=row["error"],
    )


def agent_instance(row: Row) -> AgentInstance:
    return AgentInstance(
        instance=row["instance"],
        agent=row["agent"],
        operations=tuple(loads(row["operations"])),
        capacity=row["capacity"],
        inflight=row["inflight"],
        breaker=row["breaker"],
        breaker_detail=loads(row["breaker_detail"]),
        started_at=at(row["started_at"]),
        heartbeat_at=at(row["heartbeat_at"]),
        expires_at=at(row["expires_at"]),
        alive=bool(row["alive"]),
    )


def scheduler_instance(row: Row) -> SchedulerInstance:
    return SchedulerInstance(
        instance=row["instance"],
        workflows=tuple(loads(row["workflows"])),
        versions=tuple((str(w), int(v)) for w, v in loads(row["versions"])),
        capacity=row["capacity"],
        held=row["held"],
        started_at=at(row["started_at"]),
        heartbeat_at=at(row["heartbeat_at"]),
        expires_at=at(row["expires_at"]),
        alive=bool(row["alive"]),
    )


def lease(row: Row) -> LeaseRecord:
    since = row["since_renewed"]
    return LeaseRecord(
        name=row["name"],
        holder=row["holder"],
        term=int(row["term"]),
        expires_at=at(row["expires_at"]),
        remaining=float(row["remaining"]),
        since_renewed=None if since is None else float(since),
    )


def step_stats(row: Row) -> StepStats:
    return StepStats(
        agent=row["agent"],
        operation=row["operation"],
        started=int(row["started"] or 0),
        completed=int(row["completed"] or 0),
        failed=int(row["failed"] or 0),
        reassignments=int(row["reassignments"] or 0),
        retried=int(row["retried"] or 0),
        duration_buckets=tuple(int(row[f"b{i}"] or 0) for i in range(len(DURATION_BUCKETS))),
        duration_sum=float(row["duration_sum"] or 0.0),
    )


def activity(rows: Sequence[Row], bucket: float) -> Activity:
    """The `activity` query's rows: the database clock (`now`, on every row) and one row per
    bucket number `b` in which something happened (none when `b` is null)."""
    buckets = [
        ActivityBucket(
            start=datetime.fromtimestamp(r["b"] * bucket, UTC),
            processed=int(r["processed"]),
            failed=int(r["failed"]),
        )
        for r in rows
        if r["b"] is not None
    ]
    return Activity(now=at(rows[0]["now"]), bucket=bucket, buckets=buckets)


def wait_binding(row: Row) -> Binding | None:
    """The record what a wait took belongs to (from its `kind`, `name`, `event_id` and
    `task_id` columns): an event's payload, that event; a child's result, the child's."""
    if row["kind"] == "event" and row["event_id"] is not None:
        return Binding.event(row["task_id"], row["event_id"])
    if row["kind"] == "child":
        return Binding.result(row["name"])
    return None


def wait_payload(row: Row, keys: Keyring | None = None) -> Any:
    """What a wait took (its `payload`): an event's payload, or a child's result."""
    return loads(row["payload"], at=wait_binding(row), keys=keys)


def wait_record(row: Row, keys: Keyring | None = None) -> WaitRecord:
    return WaitRecord(
        task_id=row["task_id"],
        seq=row["seq"],
        kind=row["kind"],
        name=row["name"],
        wake_at=when(row["wake_at"]),
        state=row["state"],
        event_id=row["event_id"],
        payload=wait_payload(row, keys),
        created_at=at(row["created_at"]),
        finished_at=when(row["finished_at"]),
        position=row["position"],
    )


def schedule_record(row: Row, keys: Keyring | None = None) -> ScheduleRecord:
    return ScheduleRecord(
        name=row["name"],
        workflow=row["workflow"],
        cron=row["cron"],
        every=row["every"],
        input=loads(row["input"], at=Binding.schedule(row["name"]), keys=keys),
        timezone=row["timezone"],
        catch_up=row["catch_up"],
        paused=bool(row["paused"]),
        next_at=at(row["next_at"]),
        last_tick=when(row["last_tick"]),
        complete_within=float(row["complete_within"]),
        max_failures=int(row["max_failures"]),
        on_failure=row["on_failure"],
        version=int(row["version"]),
        tenant=row.get("tenant") or None,
    )


def schedule_spec(row: Row) -> ScheduleSpec:
    """A stored schedule as the rules read it (`rules.first_tick`, `rules.plan_ticks`)."""
    return ScheduleSpec(
        name=row["name"],
        workflow=row["workflow"],
        input=row["input"],
        complete_within=float(row["complete_within"]),
        max_failures=int(row["max_failures"]),
        on_failure=row["on_failure"],
        cron=row["cron"],
        every=row["every"],
        timezone=row["timezone"],
        catch_up=row["catch_up"],
        version=int(row["version"]),
        tenant=row.get("tenant") or None,
    )


def expired(row: Row, *, set_aside: bool = False) -> Expired:
    """A task a sweep recovered (`reset_tasks`: its expired step's seq, or none), or set
    aside (`set_aside`: no step named)."""
    return Expired(
        task_id=row["task_id"],
        seq=None if set_aside else row["seq"],
        failure_count=row["failure_count"],
        process_state=TaskState(row["process_state"]),
        set_aside=set_aside,
        alert=str(AlertReason.SET_ASIDE) if set_aside else None,
    )


def released(row: Row) -> Released:
    return Released(
        task_id=row["task_id"],
        attempt=row["attempt"],
        scheduler=row["scheduler"],
        process_state=TaskState(row["process_state"]),
    )


def woke(row: Row) -> Woke:
    return Woke(task_id=row["task_id"], waited_for=row["waiting_for"])


def version_backlog(row: Row) -> VersionBacklog:
    return VersionBacklog(
        workflow=row["workflow"],
        version=int(row["version"]),
        pending=int(row["pending"]),
        compensating=int(row["compensating"]),
        oldest=at(row["oldest"]),
    )


def generations(rows: Sequence[Row]) -> list[Generation]:
    """The shard map's generations as stored (JSON text on both dialects), oldest first."""
    return [Generation.decoded(int(r["generation"]), r["shards"], r["slots"]) for r in rows]


def call_facts(row: Row) -> CallFacts:
    """A step and its task, as `call_facts` and `held_steps` read them, for the rules of an
    agent's call."""
    return CallFacts(
        state=StepState(row["state"]),
        attempt=int(row["attempt"]),
        locked_by=row["locked_by"],
        abandoned=bool(row["abandoned"]),
        call_stopped=bool(row["call_stopped"]),
        task_state=TaskState(row["process_state"]),
    )


def wait_fact(row: Row) -> WaitFact:
    return WaitFact(
        position=row["position"], kind=row["kind"], name=row["name"], wake_at=when(row["wake_at"])
    )


def child_facts(rows: Sequence[Row]) -> tuple[ChildFact, ...]:
    """The children a task's open child waits name, each in its state (a child purged
    meanwhile is left out)."""
    return tuple(
        ChildFact(task_id=r["name"], state=TaskState(r["child_state"]))
        for r in rows
        if r["kind"] == "child" and r["child_state"] is not None
    )


def pause_fact(rows: Sequence[Row]) -> PauseFact | None:
    """The operator action that paused the task, of the rows `why_marks` reads."""
    for r in rows:
        if r["kind"] == "operator":
            detail = loads(r["detail"])
            return PauseFact(
                by=str(detail.get("by")),
                authenticated=detail.get("authenticated"),
                note=detail.get("reason"),
                at=at(r["at"]),
            )
    return None


def alert_reason(rows: Sequence[Row]) -> str | None:
    """The reason of the task's newest alert, of the rows `why_marks` reads."""
    for r in rows:
        if r["kind"] == "alert":
            reason = loads(r["detail"]).get("reason")
            return None if reason is None else str(reason)
    return None


def task_facts(
    row: Row,
    waits: Sequence[Row],
    marks: Sequence[Row],
    schedulers: Sequence[SchedulerInstance],
    keys: Keyring | None = None,
) -> TaskFacts:
    return TaskFacts(
        task=task_record(row, keys),
        now=at(row["now"]),
        eligible_at=at(row["eligible_at"]),
        ahead=int(row["ahead"]),
        tenant_ahead=int(row["tenant_ahead"]),
        share=float(row["tenant_weight"]) / float(row["weights"]),
        waits=tuple(wait_fact(w) for w in waits),
        children=child_facts(waits),
        paused=pause_fact(marks),
        alert=alert_reason(marks),
        schedulers=tuple(schedulers),
    )


def step_facts(
    row: Row,
    instances: Sequence[AgentInstance],
    limit: OpLimit | None,
    usage: Row | None,
    keys: Keyring | None = None,
) -> StepFacts:
    """An open step's facts: `usage` is its operation's `why_limit` row (None: no limit)."""
    return StepFacts(
        step=step_record(row, keys),
        now=at(row["now"]),
        instances=tuple(i for i in instances if i.agent == row["agent"]),
        ahead=int(row["ahead"]),
        limit=limit,
        running=0 if usage is None else int(usage["running"]),
        running_tasks=() if usage is None else tuple(loads(usage["running_tasks"])),
        started=0 if usage is None else int(usage["started"]),
        oldest_start=None if usage is None else when(usage["oldest_start"]),
    )
