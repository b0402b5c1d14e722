"""The store's read-only queries behind the dashboard and /metrics, on both stores."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden.records import DURATION_BUCKETS
from tests.stores import app_store

from ..support.worker import running

RUN_FOR = 0.06
"""Seconds each successful stamp takes (so that its duration lands in a known bucket)."""


def build(store_url: str) -> sw.App:
    app = sw.App("queries", store=store_url)
    desk = app.agent("desk", retry=sw.Retry(max_attempts=1))

    @desk.operation
    async def stamp(call: sw.Call, order: dict[str, Any]) -> str:
        if order.get("refuse"):
            raise sw.PermanentError("refused")
        await asyncio.sleep(RUN_FOR)  # the remote call's latency
        return "ok"

    @app.workflow(complete_within=timedelta(seconds=30), on_failure="stop")
    async def w1(ctx: sw.Context, order: dict[str, Any]) -> Any:
        return await ctx.step(desk.stamp, order)

    @app.workflow(complete_within=timedelta(seconds=30), on_failure="stop")
    async def w2(ctx: sw.Context, order: dict[str, Any]) -> Any:
        return await ctx.step(desk.stamp, order)

    return app


async def test_the_dashboard_queries_read_what_the_store_holds(store_url: str) -> None:
    app = build(store_url)
    try:
        store = await app_store(app)
        # An empty store.
        assert await store.find_tasks() == []
        assert await store.workflow_names() == []
        assert await store.oldest_pending_age() is None
        assert await store.read_lease("supervisor") is None
        assert await store.step_stats() == []
        assert await store.count_events("expired") == 0
        empty = await store.activity(window=3600, bucket=60)
        assert empty.buckets == []
        assert abs((empty.now - datetime.now(UTC)).total_seconds()) < 60

        async with running(app):
            await app.submit_async("w1", {"n": 1}, task_id="x-1")
            await app.submit_async("w2", {"refuse": True}, task_id="x-2")
            assert await app.result_async("x-1", timeout=20) == "ok"
            with pytest.raises(sw.TaskFailed, match="refused"):
                await app.result_async("x-2", timeout=20)
            lease = await store.read_lease("supervisor")
            assert lease is not None and lease.holder.startswith("supervisor")
            # Renewed before each sweep, for its ttl (1 s): what is left and the age of the
            # last renewal add up to the ttl (a leader slowed down by a busy machine may let
            # it lapse: remaining then falls below 0, the sum holds).
            assert lease.term >= 1 and lease.remaining <= 1.0
            assert lease.since_renewed is not None and lease.since_renewed >= 0
            assert abs(lease.since_renewed + lease.remaining - 1.0) < 0.05
        await app.submit_async("w1", {"n": 3}, task_id="x-3")
        await store.record_events([("x-1", "expired", {"seq": 1, "attempt": 1})])

        # Newest first; filtered by state, workflow and part of the id (not a pattern).
        assert [t.task_id for t in await store.find_tasks()] == ["x-3", "x-2", "x-1"]
        assert [t.task_id for t in await store.find_tasks(limit=1)] == ["x-3"]
        assert [t.task_id for t in await store.find_tasks(state=sw.TaskState.ERROR)] == ["x-2"]
        assert [t.task_id for t in await store.find_tasks(workflow="w1")] == ["x-3", "x-1"]
        assert [t.task_id for t in await store.find_tasks(search="-2")] == ["x-2"]
        assert await store.find_tasks(search="%") == []
        assert await store.find_tasks(search="_") == []
        found = await store.find_tasks(state=sw.TaskState.PENDING, workflow="w1", search="x")
        assert [t.task_id for t in found] == ["x-3"]
        assert await store.workflow_names() == ["w1", "w2"]

        age = await store.oldest_pending_age()
        assert age is not None and 0 <= age < 30

        # A supervisor that stops lets its lease go.
        lease = await store.read_lease("supervisor")
        assert lease is not None and lease.remaining < 0

        activity = await store.activity(window=3600, bucket=60)
        assert sum(b.processed for b in activity.buckets) == 1
        assert sum(b.failed for b in activity.buckets) == 2  # x-2's step_failed, and the expiry
        assert all(b.start <= activity.now for b in activity.buckets)
        assert await store.activity(window=0.001, bucket=60) is not None

        [stats] = await store.step_stats()
        assert (stats.agent, stats.operation) == ("desk", "stamp")
        assert (stats.started, stats.completed, stats.failed, stats.reassignments) == (2, 1, 1, 0)
        assert len(stats.duration_buckets) == len(DURATION_BUCKETS)
        # The one completed step took at least RUN_FOR: no bucket below it counts it, the
        # widest ones (a minute) do.
        for bound, n in zip(DURATION_BUCKETS, stats.duration_buckets, strict=True):
            if bound < RUN_FOR:
                assert n == 0, (bound, stats.duration_buckets)
        assert stats.duration_buckets[-1] == 1
        assert RUN_FOR <= stats.duration_sum < 10

        assert await store.count_events("expired") == 1
        assert await store.count_events("step_failed") == 1
    finally:
        await app.aclose()
