"""Workflow versions on each store: a task records the version it was submitted with (the
newest the submitting App declares, or the one it names), a scheduler claims only the tasks of
the (workflow, version)s its code declares, and a task runs its whole life on its version:
across a deploy, a replay after a wait, and its compensation."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import pytest

import stepwarden as sw
from stepwarden.scheduler import VERSIONS_EVERY
from stepwarden.supervisor import Supervisor
from tests.rawsql import is_sqlite, sql
from tests.stores import app_store

from ..support.worker import running

T = TypeVar("T")
WAITING = sw.TaskState.WAITING
PENDING = sw.TaskState.PENDING


class Deploy:
    """One deploy of the shop's code: the versions of workflow `order` it declares.

    Version 1: reserve (undone by release), [wait for "go"], ship.
    Version 2 takes another path: reserve, check, [wait for "go"], ship.
    Each version names its steps after itself ("v1 reserve", "v2 check", ...), so that the
    steps a task recorded say which version ran it; `ran` notes (task, version) each time one
    of this deploy's functions runs a task. An order {"fail": true} fails to ship (permanent).
    """

    def __init__(self, store_url: str, versions: Sequence[int]) -> None:
        self.app = sw.App("shop", store=store_url)
        self.ran: list[tuple[str, int]] = []
        shop = self.app.agent("shop")

        @shop.operation
        async def reserve(call: sw.Call, order: dict[str, Any]) -> str:
            return "reserved"

        @shop.operation
        async def release(call: sw.Call, order: dict[str, Any]) -> str:
            return "released"

        @shop.operation
        async def check(call: sw.Call, order: dict[str, Any]) -> str:
            return "checked"

        @shop.operation
        async def ship(call: sw.Call, order: dict[str, Any]) -> str:
            if order.get("fail"):
                raise sw.PermanentError("undeliverable")
            return "shipped"

        async def wait(ctx: sw.Context, order: dict[str, Any]) -> None:
            if order.get("wait"):
                await ctx.wait_for_event("go", timeout=timedelta(minutes=5))

        async def order_v1(ctx: sw.Context, order: dict[str, Any]) -> str:
            self.ran.append((ctx.task_id, 1))
            await ctx.step(shop.reserve, order, name="v1 reserve", compensate=shop.release)
            await wait(ctx, order)
            return str(await ctx.step(shop.ship, order, name="v1 ship"))

        async def order_v2(ctx: sw.Context, order: dict[str, Any]) -> str:
            self.ran.append((ctx.task_id, 2))
            await ctx.step(shop.reserve, order, name="v2 reserve", compensate=shop.release)
            await ctx.step(shop.check, order, name="v2 check")
            await wait(ctx, order)
            return str(await ctx.step(shop.ship, order, name="v2 ship"))

        functions = {1: order_v1, 2: order_v2}
        for version in versions:
            self.app.workflow(
                functions[version],
                name="order",
                version=version,
                complete_within=timedelta(seconds=20),
            )

    async def steps(self, task_id: str) -> list[tuple[str, sw.StepState]]:
        return [(s.name, s.state) for s in (await self.app.show_async(task_id)).steps]


async def until(what: str, check: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
    """`check()`'s value once it is true; fails after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def test_versions_are_declared_beside_each_other_and_bad_ones_refused(sqlite_url: str) -> None:
    deploy = Deploy(sqlite_url, [1, 2])
    app = deploy.app
    assert sorted(app.workflow_versions) == [("order", 1), ("order", 2)]
    assert app.workflows["order"].version == 2  # what a submit runs by default

    async def another(ctx: sw.Context, order: Any) -> None: ...

    with pytest.raises(sw.ConfigurationError, match="'order' version 2 is already declared"):
        app.workflow(another, name="order", version=2)
    with pytest.raises(sw.ConfigurationError, match="'order' version 1 is already declared"):
        app.workflow(another, name="order")  # no version: version 1
    for bad in (0, -1, True, "3", 3.0, None):
        with pytest.raises(sw.ConfigurationError, match="version must be an integer from 1"):
            app.workflow(another, name="order", version=bad)  # type: ignore[arg-type]
    assert sorted(app.workflow_versions) == [("order", 1), ("order", 2)]


