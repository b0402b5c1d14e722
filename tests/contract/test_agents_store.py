"""The Store contract of healthy, capable agents, on each store: the registry, requests handed
back, step heartbeats, the supervisor's reassignments and timeouts, claims within limits.

What an agent asks (`store.ports.AgentPort`: beat, leave, claim, heartbeat, complete, hand back)
goes through the fixture `agents`, once to the store itself and once over HTTP to a server's
agent protocol over the same store (`remote.RemoteAgentPort`); what the scheduler, the
supervisor and the operator do goes to `store`. Agent instances are named `tester/...`, as
the protocol's client `tester` names its own."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from stepwarden import rules
from stepwarden.records import (
    CallStop,
    OperatorAction,
    OpLimit,
    RequestHandback,
    SchedulerBeat,
    StepSwept,
    WaitRequest,
)
from stepwarden.retry import Backoff
from stepwarden.states import StepState, TaskState
from stepwarden.store import Store
from stepwarden.store.ports import AgentPort
from stepwarden.store.sqlite import SQLiteStore

from ..dispatching import new_step
from ..rawsql import sql
from ..support.store import (
    A1,
    A2,
    A3,
    beat,
    compensating,
    dispatch,
    held_task,
    new_task,
    outcome,
    running_step,
)

LEASE = "supervisor"


async def sweep(store: Store, term: int) -> list[StepSwept]:
    return await store.sweep_steps(
        lease=LEASE, holder="sup", term=term, limit=100, forget_after=3600
    )


async def sweep_until(store: Store, term: int, timeout: float = 10) -> list[StepSwept]:
    """Sweep until something is swept (a deadline has to pass first)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        swept = await sweep(store, term)
        if swept:
            return swept
        await asyncio.sleep(0.02)
    raise AssertionError("nothing swept")


async def test_the_registry_shows_each_instance_alive_until_it_leaves(
    store: Store, agents: AgentPort
) -> None:
    await agents.beat([beat(A1), beat(A2, breaker="open")], ttl=30)
    await agents.beat([beat(A1, agent="ship")], ttl=30)
    found = {(a.instance, a.agent): a for a in await store.list_agents()}
    assert sorted(found) == [(A1, "pay"), (A1, "ship"), (A2, "pay")]
    a2 = found[(A2, "pay")]
    assert (a2.alive, a2.breaker, a2.capacity, a2.inflight) == (True, "open", 10, 1)
    assert a2.operations == ("charge",) and a2.breaker_detail == {"failures": 0}
    assert a2.heartbeat_at >= a2.started_at
    await agents.leave(A2, ["pay"])
    alive = {(a.instance, a.agent): a.alive for a in await store.list_agents()}
    assert alive == {(A1, "pay"): True, (A1, "ship"): True, (A2, "pay"): False}
    await agents.beat([beat(A2)], ttl=30)  # back: a beat revives it, started_at kept
    again = {(a.instance, a.agent): a for a in await store.list_agents()}
    assert again[(A2, "pay")].alive and again[(A2, "pay")].started_at == a2.started_at


async def test_a_request_handed_back_is_claimed_by_another_instance(
    store: Store, agents: AgentPort
) -> None:
    await running_step(store, agents, "t1")
    refused = RequestHandback(task_id="t1", seq=1, attempt=1, agent_instance=A2, reason="x")
    mine = replace(refused, agent_instance=A1, reason="breaker open")
    assert await agents.hand_back([refused, mine]) == [False, True]
    [step] = await store.get_steps("t1")
    assert (step.state, step.attempt, step.locked_by, step.reassignments) == (
        StepState.NOT_STARTED,
        1,
        None,
        1,
    )
    assert await agents.complete_steps([outcome("t1", 1, instance=A1)]) == [False]
    [req] = await agents.claim_requests(A2, "pay", ["charge"], 5)
    assert (req.task_id, req.attempt) == ("t1", 1)
    assert await agents.complete_steps([outcome("t1", 1, instance=A2)]) == [True]
    [event] = [e for e in await store.events(task_id="t1") if e.kind == "handed_back"]
    assert event.detail == {"seq": 1, "attempt": 1, "from": A1, "reason": "breaker open"}


