"""Cancellation that reaches the call, on each store: the store tells an agent instance which
of its calls in flight no longer hold their step, and why; an instance's word that such a
call has stopped is fenced; a compensation waits for the calls of its abandoned steps until
they stop or their complete_by passes, whichever comes first.

The agents' calls (claim, lost calls, stops, steps held) go through the fixture `agents`:
to the store, and over HTTP to a server's agent protocol (`test_agents_store`)."""

from __future__ import annotations

import asyncio

from stepwarden.records import CallStop, OperatorAction, TaskOutcome
from stepwarden.retry import Backoff
from stepwarden.states import StepState, TaskState
from stepwarden.store import Store
from stepwarden.store.ports import AgentPort

from ..rawsql import seconds_until, sql
from ..support.store import A1, A2, A3, beat, dispatch, new_task, outcome, running_step, undoable

LEASE = "supervisor"


async def act(store: Store, action: str, task_id: str) -> None:
    [out] = await store.operate([OperatorAction(action=action, task_id=task_id, actor="ops")])  # type: ignore[arg-type]
    assert out.applied, out


def stop(task_id: str, seq: int = 1, attempt: int = 1, instance: str = A1) -> CallStop:
    return CallStop(
        task_id=task_id, seq=seq, attempt=attempt, agent_instance=instance, reason="test"
    )


async def undoable_calls(
    store: Store, agents: AgentPort, task_id: str, *, within: float = 60
) -> int:
    """A held task with two undoable steps running, step 1 called by a1, step 2 by a2, each
    with `within` seconds to go; the task's attempt."""
    await store.submit([new_task(task_id, within=120)])
    [claimed] = await store.claim_tasks("s1", ["wf"], 1)
    attempt = claimed.task.attempt
    got = await store.dispatch_steps(
        [
            undoable(dispatch(task_id, attempt, seq=1, within=within)),
            undoable(dispatch(task_id, attempt, seq=2, within=within)),
        ]
    )
    assert all(got), got
    assert len(await agents.claim_requests(A1, "pay", ["charge"], 1)) == 1
    assert len(await agents.claim_requests(A2, "pay", ["charge"], 1)) == 1
    return attempt


def eligible_in(url: str, task_id: str) -> float:
    """Seconds until the task's eligible_at, by the database clock."""
    [(left,)] = sql(
        url,
        f"SELECT {seconds_until(url, 'eligible_at')} FROM stepwarden_tasks"
        f" WHERE task_id = '{task_id}'",
    )
    return float(left)


async def test_the_store_tells_an_instance_which_calls_it_no_longer_holds_and_why(
    store: Store,
    agents: AgentPort,
) -> None:
    term = await store.acquire_lease(LEASE, "sup", 30)
    assert term is not None
    await agents.beat([beat(A1), beat(A2)], ttl=30)
    for t in ("cancelled", "paused", "compensated", "moved"):
        await running_step(store, agents, t)
    await running_step(store, agents, "kept", instance=A2)
    await act(store, "cancel", "cancelled")
    await act(store, "pause", "paused")
    await act(store, "compensate", "compensated")
    calls = [(t, 1, 1) for t in ("cancelled", "paused", "compensated", "moved", "kept")]
    lost = await agents.lost_calls(A1, [*calls, ("nothing", 1, 1)])
    assert lost == {
        ("cancelled", 1, 1): "the task is cancelled",
        ("paused", 1, 1): "the task is paused",
        ("compensated", 1, 1): "the task is compensating",
        ("kept", 1, 1): "the step is held by another agent instance",
        ("nothing", 1, 1): "the step no longer exists",
    }
    # a1 leaves the registry: the supervisor gives back its running steps (a new attempt:
    # that of "moved" queued again, that of the paused task past its complete_by), and the
    # calls a1 may still be making of them hold nothing.
    await agents.leave(A1, ["pay"])
    swept = await store.sweep_steps(
        lease=LEASE, holder="sup", term=term, limit=100, forget_after=3600
    )
    assert sorted((s.task_id, s.kind) for s in swept) == [
        ("moved", "reassigned"),
        ("paused", "reassigned"),
    ]
    lost = await agents.lost_calls(A1, calls)
    assert lost == {
        ("cancelled", 1, 1): "the task is cancelled",
        ("paused", 1, 1): "the step was dispatched again (attempt 2)",
        ("compensated", 1, 1): "the task is compensating",
        ("moved", 1, 1): "the step was dispatched again (attempt 2)",
        ("kept", 1, 1): "the step is held by another agent instance",
    }
    # The instance that holds a step, under its attempt, is told nothing about it.
    assert await agents.lost_calls(A2, [("kept", 1, 1)]) == {}
    assert await agents.lost_calls(A2, [("kept", 1, 2)]) == {
        ("kept", 1, 2): "the step was dispatched again (attempt 1)"
    }
    assert await agents.lost_calls(A1, []) == {}


