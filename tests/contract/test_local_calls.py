"""Steps called in the scheduler's own process, on each store: a worker that runs the
scheduler and the agents hands a new step to its own agent instance at once (recorded running,
held by that instance), and the step's outcome is recorded with the workflow's next write.
The fences are those of any step: an outcome the store refuses records nothing after it.

A hand-over happens only in the scheduler's own process, so these tests run on the store
alone, but for the answer that comes after a cancel: that one also runs with the agents in a
second worker served over HTTP (`workers`), where the step is claimed, not handed over, and
the late outcome is refused by the server's fence, after which the call asks the server why
and says there that it stopped."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden.records import DispatchedStep, StepOutcome, TaskOutcome
from stepwarden.store import Store
from tests.stores import app_store

from ..agentserver import Workers
from ..support.apps import Shop, app_task, new_step
from ..support.poll import until
from ..support.worker import running


@pytest.fixture
async def shop(store_url: str) -> Any:
    s = Shop(store_url)
    yield s
    s.release.set()
    await s.app.aclose()


async def test_a_worker_with_the_agents_hands_steps_to_them_at_once(shop: Shop) -> None:
    async with running(shop.app) as worker:
        # The first task may find the agents not yet sure that nothing is queued: they hand
        # steps over once a claim of theirs has found the queue empty.
        await shop.app.submit_async(shop.three, None, task_id="warm-up")
        await shop.app.result_async("warm-up", timeout=30)
        await shop.app.submit_async(shop.three, None, task_id="t")
        assert await shop.app.result_async("t", timeout=30) == ["done a", "done b", "done c"]
    view = await shop.app.show_async("t")
    instance = f"agent-{worker.instance}"
    assert [(s.state, s.locked_by, s.attempt) for s in view.steps] == [
        (sw.StepState.COMPLETED, instance, 1)
    ] * 3
    # Claimed as it was recorded: no queue, no other instance's claim in between.
    assert all(s.claimed_at == s.created_at for s in view.steps)
    assert shop.calls == Counter(a=2, b=2, c=2)


async def test_an_answer_after_a_cancel_records_nothing_after_it(
    shop: Shop, workers: Workers, caplog: pytest.LogCaptureFixture
) -> None:
    """The first step's sync call runs on after its task is cancelled, and answers: its
    agent either sees the cancel first and discards the answer, or reports it and the store
    refuses it. Either way the step the workflow would go on to is never recorded, and the
    store is told that the call stopped."""
    caplog.set_level(logging.INFO, logger="stepwarden.agent")
    async with workers(shop.app):
        await shop.app.submit_async(shop.stalled, None, task_id="t")
        await asyncio.to_thread(shop.started.wait, 20)
        await shop.app.cancel_async("t", reason="changed my mind")
        shop.release.set()

        async def call_ended() -> bool:
            return any(
                "late outcome of t/1 attempt 1 discarded" in m or "for t/1: cancelled" in m
                for m in caplog.messages
            )

        await until(call_ended)
        store = await app_store(shop.app)

        async def call_stopped() -> bool:
            return any(s.call_stopped_at is not None for s in await store.get_steps("t"))

        await until(call_stopped)
    view = await shop.app.show_async("t")
    assert view.task.process_state == sw.TaskState.CANCELLED
    assert [s.input for s in view.steps] == [["first"]]
    assert view.steps[0].state == sw.StepState.FAILED and view.steps[0].abandoned
    assert shop.calls["second"] == 0


async def test_a_group_commit_applies_nothing_that_depends_on_a_refused_outcome(
    store_url: str,
) -> None:
    """`Store.advance` on its own: of two tasks, each with a step held by an agent
    instance, one outcome is refused (the wrong attempt): that task's next step and its
    outcome are not applied; the other task's are."""
    app = sw.App("local", store=store_url)
    store = await app_store(app)
    try:
        ids = ["ok", "refused"]
        await store.submit([app_task(tid) for tid in ids])
        claimed = await store.claim_tasks("s1", ["wf"], 2)
        attempt = {c.task.task_id: c.task.attempt for c in claimed}
        firsts = [new_step(tid, attempt[tid], 1, claimed_by="a1") for tid in ids]
        got = await store.dispatch_steps(firsts)
        assert all(isinstance(g, DispatchedStep) for g in got)
        outcomes = [
            StepOutcome(task_id=tid, seq=1, attempt=1 if tid == "ok" else 2,
                        agent_instance="a1", state=sw.StepState.COMPLETED, result='"r"',
                        error=None, tries=1)
            for tid in ids
        ]  # fmt: skip
        finishes = [
            TaskOutcome(task_id=tid, attempt=attempt[tid], scheduler="s1",
                        state=sw.TaskState.PROCESSED, result='"r"', error=None)
            for tid in ids
        ]  # fmt: skip
        # "ok" goes on to its second step; "refused" would finish, on a refused outcome.
        done, dispatched, finished = await store.advance(
            outcomes, [new_step("ok", attempt["ok"], 2)], [finishes[1]]
        )
        assert (done, finished) == ([True, False], [False])
        assert isinstance(dispatched[0], DispatchedStep)
        task = await store.get_task("refused")
        assert task is not None and task.process_state == sw.TaskState.PROCESSING
        _, _, finished = await store.advance([], [], finishes)
        assert finished == [True, True]  # nothing in this batch depends on a refused one
        steps = {tid: await store.get_steps(tid) for tid in ids}
        assert [(s.seq, s.state) for s in steps["ok"]] == [
            (1, sw.StepState.COMPLETED),
            (2, sw.StepState.FAILED),  # closed as abandoned when the task finished
        ]
        assert [(s.seq, s.state, s.locked_by) for s in steps["refused"]] == [
            (1, sw.StepState.FAILED, "a1")
        ]
    finally:
        await app.aclose()