async def test_a_heartbeat_moves_complete_by_on_only_for_the_holder(
    store: Store, agents: AgentPort
) -> None:
    await running_step(store, agents, "t1")
    before = await store.read_step("t1", 1)
    assert before is not None
    left = await agents.heartbeat_step("t1", 1, 1, A1, '{"done": 3}')
    assert left is not None and 0 < left <= 10
    after = await store.read_step("t1", 1)
    assert after is not None
    assert after[0].complete_by >= before[0].complete_by
    assert after[0].heartbeat == {"done": 3} and after[0].heartbeat_at is not None
    # Another instance, or another attempt, holds nothing: refused, nothing written.
    assert await agents.heartbeat_step("t1", 1, 1, A2, '{"x": 1}') is None
    assert await agents.heartbeat_step("t1", 1, 2, A1, '{"x": 1}') is None
    assert (await store.get_steps("t1"))[0].heartbeat == {"done": 3}


async def test_a_heartbeat_never_passes_the_tasks_complete_by(
    store: Store, agents: AgentPort
) -> None:
    await store.submit([new_task("t1", within=3)])
    [claimed] = await store.claim_tasks("s1", ["wf"], 1)
    [got] = await store.dispatch_steps([dispatch("t1", claimed.task.attempt, within=60)])
    assert got is not None and got.remaining <= 3
    await agents.claim_requests(A1, "pay", ["charge"], 1)
    left = await agents.heartbeat_step("t1", 1, 1, A1, None)
    assert left is not None and left <= 3


DEADLINES = [  # (now, complete_within, task's complete_by, give_up_by, not_before): result
    ((100, 30, 120, 200, None), 120),  # the task's complete_by is the earliest
    ((100, 30, 150, 120, None), 120),  # the total timeout is
    ((100, 30, None, 200, None), 130),  # no task's complete_by (a reassignment)
    ((100, 30, 120, None, None), 120),  # no total timeout
    ((100, 30, None, None, None), 130),
    ((100, 30, 120, 200, 125), 125),  # never before not_before (a heartbeat never shortens)
    ((100, 30, 120, 200, 110), 120),
    ((100, None, 120, None, None), 120),
    ((100, None, None, None, None), None),
    ((100, None, None, None, 125), 125),
]


async def test_a_steps_deadline_is_the_earliest_of_its_caps_a_null_none_of_them(
    store: Store,
) -> None:
    """The one rule of a step's complete_by (`rules.step_deadline`, the SQL function
    `stepwarden_step_deadline` of every store: SQLite's calls the rule, PostgreSQL's is the
    rule in SQL, on the database's clock) gives the same deadline on every store: a NULL is
    no candidate, as in PostgreSQL's LEAST and GREATEST."""
    for args, deadline in DEADLINES:
        if isinstance(store, SQLiteStore):
            call = f"SELECT stepwarden_step_deadline({', '.join(map(_literal, args))}) AS d"

            def read(conn: sqlite3.Connection, query: str = call) -> Any:
                return conn.execute(query).fetchone()["d"]

            found = await store._in_thread(read)
        else:
            now, within, *times = args
            stamps = [f"to_timestamp({_literal(t)})" for t in (now, *times)]
            interval = f"make_interval(secs => {_literal(within)})"
            call = f"stepwarden_step_deadline({stamps[0]}, {interval}, {', '.join(stamps[1:])})"
            [(found,)] = sql(store.url, f"SELECT extract(epoch FROM {call})::float8")
        assert found == deadline == rules.step_deadline(*args), (args, found)


def _literal(value: float | None) -> str:
    return "NULL" if value is None else repr(value)