async def test_a_submit_records_the_newest_version_or_the_one_it_names(store_url: str) -> None:
    both, old = Deploy(store_url, [1, 2]), Deploy(store_url, [1])
    app = both.app
    try:
        assert (
            await app.status_async(await app.submit_async("order", {}, task_id="n"))
        ).version == 2
        await app.submit_async("order", {}, task_id="one", version=1)
        await old.app.submit_async("order", {}, task_id="old")  # its newest is 1
        async with app.transaction() as tx:
            await tx.submit("order", {}, task_id="tx-1", version=1)
            await tx.submit("order", {}, task_id="tx-2")
        await app.submit_many_async(
            [
                app.new_task("order", {}, task_id="many-1", version=1),
                app.new_task("order", {}, task_id="many-2"),
            ]
        )
        listed = {t.task_id: t.version for t in await app.tasks_async()}
        assert listed == {
            "n": 2,
            "one": 1,
            "old": 1,
            "tx-1": 1,
            "tx-2": 2,
            "many-1": 1,
            "many-2": 2,
        }

        # A version the submitting App does not declare, or not a version: a clear error, and
        # nothing written.
        with pytest.raises(sw.UnknownNameError, match=r"'order' has no version 3 .*declared: 1, 2"):
            await app.submit_async("order", {}, task_id="x", version=3)
        with pytest.raises(sw.UnknownNameError, match=r"no version 2 .*declared: 1\)"):
            await old.app.submit_async("order", {}, task_id="x", version=2)
        for bad in (0, -2, True, "1", 1.0):
            with pytest.raises(sw.ConfigurationError, match="version must be an integer from 1"):
                await app.submit_async("order", {}, task_id="x", version=bad)  # type: ignore[arg-type]
        with pytest.raises(sw.UnknownNameError):
            async with app.transaction() as tx:
                await tx.submit("order", {}, task_id="x", version=9)
        assert len(await app.tasks_async()) == len(listed)

        # Listing by version, alone or with a state and a workflow.
        ones = await app.tasks_async(workflow="order", version=1)
        assert [t.task_id for t in ones] == ["one", "old", "tx-1", "many-1"]
        twos = await app.tasks_async(state="pending", version=2)
        assert [t.task_id for t in twos] == ["n", "tx-2", "many-2"]
        assert await app.tasks_async(workflow="order", version=7) == []
        with pytest.raises(sw.ConfigurationError, match="version must be an integer from 1"):
            await app.tasks_async(version=0)
    finally:
        await both.app.aclose()
        await old.app.aclose()


async def test_a_scheduler_claims_only_the_versions_it_has(store_url: str) -> None:
    deploy = Deploy(store_url, [1, 2])
    app = deploy.app
    try:
        for task_id, version in [("a1", 1), ("a2", 1), ("b1", 2), ("b2", 2)]:
            await app.submit_async("order", {}, task_id=task_id, version=version)
        store = await app_store(app)
        claimed = await store.claim_tasks("only-v2", [("order", 2)], 10)
        assert sorted((c.task.task_id, c.task.version) for c in claimed) == [("b1", 2), ("b2", 2)]
        assert await store.claim_tasks("only-v2", [("order", 2)], 10) == []
        assert await store.claim_tasks("other", [("other", 1), ("order", 3)], 10) == []
        for task_id in ("a1", "a2"):
            task = await app.status_async(task_id)
            assert (task.process_state, task.attempt, task.locked_by) == (PENDING, 0, None)

        # Compensation is claimed the same way: a compensating version-1 task (held by no
        # scheduler) is not claimed by a scheduler that has version 2 only.
        assert await app.cancel_async("a1", compensate=True) == sw.TaskState.COMPENSATING
        assert await store.claim_tasks("only-v2", [("order", 2)], 10) == []
        claimed = await store.claim_tasks("has-v1", [("order", 1), ("order", 2)], 10)
        got = {c.task.task_id: (c.task.process_state, c.task.version) for c in claimed}
        assert got == {"a1": (sw.TaskState.COMPENSATING, 1), "a2": (sw.TaskState.PROCESSING, 1)}

        # A workflow named alone is its version 1.
        await app.submit_async("order", {}, task_id="a3", version=1)
        await app.submit_async("order", {}, task_id="b3", version=2)
        [bare] = await store.claim_tasks("bare", ["order"], 10)
        assert bare.task.task_id == "a3"
    finally:
        await app.aclose()