async def test_a_first_step_handed_at_once_is_written_alone_and_fenced(store: Store) -> None:
    """A group commit of new steps only, each taken at once by an agent instance of the
    scheduler's process (a task's first step), is one statement: the step of the task held
    under its attempt is recorded running, held by that instance, and queued for no agent;
    one under a stale attempt is not recorded."""
    await store.submit([app_task("held"), app_task("stale")])
    claimed = {c.task.task_id: c.task.attempt for c in await store.claim_tasks("s1", ["wf"], 2)}
    steps = [
        new_step("held", claimed["held"], 1, claimed_by="a1"),
        new_step("stale", claimed["stale"] - 1, 1, claimed_by="a1"),
    ]
    done, dispatched, finished = await store.advance([], steps, [])
    assert (done, finished) == ([], [])
    assert isinstance(dispatched[0], DispatchedStep) and dispatched[1] is None
    [step] = await store.get_steps("held")
    assert (step.state, step.locked_by) == (sw.StepState.RUNNING, "a1")
    assert await store.get_steps("stale") == []
    assert await store.claim_requests("a2", "svc", ["quick"], 10) == []


async def test_a_drive_whose_outcome_was_refused_writes_nothing_more(store: Store) -> None:
    """The drive of a task goes on from the outcome of a step called in its process, which
    the store then refuses (written alone, under the wrong attempt): none of the task's later
    writes is applied, neither its next step nor its outcome, and a wait stops it."""
    from stepwarden.drive import Answer, TaskDrive
    from stepwarden.records import WaitRequest
    from stepwarden.scheduler import Scheduler
    from stepwarden.workflow import Abandon, Workflow

    async def wf(ctx: sw.Context, _: Any) -> None: ...

    flow = Workflow(name="wf", fn=wf, complete_within=timedelta(seconds=30), max_failures=3)
    scheduler = Scheduler(store, {flow.key: flow}, instance="s1")
    await store.submit([app_task("t")])
    [claimed] = await store.claim_tasks("s1", [("wf", 1)], 1)
    attempt = claimed.task.attempt
    [got] = await store.dispatch_steps([new_step("t", attempt, 1, claimed_by="a1")])
    assert isinstance(got, DispatchedStep)
    drive = TaskDrive(scheduler, claimed)
    wrong = StepOutcome(
        task_id="t", seq=1, attempt=got.attempt + 1, agent_instance="a1",
        state=sw.StepState.COMPLETED, result='"r"', error=None, tries=1,
    )  # fmt: skip
    future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    assert await drive._local_outcome(future, wrong) is False  # written alone, refused
    assert future.result().result == "r"  # the workflow went on from it
    with pytest.raises(Abandon):
        await drive.run_step(drive.held, new_step("t", attempt, 2), "svc.quick")
    await drive._finish(sw.TaskState.PROCESSED, '"done"', None)
    request = WaitRequest(
        task_id="t", task_attempt=attempt, scheduler="s1", seq=3, kind="timer", name="",
        delay=60.0, position="3",
    )  # fmt: skip
    with pytest.raises(Abandon):
        await drive.wait(request)
    assert [s.seq for s in await store.get_steps("t")] == [1]
    task = await store.get_task("t")
    assert task is not None and task.process_state == sw.TaskState.PROCESSING