async def test_the_steps_of_a_gone_instance_are_reassigned(store: Store, agents: AgentPort) -> None:
    """A worker of every role dies: its agent instance and its scheduler instance are found
    gone. The step goes back to the queue and its task is released with it."""
    term = await store.acquire_lease(LEASE, "sup", 30)
    assert term is not None
    await agents.beat([beat(A1)], ttl=30)
    await store.beat_schedulers(
        [SchedulerBeat(instance="s1", workflows=("wf",), capacity=10, held=1)], ttl=30
    )
    await running_step(store, agents, "t1")
    assert await sweep(store, term) == []  # a1 is alive
    assert await sweep(store, term + 1) == []  # not the lease's term: nothing
    await agents.leave(A1, ["pay"])
    await store.leave_scheduler("s1")
    assert await sweep(store, term + 1) == []
    [swept] = await sweep(store, term)
    assert (swept.task_id, swept.seq, swept.kind, swept.instance) == ("t1", 1, "reassigned", A1)
    [step] = await store.get_steps("t1")
    assert (step.state, step.attempt, step.reassignments, step.locked_by) == (
        StepState.NOT_STARTED,
        2,
        1,
        None,
    )
    # Its task is released for a scheduler to take up again (its own may be gone too), no
    # failure counted; the next claim adopts the step.
    task = await store.get_task("t1")
    assert task is not None and task.failure_count == 0
    assert (task.process_state, task.locked_by, task.complete_by) == (TaskState.PENDING, None, None)
    [again] = await store.claim_tasks("s2", ["wf"], 1)
    assert (again.task.task_id, again.task.attempt) == ("t1", 2)
    adopt = dispatch("t1", 2, scheduler="s2", kind="adopt", expected=2)
    [adopted] = await store.dispatch_steps([adopt])
    assert adopted is not None and adopted.attempt == 2
    # The gone instance's late answer changes nothing; the next instance's counts.
    assert await agents.complete_steps([outcome("t1", 1, instance=A1)]) == [False]
    [req] = await agents.claim_requests(A2, "pay", ["charge"], 1)
    assert req.attempt == 2
    assert await agents.complete_steps([outcome("t1", 2, instance=A2)]) == [True]
    [event] = [e for e in await store.events(task_id="t1") if e.kind == "reassigned"]
    assert event.detail["from"] == A1 and event.detail["attempt"] == 2


async def test_a_gone_instances_step_of_a_task_an_alive_scheduler_holds_is_queued_for_it(
    store: Store, agents: AgentPort
) -> None:
    """Only the agent instance is gone: the scheduler holding the task is alive and waits
    for the step. The step is queued again under that scheduler's attempt of the task, its
    complete_by never past the task's; the task stays held (no release, no new claim), and
    the scheduler adopts the step as it stands."""
    term = await store.acquire_lease(LEASE, "sup", 30)
    assert term is not None
    await agents.beat([beat(A1)], ttl=30)
    await store.beat_schedulers(
        [SchedulerBeat(instance="s1", workflows=("wf",), capacity=10, held=1)], ttl=30
    )
    await running_step(store, agents, "t1")
    held = await store.get_task("t1")
    assert held is not None and held.complete_by is not None
    await agents.leave(A1, ["pay"])
    [swept] = await sweep(store, term)
    assert (swept.task_id, swept.kind) == ("t1", "reassigned")
    task = await store.get_task("t1")
    assert task is not None
    assert (task.process_state, task.locked_by, task.attempt, task.failure_count) == (
        TaskState.PROCESSING,
        "s1",
        held.attempt,
        0,
    )
    [step] = await store.get_steps("t1")
    assert (step.state, step.attempt, step.task_attempt) == (StepState.NOT_STARTED, 2, held.attempt)
    assert step.complete_by is not None and step.complete_by <= held.complete_by
    adopt = dispatch("t1", held.attempt, scheduler="s1", kind="adopt", expected=2)
    [adopted] = await store.dispatch_steps([adopt])
    assert adopted is not None and adopted.attempt == 2
    [req] = await agents.claim_requests(A2, "pay", ["charge"], 1)
    assert req.attempt == 2
    assert await agents.complete_steps([outcome("t1", 2, instance=A2)]) == [True]


