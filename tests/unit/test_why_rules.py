"""`rules.task_gate`, `rules.step_gate` and `rules.holding_gate` on canned facts: which reason
holds a task or a step, and the facts it carries, in the cases the stores' contract tests do
not reach one by one."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from stepwarden.records import (
    AgentInstance,
    ChildFact,
    Gate,
    OpLimit,
    SchedulerInstance,
    StepFacts,
    StepRecord,
    TaskFacts,
    TaskRecord,
    WaitFact,
    WaitReason,
)
from stepwarden.rules import holding_gate, step_gate, task_gate
from stepwarden.states import StepState, TaskState

NOW = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
R = WaitReason


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def task(**changes: Any) -> TaskRecord:
    base = TaskRecord(
        task_id="t", workflow="wf", input=None, process_state=TaskState.PENDING,
        locked_by=None, complete_by=None, failure_count=0, max_failures=3, attempt=0,
        priority=0, complete_within=60.0, result=None, error=None, created_at=ago(60),
        updated_at=ago(30), finished_at=None,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def scheduler(instance: str, *, alive: bool = True, beat: float = 1.0) -> SchedulerInstance:
    return SchedulerInstance(
        instance=instance, workflows=("wf",), capacity=10, held=0, versions=(("wf", 1),),
        started_at=ago(600), heartbeat_at=ago(beat), expires_at=ago(beat) + timedelta(seconds=5),
        alive=alive,
    )  # fmt: skip


def facts(t: TaskRecord, **changes: Any) -> TaskFacts:
    base = TaskFacts(
        task=t, now=NOW, eligible_at=ago(1), ahead=0, waits=(), children=(), paused=None,
        alert=None, schedulers=(),
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def instance(name: str, **changes: Any) -> AgentInstance:
    base = AgentInstance(
        instance=name, agent="desk", operations=("stamp",), capacity=2, inflight=0,
        breaker="closed", breaker_detail={}, started_at=ago(600), heartbeat_at=ago(1),
        expires_at=ago(1) + timedelta(seconds=5), alive=True,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def step(**changes: Any) -> StepFacts:
    record = StepRecord(
        task_id="t", seq=1, name="stamp", agent="desk", operation="stamp",
        state=StepState.NOT_STARTED, attempt=1, task_attempt=1,
        complete_by=NOW + timedelta(seconds=30), idempotency_key="t/1", input=None,
        result=None, error=None, locked_by=None, tries=0,
        created_at=ago(5), claimed_at=None, finished_at=None,
    )  # fmt: skip
    base = StepFacts(
        step=record, now=NOW, instances=(), ahead=0, limit=None, running=0, running_tasks=(),
        started=0, oldest_start=None,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def test_a_pending_task_goes_to_the_alive_schedulers_of_its_version_only() -> None:
    gone = scheduler("old", alive=False, beat=90)
    other = dataclasses.replace(scheduler("v2"), versions=(("wf", 2),))
    g = task_gate(facts(task(), schedulers=(gone, other)))
    assert (g.reason, g.since) == (R.NO_SCHEDULER, gone.heartbeat_at)
    g = task_gate(facts(task(), schedulers=(gone, scheduler("s1")), ahead=4))
    assert (g.reason, g.schedulers, g.ahead, g.rank) == (R.RANKED, ("s1",), 4, 5)
    # A pending task's tenant: its own tasks ahead, and its share of the claims.
    theirs = task(tenant="acme")
    g = task_gate(facts(theirs, schedulers=(scheduler("s1"),), ahead=4, tenant_ahead=1, share=0.75))
    assert (g.tenant, g.tenant_ahead, g.share) == ("acme", 1, 0.75)
    # An unheld compensating task is claimed as a pending one, by rank alone (no tenant's
    # share); its backoff comes first.
    comp = task(process_state=TaskState.COMPENSATING)
    g = task_gate(facts(comp, schedulers=(scheduler("s1"),)))
    assert (g.reason, g.tenant, g.tenant_ahead, g.share) == (R.RANKED, None, None, None)
    g = task_gate(facts(comp, eligible_at=NOW + timedelta(seconds=9)))
    assert (g.reason, g.until) == (R.BACKOFF, NOW + timedelta(seconds=9))


def test_a_held_task_is_taken_back_at_its_complete_by_or_its_holder_s_expiry() -> None:
    held = task(
        process_state=TaskState.PROCESSING, locked_by="s1", complete_by=NOW + timedelta(seconds=60)
    )
    g = task_gate(facts(held, schedulers=(scheduler("s1", beat=2),)))
    assert (g.reason, g.holder, g.holder_alive, g.beat_age) == (R.HELD, "s1", True, 2.0)
    assert g.until == ago(2) + timedelta(seconds=5)  # its registry row expires first
    g = task_gate(facts(held))  # a holder the registry does not know
    assert (g.holder_alive, g.beat_age, g.until) == (False, None, NOW + timedelta(seconds=60))


def test_a_waiting_task_waits_for_its_first_wait_in_the_workflow_s_order() -> None:
    waits = (
        WaitFact(position="10", kind="timer", name="", wake_at=NOW + timedelta(seconds=1)),
        WaitFact(position="9", kind="child", name="c9", wake_at=None),
    )
    waiting = task(process_state=TaskState.WAITING)
    child = ChildFact(task_id="c9", state=TaskState.PENDING)
    g = task_gate(facts(waiting, waits=waits, children=(child,)))
    assert (g.reason, g.children, [w.position for w in g.waits]) == (
        R.CHILDREN, (child,), ["9", "10"],
    )  # fmt: skip
    started = task(process_state=TaskState.WAITING, wake_at=NOW + timedelta(hours=1))
    assert task_gate(facts(started)) == Gate(reason=R.START, until=NOW + timedelta(hours=1))


def test_a_queued_step_names_what_keeps_it_from_an_instance() -> None:
    gone = instance("gone", alive=False, heartbeat_at=ago(300))
    elsewhere = instance("elsewhere", operations=("other",))
    g = step_gate(step(instances=(gone, elsewhere)))
    assert (g.reason, g.since) == (R.NO_AGENT, gone.heartbeat_at)
    tripped = instance("a", breaker="open", breaker_detail={"half_open_in": 20.0})
    sooner = instance("b", breaker="open", breaker_detail={"half_open_in": 5.0})
    g = step_gate(step(instances=(tripped, sooner)))
    assert (g.reason, g.instances, g.until) == (
        R.BREAKER_OPEN,
        ("a", "b"),
        ago(1) + timedelta(seconds=5),
    )
    # A half-open breaker lets a call through: the step is in line for it.
    trying = instance("c", breaker="half_open")
    assert step_gate(step(instances=(tripped, trying))).reason == R.QUEUED
    busy = instance("busy", inflight=2)
    assert step_gate(step(instances=(busy,))).reason == R.NO_CAPACITY
    g = step_gate(step(instances=(busy, instance("idle")), ahead=3))
    assert (g.reason, g.instances, g.rank) == (R.QUEUED, ("busy", "idle"), 4)


def test_an_operation_s_limits_come_before_the_slots() -> None:
    busy = instance("busy", inflight=2)
    g = step_gate(
        step(instances=(busy,), limit=OpLimit(concurrency=2), running=2, running_tasks=("x", "y"))
    )
    assert (g.reason, g.limit, g.in_use, g.held_by) == (R.CONCURRENCY_FULL, 2, 2, ("x", "y"))
    g = step_gate(
        step(instances=(busy,), limit=OpLimit(rate=3, per=60), started=3, oldest_start=ago(10))
    )
    assert (g.reason, g.limit, g.per, g.until) == (
        R.RATE_FULL,
        3,
        60,
        ago(10) + timedelta(seconds=60),
    )
    under = step(instances=(instance("idle"),), limit=OpLimit(concurrency=2, rate=3), running=1)
    assert step_gate(under).reason == R.QUEUED


def test_a_held_task_waits_in_the_end_for_its_first_open_step() -> None:
    held = Gate(reason=R.HELD, holder="s1")
    queued = Gate(reason=R.NO_AGENT, agent="desk")
    assert holding_gate(held, [queued, Gate(reason=R.QUEUED)]) is queued
    assert holding_gate(held, []) is held
    paused = Gate(reason=R.PAUSED)
    assert holding_gate(paused, [queued]) is paused
