"""Writes whose commit was made but whose answer was lost (a connection cut at the wrong
moment), on each store. The same outcome tried again is taken as recorded, and a group commit
tried again goes on; a step that an agent instance holds but is not calling (its claim's or
hand-over's answer lost) is called by that instance at its next heartbeat, once; a call of its
own that ended without an outcome is not made again (its step waits for its complete_by).

The agent runner's tests run it over both of its transports (`agents`): on the store, and
over HTTP through a server's agent protocol, where a lost claim is taken up from the steps
the server says the instance holds. A step handed over at once by the scheduler of the
agents' own process (`claimed_by`) is of the store alone: an agent served over HTTP shares
no process with a scheduler, and is never handed one."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

import stepwarden as sw
from stepwarden.agent import Agent, Call
from stepwarden.records import DispatchedStep, Request, StepOutcome
from stepwarden.retry import Retry
from stepwarden.runner import AgentRunner
from stepwarden.states import StepState
from stepwarden.store import Store
from stepwarden.store.ports import AgentPort
from tests.stores import app_store

from ..support.apps import Shop, app_task, new_step
from ..support.poll import until
from ..support.store import A1
from ..support.worker import RESUME


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
    assert [(r.task_id, r.seq) for r in await store.held_steps("a1", "svc")] == [("t", 2)]


class Service:
    """The agent "svc", and beside it in the same process (its instance of the same name)
    the agent "twin", whose operation has the same name."""

    def __init__(self) -> None:
        self.agent = Agent("svc")
        self.twin = Agent("twin")
        self.calls: Counter[str] = Counter()

        @self.twin.operation(name="quick")
        async def twin_quick(call: Call, what: str) -> str:
            self.calls[call.idempotency_key] += 1
            return f"twin {what}"

        @self.agent.operation
        async def quick(call: Call, what: str) -> str:
            self.calls[call.idempotency_key] += 1
            await asyncio.sleep(0.5)  # running through several heartbeats of both agents
            return f"done {what}"

        @self.agent.operation(retry=Retry(max_attempts=1))
        async def flaky(call: Call, what: str) -> str:
            self.calls[call.idempotency_key] += 1
            raise RuntimeError("the service is down")


@asynccontextmanager
async def serving(agents: AgentPort, service: Service) -> AsyncIterator[AgentRunner]:
    """The runners of "svc" and "twin", as the instance A1, on `agents`."""
    runner, twin = (
        AgentRunner(agents, agent, instance=A1, heartbeat=0.05, poll_interval=0.05)
        for agent in (service.agent, service.twin)
    )
    stop = asyncio.Event()
    running = [asyncio.create_task(r.run(stop)) for r in (runner, twin)]
    try:
        yield runner
    finally:
        stop.set()
        await asyncio.gather(*running)
        await asyncio.gather(runner.drain(5), twin.drain(5))


async def test_a_step_whose_claim_answer_was_lost_is_called_by_its_instance_once(
    store: Store, agents: AgentPort
) -> None:
    service = Service()
    attempt = await held_task(store, "t")
    await store.dispatch_steps([new_step("t", attempt, 1)])
    # a1's claim is made, and its answer lost: a1 holds the step and does not know it.
    [lost] = await store.claim_requests(A1, "svc", ["quick"], 1)
    assert (lost.task_id, lost.seq) == ("t", 1)
    async with serving(agents, service):

        async def called() -> bool:
            [step] = await store.get_steps("t")
            return step.state == StepState.COMPLETED

        await until(called)
    [step] = await store.get_steps("t")
    assert (step.result, step.attempt, step.locked_by) == ("done x", 1, A1)
    assert service.calls == Counter({"t/1": 1})


async def test_a_claim_answered_late_is_called_once_whatever_a_look_finds_meanwhile(
    store: Store, agents: AgentPort
) -> None:
    """a1's claim is committed and its answer is slow to come (a loaded process, a slow
    network): meanwhile the store shows the step held by a1 and not called. A look at the
    steps a1 holds while the claim is under way calls nothing; the claim's answer does,
    once."""
    service = Service()
    attempt = await held_task(store, "t")
    await store.dispatch_steps([new_step("t", attempt, 1)])
    claim = agents.claim_requests
    answered, release = asyncio.Event(), asyncio.Event()

    async def answered_late(*args: Any, **kwargs: Any) -> list[Request]:
        requests = await claim(*args, **kwargs)
        if any(r.task_id == "t" for r in requests):
            answered.set()
            await release.wait()
        return requests

    agents.claim_requests = answered_late  # type: ignore[method-assign]
    async with serving(agents, service) as runner:
        await asyncio.wait_for(answered.wait(), 10)
        try:
            assert [r.task_id for r in await agents.held_steps(A1, "svc")] == ["t"]
            took_up = await runner.take_up()
        finally:
            release.set()
        assert took_up == 0

        async def called() -> bool:
            [step] = await store.get_steps("t")
            return step.state == StepState.COMPLETED

        await until(called)
        assert await runner.take_up() == 0
    assert service.calls == Counter({"t/1": 1})


async def test_a_call_that_ended_without_an_outcome_is_not_made_again(
    store: Store, agents: AgentPort, caplog: pytest.LogCaptureFixture
) -> None:
    """Out of tries, a call ends and reports nothing: its step, still held by the instance,
    waits for its complete_by (then the supervisor counts a failure and dispatches it
    again); the instance does not take it up."""
    caplog.set_level(logging.INFO, logger="stepwarden.agent")
    service = Service()
    attempt = await held_task(store, "t")
    flaky = replace(new_step("t", attempt, 1), name="svc.flaky", operation="flaky")
    await store.dispatch_steps([flaky])
    async with serving(agents, service) as runner:

        async def gave_up() -> bool:
            return any("giving up after 1 tries" in m for m in caplog.messages)

        await until(gave_up)
        [step] = await store.get_steps("t")
        assert (step.state, step.locked_by) == (StepState.RUNNING, A1)
        assert [r.task_id for r in await agents.held_steps(A1, "svc")] == ["t"]
        assert await runner.take_up() == 0
    assert service.calls == Counter({"t/1": 1})


async def test_a_task_whose_claim_answer_was_lost_is_given_back_by_its_scheduler(
    store_url: str,
) -> None:
    """A scheduler's claim of a task is made and its answer lost: the scheduler holds the
    task and does not drive it. At its heartbeats it finds the task held and not driven,
    gives it back, and claims it again: the task finishes long before its complete_by
    (30 s), with no failure counted."""
    shop = Shop(store_url)
    try:
        await given_back(shop)
    finally:
        await shop.app.aclose()


async def given_back(shop: Shop) -> None:
    await shop.app.submit_async(shop.three, None, task_id="t")
    worker = sw.Worker(shop.app, RESUME)
    store = await app_store(shop.app)
    [lost] = await store.claim_tasks(f"scheduler-{worker.instance}", ["three"], 1)
    assert lost.task.task_id == "t"
    running = asyncio.create_task(worker.run())
    try:
        assert await shop.app.result_async("t", timeout=15) == ["done a", "done b", "done c"]
    finally:
        worker.stop.set()
        await asyncio.wait_for(running, 30)
    view = await shop.app.show_async("t")
    [released] = [e for e in view.events if e.kind == "released"]
    assert released.detail["reason"] == "held but not driven"
    assert view.task.failure_count == 0


async def test_a_step_taken_up_is_not_called_again_by_a_late_hand_over(store: Store) -> None:
    """This process's scheduler writes a step held by its agent instance and hears of the
    write late (its answer lost, then read back): the instance has taken the step up
    meanwhile, and the hand-over calls nothing more. The outcome is recorded as any
    claimed step's, not through the hand-over."""
    service = Service()
    attempt = await held_task(store, "t")
    [got] = await store.dispatch_steps([new_step("t", attempt, 1, claimed_by=A1)])
    assert isinstance(got, DispatchedStep)
    reported: list[StepOutcome] = []

    async def report(outcome: StepOutcome) -> bool:
        reported.append(outcome)
        return True

    async with serving(store, service) as runner:

        async def taken_up() -> bool:
            return service.calls["t/1"] == 1

        await until(taken_up)
        [request] = await store.held_steps(A1, "svc")
        runner.serve_local(request, report)

        async def recorded() -> bool:
            [step] = await store.get_steps("t")
            return step.state == StepState.COMPLETED

        await until(recorded)
    assert service.calls == Counter({"t/1": 1}) and reported == []