async def _task_in(store: Store, agents: AgentPort, state: str) -> tuple[int, str]:
    """Task "t1" with a step running under A1, the task then brought to `state` (its
    scheduler s1 alive or not: A1 is the one found gone); the step's seq, and the operation."""
    await agents.beat([beat(A1), replace(beat(A2), operations=("charge", "refund"))], ttl=30)
    if state == "compensating":
        # Its undo step runs; then its scheduler drains: compensating, held by none.
        await compensating(store, within=30)
        [undo] = await agents.claim_requests(A1, "pay", ["refund"], 1)
        assert undo.seq == 2
        assert len(await store.release_held("s2")) == 1
        return 2, "refund"
    await running_step(store, agents, "t1")
    if state == "pending":  # its scheduler drained (or was found gone): released
        assert len(await store.release_held("s1")) == 1
    elif state == "processing":  # claimed again by s2, which has not adopted the step yet
        assert len(await store.release_held("s1")) == 1
        [again] = await store.claim_tasks("s2", ["wf"], 1)
        assert again.task.attempt == 2
    elif state == "waiting":  # parked on a timer while its step runs
        timer = WaitRequest(
            task_id="t1", task_attempt=1, scheduler="s1", seq=2, kind="timer", name="", delay=60
        )
        assert (await store.wait(timer)).state == "parked"
    elif state == "paused":
        [paused] = await store.operate([OperatorAction(action="pause", task_id="t1", actor="ops")])
        assert paused.applied
    task = await store.get_task("t1")
    assert task is not None and task.process_state == state
    return 1, "charge"


@pytest.mark.parametrize("state", ["pending", "processing", "waiting", "compensating", "paused"])
async def test_a_gone_instances_step_is_given_back_whatever_the_state_of_its_task(
    store: Store, agents: AgentPort, state: str
) -> None:
    """The running step of an instance found gone goes back to not_started under a new
    attempt, whether its task is held, released, held again by another scheduler, waiting,
    compensating or paused: queued in time for another instance while the task's calls go
    on; past its complete_by for a paused task, for the scheduler that resumes it to
    dispatch again. The gone instance's late outcome, heartbeat and stop are refused."""
    term = await store.acquire_lease(LEASE, "sup", 30)
    assert term is not None
    seq, operation = await _task_in(store, agents, state)
    before = await store.get_task("t1")
    assert await sweep(store, term) == []  # a1 is alive
    await agents.leave(A1, ["pay"])
    [swept] = await sweep(store, term)
    assert (swept.task_id, swept.seq, swept.kind, swept.instance) == ("t1", seq, "reassigned", A1)
    found = await store.read_step("t1", seq)
    assert found is not None
    step, remaining = found
    assert (step.state, step.attempt, step.reassignments, step.locked_by) == (
        StepState.NOT_STARTED,
        2,
        1,
        None,
    )
    task = await store.get_task("t1")
    assert task is not None and before is not None and task.failure_count == 0
    if state == "processing":  # s2 (alive) keeps it; the step is queued under its attempt
        assert (task.process_state, task.locked_by, task.attempt) == (TaskState.PROCESSING, "s2", 2)
        assert step.task_attempt == 2
    else:
        assert (task.process_state, task.locked_by) == (before.process_state, None)
    assert await sweep(store, term) == []  # once
    # Whatever the gone instance sends late is refused.
    late = outcome("t1", 1, seq, instance=A1)
    assert await agents.complete_steps([late]) == [False]
    assert await agents.heartbeat_step("t1", seq, 1, A1, None) is None
    stop = CallStop(task_id="t1", seq=seq, attempt=1, agent_instance=A1, reason="x")
    assert await agents.stop_calls([stop]) == [False]
    if state == "paused":
        # Claimed by none while the task is paused; dispatched again once it is resumed.
        assert remaining <= 0
        assert await agents.claim_requests(A2, "pay", ["charge"], 5) == []
        [resumed] = await store.operate(
            [OperatorAction(action="resume", task_id="t1", actor="ops")]
        )
        assert resumed.applied
        [again] = await store.claim_tasks("s2", ["wf"], 1)
        redispatch = dispatch("t1", again.task.attempt, scheduler="s2", kind="redispatch",
                              expected=2)  # fmt: skip
        [got] = await store.dispatch_steps([redispatch])
        assert got is not None and got.attempt == 3
    else:
        assert remaining > 5  # a full complete_by of its own (10 s, 30 s for the undo)
    [req] = await agents.claim_requests(A2, "pay", [operation], 5)
    assert (req.task_id, req.seq) == ("t1", seq)
    assert await agents.complete_steps([outcome("t1", req.attempt, seq, instance=A2)]) == [True]
    assert await agents.complete_steps([late]) == [False]


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_gone_instances_step_waits_for_a_claim_of_its_task_under_way(
    store: Store, agents: AgentPort, store_url: str
) -> None:
    """PostgreSQL (SQLite runs one write at a time): a step of a gone instance whose task
    another transaction holds locked (a claim under way) is left for the next sweep. Given
    back meanwhile, on the task as it stood before the claim, it would leave the new holder
    a step it can neither adopt nor dispatch again (the attempt moved), its task held until
    its complete_by; after the claim, it is given back under the new holder's attempt, for
    that holder (alive) to adopt."""
    term = await store.acquire_lease(LEASE, "sup", 30)
    assert term is not None
    await agents.beat([beat(A1)], ttl=30)
    await running_step(store, agents, "t1")
    assert len(await store.release_held("s1")) == 1  # pending, its step running under a1
    await agents.leave(A1, ["pay"])
    with psycopg.connect(store_url) as claim:  # a claim of the task, under way
        claim.execute(
            "UPDATE stepwarden_tasks SET process_state = 'processing', locked_by = 's2',"
            " attempt = attempt + 1 WHERE task_id = 't1'"
        )
        assert await sweep(store, term) == []
        claim.commit()
    [swept] = await sweep(store, term)
    assert (swept.task_id, swept.kind) == ("t1", "reassigned")
    task = await store.get_task("t1")
    assert task is not None
    assert (task.process_state, task.locked_by, task.attempt) == (TaskState.PROCESSING, "s2", 2)
    [step] = await store.get_steps("t1")
    assert (step.state, step.task_attempt) == (StepState.NOT_STARTED, 2)


