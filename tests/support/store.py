"""Tasks, dispatches, outcomes and agents' beats written straight to a store, for the store's
contract tests."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Literal

from stepwarden.records import (
    AgentBeat,
    NewStep,
    StepDispatch,
    StepOutcome,
    Submission,
    TaskOutcome,
)
from stepwarden.sealing import input_digest
from stepwarden.states import StepState, TaskState
from stepwarden.store import Store, open_one
from stepwarden.store.ports import AgentPort

from ..agentserver import CLIENT
from ..dispatching import new_step, step_dispatch

A1, A2, A3 = (f"{CLIENT}/a{n}" for n in (1, 2, 3))
"""Agent instances of the agent server's client."""


def beat(instance: str, *, agent: str = "pay", breaker: str = "closed") -> AgentBeat:
    return AgentBeat(
        instance=instance,
        agent=agent,
        operations=("charge",),
        capacity=10,
        inflight=1,
        breaker=breaker,
        breaker_detail={"failures": 0},
    )


async def running_step(
    store: Store, agents: AgentPort, task_id: str, instance: str = A1, **kw: object
) -> None:
    """A held task whose step 1 is running, claimed by `instance` (through `agents`)."""
    attempt = await held_task(store, task_id)
    [got] = await store.dispatch_steps([replace(dispatch(task_id, attempt), **kw)])  # type: ignore[arg-type]
    assert got is not None
    [req] = await agents.claim_requests(instance, "pay", ["charge"], 1)
    assert req.task_id == task_id


def new_task(
    task_id: str,
    *,
    priority: int = 0,
    within: float = 30,
    max_failures: int = 3,
    workflow: str = "wf",
) -> Submission:
    return Submission(
        task_id=task_id,
        workflow=workflow,
        input='{"n": 1}',
        input_digest=input_digest('{"n": 1}'),
        priority=priority,
        complete_within=within,
        max_failures=max_failures,
    )


def dispatch(
    task_id: str,
    attempt: int,
    seq: int = 1,
    *,
    scheduler: str = "s1",
    kind: str = "new",
    expected: int = 0,
    within: float = 10,
    agent: str = "pay",
) -> StepDispatch:
    return step_dispatch(
        kind,
        task_id=task_id,
        task_attempt=attempt,
        scheduler=scheduler,
        seq=seq,
        name=f"{agent}.charge",
        agent=agent,
        operation="charge",
        input='[{"amount": 5}]',
        priority=0,
        complete_within=within,
        expected_attempt=expected,
    )


def outcome(
    task_id: str,
    attempt: int,
    seq: int = 1,
    *,
    instance: str = "a1",
    state: Literal[StepState.COMPLETED, StepState.FAILED] = StepState.COMPLETED,
) -> StepOutcome:
    return StepOutcome(
        task_id=task_id,
        seq=seq,
        attempt=attempt,
        agent_instance=instance,
        state=state,
        result='{"ok": true}',
        error=None if state == StepState.COMPLETED else "boom",
        tries=1,
    )


async def claim_one(store: Store, scheduler: str = "s1") -> int:
    claimed = await store.claim_tasks(scheduler, ["wf"], 1)
    assert len(claimed) == 1
    return claimed[0].task.attempt


def undoable(d: StepDispatch) -> NewStep:
    return dataclasses.replace(
        new_step(d), compensation="pay.refund", compensation_input='{"n": 1}'
    )


async def compensating(store: Store, *, within: float) -> int:
    """A task "t1" in compensating, held by s2, with its undo step 2 of that attempt queued."""
    await store.submit([new_task("t1", max_failures=3)])
    attempt = await claim_one(store)
    await store.dispatch_steps([undoable(dispatch("t1", attempt))])
    assert len(await store.claim_requests("a1", "pay", ["charge"], 10)) == 1
    assert await store.complete_steps([outcome("t1", 1)]) == [True]
    error = TaskOutcome(
        task_id="t1",
        attempt=attempt,
        scheduler="s1",
        state=TaskState.ERROR,
        result=None,
        error="declined",
    )
    assert await store.finish_tasks([error]) == [True]
    attempt = await claim_one(store, "s2")
    undo = dataclasses.replace(
        new_step(dispatch("t1", attempt, seq=2, scheduler="s2", within=within)),
        operation="refund",
        compensates=1,
    )
    assert await store.dispatch_steps([undo]) != [None]
    return attempt


async def held_task(store: Store, task_id: str, *, within: float = 30) -> int:
    """Submit a task and claim it as scheduler s1; its attempt."""
    await store.submit([new_task(task_id, within=within)])
    [claimed] = await store.claim_tasks("s1", ["wf"], 1)
    assert claimed.task.task_id == task_id
    return claimed.task.attempt


@contextlib.asynccontextmanager
async def whole_store(store_url: str) -> AsyncIterator[Store]:
    """The store at `store_url` opened whole (the actors' and the operator's calls too, as a
    worker or the command line opens it), for a test's setup: an App's own store
    (`App.store`) is the application's part only."""
    store = open_one(store_url)
    await store.open(migrate=False)
    try:
        yield store
    finally:
        await store.close()
