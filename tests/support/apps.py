"""The test applications: a saga, a family of parent and children, approvals waiting for events, a
shop with local calls; the sealing tests' keyring."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden import sealing
from stepwarden.records import NewStep, Submission


class Family:
    """An App whose workflows start children. `work` records each call; calls of an argument
    in `gates` wait until their gate is set; `meet` waits until `meet_of` calls have started
    (all at once, or not at all)."""

    def __init__(self, store_url: str, *, kid_within: float = 10) -> None:
        self.app = sw.App("family", store=store_url)
        self.calls: Counter[str] = Counter()
        self.undone: Counter[str] = Counter()
        self.gates: dict[str, asyncio.Event] = {}
        self.started: dict[str, asyncio.Event] = {}
        self.met: list[str] = []
        self.meet_of = 3
        self.all_met = asyncio.Event()
        svc = self.app.agent("svc", retry=sw.Retry(max_attempts=2, initial=0.01, maximum=0.02))

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

        @svc.operation
        async def meet(call: sw.Call, who: str) -> str:
            self.met.append(who)
            if len(self.met) >= self.meet_of:
                self.all_met.set()
            await asyncio.wait_for(self.all_met.wait(), 20)  # raises if they ran one by one
            return f"met {who}"

        @self.app.workflow(complete_within=timedelta(seconds=kid_within), max_failures=1)
        async def kid(ctx: sw.Context, items: list[str]) -> list[str]:
            return [await ctx.step(work, item, compensate=undo) for item in items]

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def patient_kid(ctx: sw.Context, spec: dict[str, Any]) -> Any:
            await ctx.step(work, spec["first"], compensate=undo)
            told = await ctx.wait_for_event(spec["event"], timeout=timedelta(seconds=60))
            return {"told": told}

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def meeting(ctx: sw.Context, who: str) -> Any:
            return await ctx.step(meet, who)

        @self.app.workflow(complete_within=timedelta(seconds=20), max_failures=1)
        async def single(ctx: sw.Context, items: list[str]) -> Any:
            first = await ctx.step(work, "p-first", compensate=undo)
            return [first, await ctx.child(kid, items)]

        @self.app.workflow(complete_within=timedelta(seconds=20), max_failures=1)
        async def brood(ctx: sw.Context, spec: dict[str, Any]) -> Any:
            first = await ctx.step(work, "p-first", compensate=undo)
            workflow = spec.get("workflow", "kid")
            kids = await ctx.gather(*(ctx.child(workflow, x) for x in spec["children"]))
            return [first, kids]

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def careful(ctx: sw.Context, items: list[str]) -> Any:
            try:
                return await ctx.child(kid, items)
            except sw.ChildFailed as exc:
                return {"task_id": exc.task_id, "state": exc.state, "error": exc.error}

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def named(ctx: sw.Context, task_id: str) -> Any:
            return await ctx.child(kid, ["n"], task_id=task_id)

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def half_held(ctx: sw.Context, _: Any) -> Any:
            return await ctx.gather(ctx.child(kid, ["slow"]), ctx.step(work, "p-held"))

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def both(ctx: sw.Context, _: Any) -> Any:
            told = ctx.wait_for_event("go", timeout=timedelta(seconds=60))
            spec = {"first": "k-first", "event": "kid-go"}
            return await ctx.gather(told, ctx.child(patient_kid, spec))

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def nap_beside_a_step(ctx: sw.Context, _: Any) -> Any:
            return await ctx.gather(ctx.sleep(timedelta(seconds=0.3)), ctx.step(work, "long"))

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def timer_and_event(ctx: sw.Context, _: Any) -> Any:
            return await ctx.gather(
                ctx.sleep(timedelta(seconds=40)),
                ctx.wait_for_event("x", timeout=timedelta(seconds=90)),
            )

        self.work, self.undo, self.kid = work, undo, kid

    def gate(self, what: str) -> asyncio.Event:
        return self.gates.setdefault(what, asyncio.Event())

    async def started_call(self, what: str) -> None:
        await asyncio.wait_for(self.started.setdefault(what, asyncio.Event()).wait(), 20)


class Saga:
    """reserve (undone by release) -> charge (undone by refund) -> ship (no undo)."""

    def __init__(
        self,
        store_url: str,
        *,
        on_failure: str = "compensate",
        max_failures: int = 2,
        within: float = 5,
        alert_after: int = 3,
    ) -> None:
        self.app = sw.App("saga", store=store_url)
        self.effects: Counter[str] = Counter()
        self.keys: dict[str, list[str | None]] = {}
        self.fail: dict[str, BaseException] = {}
        self.hang: set[str] = set()
        self.release_gate = asyncio.Event()
        self.release_gate.set()
        inventory = self.app.agent("inventory", retry=sw.Retry(max_attempts=2, initial=0.001))
        payments = self.app.agent("payments", retry=sw.Retry(max_attempts=2, initial=0.001))
        shipping = self.app.agent("shipping")

        def effect(name: str, call: sw.Call) -> None:
            if name in self.fail:
                raise self.fail[name]
            self.effects[name] += 1
            self.keys.setdefault(name, []).append(call.compensates_key)

        @inventory.operation
        async def reserve(call: sw.Call, order: dict[str, Any]) -> str:
            effect("reserve", call)
            return "reserved"

        @inventory.operation
        async def release(call: sw.Call, order: dict[str, Any]) -> str:
            await self.release_gate.wait()
            effect("release", call)
            return "released"

        @payments.operation
        async def charge(call: sw.Call, order: dict[str, Any]) -> str:
            if "charge" in self.hang:
                await asyncio.sleep(3600)  # past complete_by: the agent gives up
            effect("charge", call)
            return "charged"

        @payments.operation
        async def refund(call: sw.Call, order: dict[str, Any]) -> str:
            effect("refund", call)
            return "refunded"

        @shipping.operation
        async def ship(call: sw.Call, order: dict[str, Any]) -> str:
            effect("ship", call)
            return "shipped"

        @self.app.workflow(
            complete_within=timedelta(seconds=within),
            max_failures=max_failures,
            on_failure=on_failure,
            alert_after=alert_after,
        )
        async def order(ctx: sw.Context, order: dict[str, Any]) -> str:
            await ctx.step(inventory.reserve, order, compensate=inventory.release)
            await ctx.step(
                payments.charge,
                order,
                compensate=payments.refund,
                complete_within=timedelta(seconds=0.3),
            )
            await ctx.step(shipping.ship, order)
            return "done"

        self.order = order


async def finish(saga: Saga, task_id: str, timeout: float = 20) -> sw.TaskState:
    with pytest.raises(sw.TaskFailed) as failed:
        await saga.app.result_async(task_id, timeout=timeout)
    return sw.TaskState(failed.value.state)


class Shop:
    def __init__(self, store_url: str) -> None:
        self.app = sw.App("local", store=store_url)
        self.calls: Counter[str] = Counter()
        self.release = threading.Event()
        self.started = threading.Event()
        svc = self.app.agent("svc")

        @svc.operation
        async def quick(call: sw.Call, what: str) -> str:
            self.calls[what] += 1
            return f"done {what}"

        @svc.operation
        def slow(call: sw.Call, what: str) -> str:  # a sync call: nothing interrupts it
            self.started.set()
            self.release.wait(20)
            self.calls[what] += 1
            return f"done {what}"

        @self.app.workflow(complete_within=timedelta(seconds=30))
        async def three(ctx: sw.Context, _: Any) -> list[str]:
            return [await ctx.step(quick, w) for w in ("a", "b", "c")]

        @self.app.workflow(complete_within=timedelta(seconds=30))
        async def stalled(ctx: sw.Context, _: Any) -> list[str]:
            first = await ctx.step(slow, "first")
            return [first, await ctx.step(quick, "second")]

        self.three, self.stalled = three, stalled


def app_task(task_id: str) -> Submission:
    return Submission(
        task_id=task_id,
        workflow="wf",
        input="null",
        priority=0,
        complete_within=30,
        max_failures=3,
    )


def new_step(task_id: str, attempt: int, seq: int, claimed_by: str | None = None) -> NewStep:
    return NewStep(
        task_id=task_id,
        task_attempt=attempt,
        scheduler="s1",
        seq=seq,
        name="svc.quick",
        agent="svc",
        operation="quick",
        input='["x"]',
        priority=0,
        complete_within=30,
        position=str(seq),
        claimed_by=claimed_by,
    )


def keyring(*seal_ids: str, digest: str | None = None, keys: dict[str, str]) -> sw.Keyring:
    """A keyring of these seal keys (the last seals), and a digest key, from `keys`: the
    key text by id, made when missing (the same id has the same key across calls)."""
    for key_id in (*seal_ids, "d1"):
        keys.setdefault(key_id, sealing.new_key())
    lines = [f"digest d1 {digest or keys['d1']}", *(f"seal {k} {keys[k]}" for k in seal_ids)]
    return sw.Keyring.parse("\n".join(lines))


class Approvals:
    """reserve -> (sleep | wait for "approved") -> ship; each effect counted."""

    def __init__(self, store_url: str) -> None:
        self.app = sw.App("waits", store=store_url)
        self.effects: Counter[str] = Counter()
        desk = self.app.agent("desk")

        @desk.operation
        async def reserve(call: sw.Call, order: Any) -> str:
            self.effects["reserve"] += 1
            return "reserved"

        @desk.operation
        async def ship(call: sw.Call, order: Any) -> str:
            self.effects["ship"] += 1
            return "shipped"

        @desk.operation
        async def release(call: sw.Call, order: Any) -> str:
            self.effects["release"] += 1
            return "released"

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def nap(ctx: sw.Context, seconds: float) -> Any:
            await ctx.step(desk.reserve, seconds, compensate=desk.release)
            await ctx.sleep(timedelta(seconds=seconds))
            return await ctx.step(desk.ship, seconds)

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def until(ctx: sw.Context, when: str) -> Any:
            await ctx.sleep_until(datetime.fromisoformat(when))
            return await ctx.step(desk.ship, when)

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def approval(ctx: sw.Context, timeout: float) -> Any:
            await ctx.step(desk.reserve, timeout, compensate=desk.release)
            try:
                decision = await ctx.wait_for_event("approved", timeout=timedelta(seconds=timeout))
            except sw.EventTimeout:
                return {"timed_out": True}
            await ctx.step(desk.ship, decision)
            return {"approved": decision}

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def twice(ctx: sw.Context, _: Any) -> Any:
            first = await ctx.wait_for_event("vote", timeout=timedelta(seconds=60))
            second = await ctx.wait_for_event("vote", timeout=timedelta(seconds=60))
            return [first, second]

        @self.app.workflow(complete_within=timedelta(seconds=20))
        async def plain(ctx: sw.Context, value: Any) -> Any:
            return await ctx.step(desk.ship, value)