async def test_agent_room_counts_only_what_alive_instances_hold(
    store: Store, agents: AgentPort
) -> None:
    """A step running under an instance gone, and a task held by a scheduler instance gone,
    take up none of the room: the supervisor gives both back, and until then the alive
    instances' capacity is free for other work."""
    await agents.beat([replace(beat(A1), capacity=4), replace(beat(A2), capacity=3)], ttl=30)
    alive = SchedulerBeat(instance="s1", workflows=("wf",), capacity=10, held=0)
    await store.beat_schedulers([alive], ttl=30)
    attempt = await held_task(store, "t1")
    await held_task(store, "t2")
    for seq in (1, 2, 3):
        await store.dispatch_steps([dispatch("t1", attempt, seq)])
    assert len(await agents.claim_requests(A2, "pay", ["charge"], 3)) == 3
    assert await store.agent_room() == 7 - 3  # three steps running, two tasks held
    await agents.leave(A2, ["pay"])
    assert await store.agent_room() == 4 - 2  # a2's steps no longer count, s1's tasks do
    await store.leave_scheduler("s1")
    assert await store.agent_room() == 4  # nor the tasks of a scheduler instance gone
    await store.submit([new_task("t3")])
    [claimed] = await store.claim_tasks("s2", ["wf"], 1)
    assert claimed.task.task_id == "t3"
    assert await store.agent_room() == 3