async def test_a_call_stopped_is_recorded_only_by_the_instance_and_attempt_that_held_it(
    store: Store,
    agents: AgentPort,
) -> None:
    await running_step(store, agents, "t1")
    await act(store, "cancel", "t1")
    [step] = await store.get_steps("t1")
    # Abandoned, the step still names the instance whose call may be running.
    assert (step.state, step.abandoned, step.locked_by, step.call_stopped_at) == (
        StepState.FAILED,
        True,
        A1,
        None,
    )
    stale = [stop("t1", instance=A2), stop("t1", attempt=2)]
    assert await agents.stop_calls(stale) == [False, False]
    # An attempt before the step's (the agent protocol takes none below 1: the store's).
    assert await store.stop_calls([stop("t1", attempt=0)]) == [False]
    assert (await store.get_steps("t1"))[0].call_stopped_at is None
    assert await store.events(task_id="t1", kind="call_stopped") == []
    assert await agents.stop_calls([stop("t1"), stop("t1")]) == [True, False]
    assert await agents.stop_calls([stop("t1")]) == [False]  # once
    [step] = await store.get_steps("t1")
    assert step.call_stopped_at is not None
    assert (step.state, step.abandoned, step.locked_by, step.attempt) == (
        StepState.FAILED,
        True,
        A1,
        1,
    )
    [event] = await store.events(task_id="t1", kind="call_stopped")
    assert event.detail == {
        "seq": 1,
        "attempt": 1,
        "from": A1,
        "reason": "test",
        "then": "stopped",
    }
    # A step that ended otherwise (its outcome recorded) takes no stop.
    await running_step(store, agents, "t2")
    assert await agents.complete_steps([outcome("t2", 1, instance=A1)]) == [True]
    assert await agents.stop_calls([stop("t2")]) == [False]
    assert (await store.get_steps("t2"))[0].state == StepState.COMPLETED


async def test_a_call_stopped_while_its_task_is_paused_is_dispatched_again_on_resume(
    store: Store,
    agents: AgentPort,
) -> None:
    await running_step(store, agents, "t1")
    await act(store, "pause", "t1")
    assert await agents.stop_calls([stop("t1", instance=A2)]) == [False]
    assert await agents.stop_calls([stop("t1")]) == [True]
    [step] = await store.get_steps("t1")
    # Back in the queue, already past its complete_by: no agent claims it while paused...
    assert (step.state, step.locked_by, step.attempt) == (StepState.NOT_STARTED, None, 1)
    assert await agents.claim_requests(A2, "pay", ["charge"], 5) == []
    # ...and the scheduler resuming the task dispatches it again at once (it cannot adopt it).
    await act(store, "resume", "t1")
    [claimed] = await store.claim_tasks("s2", ["wf"], 1)
    attempt = claimed.task.attempt
    adopt = dispatch("t1", attempt, kind="adopt", expected=1, scheduler="s2")
    assert await store.dispatch_steps([adopt]) == [None]
    again = dispatch("t1", attempt, kind="redispatch", expected=1, scheduler="s2")
    [got] = await store.dispatch_steps([again])
    assert got is not None and got.attempt == 2
    [req] = await agents.claim_requests(A2, "pay", ["charge"], 5)
    assert (req.task_id, req.attempt) == ("t1", 2)


async def test_a_call_stopped_after_its_task_was_resumed_hands_the_step_back(
    store: Store,
    agents: AgentPort,
) -> None:
    # Paused, then resumed before the agent's word that it stopped the call arrives: the
    # step goes back to the queue, in time, for an agent to claim (its task calls again).
    await running_step(store, agents, "t1")
    await act(store, "pause", "t1")
    await act(store, "resume", "t1")
    assert await agents.stop_calls([stop("t1")]) == [True]
    [step] = await store.get_steps("t1")
    assert (step.state, step.locked_by, step.attempt) == (StepState.NOT_STARTED, None, 1)
    [req] = await agents.claim_requests(A2, "pay", ["charge"], 5)
    assert (req.task_id, req.attempt) == ("t1", 1)


async def test_a_compensation_waits_for_its_abandoned_calls_until_they_stop(
    store: Store,
    agents: AgentPort,
) -> None:
    url = store.url
    await undoable_calls(store, agents, "t1", within=60)
    await act(store, "compensate", "t1")
    # Both calls may still apply their effect: the compensation waits (their complete_by).
    assert eligible_in(url, "t1") > 50
    assert await store.claim_tasks("s2", ["wf"], 1) == []
    # One stops; the other still runs, in time: still waiting. A stale word changes nothing.
    assert await agents.stop_calls([stop("t1", seq=2, instance=A1)]) == [False]
    assert await agents.stop_calls([stop("t1", seq=1, instance=A1)]) == [True]
    assert eligible_in(url, "t1") > 50
    assert await store.claim_tasks("s2", ["wf"], 1) == []
    # The other stops: the compensation may start at once.
    assert await agents.stop_calls([stop("t1", seq=2, instance=A2)]) == [True]
    # Eligible now, by the store's own clock (a raw read of another clock may differ by the
    # rounding of the last digit): a scheduler claims it at once.
    [claimed] = await store.claim_tasks("s2", ["wf"], 1)
    assert (claimed.task.task_id, claimed.task.process_state) == ("t1", TaskState.COMPENSATING)


