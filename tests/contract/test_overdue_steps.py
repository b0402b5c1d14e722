"""A step still open past its complete_by, on each store: a real scheduler drives its task,
and the test makes the supervisor's sweep only once the drive has looked at the step and
found it overdue, as a supervisor late under load does. The sweep then either fails the step
(its total timeout passed: the task stays held) or expires the task (its hold taken from the
drive). Whichever it is, and however late it comes, the drive goes on from it: the task ends
with the step's failure long before its own complete_by, or the drive stops, writing nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, cast

import stepwarden as sw
from stepwarden.records import StepRecord, Submission
from stepwarden.retry import Backoff
from stepwarden.scheduler import Scheduler
from stepwarden.store import Store
from stepwarden.store.ports import SchedulerPort
from stepwarden.workflow import Workflow

from ..support.poll import until

LEASE = "supervisor"
STEP_WITHIN = 0.3
"""Seconds each dispatch of the step may take (and, with a total timeout, all of them)."""

svc = sw.Agent("svc")


@svc.operation
async def act(call: sw.Call) -> str:
    return "done"  # never called: no agent runs


async def one_step(ctx: sw.Context, total: float | None) -> str:
    return await ctx.step(act, complete_within=STEP_WITHIN, total_within=total)


FLOW = Workflow(
    name="overdue",
    fn=one_step,
    complete_within=timedelta(seconds=30),
    max_failures=3,
    on_failure=sw.OnFailure.STOP,
)


class Looks:
    """The scheduler's store, which says when a read of a step finds it open past its
    complete_by: from then on, the supervisor's sweep comes later than the drive's first
    look at the step."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.overdue = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _saw(self, step: StepRecord, remaining: float) -> None:
        if step.state in (sw.StepState.NOT_STARTED, sw.StepState.RUNNING) and remaining <= 0:
            self.overdue.set()

    async def read_step(self, task_id: str, seq: int) -> tuple[StepRecord, float] | None:
        found = await self._store.read_step(task_id, seq)
        if found is not None:
            self._saw(*found)
        return found

    async def read_held_step(
        self, task_id: str, seq: int, attempt: int, scheduler: str
    ) -> tuple[StepRecord, float, bool] | None:
        found = await self._store.read_held_step(task_id, seq, attempt, scheduler)
        if found is not None:
            self._saw(found[0], found[1])
        return found


@contextlib.asynccontextmanager
async def driven(store: Store, total: float | None) -> AsyncIterator[Scheduler]:
    """Submit task `t` (its step bounded by `total` too, when given) and run a scheduler (no
    agent, no supervisor) that claims it, until its drive has found the step overdue."""
    looks = Looks(store)
    scheduler = Scheduler(
        cast(SchedulerPort, looks),
        {FLOW.key: FLOW},
        instance="s1",
        poll_interval=0.05,
        admission=False,  # no agent has room: claim all the same
    )
    task = Submission(
        task_id="t",
        workflow=FLOW.name,
        input=json.dumps(total),
        priority=0,
        complete_within=30,
        max_failures=3,
        on_failure="stop",
    )
    await store.submit([task])
    stop = asyncio.Event()
    running = asyncio.create_task(scheduler.run(stop, drain_timeout=1))
    try:
        async with asyncio.timeout(20):
            await looks.overdue.wait()
        yield scheduler
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)


async def test_a_step_failed_by_its_total_timeout_after_its_drive_found_it_overdue_ends_the_task(
    store: Store,
) -> None:
    """The step's total timeout is its complete_by: past it, the supervisor fails the step
    and leaves the task held. Its sweep comes after the drive's look found the step overdue:
    the drive waits on, is woken by the failure, and ends the task with it."""
    async with driven(store, STEP_WITHIN) as scheduler:
        term = await store.acquire_lease(LEASE, "sup", 30)
        assert term is not None
        swept = await store.sweep_steps(
            lease=LEASE, holder="sup", term=term, limit=100, forget_after=3600
        )
        assert [(s.task_id, s.kind) for s in swept] == [("t", "total")]

        async def ended() -> bool:
            task = await store.get_task("t")
            return task is not None and task.process_state == sw.TaskState.ERROR

        await until(ended, timeout=10)  # its own complete_by is 30 s away
        task = await store.get_task("t")
        [step] = await store.get_steps("t")
    assert task is not None and (task.attempt, task.failure_count) == (1, 0)
    assert step.state == sw.StepState.FAILED and step.attempt == 1
    assert step.error is not None and step.error in (task.error or "")
    assert scheduler.tasks_held() == 0


async def test_a_drive_whose_task_expired_after_it_found_its_step_overdue_stops(
    store: Store,
) -> None:
    """The step has no total timeout: past its complete_by the supervisor expires the task
    (a failure counted, the task pending again after its backoff). Its sweep comes after the
    drive's look found the step overdue: the drive, no longer holding the task, stops, and
    writes nothing; the step waits for the task's next claim."""
    async with driven(store, None) as scheduler:
        term = await store.acquire_lease(LEASE, "sup", 30)
        assert term is not None
        expired = await store.sweep(
            lease=LEASE, holder="sup", term=term, limit=100, backoff=Backoff(initial=60, maximum=60)
        )
        assert [(e.task_id, e.process_state) for e in expired] == [("t", sw.TaskState.PENDING)]

        async def let_go() -> bool:
            return scheduler.tasks_held() == 0

        await until(let_go, timeout=10)
        task = await store.get_task("t")
        [step] = await store.get_steps("t")
    assert task is not None and task.process_state == sw.TaskState.PENDING
    assert (task.attempt, task.failure_count, task.locked_by) == (1, 1, None)
    assert (step.state, step.attempt, step.task_attempt) == (sw.StepState.NOT_STARTED, 1, 1)
