"""Parallel steps on each store: `ctx.gather` runs branches side by side, numbers each
branch's steps on its own (so that a replay finds them however the branches interleaved),
cancels the other branches' waits when one fails, and the task's compensation undoes what the
branches completed, once."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw

from ..support.poll import until
from ..support.worker import FAST, RESUME, running


class Fanout:
    """An App whose operations record each call; `gates` hold calls of a given argument until
    released (an asyncio.Event per argument)."""

    def __init__(self, store_url: str, *, within: float = 10) -> None:
        self.app = sw.App("fanout", store=store_url)
        self.calls: Counter[str] = Counter()
        self.undone: Counter[str] = Counter()
        self.gates: dict[str, asyncio.Event] = {}
        self.started: dict[str, asyncio.Event] = {}
        svc = self.app.agent("svc", retry=sw.Retry(max_attempts=2, initial=0.01, maximum=0.02))
        self.svc = svc

        @svc.operation
        async def work(call: sw.Call, what: str) -> str:
            self.started.setdefault(what, asyncio.Event()).set()
            gate = self.gates.get(what)
            if gate is not None:
                await gate.wait()
            if what.startswith("fail"):
                raise sw.PermanentError(f"{what} cannot be done")
            self.calls[what] += 1
            return f"done {what}"

        @svc.operation
        async def undo(call: sw.Call, what: str) -> None:
            self.undone[what] += 1

        self.work, self.undo = work, undo

        async def branch(ctx: sw.Context, items: list[str]) -> list[str]:
            return [await ctx.step(work, item, compensate=undo) for item in items]

        @self.app.workflow(complete_within=timedelta(seconds=within), max_failures=1)
        async def branches(ctx: sw.Context, spec: dict[str, Any]) -> Any:
            first = await ctx.step(work, "first", compensate=undo)
            both = await ctx.gather(*(branch(ctx, items) for items in spec["branches"]))
            last = await ctx.step(work, "last", compensate=undo)
            return [first, both, last]

        @self.app.workflow(complete_within=timedelta(seconds=60))
        async def fan_out(ctx: sw.Context, n: int) -> list[str]:
            return await ctx.gather(*(ctx.step(work, f"item-{i}") for i in range(n)))

        @self.app.workflow(complete_within=timedelta(seconds=within))
        async def plain(ctx: sw.Context, items: list[str]) -> list[str]:
            return list(await asyncio.gather(*(ctx.step(work, item) for item in items)))

        @self.app.workflow(complete_within=timedelta(seconds=within))
        async def nested(ctx: sw.Context, _: Any) -> Any:
            async def inner(tag: str) -> list[str]:
                return await ctx.gather(ctx.step(work, f"{tag}-x"), ctx.step(work, f"{tag}-y"))

            async def outer() -> Any:
                return [await ctx.step(work, "o"), await inner("deep")]

            return await ctx.gather(outer(), inner("flat"))

        self.branches, self.fan_out, self.plain, self.nested = branches, fan_out, plain, nested

    def gate(self, what: str) -> asyncio.Event:
        return self.gates.setdefault(what, asyncio.Event())

    async def started_call(self, what: str) -> None:
        await asyncio.wait_for(self.started.setdefault(what, asyncio.Event()).wait(), 20)


@pytest.fixture
async def fanout(store_url: str) -> Any:
    f = Fanout(store_url)
    yield f
    await f.app.aclose()


async def completed(app: sw.App, task_id: str, what: str) -> None:
    """Wait until the step whose argument is `what` is completed in the store."""

    async def done() -> bool:
        steps = (await app.show_async(task_id)).steps
        return any(s.input == [what] and s.state == sw.StepState.COMPLETED for s in steps)

    await until(done)


def places(view: sw.TaskView) -> dict[str, tuple[str | None, Any]]:
    """Each step's argument, with its position and result."""
    return {s.input[0]: (s.position, s.result) for s in view.steps if s.compensates is None}