async def test_a_compensation_after_an_error_waits_for_a_call_until_it_stops(
    store: Store,
    agents: AgentPort,
) -> None:
    url = store.url
    attempt = await undoable_calls(store, agents, "t1", within=60)
    # The scheduler ends the task in error (another step failed): it compensates, once the
    # two calls its task no longer holds have stopped.
    failed = TaskOutcome(
        task_id="t1",
        attempt=attempt,
        scheduler="s1",
        state=TaskState.ERROR,
        result=None,
        error="PermanentError: declined",
    )
    assert await store.finish_tasks([failed]) == [True]
    assert (await store.get_task("t1")).process_state == TaskState.COMPENSATING  # type: ignore[union-attr]
    assert eligible_in(url, "t1") > 50
    assert await agents.stop_calls([stop("t1", seq=1), stop("t1", seq=2, instance=A2)]) == [
        True,
        True,
    ]
    assert len(await store.claim_tasks("s2", ["wf"], 1)) == 1  # at once, by the store's clock


async def test_a_compensation_after_expiry_starts_when_its_calls_stop_not_before_its_backoff(
    store: Store,
    agents: AgentPort,
) -> None:
    url = store.url
    await store.submit([new_task("t1", max_failures=1, within=120)])
    [claimed] = await store.claim_tasks("s1", ["wf"], 1)
    attempt = claimed.task.attempt
    await store.dispatch_steps(
        [
            undoable(dispatch("t1", attempt, seq=1, within=60)),
            undoable(dispatch("t1", attempt, seq=2, within=0.05)),
        ]
    )
    assert len(await agents.claim_requests(A1, "pay", ["charge"], 2)) >= 1
    await asyncio.sleep(0.1)  # step 2 is past its complete_by
    term = await store.acquire_lease(LEASE, "sup", 30)
    assert term is not None
    backoff = Backoff(initial=20, maximum=20)
    swept = await store.sweep(lease=LEASE, holder="sup", term=term, limit=10, backoff=backoff)
    assert [(e.task_id, e.process_state) for e in swept] == [("t1", TaskState.COMPENSATING)]
    assert eligible_in(url, "t1") > 50  # step 1's call may still run: its complete_by
    assert await agents.stop_calls([stop("t1", seq=1)]) == [True]
    # Its call stopped: the compensation waits only for the end of the backoff (20 s).
    left = eligible_in(url, "t1")
    assert 10 < left <= 20
    assert await store.claim_tasks("s2", ["wf"], 1) == []


async def test_a_task_compensating_from_before_the_upgrade_keeps_waiting_for_complete_by(
    store: Store,
    agents: AgentPort,
) -> None:
    # A compensating task whose backoff_until is unknown (written before migration 0010)
    # waits for its abandoned steps' complete_by, as it did: a stop does not move it.
    url = store.url
    await running_step(store, agents, "t1", complete_within=60.0)
    await act(store, "compensate", "t1")
    sql(url, "UPDATE stepwarden_tasks SET backoff_until = NULL WHERE task_id = 't1'")
    assert eligible_in(url, "t1") > 20  # the step's complete_by (the task's, 30 s)
    assert await agents.stop_calls([stop("t1")]) == [True]
    assert eligible_in(url, "t1") > 20
    assert await store.claim_tasks("s2", ["wf"], 1) == []


async def test_the_store_tells_an_instance_which_steps_it_holds_that_a_call_may_make(
    store: Store,
    agents: AgentPort,
) -> None:
    """`held_steps`: the steps an agent instance holds, as the requests it claimed (for the
    steps whose claim's answer was lost): running, locked by it, in time, for a
    task whose calls go on (a paused task's step runs until its call stops)."""
    for t in ("kept", "done", "cancelled", "paused"):
        await running_step(store, agents, t)
    await running_step(store, agents, "other", instance=A2)
    assert await agents.complete_steps([outcome("done", 1, instance=A1)]) == [True]
    await act(store, "cancel", "cancelled")
    await act(store, "pause", "paused")
    [paused] = await store.get_steps("paused")
    assert (paused.state, paused.locked_by) == (StepState.RUNNING, A1)
    [held] = await agents.held_steps(A1, "pay")
    assert (held.task_id, held.seq, held.attempt, held.idempotency_key) == ("kept", 1, 1, "kept/1")
    assert (held.agent, held.operation, held.input) == ("pay", "charge", [{"amount": 5}])
    assert 0 < held.remaining <= 10
    assert [r.task_id for r in await agents.held_steps(A2, "pay")] == ["other"]
    assert await agents.held_steps(A3, "pay") == []
    # The agent instances of one process share a name: each asks for its agent's steps.
    assert await agents.held_steps(A1, "ship") == []
