"""Tenants on each store: a task records who it belongs to (none unless its submit names
one), a child has its parent's, a schedule's tasks have the schedule's; the operator lists
and purges one tenant's tasks."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden.supervisor import Supervisor
from tests.rawsql import is_sqlite, sql
from tests.stores import app_store

from ..support.worker import running


def _app(store_url: str) -> sw.App:
    app = sw.App("tenants", store=store_url)
    desk = app.agent("desk")

    @desk.operation
    async def stamp(call: sw.Call, value: Any) -> Any:
        return value

    @app.workflow(complete_within=timedelta(seconds=20))
    async def leaf(ctx: sw.Context, value: Any) -> Any:
        return await ctx.step(desk.stamp, value)

    @app.workflow(complete_within=timedelta(seconds=20))
    async def parent(ctx: sw.Context, value: Any) -> Any:
        return await ctx.child("leaf", value, task_id=f"{ctx.task_id}-kid")

    return app


async def test_a_task_records_its_tenant_and_its_child_inherits_it(store_url: str) -> None:
    app = _app(store_url)
    try:
        mine = await app.submit_async("parent", 1, task_id="p-acme", tenant="acme")
        plain = await app.submit_async("leaf", 2, task_id="p-none")
        async with running(app):
            assert await app.result_async(mine, timeout=20) == 1
            assert await app.result_async(plain, timeout=20) == 2
        kid = await app.status_async("p-acme-kid")
        assert (kid.parent_id, kid.tenant) == ("p-acme", "acme")
        assert (await app.status_async(mine)).tenant == "acme"
        assert (await app.status_async(plain)).tenant is None
        assert (await app.task_status_async(mine)).tenant == "acme"
        # The operator's list: one tenant's, those of none (""), or every one.
        acme = await app.tasks_async(tenant="acme")
        assert sorted(t.task_id for t in acme) == ["p-acme", "p-acme-kid"]
        assert [t.task_id for t in await app.tasks_async(tenant="")] == ["p-none"]
        assert len(await app.tasks_async()) == 3
        with pytest.raises(sw.ConfigurationError, match="tenant must be"):
            app.new_task("leaf", 1, tenant="no spaces")
        # A re-submit under another tenant is no longer the same submit.
        again = app.new_task("leaf", 2, task_id="p-none", tenant="acme")
        [answer] = await (await app.store()).submit([again])
        assert (answer.outcome, answer.differs) == ("conflict", ("tenant",))
    finally:
        await app.aclose()


async def test_purge_of_one_tenant_keeps_the_others(store_url: str) -> None:
    app = _app(store_url)
    try:
        ids = [
            await app.submit_async("leaf", n, task_id=f"t-{tenant or 'none'}", tenant=tenant)
            for n, tenant in enumerate(["acme", "globex", None])
        ]
        async with running(app):
            for task_id in ids:
                await app.result_async(task_id, timeout=20)
        store = await app_store(app)
        assert await store.purge(0, 100, "acme") == 1
        left = sorted(t.task_id for t in await app.tasks_async())
        assert left == ["t-globex", "t-none"]
        assert await store.purge(0, 100, "") == 1
        assert [t.task_id for t in await app.tasks_async()] == ["t-globex"]
        assert await store.purge(0, 100) == 1
    finally:
        await app.aclose()


async def test_a_schedule_s_tasks_have_its_tenant(store_url: str) -> None:
    app = _app(store_url)
    app.schedule(
        "tick", "leaf", every=timedelta(hours=1), input="hi", tenant="acme", catch_up="latest"
    )
    try:
        store = await app_store(app)
        leader = Supervisor(
            store, instance="sup", lease_ttl=30, schedules=list(app.schedule_specs.values())
        )
        await leader.tick()  # stores the schedule, its first tick an hour away
        [stored] = await app.schedules_async()
        assert stored.tenant == "acme"
        past = "next_at - 7200" if is_sqlite(store_url) else "next_at - interval '2 hours'"
        sql(store_url, f"UPDATE stepwarden_schedules SET next_at = {past}")
        async with asyncio.timeout(20):
            while not (made := [t for t in await app.tasks_async() if t.task_id[:5] == "tick@"]):
                await leader.tick()
                await asyncio.sleep(0.05)
        assert {t.tenant for t in made} == {"acme"}
        triggered = await app.trigger_schedule_async("tick")
        assert (await app.status_async(triggered)).tenant == "acme"
    finally:
        await app.aclose()
