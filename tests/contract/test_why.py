"""Why a task waits, on each store: each `WaitReason` is met by putting a task in that state
through the engine (a worker of the roles it needs, the App's actions, the registries' own
beats), and `App.why` answers the reason with its facts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from datetime import datetime, timedelta
from typing import Any

import stepwarden as sw
from stepwarden.records import AgentBeat, SchedulerBeat
from stepwarden.store import open_one

from ..support.store import whole_store
from ..support.why import ROLES, until
from ..support.worker import FAST, running

R = sw.WaitReason
WITHIN = timedelta(seconds=60)


class Desk:
    """An App whose agent `desk` holds its calls of `hold` until `release` is set, runs
    `single` one at a time and `rated` once a minute, and fails `boom`; a workflow per
    state to reach."""

    def __init__(self, store_url: str) -> None:
        self.app = sw.App("why", store=store_url)
        self.release = asyncio.Event()
        self.calls: list[str] = []
        desk = self.app.agent("desk")
        self.desk = desk

        @desk.operation
        async def hold(call: sw.Call, n: int) -> int:
            self.calls.append(call.idempotency_key)
            await self.release.wait()
            return n

        @desk.operation(limit=sw.Limit(concurrency=1))
        async def single(call: sw.Call, n: int) -> int:
            self.calls.append(call.idempotency_key)
            await self.release.wait()
            return n

        @desk.operation(limit=sw.Limit(rate=1, per=600))
        async def rated(call: sw.Call, n: int) -> int:
            return n

        @desk.operation
        async def boom(call: sw.Call, n: int) -> int:
            raise sw.PermanentError("the desk is closed")

        @self.app.workflow(complete_within=WITHIN)
        async def holding(ctx: sw.Context, n: int) -> int:
            return await ctx.step(desk.hold, n)

        @self.app.workflow(complete_within=WITHIN)
        async def one_by_one(ctx: sw.Context, n: int) -> int:
            return await ctx.step(desk.single, n)

        @self.app.workflow(complete_within=WITHIN)
        async def rationed(ctx: sw.Context, n: int) -> int:
            return await ctx.step(desk.rated, n)

        @self.app.workflow(complete_within=WITHIN, on_failure="stop")
        async def failing(ctx: sw.Context, n: int) -> int:
            return await ctx.step(desk.boom, n)

        @self.app.workflow(complete_within=WITHIN)
        async def sleeping(ctx: sw.Context, n: int) -> int:
            await ctx.sleep(timedelta(minutes=10))
            return n

        @self.app.workflow(complete_within=WITHIN)
        async def approving(ctx: sw.Context, n: int) -> Any:
            return await ctx.wait_for_event("approval", timeout=timedelta(minutes=10))

        @self.app.workflow(complete_within=WITHIN)
        async def parent(ctx: sw.Context, n: int) -> Any:
            return await ctx.child("approving", n, task_id=f"child-of-{ctx.task_id}")

        @self.app.workflow(complete_within=WITHIN)
        async def quick(ctx: sw.Context, n: int) -> int:
            return n

    async def why(self, task_id: str) -> sw.Why:
        return await self.app.why_async(task_id)

    async def reason(self, task_id: str, reason: sw.WaitReason) -> sw.Why | None:
        why = await self.why(task_id)
        return why if why.gate.reason == reason else None

    async def step_reason(self, task_id: str, reason: sw.WaitReason) -> sw.StepWhy | None:
        why = await self.why(task_id)
        return next((s for s in why.steps if s.gate.reason == reason), None)


@contextlib.asynccontextmanager
async def desk(store_url: str) -> AsyncIterator[Desk]:
    d = Desk(store_url)
    try:
        yield d
    finally:
        d.release.set()
        await d.app.aclose()


async def beat_agent(store_url: str, instance: str, **beat: Any) -> None:
    """An instance of agent `desk` in the registry, beating as a runner does."""
    store = open_one(store_url)
    await store.open(migrate=False)
    try:
        fields: dict[str, Any] = {
            "instance": instance,
            "agent": "desk",
            "operations": ("hold", "single", "rated", "boom"),
            "capacity": 4,
            "inflight": 0,
            "breaker": "closed",
            "breaker_detail": {},
        }
        await store.beat([AgentBeat(**{**fields, **beat})], ttl=60)
    finally:
        await store.close()


async def beat_scheduler(
    store_url: str, instance: str, versions: tuple[tuple[str, int], ...]
) -> None:
    store = open_one(store_url)
    await store.open(migrate=False)
    try:
        beat = SchedulerBeat(
            instance=instance,
            workflows=tuple(w for w, _ in versions),
            capacity=10,
            held=0,
            versions=versions,
        )
        await store.beat_schedulers([beat], ttl=60)
    finally:
        await store.close()


def close_to(when: datetime | None, expected: datetime, slack: float = 5.0) -> bool:
    return when is not None and abs((when - expected).total_seconds()) < slack


async def test_a_finished_task_is_held_by_nothing(store_url: str) -> None:
    async with desk(store_url) as d, running(d.app):
        await d.app.submit_async("quick", 1, task_id="done")
        assert await d.app.result_async("done", timeout=30) == 1
    why = await d.why("done")
    assert why.gate.reason == R.FINISHED and why.gate.state == sw.TaskState.PROCESSED
    assert why.steps == ()


async def test_a_task_no_scheduler_runs_waits_since_the_last_one_left(store_url: str) -> None:
    async with desk(store_url) as d:
        await d.app.submit_async("quick", 1, task_id="alone")
        why = await d.why("alone")
        assert why.gate.reason == R.NO_SCHEDULER
        assert (why.gate.workflow, why.gate.version, why.gate.since) == ("quick", 1, None)
        # A scheduler of another version is no help.
        await beat_scheduler(store_url, "old", (("quick", 2),))
        assert (await d.why("alone")).gate.reason == R.NO_SCHEDULER


async def test_a_pending_task_is_ranked_behind_those_before_it(store_url: str) -> None:
    async with desk(store_url) as d:
        for n in range(3):
            await d.app.submit_async("quick", n, task_id=f"q{n}")
        await beat_scheduler(store_url, "sched-1", (("quick", 1),))
        first, last = await d.why("q0"), await d.why("q2")
    assert first.gate.reason == last.gate.reason == R.RANKED
    assert first.gate.schedulers == ("sched-1",)
    assert (first.gate.ahead, first.gate.rank) == (0, 1)
    assert (last.gate.ahead, last.gate.rank) == (2, 3)
    # Of no tenant, alone: every claim is theirs.
    assert (last.gate.tenant, last.gate.tenant_ahead, last.gate.share) == ("", 2, 1.0)


async def test_a_ranked_task_says_its_rank_in_its_tenant_and_its_tenant_s_share(
    store_url: str,
) -> None:
    """acme (weight 3) and globex (weight 1, unset) wait with tasks of one workflow: acme's
    share of the claims is 3/4, globex's 1/4; each task's own tenant's tasks ahead of it are
    counted apart from every task ahead."""
    async with desk(store_url) as d:
        for n, tenant in enumerate(("acme", "globex", "acme", "globex", "acme")):
            await d.app.submit_async("quick", n, task_id=f"t{n}", tenant=tenant)
        await beat_scheduler(store_url, "sched-1", (("quick", 1),))
        async with whole_store(store_url) as store:
            await store.set_tenant_weight("acme", 3)
        whys = {f"t{n}": (await d.why(f"t{n}")).gate for n in range(5)}
        # A task of no tenant: its own share (weight 1) beside acme's and globex's.
        await d.app.submit_async("quick", 9, task_id="mine")
        mine = (await d.why("mine")).gate
    assert all(g.reason == R.RANKED for g in whys.values())
    assert [(g.tenant, g.ahead, g.tenant_ahead, g.share) for g in whys.values()] == [
        ("acme", 0, 0, 0.75),
        ("globex", 1, 0, 0.25),
        ("acme", 2, 1, 0.75),
        ("globex", 3, 1, 0.25),
        ("acme", 4, 2, 0.75),
    ]
    assert (mine.tenant, mine.ahead, mine.tenant_ahead, mine.share) == ("", 5, 0, 0.2)


async def test_a_delayed_start_a_timer_and_an_event_say_until_when(store_url: str) -> None:
    async with desk(store_url) as d, running(d.app):
        await d.app.submit_async("quick", 1, task_id="later", start_after=timedelta(minutes=5))
        await d.app.submit_async("sleeping", 1, task_id="nap")
        await d.app.submit_async("approving", 1, task_id="ask")
        start = await until("a delayed start", lambda: d.reason("later", R.START))
        nap = await until("a timer", lambda: d.reason("nap", R.TIMER))
        ask = await until("an event", lambda: d.reason("ask", R.EVENT))
    now = datetime.now().astimezone()
    assert close_to(start.gate.until, now + timedelta(minutes=5))
    assert close_to(nap.gate.until, now + timedelta(minutes=10))
    assert [w.kind for w in nap.gate.waits] == ["timer"]
    assert ask.gate.event == "approval"
    assert close_to(ask.gate.until, now + timedelta(minutes=10))


async def test_a_parent_waits_for_its_children_in_their_state(store_url: str) -> None:
    async with desk(store_url) as d, running(d.app):
        await d.app.submit_async("parent", 1, task_id="p")
        why = await until("the parent to wait", lambda: d.reason("p", R.CHILDREN))
        await until("the child to wait", lambda: d.reason("child-of-p", R.EVENT))
        why = await d.why("p")
    assert why.gate.reason == R.CHILDREN
    assert [(c.task_id, c.state) for c in why.gate.children] == [
        ("child-of-p", sw.TaskState.WAITING)
    ]


async def test_a_paused_task_names_who_paused_it(store_url: str) -> None:
    async with desk(store_url) as d:
        await d.app.submit_async("quick", 1, task_id="stop")
        [outcome] = await d.app.operate_async("pause", ["stop"], by="ann", reason="a look")
        assert outcome.applied
        why = await d.why("stop")
    assert why.gate.reason == R.PAUSED
    assert (why.gate.by, why.gate.note) == ("ann", "a look")
    assert why.gate.since is not None


async def test_a_task_in_error_waits_for_an_operator(store_url: str) -> None:
    async with desk(store_url) as d, running(d.app):
        await d.app.submit_async("failing", 1, task_id="broke")
        why = await until("the task in error", lambda: d.reason("broke", R.SET_ASIDE))
    assert why.gate.state == sw.TaskState.ERROR
    assert why.gate.error is not None and "the desk is closed" in why.gate.error
    assert why.gate.alert == "task_error"


async def test_a_task_released_after_its_complete_by_waits_for_its_backoff(
    store_url: str,
) -> None:
    """A scheduler claims the task and goes silent; the supervisor releases it after its
    complete_by passed, to be eligible after the backoff."""
    async with desk(store_url) as d:
        d.app.workflow(d.app.workflows["quick"].fn, name="brief", complete_within=0.2)
        await d.app.submit_async("brief", 1, task_id="brief")
        store = open_one(store_url)
        await store.open(migrate=False)
        try:
            [claimed] = await store.claim_tasks("silent", [("brief", 1)], 1)
        finally:
            await store.close()
        assert claimed.task.task_id == "brief"
        held = await d.why("brief")
        assert held.gate.reason == R.HELD and held.gate.holder == "silent"
        assert held.gate.holder_alive is False  # it never beat
        options = dataclasses.replace(
            FAST, roles=frozenset({"supervisor"}), backoff=sw.Backoff(initial=300, maximum=300)
        )
        async with running(d.app, options):
            why = await until("the backoff", lambda: d.reason("brief", R.BACKOFF))
    assert close_to(why.gate.until, datetime.now().astimezone() + timedelta(seconds=300), 30)


async def test_a_step_with_no_agent_alive_and_its_task_held(store_url: str) -> None:
    async with desk(store_url) as d, running(d.app, ROLES["no_agents"]) as worker:
        await d.app.submit_async("holding", 1, task_id="h")
        step = await until("the queued step", lambda: d.step_reason("h", R.NO_AGENT))
        why = await d.why("h")
    assert (step.gate.agent, step.gate.operation, step.gate.since) == ("desk", "hold", None)
    assert step.state == sw.StepState.NOT_STARTED
    assert why.gate.reason == R.HELD and why.gate.holder_alive
    assert why.gate.holder is not None and worker.instance in why.gate.holder
    assert why.gate.beat_age is not None and why.gate.beat_age < 30
    assert why.gate.until is not None


async def test_a_queued_step_behind_open_breakers_full_slots_or_in_line(store_url: str) -> None:
    async with desk(store_url) as d, running(d.app, ROLES["no_agents"]):
        await d.app.submit_async("holding", 1, task_id="h")
        await until("the queued step", lambda: d.step_reason("h", R.NO_AGENT))
        await beat_agent(
            store_url, "tripped", breaker="open", breaker_detail={"half_open_in": 30.0}
        )
        step = await d.step_reason("h", R.BREAKER_OPEN)
        assert step is not None and step.gate.instances == ("tripped",)
        assert close_to(step.gate.until, datetime.now().astimezone() + timedelta(seconds=30))
        await beat_agent(store_url, "busy", capacity=2, inflight=2)
        step = await d.step_reason("h", R.NO_CAPACITY)
        assert step is not None and step.gate.instances == ("busy",)
        await beat_agent(store_url, "idle", capacity=2, inflight=0)
        step = await d.step_reason("h", R.QUEUED)
        assert step is not None and set(step.gate.instances) == {"busy", "idle"}
        assert (step.gate.ahead, step.gate.rank) == (0, 1)


async def test_a_running_step_is_held_by_its_instance(store_url: str) -> None:
    async with desk(store_url) as d, running(d.app) as worker:
        await d.app.submit_async("holding", 1, task_id="h")
        step = await until("the running step", lambda: d.step_reason("h", R.HELD))
        await until("the call", lambda: asyncio.sleep(0, d.calls))
    assert step.state == sw.StepState.RUNNING
    assert step.gate.holder is not None and worker.instance in step.gate.holder
    assert step.gate.holder_alive and step.gate.beat_age is not None
    assert step.gate.until is not None


async def test_a_step_waits_for_its_operation_s_concurrency(store_url: str) -> None:
    async with desk(store_url) as d, running(d.app):
        await d.app.submit_async("one_by_one", 1, task_id="first")
        await until("the first call", lambda: asyncio.sleep(0, d.calls))
        await d.app.submit_async("one_by_one", 2, task_id="second")
        step = await until("the limit", lambda: d.step_reason("second", R.CONCURRENCY_FULL))
    assert (step.gate.limit, step.gate.in_use, step.gate.held_by) == (1, 1, ("first",))


async def test_a_step_waits_for_its_operation_s_rate(store_url: str) -> None:
    async with desk(store_url) as d, running(d.app):
        await d.app.submit_async("rationed", 1, task_id="first")
        assert await d.app.result_async("first", timeout=30) == 1
        await d.app.submit_async("rationed", 2, task_id="second")
        step = await until("the rate", lambda: d.step_reason("second", R.RATE_FULL))
    assert (step.gate.limit, step.gate.per, step.gate.in_use) == (1, 600.0, 1)
    assert close_to(step.gate.until, datetime.now().astimezone() + timedelta(seconds=600), 30)


async def stuck_alerts(app: sw.App, task_id: str) -> list[str]:
    store = await app.store()
    found = await store.events(task_id=task_id, kind="alert")
    return [e.detail["wait_reason"] for e in found if e.detail["reason"] == "task_stuck"]


async def test_a_task_unmoved_past_its_workflow_s_threshold_alerts_once_per_reason(
    store_url: str,
) -> None:
    """`stuck_after` of its workflow: a task that does not move for that long raises one
    task_stuck alert with what holds it, once per reason; a workflow without it raises
    none."""
    async with desk(store_url) as d:
        d.app.workflow(d.app.workflows["quick"].fn, name="watched", stuck_after=0.3)
        await d.app.submit_async("watched", 1, task_id="w1")
        await d.app.submit_async("quick", 1, task_id="unwatched")
        supervisor = dataclasses.replace(FAST, roles=frozenset({"supervisor"}))
        async with running(d.app, supervisor):
            assert await until("w1's alert", lambda: stuck_alerts(d.app, "w1")) == ["no_scheduler"]
            # A later look (w2's alert) raises none again for w1, still held by the same.
            await d.app.submit_async("watched", 2, task_id="w2")
            await until("w2's alert", lambda: stuck_alerts(d.app, "w2"))
            assert await stuck_alerts(d.app, "w1") == ["no_scheduler"]
            # Held by another reason once it stays unmoved again: one more.
            await d.app.operate_async("pause", ["w1"], by="ann")
            reasons = await until(
                "w1's second alert",
                lambda: _at_least(stuck_alerts(d.app, "w1"), 2),
            )
            assert reasons == ["no_scheduler", "paused"]
        assert await stuck_alerts(d.app, "unwatched") == []
        store = await d.app.store()
        [alert] = [
            m
            for m in await store.outbox(channel="alerts", task_id="w2")
            if m.detail["reason"] == "task_stuck"
        ]
        assert alert.detail["wait_reason"] == "no_scheduler"
        assert "has not moved for 0.3s" in alert.detail["error"]


async def _at_least(found: Awaitable[list[str]], n: int) -> list[str] | None:
    got = await found
    return got if len(got) >= n else None
