"""Writes whose commit was made but whose answer was lost (a connection cut at the wrong
moment), on each store. The same outcome tried again is taken as recorded, and a group commit
tried again goes on; a step that an agent instance holds but is not calling (its claim's or
hand-over's answer lost) is called by that instance at its next heartbeat, once; a call of its
own that ended without an outcome is not made again (its step waits for its complete_by)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest

from stepwarden.agent import Agent, Call
from stepwarden.records import DispatchedStep, StepOutcome
from stepwarden.retry import Retry
from stepwarden.runner import AgentRunner
from stepwarden.states import StepState
from stepwarden.store import Store

from .test_local_calls import app_task, new_step
from .test_outbox import until


def done(task_id: str, seq: int = 1) -> StepOutcome:
    return StepOutcome(
        task_id=task_id,
        seq=seq,
        attempt=1,
        agent_instance="a1",
        state=StepState.COMPLETED,
        result='"r"',
        error=None,
        tries=1,
    )


async def held_task(store: Store, task_id: str) -> int:
    await store.submit([app_task(task_id)])
    [claimed] = await store.claim_tasks("s1", ["wf"], 1)
    return claimed.task.attempt


async def test_a_group_commit_tried_again_after_its_answer_was_lost_goes_on(
    store: Store,
) -> None:
    """A scheduler's write of a step's outcome with the next step (handed to the same
    agent instance) is made, its answer lost, and tried again: the outcome is taken as
    recorded (the workflow is not stopped), the step exists once, held by the instance."""
    attempt = await held_task(store, "t")
    [got] = await store.dispatch_steps([new_step("t", attempt, 1, claimed_by="a1")])
    assert isinstance(got, DispatchedStep)
    then = new_step("t", attempt, 2, claimed_by="a1")
    recorded, dispatched, _ = await store.advance([done("t")], [then], [])
    assert recorded == [True] and isinstance(dispatched[0], DispatchedStep)
    recorded, dispatched, _ = await store.advance([done("t")], [then], [])  # tried again
    assert recorded == [True] and dispatched == [None]  # the step is there already
    steps = await store.get_steps("t")
    assert [(s.seq, s.state, s.locked_by) for s in steps] == [
        (1, StepState.COMPLETED, "a1"),
        (2, StepState.RUNNING, "a1"),
    ]
    assert [(r.task_id, r.seq) for r in await store.held_steps("a1")] == [("t", 2)]


class Service:
    def __init__(self) -> None:
        self.agent = Agent("svc")
        self.calls: Counter[str] = Counter()

        @self.agent.operation
        async def quick(call: Call, what: str) -> str:
            self.calls[call.idempotency_key] += 1
            return f"done {what}"

        @self.agent.operation(retry=Retry(max_attempts=1))
        async def flaky(call: Call, what: str) -> str:
            self.calls[call.idempotency_key] += 1
            raise RuntimeError("the service is down")


@asynccontextmanager
async def serving(store: Store, service: Service) -> AsyncIterator[AgentRunner]:
    runner = AgentRunner(store, service.agent, instance="a1", heartbeat=0.05, poll_interval=0.05)
    stop = asyncio.Event()
    running = asyncio.create_task(runner.run(stop))
    try:
        yield runner
    finally:
        stop.set()
        await running
        await runner.drain(5)


async def test_a_step_whose_claim_answer_was_lost_is_called_by_its_instance_once(
    store: Store,
) -> None:
    service = Service()
    attempt = await held_task(store, "t")
    await store.dispatch_steps([new_step("t", attempt, 1)])
    # a1's claim is made, and its answer lost: a1 holds the step and does not know it.
    [lost] = await store.claim_requests("a1", "svc", ["quick"], 1)
    assert (lost.task_id, lost.seq) == ("t", 1)
    async with serving(store, service):

        async def called() -> bool:
            [step] = await store.get_steps("t")
            return step.state == StepState.COMPLETED

        await until(called)
    [step] = await store.get_steps("t")
    assert (step.result, step.attempt, step.locked_by) == ("done x", 1, "a1")
    assert service.calls == Counter({"t/1": 1})


async def test_a_call_that_ended_without_an_outcome_is_not_made_again(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Out of tries, a call ends and reports nothing: its step, still held by the instance,
    waits for its complete_by (then the supervisor counts a failure and dispatches it
    again); the instance does not take it up."""
    caplog.set_level(logging.INFO, logger="stepwarden.agent")
    service = Service()
    attempt = await held_task(store, "t")
    flaky = replace(new_step("t", attempt, 1), name="svc.flaky", operation="flaky")
    await store.dispatch_steps([flaky])
    async with serving(store, service) as runner:

        async def gave_up() -> bool:
            return any("giving up after 1 tries" in m for m in caplog.messages)

        await until(gave_up)
        [step] = await store.get_steps("t")
        assert (step.state, step.locked_by) == (StepState.RUNNING, "a1")
        assert [r.task_id for r in await store.held_steps("a1")] == ["t"]
        assert await runner.take_up() == 0
    assert service.calls == Counter({"t/1": 1})
