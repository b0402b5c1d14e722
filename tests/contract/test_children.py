"""Child workflows on each store: `ctx.child` starts another task and waits for it, released;
children started in the branches of a `ctx.gather` run at the same time; a replay finds the
child it started; a child's failure is the parent's ChildFailed; cancelling or compensating
a parent reaches its children that have not ended, newest first."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import stepwarden as sw

from ..support.apps import Family
from ..support.poll import in_state, until
from ..support.worker import FAST, RESUME, running


@pytest.fixture
async def family(store_url: str) -> Any:
    f = Family(store_url)
    yield f
    await f.app.aclose()


async def test_a_childs_result_is_returned_to_its_parent(family: Family) -> None:
    app = family.app
    async with running(app):
        await app.submit_async("single", ["a", "b"], task_id="p")
        result = await app.result_async("p", timeout=30)
    assert result == ["done p-first", ["done a", "done b"]]
    child = await app.status_async("p:2")  # the parent's id and the child's place
    assert child.process_state == sw.TaskState.PROCESSED
    assert (child.parent_id, child.parent_position, child.workflow) == ("p", "2", "kid")
    assert child.result == ["done a", "done b"]
    view = await app.show_async("p")
    assert [c.task_id for c in view.children] == ["p:2"]
    assert view.task.parent_id is None
    kinds = [e.kind for e in reversed(view.events)]
    # Started with its wait, parked while the child ran (released), woken by its end.
    assert kinds == ["child_started", "waiting", "woke"]
    [waiting] = [e for e in view.events if e.kind == "waiting"]
    assert waiting.detail["for"] == "child:p:2" and waiting.detail["until"] is None
    [woke] = [e for e in view.events if e.kind == "woke"]
    assert woke.detail["child"] == "p:2" and woke.detail["state"] == "processed"
    [wait] = await (await app.store()).waits("p")
    assert (wait.kind, wait.name, wait.state, wait.wake_at) == ("child", "p:2", "done", None)
    assert family.calls == Counter({"p-first": 1, "a": 1, "b": 1})


async def test_the_parent_is_released_while_its_child_runs(family: Family) -> None:
    app = family.app
    hold = family.gate("a")
    async with running(app):
        await app.submit_async("single", ["a"], task_id="p")
        await family.started_call("a")
        parent = await in_state(app, "p", sw.TaskState.WAITING)
        assert parent.locked_by is None and parent.complete_by is None
        assert parent.waiting_for == "child:p:2" and parent.wake_at is None
        assert (await app.status_async("p:2")).process_state == sw.TaskState.PROCESSING
        hold.set()
        assert await app.result_async("p", timeout=30) == ["done p-first", ["done a"]]


async def test_a_failed_child_raises_child_failed_in_its_parent(family: Family) -> None:
    app = family.app
    async with running(app):
        await app.submit_async("single", ["fail-x"], task_id="p")
        with pytest.raises(sw.TaskFailed) as failed:
            await app.result_async("p", timeout=30)
        await app.submit_async("careful", ["c1", "fail-y"], task_id="c")
        caught = await app.result_async("c", timeout=30)
    # The parent compensates, by its on_failure, what it did; the child ended in error
    # (its failed step had nothing to undo).
    assert failed.value.state == sw.TaskState.COMPENSATED
    assert "ChildFailed" not in (failed.value.error or "")
    assert "child task 'p:2' ended error" in (failed.value.error or "")
    assert "fail-x cannot be done" in (failed.value.error or "")
    assert (await app.status_async("p:2")).process_state == sw.TaskState.ERROR
    assert family.undone["p-first"] == 1
    # A workflow that catches ChildFailed sees the child's id, state and error: the child
    # compensated its completed step (c1) and ended compensated.
    assert caught["task_id"] == "c:1" and caught["state"] == "compensated"
    assert "fail-y cannot be done" in caught["error"]
    assert family.undone["c1"] == 1


async def test_children_started_in_a_gather_run_at_the_same_time(family: Family) -> None:
    """Each child's only step waits until all three have started: they finish only if the
    three ran side by side."""
    app = family.app
    async with running(app):
        spec = {"workflow": "meeting", "children": ["ann", "bob", "cy"]}
        await app.submit_async("brood", spec, task_id="p")
        result = await app.result_async("p", timeout=40)
    assert result == ["done p-first", ["met ann", "met bob", "met cy"]]
    assert sorted(family.met) == ["ann", "bob", "cy"]
    view = await app.show_async("p")
    assert {(c.task_id, c.parent_position) for c in view.children} == {
        ("p:2.1.1", "2.1.1"),
        ("p:2.2.1", "2.2.1"),
        ("p:2.3.1", "2.3.1"),
    }
    # The parent parked first on the three children together, once it had started them all
    # (woken by the first to end, it may park again on those still running).
    oldest_first = list(reversed(view.events))
    kinds = [e.kind for e in oldest_first]
    assert kinds.count("child_started") == 3
    assert kinds.index("waiting") > max(i for i, k in enumerate(kinds) if k == "child_started")
    waiting = oldest_first[kinds.index("waiting")]
    assert waiting.detail["for"] == "child:p:2.1.1 +2" and len(waiting.detail["seqs"]) == 3


async def test_a_replay_after_the_parents_scheduler_stopped_starts_no_second_child(
    family: Family,
) -> None:
    """The parent started its child and waits for a step of its own in the other branch when
    its scheduler stops (and hands it back): the next scheduler replays it, finds the child
    at its place, and waits for it; nothing runs twice."""
    app = family.app
    slow, held = family.gate("slow"), family.gate("p-held")
    drain = dataclasses.replace(FAST, drain_timeout=0.2)
    async with running(app, drain):
        await app.submit_async("half_held", None, task_id="p")
        await family.started_call("slow")
        await family.started_call("p-held")
    store = await app.store()
    before = await store.waits("p")
    assert [(w.kind, w.name) for w in before] == [("child", "p:1.1.1")]
    assert (await app.status_async("p")).process_state == sw.TaskState.PENDING  # handed back
    slow.set()
    held.set()
    async with running(app, RESUME):
        result = await app.result_async("p", timeout=30)
    assert result == [["done slow"], "done p-held"]
    view = await app.show_async("p")
    assert [c.task_id for c in view.children] == ["p:1.1.1"]
    assert view.task.attempt >= 2  # replayed
    assert [(w.seq, w.kind, w.name) for w in await store.waits("p")] == [
        (w.seq, w.kind, w.name) for w in before
    ]
    assert [e.kind for e in view.events].count("child_started") == 1
    assert family.calls == Counter({"slow": 1, "p-held": 1})


async def test_a_task_id_taken_by_another_task_fails_the_parent(family: Family) -> None:
    app = family.app
    await app.submit_async("kid", ["other"], task_id="taken")
    async with running(app):
        await app.submit_async("named", "taken", task_id="p")
        with pytest.raises(sw.TaskFailed) as failed:
            await app.result_async("p", timeout=30)
        await app.submit_async("named", "mine", task_id="q")
        assert await app.result_async("q", timeout=30) == ["done n"]
        assert await app.result_async("taken", timeout=30) == ["done other"]
    assert failed.value.state == sw.TaskState.ERROR  # nothing to undo
    assert "task 'taken' exists and is not a child of this task" in (failed.value.error or "")
    assert (await app.status_async("taken")).parent_id is None  # left as it was
    assert await (await app.store()).waits("p") == []  # nothing recorded
    assert (await app.status_async("mine")).parent_id == "q"


async def test_cancelling_a_parent_cancels_its_running_children_newest_first(
    family: Family,
) -> None:
    app = family.app
    for what in ("k0", "k1", "k2"):
        family.gate(what)
    async with running(app):
        await app.submit_async("brood", {"children": [["k0"], ["k1"], ["k2"]]}, task_id="p")
        for what in ("k0", "k1", "k2"):
            await family.started_call(what)
        await in_state(app, "p", sw.TaskState.WAITING)
        assert await app.cancel_async("p", reason="customer left") == sw.TaskState.CANCELLED
        view = await app.show_async("p")
        children = sorted(view.children, key=lambda c: c.created_at)
        assert [c.process_state for c in children] == [sw.TaskState.CANCELLED] * 3
        cancels = []
        for c in children:
            [event] = [e for e in (await app.show_async(c.task_id)).events if e.kind == "operator"]
            assert event.detail["action"] == "cancel" and event.detail["parent"] == "p"
            assert event.detail["from"] == "processing" and event.detail["to"] == "cancelled"
            assert event.detail["reason"] == "its parent 'p' was cancelled"
            cancels.append(event.id)
        assert cancels == sorted(cancels, reverse=True)  # the newest child first
        for what in ("k0", "k1", "k2"):
            family.gates[what].set()
        for c in children:  # their open steps were closed: an answer changes nothing
            with pytest.raises(sw.TaskFailed, match="cancelled"):
                await app.result_async(c.task_id, timeout=10)
    assert family.calls["p-first"] == 1 and family.undone == Counter()


async def test_cancel_compensate_of_a_parent_compensates_its_children(family: Family) -> None:
    app = family.app
    spec = {
        "workflow": "patient_kid",
        "children": [{"first": f"c{i}", "event": "never"} for i in range(3)],
    }
    async with running(app):
        await app.submit_async("brood", spec, task_id="p")
        children = ["p:2.1.1", "p:2.2.1", "p:2.3.1"]
        await in_state(app, "p", sw.TaskState.WAITING)
        for c in children:
            await in_state(app, c, sw.TaskState.WAITING)
        assert await app.cancel_async("p", compensate=True) == sw.TaskState.COMPENSATING
        for c in children:
            await in_state(app, c, sw.TaskState.COMPENSATED)
        await in_state(app, "p", sw.TaskState.COMPENSATED)
    assert family.undone == Counter({"p-first": 1, "c0": 1, "c1": 1, "c2": 1})
    for c in children:
        [event] = [e for e in (await app.show_async(c)).events if e.kind == "operator"]
        assert (event.detail["action"], event.detail["parent"]) == ("compensate", "p")
        assert event.detail["from"] == "waiting"


async def test_a_parent_that_fails_compensates_the_children_still_running(
    family: Family,
) -> None:
    """One child fails; the parent fails (ChildFailed) and compensates, and so compensates
    its other child, still running: its completed step is undone once."""
    app = family.app
    spec = {
        "workflow": "patient_kid",
        "children": [{"first": "alive", "event": "never"}, {"first": "fail-now", "event": "x"}],
    }
    async with running(app):
        await app.submit_async("brood", spec, task_id="p")
        with pytest.raises(sw.TaskFailed) as failed:
            await app.result_async("p", timeout=30)
        await in_state(app, "p:2.1.1", sw.TaskState.COMPENSATED)
    assert failed.value.state == sw.TaskState.COMPENSATED
    assert "child task 'p:2.2.1' ended error" in (failed.value.error or "")
    assert family.undone == Counter({"p-first": 1, "alive": 1})
    [event] = [e for e in (await app.show_async("p:2.1.1")).events if e.kind == "operator"]
    assert event.detail["by"] == "stepwarden" and event.detail["parent"] == "p"


async def test_an_event_and_a_child_in_one_gather_each_wake_the_parent(family: Family) -> None:
    app = family.app
    async with running(app):
        await app.submit_async("both", None, task_id="p")
        await in_state(app, "p:1.2.1", sw.TaskState.WAITING)
        parked = await in_state(app, "p", sw.TaskState.WAITING)
        assert parked.waiting_for == "event:go +1" and parked.wake_at is not None
        # The event wakes it (its wait for it is open, though waiting_for names it first
        # only by chance); it takes the event, and parks again on its child alone.
        sent = await app.send_event_async("p", "go", {"by": "ana"}, event_id="e1")
        assert sent.sent and sent.woke

        async def parked_on_the_child() -> bool:
            t = await app.status_async("p")
            return t.process_state == sw.TaskState.WAITING and t.waiting_for == "child:p:1.2.1"

        await until(parked_on_the_child)
        assert (await app.status_async("p")).wake_at is None
        # An event no wait of it takes keeps it waiting.
        other = await app.send_event_async("p", "unrelated", 1, event_id="e2")
        assert other.sent and not other.woke
        # The child's end wakes it.
        await app.send_event_async("p:1.2.1", "kid-go", "now", event_id="e3")
        result = await app.result_async("p", timeout=30)
    assert result == [{"by": "ana"}, {"told": "now"}]
    events = list(reversed((await app.show_async("p")).events))
    assert [e.kind for e in events].count("waiting") == 2
    received = [(e.detail["name"], e.detail["woke"]) for e in events if e.kind == "event_received"]
    assert received == [("go", True), ("unrelated", False)]
    [woke] = [e for e in events if e.kind == "woke"]  # by the child's end
    assert woke.detail["child"] == "p:1.2.1" and woke.detail["state"] == "processed"


async def test_several_waits_park_until_the_earliest(family: Family) -> None:
    app = family.app
    async with running(app):
        await app.submit_async("timer_and_event", None, task_id="t")
        parked = await in_state(app, "t", sw.TaskState.WAITING)
        assert parked.waiting_for == "timer +1"
        waits = {w.kind: w for w in await (await app.store()).waits("t")}
        assert parked.wake_at == waits["timer"].wake_at  # the earlier of the two
        assert await app.cancel_async("t") == sw.TaskState.CANCELLED


async def test_a_timer_that_fires_while_another_branch_runs_does_not_park_the_task(
    family: Family,
) -> None:
    """The timer's branch waits while the other branch's step runs (the task is not parked:
    a branch waits for its step); once the step is done the timer has fired, and the one
    transaction that would park the task finds it ready instead."""
    app = family.app
    long = family.gate("long")
    async with running(app):
        await app.submit_async("nap_beside_a_step", None, task_id="t")
        await family.started_call("long")

        async def fired() -> bool:
            waits = await (await app.store()).waits("t")  # none until the branch gets there
            due = any(w.wake_at is not None and w.wake_at <= datetime.now(UTC) for w in waits)
            return due and (await app.status_async("t")).process_state == sw.TaskState.PROCESSING

        await until(fired)
        long.set()
        assert await app.result_async("t", timeout=30) == [None, "done long"]
    view = await app.show_async("t")
    assert [e.kind for e in view.events if e.kind in ("waiting", "woke")] == []
    [wait] = await (await app.store()).waits("t")
    assert wait.state == "done"


async def test_a_child_cancelled_by_an_operator_fails_its_parent(family: Family) -> None:
    app = family.app
    family.gate("k")
    async with running(app):
        await app.submit_async("careful", ["k"], task_id="c")
        await family.started_call("k")
        await in_state(app, "c", sw.TaskState.WAITING)
        assert await app.cancel_async("c:1", reason="not needed") == sw.TaskState.CANCELLED
        caught = await app.result_async("c", timeout=30)
        family.gates["k"].set()  # the cancelled child's call answers: nothing changes
    assert caught == {"task_id": "c:1", "state": "cancelled", "error": None}
    [woke] = [e for e in (await app.show_async("c")).events if e.kind == "woke"]
    assert woke.detail == {"waited_for": "child:c:1", "child": "c:1", "state": "cancelled"}


async def test_a_replay_asking_for_a_child_of_another_workflow_at_its_place_fails(
    store_url: str,
) -> None:
    """The code changed between two runs of a parent: at the place where it started a child
    of one workflow it now asks for a child of another (the default id is the same): the
    replay says so (NonDeterminismError) rather than take the recorded child for it."""
    app = sw.App("family", store=store_url)
    svc = app.agent("svc")
    gate = asyncio.Event()
    code = {"child": "first"}

    @svc.operation
    async def work(call: sw.Call, what: str) -> str:
        await gate.wait()
        return what

    @app.workflow(complete_within=timedelta(seconds=20))
    async def first(ctx: sw.Context, _: Any) -> Any:
        return await ctx.step(work, "first")

    @app.workflow(complete_within=timedelta(seconds=20))
    async def second(ctx: sw.Context, _: Any) -> Any:
        return await ctx.step(work, "second")

    @app.workflow(complete_within=timedelta(seconds=20), on_failure="stop")
    async def parent(ctx: sw.Context, _: Any) -> Any:
        return await ctx.child(code["child"], None)

    try:
        async with running(app, dataclasses.replace(FAST, drain_timeout=0.2)):
            await app.submit_async(parent, None, task_id="p")
            await in_state(app, "p", sw.TaskState.WAITING)
        code["child"] = "second"
        gate.set()
        async with running(app, RESUME):
            with pytest.raises(sw.TaskFailed) as failed:
                await app.result_async("p", timeout=30)
        assert failed.value.state == sw.TaskState.ERROR
        assert "runs workflow 'first', the workflow asked for 'second'" in (
            failed.value.error or ""
        )
    finally:
        await app.aclose()