async def test_a_step_nobody_picks_up_in_time_fails(store: Store, agents: AgentPort) -> None:
    term = await store.acquire_lease(LEASE, "sup", 30)
    assert term is not None
    attempt = await held_task(store, "t1")
    await store.dispatch_steps([replace(new_step(dispatch("t1", attempt)), pickup_within=0.2)])
    [swept] = await sweep_until(store, term)
    assert (swept.task_id, swept.kind) == ("t1", "pickup")
    [step] = await store.get_steps("t1")
    assert step.state == StepState.FAILED
    assert step.error == "not picked up: no agent claimed the step within 0.2s"
    assert await agents.claim_requests(A1, "pay", ["charge"], 5) == []
    assert [r.seq for r in await store.finished_steps([("t1", 1)])] == [1]


async def test_a_step_past_its_total_timeout_fails_abandoned_if_it_ran(
    store: Store, agents: AgentPort
) -> None:
    term = await store.acquire_lease(LEASE, "sup", 30)
    assert term is not None
    await agents.beat([beat(A1)], ttl=30)
    await running_step(store, agents, "t1", total_within=0.3)
    attempt = await held_task(store, "t2")
    await store.dispatch_steps(
        [replace(new_step(dispatch("t2", attempt, agent="ship")), total_within=0.3)]
    )
    swept = await sweep_until(store, term)
    while len(swept) < 2:
        swept += await sweep_until(store, term)
    assert sorted((s.task_id, s.kind) for s in swept) == [("t1", "total"), ("t2", "total")]
    [ran] = await store.get_steps("t1")
    [queued] = await store.get_steps("t2")
    assert ran.error == "abandoned: total timeout: not completed within 0.3s of its first dispatch"
    assert queued.error == "total timeout: not completed within 0.3s of its first dispatch"
    assert ran.state == queued.state == StepState.FAILED


async def test_a_step_past_its_total_timeout_counts_no_expiry_of_its_task(
    store: Store, agents: AgentPort
) -> None:
    """A step's complete_by is capped by its total timeout, so both pass together: the
    expiry sweep leaves such a step to the step sweep, which fails it; its task counts no
    failure (else, at its last try, max_failures would end it in error instead)."""
    term = await store.acquire_lease(LEASE, "sup", 30)
    assert term is not None
    await agents.beat([beat(A1)], ttl=30)
    await running_step(store, agents, "t1", total_within=0.3)
    swept: list[StepSwept] = []
    end = time.monotonic() + 10
    while not swept:  # the expiry sweep first, as each tick of the supervisor ends with it
        assert time.monotonic() < end, "nothing swept"
        expired = await store.sweep(
            lease=LEASE, holder="sup", term=term, limit=100, backoff=Backoff()
        )
        assert expired == [], expired
        swept = await sweep(store, term)
        await asyncio.sleep(0.02)
    assert [(s.task_id, s.kind) for s in swept] == [("t1", "total")]
    [step] = await store.get_steps("t1")
    assert step.state == StepState.FAILED and step.error is not None
    assert step.error.startswith("abandoned: total timeout")
    task = await store.get_task("t1")
    assert task is not None and task.failure_count == 0


async def test_claims_hold_the_concurrency_limit_across_instances(
    store: Store, agents: AgentPort
) -> None:
    for i in range(4):
        attempt = await held_task(store, f"t{i}")
        await store.dispatch_steps([dispatch(f"t{i}", attempt)])
    limits = {"charge": OpLimit(concurrency=2)}
    first = await agents.claim_requests(A1, "pay", ["charge"], 10, limits)
    assert [r.task_id for r in first] == ["t0", "t1"]
    assert await agents.claim_requests(A2, "pay", ["charge"], 10, limits) == []
    assert await agents.complete_steps([outcome("t0", 1, instance=A1)]) == [True]
    [more] = await agents.claim_requests(A2, "pay", ["charge"], 10, limits)
    assert more.task_id == "t2"
    # Without limits, the rest is claimed at once.
    assert [r.task_id for r in await agents.claim_requests(A3, "pay", ["charge"], 10)] == ["t3"]