async def test_branches_run_side_by_side_and_take_their_places_by_branch(
    fanout: Fanout,
) -> None:
    # The second branch's first step finishes before the first branch's first: the records
    # are made in that order, but each step's place is its branch's.
    slow = fanout.gate("a1")
    async with running(fanout.app):
        await fanout.app.submit_async(
            fanout.branches, {"branches": [["a1", "a2"], ["b1", "b2", "b3"]]}, task_id="t"
        )
        await fanout.started_call("b3")  # the second branch ran on while the first waited
        slow.set()
        result = await fanout.app.result_async("t", timeout=30)
    assert result == [
        "done first",
        [["done a1", "done a2"], ["done b1", "done b2", "done b3"]],
        "done last",
    ]
    view = await fanout.app.show_async("t")
    assert {k: p for k, (p, _) in places(view).items()} == {
        "first": "1",
        "a1": "2.1.1",
        "a2": "2.1.2",
        "b1": "2.2.1",
        "b2": "2.2.2",
        "b3": "2.2.3",
        "last": "3",
    }
    by_seq = [s.input[0] for s in sorted(view.steps, key=lambda s: s.seq)]
    assert by_seq.index("b3") < by_seq.index("a2")  # recorded as they came
    assert fanout.calls == Counter(first=1, a1=1, a2=1, b1=1, b2=1, b3=1, last=1)


async def test_a_replay_after_the_scheduler_stopped_finds_each_branch_by_its_place(
    fanout: Fanout,
) -> None:
    """The first run records branch b's steps and a1 (held at its agent); its scheduler is
    stopped and hands the task back. The second run, where a1 now returns at once, replays
    the branches in another interleaving: every completed step returns its recorded result
    and runs no second time, a1 is taken over at its place, and the rest runs once."""
    hold = fanout.gate("a1")
    drain = dataclasses.replace(FAST, drain_timeout=0.2)
    async with running(fanout.app, drain):
        await fanout.app.submit_async(
            fanout.branches, {"branches": [["a1", "a2"], ["b1", "b2"]]}, task_id="t"
        )
        await fanout.started_call("a1")
        await completed(fanout.app, "t", "b2")
    before = {s.input[0]: (s.seq, s.position) for s in (await fanout.app.show_async("t")).steps}
    assert set(before) == {"first", "a1", "b1", "b2"}
    hold.set()
    async with running(fanout.app, RESUME):
        result = await fanout.app.result_async("t", timeout=30)
    assert result[1] == [["done a1", "done a2"], ["done b1", "done b2"]]
    view = await fanout.app.show_async("t")
    after = {s.input[0]: (s.seq, s.position) for s in view.steps}
    assert {k: after[k] for k in before} == before  # the same records, at the same places
    assert after["a2"][1] == "2.1.2" and after["last"][1] == "3"
    assert fanout.calls == Counter(first=1, a1=1, a2=1, b1=1, b2=1, last=1)


async def test_a_failing_branch_cancels_the_others_and_what_they_completed_is_undone_once(
    store_url: str,
) -> None:
    """Branch a fails at its second step while branch b waits for its second: the workflow
    stops waiting at once and fails; b2, held at its agent, finishes after the task began
    compensating. Every step that took effect (first, a1, b1, and b2, which was open when
    the task failed) is compensated exactly once; the failed one and the last are not."""
    fanout = Fanout(store_url, within=3)  # b2's compensation waits for its complete_by
    hold_b2 = fanout.gate("b2")
    fail_gate = fanout.gate("fail-a2")
    async with running(fanout.app):
        await fanout.app.submit_async(
            fanout.branches, {"branches": [["a1", "fail-a2"], ["b1", "b2"]]}, task_id="t"
        )
        await fanout.started_call("b2")
        await fanout.started_call("fail-a2")
        fail_gate.set()

        async def failed_over() -> bool:
            task = await fanout.app.status_async("t")
            return task.process_state != sw.TaskState.PROCESSING

        await until(failed_over)
        hold_b2.set()
        with pytest.raises(sw.TaskFailed) as failed:
            await fanout.app.result_async("t", timeout=30)
    try:
        assert failed.value.state == sw.TaskState.COMPENSATED
        assert fanout.undone == Counter(first=1, a1=1, b1=1, b2=1)
        assert fanout.calls["last"] == 0
        view = await fanout.app.show_async("t")
        assert "fail-a2 cannot be done" in (view.task.error or "")
    finally:
        await fanout.app.aclose()