async def test_a_task_runs_its_whole_life_on_its_version(store_url: str) -> None:
    """Orders submitted under version 1 wait for an event; the code is deployed again, first
    with version 2 only (it leaves them pending, and runs its own), then with both: each old
    order resumes by replay on version 1 to its end, compensation included, while new orders
    run version 2."""
    v1, v2, both = Deploy(store_url, [1]), Deploy(store_url, [2]), Deploy(store_url, [1, 2])
    try:
        async with running(v1.app):
            await v1.app.submit_async("order", {"wait": True}, task_id="old-ok")
            await v1.app.submit_async("order", {"wait": True, "fail": True}, task_id="old-bad")

            async def both_waiting() -> bool:
                states = [
                    (await v1.app.status_async(t)).process_state for t in ("old-ok", "old-bad")
                ]
                return states == [WAITING, WAITING]

            await until("the old orders waiting", both_waiting)

        async with running(v2.app):
            for task_id in ("old-ok", "old-bad"):
                assert (await v2.app.send_event_async(task_id, "go", event_id="go")).woke
            await v2.app.submit_async("order", {}, task_id="new-1")
            assert await v2.app.result_async("new-1", timeout=30) == "shipped"
            for task_id in ("old-ok", "old-bad"):  # older than new-1, yet left to version 1
                task = await v2.app.status_async(task_id)
                assert (task.process_state, task.version, task.attempt) == (PENDING, 1, 1)
        assert [t for t, _ in v2.ran] == ["new-1"]

        async with running(both.app):
            await both.app.submit_async("order", {}, task_id="new-2")
            assert await both.app.result_async("old-ok", timeout=30) == "shipped"
            assert await both.app.result_async("new-2", timeout=30) == "shipped"
            with pytest.raises(sw.TaskFailed) as failed:
                await both.app.result_async("old-bad", timeout=30)
            assert failed.value.state == "compensated"

        completed, failed_ = sw.StepState.COMPLETED, sw.StepState.FAILED
        assert await both.steps("old-ok") == [("v1 reserve", completed), ("v1 ship", completed)]
        assert await both.steps("old-bad") == [
            ("v1 reserve", completed),
            ("v1 ship", failed_),
            ("compensate v1 reserve", completed),
        ]
        for new in ("new-1", "new-2"):
            assert await both.steps(new) == [
                ("v2 reserve", completed),
                ("v2 check", completed),
                ("v2 ship", completed),
            ]
        versions = {t.task_id: t.version for t in await both.app.tasks_async()}
        assert versions == {"old-ok": 1, "old-bad": 1, "new-1": 2, "new-2": 2}
        # Each old order ran on version 1 both before and after the deploy; never on 2.
        assert sorted(set(v1.ran)) == [("old-bad", 1), ("old-ok", 1)]
        assert ("old-ok", 1) in both.ran and ("old-bad", 1) in both.ran
        assert {v for t, v in both.ran if t.startswith("old")} == {1}
        assert [(t, v) for t, v in both.ran if t.startswith("new")] == [("new-2", 2)]
    finally:
        for deploy in (v1, v2, both):
            await deploy.app.aclose()


async def test_a_scheduler_registers_its_versions_and_warns_of_those_it_lacks(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = Deploy(store_url, [1]), Deploy(store_url, [2])
    try:
        for i in range(3):
            await old.app.submit_async("order", {}, task_id=f"old-{i}")
        started = asyncio.get_running_loop().time()
        with caplog.at_level(logging.WARNING, logger="stepwarden.scheduler"):
            async with running(new.app):

                async def warned() -> list[str]:
                    return [
                        r.getMessage()
                        for r in caplog.records
                        if r.name == "stepwarden.scheduler"
                        and "wait for a scheduler" in r.getMessage()
                    ]

                [message] = await until("the warning", warned)
                alive = [s for s in await new.app.scheduler_instances_async() if s.alive]
                assert [(s.workflows, s.versions) for s in alive] == [(("order",), (("order", 2),))]
                await new.app.submit_async("order", {}, task_id="new-1")
                assert await new.app.result_async("new-1", timeout=30) == "shipped"
        assert "3 task(s) of workflow 'order' version 1" in message, message
        assert "runs version 2 of it" in message, message
        # Said at start, then once a minute at most.
        elapsed = asyncio.get_running_loop().time() - started
        assert len(await warned()) <= 1 + elapsed // VERSIONS_EVERY
        for i in range(3):
            task = await old.app.status_async(f"old-{i}")
            assert (task.process_state, task.attempt) == (PENDING, 0)
    finally:
        await old.app.aclose()
        await new.app.aclose()


async def test_a_schedule_s_tasks_run_the_newest_version(store_url: str) -> None:
    deploy = Deploy(store_url, [1])
    app = deploy.app
    app.schedule("nightly", "order", every=timedelta(hours=1), input={}, catch_up="latest")
    assert app.schedule_specs["nightly"].version == 1

    async def order_v3(ctx: sw.Context, order: Any) -> str:
        return "v3"

    # Declared after the schedule: its ticks run the newest version all the same.
    app.workflow(order_v3, name="order", version=3, complete_within=timedelta(seconds=7))
    spec = app.schedule_specs["nightly"]
    assert (spec.version, spec.complete_within) == (3, 7.0)
    store = await app_store(app)
    try:
        leader = Supervisor(store, instance="sup", lease_ttl=30, schedules=[spec])
        await leader.tick()
        past = "next_at - 7200" if is_sqlite(store_url) else "next_at - interval '2 hours'"
        sql(store_url, f"UPDATE stepwarden_schedules SET next_at = {past}")
        await leader.tick()
        [stored] = await app.schedules_async()
        assert stored.version == 3
        ticked = [t for t in await app.tasks_async() if t.task_id.startswith("nightly@")]
        assert ticked and {t.version for t in ticked} == {3}
        triggered = await app.trigger_schedule_async("nightly")
        assert (await app.status_async(triggered)).version == 3
    finally:
        await app.aclose()