async def test_claims_hold_limits_per_key_the_rate_and_the_instances_room(
    store: Store, agents: AgentPort
) -> None:
    keys = ["a", "a", "b", "b", "c"]
    for i, key in enumerate(keys):
        attempt = await held_task(store, f"t{i}")
        await store.dispatch_steps([replace(new_step(dispatch(f"t{i}", attempt)), limit_key=key)])
    per_key = {"charge": OpLimit(concurrency=1, rate=1, per=60)}
    got = await agents.claim_requests(A1, "pay", ["charge"], 10, per_key)
    assert [r.task_id for r in got] == ["t0", "t2", "t4"]  # one per key
    done = [outcome(r.task_id, 1, instance=A1) for r in got]
    assert await agents.complete_steps(done) == [True, True, True]
    # Nothing runs now, but each key has had its one start of the minute.
    assert await agents.claim_requests(A2, "pay", ["charge"], 10, per_key) == []
    # Two a minute per key, with room for one more call in this instance.
    roomy = {"charge": OpLimit(rate=2, per=60, room=1)}
    [one] = await agents.claim_requests(A1, "pay", ["charge"], 10, roomy)
    assert one.task_id == "t1"
    [two] = await agents.claim_requests(A2, "pay", ["charge"], 10, roomy)
    assert two.task_id == "t3"
    assert await agents.claim_requests(A2, "pay", ["charge"], 10, roomy) == []


async def test_starts_older_than_the_rate_period_are_forgotten(
    store: Store, agents: AgentPort, store_url: str
) -> None:
    for i in range(3):
        attempt = await held_task(store, f"t{i}")
        await store.dispatch_steps([dispatch(f"t{i}", attempt)])
    brief = {"charge": OpLimit(rate=1, per=1.0)}
    began = time.monotonic()
    [first] = await agents.claim_requests(A1, "pay", ["charge"], 10, brief)
    started = time.monotonic()  # the first start is recorded between `began` and now
    refused = await agents.claim_requests(A1, "pay", ["charge"], 10, brief)
    if time.monotonic() - began < 1.0:  # within the period (a loaded machine may take longer)
        assert refused == []
    await asyncio.sleep(max(0.0, started + 1.1 - time.monotonic()))  # the period passes
    [second] = refused or await agents.claim_requests(A1, "pay", ["charge"], 10, brief)
    assert (first.task_id, second.task_id) == ("t0", "t1")
    # Only the start within the period is kept.
    assert sql(store_url, "SELECT count(*) FROM stepwarden_starts") == [(1,)]


async def test_a_claim_never_takes_more_requests_than_its_limit(
    store: Store, agents: AgentPort
) -> None:
    """An agent with one free slot claims one request, however many are queued (the pick
    of the rows to claim is made once, not again for each row updated)."""
    for i in range(10):
        attempt = await held_task(store, f"t{i}")
        await store.dispatch_steps([dispatch(f"t{i}", attempt)])
    seen: list[str] = []
    for _ in range(10):
        got = await agents.claim_requests(A1, "pay", ["charge"], 1)
        assert len(got) == 1, [r.task_id for r in got]
        seen.append(got[0].task_id)
    assert seen == [f"t{i}" for i in range(10)]
    assert await agents.claim_requests(A1, "pay", ["charge"], 1) == []


async def test_agent_room_is_the_alive_capacity_less_what_takes_it_up(
    store: Store, agents: AgentPort
) -> None:
    assert await store.agent_room() is None  # no agent instance: no admission
    await agents.beat([replace(beat(A1), capacity=4), replace(beat(A2), capacity=3)], ttl=30)
    assert await store.agent_room() == 7
    attempt = await held_task(store, "t1")
    await held_task(store, "t2")
    assert await store.agent_room() == 5  # two held tasks, about to queue their steps
    for seq in (1, 2, 3):  # one task's steps run side by side: open steps outnumber tasks
        await store.dispatch_steps([dispatch("t1", attempt, seq)])
    assert await store.agent_room() == 4
    await agents.leave(A2, ["pay"])
    assert await store.agent_room() == 1  # a gone instance has no capacity
    await agents.claim_requests(A1, "pay", ["charge"], 1)
    assert await agents.complete_steps([outcome("t1", 1, instance=A1)]) == [True]
    assert await store.agent_room() == 2