async def test_a_fan_out_of_many_steps_is_written_in_batches(fanout: Fanout) -> None:
    n = 300
    async with running(fanout.app):
        await fanout.app.submit_async(fanout.fan_out, n, task_id="t")
        result = await fanout.app.result_async("t", timeout=60)
    assert result == [f"done item-{i}" for i in range(n)]
    view = await fanout.app.show_async("t")
    want = sorted(f"1.{i}.1" for i in range(1, n + 1))
    assert sorted(s.position or "" for s in view.steps) == want
    assert fanout.calls == Counter({f"item-{i}": 1 for i in range(n)})


async def test_plain_asyncio_gather_of_steps_takes_places_in_argument_order(
    fanout: Fanout,
) -> None:
    hold = fanout.gate("x")
    async with running(fanout.app):
        await fanout.app.submit_async(fanout.plain, ["x", "y", "z"], task_id="t")
        await fanout.started_call("z")
        hold.set()
        assert await fanout.app.result_async("t", timeout=30) == ["done x", "done y", "done z"]
    view = await fanout.app.show_async("t")
    assert {k: p for k, (p, _) in places(view).items()} == {"x": "1", "y": "2", "z": "3"}


async def test_gathers_inside_branches_nest_their_places(fanout: Fanout) -> None:
    async with running(fanout.app):
        await fanout.app.submit_async(fanout.nested, None, task_id="t")
        assert await fanout.app.result_async("t", timeout=30) == [
            ["done o", ["done deep-x", "done deep-y"]],
            ["done flat-x", "done flat-y"],
        ]
    view = await fanout.app.show_async("t")
    assert {k: p for k, (p, _) in places(view).items()} == {
        "o": "1.1.1",
        "deep-x": "1.1.2.1.1",
        "deep-y": "1.1.2.2.1",
        "flat-x": "1.2.1.1.1",
        "flat-y": "1.2.1.2.1",
    }


async def test_gather_refuses_what_is_not_a_coroutine(store_url: str) -> None:
    app = sw.App("bad", store=store_url)
    svc = app.agent("svc")

    @svc.operation
    async def work(call: sw.Call, what: str) -> str:
        return what

    @app.workflow(complete_within=timedelta(seconds=10))
    async def wrong(ctx: sw.Context, _: Any) -> Any:
        return await ctx.gather(ctx.step(work, "a"), "not a coroutine")  # type: ignore[arg-type]

    try:
        async with running(app):
            await app.submit_async(wrong, None, task_id="t")
            with pytest.raises(sw.TaskFailed) as failed:
                await app.result_async("t", timeout=30)
        assert "ctx.gather takes coroutines" in (failed.value.error or "")
        assert (await app.show_async("t")).steps == []
    finally:
        await app.aclose()


@pytest.mark.parametrize("change", ["gather_to_step", "step_to_gather"])
async def test_a_replay_that_finds_a_gather_where_a_step_was_or_the_reverse_fails(
    store_url: str, change: str
) -> None:
    """Code changed between two runs of a task: a gather where a step was recorded, or a
    step where a gather's branches were: the replay says so (NonDeterminismError) rather
    than go on past records it does not match."""
    app = sw.App("changed", store=store_url)
    svc = app.agent("svc")
    gate = asyncio.Event()
    code = {"gather": change == "gather_to_step"}

    @svc.operation
    async def work(call: sw.Call, what: str) -> str:
        await gate.wait()
        return what

    @app.workflow(complete_within=timedelta(seconds=20), on_failure="stop")
    async def flow(ctx: sw.Context, _: Any) -> Any:
        if code["gather"]:
            return await ctx.gather(ctx.step(work, "b"), ctx.step(work, "c"))
        return await ctx.step(work, "d")

    try:
        async with running(app, dataclasses.replace(FAST, drain_timeout=0.2)):
            await app.submit_async(flow, None, task_id="t")

            async def recorded() -> bool:
                return bool((await app.show_async("t")).steps)

            await until(recorded)
        code["gather"] = not code["gather"]
        gate.set()
        async with running(app, RESUME):
            with pytest.raises(sw.TaskFailed) as failed:
                await app.result_async("t", timeout=30)
        assert failed.value.state == sw.TaskState.ERROR
        assert "NonDeterminismError" in (failed.value.error or "")
        wanted = (
            "branches of a gather are recorded there"
            if change == "gather_to_step"
            else ("asked for a gather but step")
        )
        assert wanted in (failed.value.error or "")
    finally:
        await app.aclose()
