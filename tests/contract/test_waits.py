"""Long-running workflows on each store: durable timers, events from outside and delayed
starts. A waiting task is held by no scheduler, wakes once, and replays without running a
completed step again."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden.store import Store
from tests.rawsql import sql

from ..support.apps import Approvals
from ..support.poll import in_state
from ..support.worker import FAST, running


async def test_a_sleeping_task_is_released_and_wakes_once(store_url: str) -> None:
    shop = Approvals(store_url)
    app = shop.app
    try:
        async with running(app):
            await app.submit_async("nap", 4, task_id="n1")
            await in_state(app, "n1", sw.TaskState.WAITING)
            waiting = await app.status_async("n1")
            assert waiting.locked_by is None and waiting.complete_by is None
            assert waiting.waiting_for == "timer" and waiting.wake_at is not None
            assert await app.result_async("n1", timeout=20) == "shipped"
        assert shop.effects == Counter(reserve=1, ship=1)  # replay ran no step again
        view = await app.show_async("n1")
        kinds = [e.kind for e in view.events]
        assert kinds.count("waiting") == 1 and kinds.count("woke") == 1
        [wait] = await (await app.store()).waits("n1")
        assert (wait.seq, wait.kind, wait.state) == (2, "timer", "done")
        done = await app.status_async("n1")
        assert wait.wake_at is not None
        assert done.finished_at is not None and done.finished_at >= wait.wake_at
    finally:
        await app.aclose()


async def test_sleep_until_and_delayed_starts(store_url: str) -> None:
    shop = Approvals(store_url)
    app = shop.app
    try:
        async with running(app):
            soon = datetime.now(UTC) + timedelta(seconds=1)
            await app.submit_async("until", soon.isoformat(), task_id="u1")
            await app.submit_async("plain", 1, task_id="later", start_after=timedelta(seconds=1))
            at = datetime.now(UTC) + timedelta(seconds=1)
            await app.submit_async("plain", 2, task_id="at", start_at=at)
            for task_id in ("u1", "later", "at"):
                assert await app.result_async(task_id, timeout=20) == "shipped"
            # A start already past runs at once.
            past = datetime.now(UTC) - timedelta(days=1)
            await app.submit_async("plain", 3, task_id="past", start_at=past)
            assert await app.result_async("past", timeout=20) == "shipped"
        # Each waited for its start, and woke once, no sooner (by the store's clock).
        woke = {}
        for task_id in ("later", "at"):
            history = (await app.show_async(task_id)).events
            [woke[task_id]] = [e for e in history if e.kind == "woke"]
            assert woke[task_id].detail["waited_for"] == "start"
        later = await app.status_async("later")
        assert woke["later"].at - later.created_at >= timedelta(seconds=0.999)
        assert woke["at"].at >= at - timedelta(milliseconds=1)
        [slept] = [e for e in (await app.show_async("u1")).events if e.kind == "woke"]
        assert slept.detail["waited_for"] == "timer" and slept.at >= soon
    finally:
        await app.aclose()


async def test_an_event_sent_after_the_wait_wakes_the_task(store_url: str) -> None:
    shop = Approvals(store_url)
    app = shop.app
    try:
        async with running(app):
            await app.submit_async("approval", 60, task_id="a1")
            await in_state(app, "a1", sw.TaskState.WAITING)
            assert (await app.status_async("a1")).waiting_for == "event:approved"
            sent = await app.send_event_async("a1", "approved", {"by": "ana"}, event_id="e1")
            assert sent.sent and sent.woke
            assert await app.result_async("a1", timeout=20) == {"approved": {"by": "ana"}}
        assert shop.effects == Counter(reserve=1, ship=1)
    finally:
        await app.aclose()


async def test_an_event_sent_again_after_it_finished_the_task_is_answered_as_sent_before(
    store_url: str,
) -> None:
    """A sender whose answer was lost sends again: once the event has finished the task, the
    answer is still "sent before" (not EventRefused), whatever the task's state; an event_id
    the task never took is refused."""
    shop = Approvals(store_url)
    app = shop.app
    try:
        async with running(app):
            await app.submit_async("approval", 60, task_id="a3")
            await in_state(app, "a3", sw.TaskState.WAITING)
            first = await app.send_event_async("a3", "approved", "ana", event_id="ok-a3")
            assert first.sent and first.woke
            assert await app.result_async("a3", timeout=20) == {"approved": "ana"}
        again = await app.send_event_async("a3", "approved", "ana", event_id="ok-a3")
        assert again == sw.SendOutcome(task_id="a3", sent=False, woke=False)
        with pytest.raises(sw.EventRefused, match="processed"):
            await app.send_event_async("a3", "approved", "bob", event_id="other")
        # A cancelled task: the event it kept is answered as sent before, too.
        await app.submit_async("approval", 60, task_id="a4")
        assert (await app.send_event_async("a4", "approved", 1, event_id="kept")).sent
        assert await app.cancel_async("a4") == sw.TaskState.CANCELLED
        assert not (await app.send_event_async("a4", "approved", 1, event_id="kept")).sent
        with pytest.raises(sw.EventRefused, match="cancelled"):
            await app.send_event_async("a4", "approved", 1, event_id="new")
        received = await (await app.store()).events(task_id="a3", kind="event_received")
        assert [e.detail["event_id"] for e in received] == ["ok-a3"]  # recorded once
    finally:
        await app.aclose()


async def test_an_event_sent_before_the_wait_is_kept_for_it(store_url: str) -> None:
    shop = Approvals(store_url)
    app = shop.app
    try:
        await app.submit_async("approval", 60, task_id="a2")  # no worker yet
        sent = await app.send_event_async("a2", "approved", "early", event_id="early")
        assert sent.sent and not sent.woke
        again = await app.send_event_async("a2", "approved", "again", event_id="early")
        assert not again.sent and not again.woke  # the same event_id: sent once
        await app.submit_async("twice", None, task_id="t2")
        for n, voter in enumerate(("ana", "bob", "eve")):
            await app.send_event_async("t2", "vote", voter, event_id=f"v{n}")
        async with running(app):
            assert await app.result_async("a2", timeout=20) == {"approved": "early"}
            assert await app.result_async("t2", timeout=20) == ["ana", "bob"]  # in order
        assert (await app.status_async("a2")).process_state == sw.TaskState.PROCESSED
    finally:
        await app.aclose()


async def test_a_wait_times_out_and_the_workflow_decides(store_url: str) -> None:
    shop = Approvals(store_url)
    app = shop.app
    try:
        async with running(app):
            await app.submit_async("approval", 1, task_id="late")
            assert await app.result_async("late", timeout=20) == {"timed_out": True}
            # The event comes too late: kept, but the finished task takes none.
            with pytest.raises(sw.EventRefused, match="processed"):
                await app.send_event_async("late", "approved", "yes")
        [wait] = await (await app.store()).waits("late")
        assert wait.state == "timed_out"
        with pytest.raises(sw.TaskNotFound):
            await app.send_event_async("nobody", "approved", "yes")
    finally:
        await app.aclose()


async def test_waiting_tasks_can_be_paused_cancelled_and_compensated(store_url: str) -> None:
    shop = Approvals(store_url)
    app = shop.app
    try:
        async with running(app):
            for task_id in ("p", "c", "k"):
                await app.submit_async("approval", 60, task_id=task_id)
            for task_id in ("p", "c", "k"):
                await in_state(app, task_id, sw.TaskState.WAITING)
            assert await app.pause_async("p") == sw.TaskState.PAUSED
            assert (await app.send_event_async("p", "approved", 1)).woke is False
            assert await app.cancel_async("c") == sw.TaskState.CANCELLED
            with pytest.raises(sw.EventRefused):
                await app.send_event_async("c", "approved", 1)
            assert await app.cancel_async("k", compensate=True) == sw.TaskState.COMPENSATING
            await in_state(app, "k", sw.TaskState.COMPENSATED)
            paused = await app.status_async("p")
            assert paused.process_state == sw.TaskState.PAUSED and paused.wake_at is None
            await app.resume_async("p")  # resumed: replays, and takes the event kept for it
            assert await app.result_async("p", timeout=20) == {"approved": 1}
        assert shop.effects["release"] == 1  # k's reservation, undone once
    finally:
        await app.aclose()


async def test_an_event_sent_in_a_transaction_that_rolls_back_is_not_sent(
    store_url: str,
) -> None:
    shop = Approvals(store_url)
    app = shop.app
    try:
        await app.submit_async("approval", 60, task_id="tx")
        with pytest.raises(RuntimeError):
            async with app.transaction() as tx:
                await tx.send_event("tx", "approved", "no", event_id="rolled-back")
                raise RuntimeError("the application's own write failed")
        async with app.transaction() as tx:
            sent = await tx.send_event("tx", "approved", "yes", event_id="committed")
        assert sent.sent
        async with running(app):
            assert await app.result_async("tx", timeout=20) == {"approved": "yes"}
        [[count]] = sql(store_url, "SELECT count(*) FROM stepwarden_inbox")
        assert count == 1
    finally:
        await app.aclose()


async def test_a_changed_workflow_is_refused_at_the_position_of_a_wait(store_url: str) -> None:
    """A task that slept at position 2, resumed by code that calls a step there instead,
    fails with NonDeterminismError (and is compensated), not running the step."""
    shop = Approvals(store_url)
    app = shop.app
    try:
        async with running(app):
            await app.submit_async("nap", 30, task_id="changed")
            await in_state(app, "changed", sw.TaskState.WAITING)
        changed = sw.App("waits", store=store_url)
        desk = changed.agent("desk")

        @desk.operation
        async def reserve(call: sw.Call, order: Any) -> str:
            return "reserved"

        @desk.operation
        async def ship(call: sw.Call, order: Any) -> str:
            raise AssertionError("a step at the wait's position must not run")

        @desk.operation
        async def release(call: sw.Call, order: Any) -> str:
            return "released"

        @changed.workflow(complete_within=timedelta(seconds=20), name="nap")
        async def nap(ctx: sw.Context, seconds: float) -> Any:
            await ctx.step(desk.reserve, seconds)
            return await ctx.step(desk.ship, seconds)

        sql(store_url, "UPDATE stepwarden_tasks SET wake_at = created_at WHERE task_id = 'changed'")
        try:
            async with running(changed, FAST):
                with pytest.raises(sw.TaskFailed, match=r"NonDeterminismError.*timer is recorded"):
                    await changed.result_async("changed", timeout=20)
        finally:
            await changed.aclose()
    finally:
        await app.aclose()


async def test_waits_and_wake_ups_are_fenced(store: Store) -> None:
    """A wait from a scheduler that no longer holds the task (another one, or an older
    attempt) records nothing and parks nothing; a wake-up under a stale lease term wakes
    nothing; a task parked twice is parked once."""
    from stepwarden.records import Submission, WaitRequest

    await store.submit(
        [Submission(task_id="f", workflow="wf", input="{}", priority=0, complete_within=30,
                 max_failures=3)]
    )  # fmt: skip
    [claimed] = await store.claim_tasks("s1", ["wf"], 1)
    attempt = claimed.task.attempt

    def request(scheduler: str, attempt: int, seq: int = 1) -> WaitRequest:
        return WaitRequest(
            task_id="f", task_attempt=attempt, scheduler=scheduler, seq=seq, kind="timer",
            name="", delay=0.2,
        )  # fmt: skip

    for fenced in (request("s2", attempt), request("s1", attempt - 1)):
        assert (await store.wait(fenced)).state == "fenced"
    assert await store.waits("f") == []
    assert (await store.get_task("f")).process_state == sw.TaskState.PROCESSING  # type: ignore[union-attr]
    assert (await store.wait(request("s1", attempt))).state == "parked"
    assert (await store.wait(request("s1", attempt))).state == "fenced"  # no longer held
    [recorded] = await store.waits("f")
    assert recorded.state == "open"
    term = await store.acquire_lease("supervisor", "sup", 30)
    assert term is not None
    async with asyncio.timeout(10):
        while True:
            old = await store.wake_due(lease="supervisor", holder="sup", term=term - 1, limit=10)
            assert old == []
            other = await store.wake_due(lease="supervisor", holder="nobody", term=term, limit=10)
            assert other == []
            woken = await store.wake_due(lease="supervisor", holder="sup", term=term, limit=10)
            if woken:
                break
            await asyncio.sleep(0.05)
    assert [w.task_id for w in woken] == ["f"] and woken[0].waited_for == "timer"
    assert (await store.get_task("f")).process_state == sw.TaskState.PENDING  # type: ignore[union-attr]
