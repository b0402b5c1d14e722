"""Alerts, status messages and retention on each store."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

import stepwarden as sw
from stepwarden.destinations import Destinations
from tests.stores import app_store

from ..support.apps import Saga, finish
from ..support.poll import until
from ..support.worker import FAST, running


class Webhook:
    """A real HTTP endpoint that is down (503) until told otherwise."""

    def __init__(self) -> None:
        self.up = False
        self.received: list[dict[str, Any]] = []
        self.refused = 0
        self.got = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        if not self.up:
            self.refused += 1
            return web.Response(status=503)
        body = await request.json()
        assert request.headers["Idempotency-Key"] == f"stepwarden-alert-{body['id']}"
        self.received.append(body)
        self.got.set()
        return web.Response(status=204)


@pytest.fixture
async def webhook() -> AsyncIterator[tuple[Webhook, str]]:
    hook = Webhook()
    app = web.Application()
    app.router.add_post("/alerts", hook.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield hook, f"http://127.0.0.1:{port}/alerts"
    await runner.cleanup()


async def test_a_webhook_that_is_down_gets_every_alert_once_it_is_back(
    store_url: str, webhook: tuple[Webhook, str]
) -> None:
    hook, url = webhook
    saga = Saga(store_url, on_failure="stop")
    saga.fail["charge"] = sw.PermanentError("card declined")
    called: list[dict[str, Any]] = []
    saga.app.add_alert_sink(sw.CallableSink(called.append, name="pager"))
    options = dataclasses.replace(FAST, alert_webhooks=(url,))
    async with running(saga.app, options):
        for i in range(3):
            await saga.app.submit_async(saga.order, {"id": i}, task_id=f"o{i}")
        for i in range(3):
            assert await finish(saga, f"o{i}") == sw.TaskState.ERROR

        async def refused_each_a_few_times() -> bool:
            return hook.refused >= 6

        await until(refused_each_a_few_times)
        assert hook.received == []
        hook.up = True

        async def all_delivered() -> bool:
            return len(hook.received) >= 3

        await until(all_delivered, timeout=30)
    await saga.app.aclose()
    # Each alert once at each sink, whatever the failed tries; the same ids everywhere.
    assert sorted(a["task_id"] for a in hook.received) == ["o0", "o1", "o2"]
    assert len({a["id"] for a in hook.received}) == 3
    assert {a["id"] for a in called} == {a["id"] for a in hook.received}
    assert len(called) == 3
    assert all(a["reason"] == "task_error" and "card declined" in a["error"] for a in called)


async def test_watch_sees_every_status_of_a_task_in_order(store_url: str) -> None:
    saga = Saga(store_url)
    saga.fail["ship"] = sw.PermanentError("no courier")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1", reply_to="shop")
        kinds = [m.kind async for m in saga.app.watch("o1")]
    await saga.app.aclose()
    # received, reserve and charge completed, then compensated newest first.
    assert kinds == [
        "received",
        "step_completed",
        "step_completed",
        "compensating",
        "step_completed",
        "step_completed",
        "compensated",
    ]


async def test_subscribe_follows_a_channel_and_resumes_after_an_id(store_url: str) -> None:
    saga = Saga(store_url)
    seen: list[tuple[str | None, str]] = []

    async def follow(after: int = 0, count: int = 10) -> int:
        last = after
        async for m in saga.app.subscribe("shop", after=after):
            seen.append((m.task_id, m.kind))
            last = m.id
            if len(seen) == count:
                break
        return last

    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1", reply_to="shop")
        await saga.app.submit_async(saga.order, {"id": 2}, task_id="o2", reply_to="other")
        await saga.app.submit_async(saga.order, {"id": 3}, task_id="o3", reply_to="shop")
        last = await follow(count=3)
        assert await saga.app.result_async("o3", timeout=20) == "done"
        assert await saga.app.result_async("o1", timeout=20) == "done"
        await follow(after=last, count=10)
    await saga.app.aclose()
    assert all(task in ("o1", "o3") for task, _ in seen)
    assert Counter(seen) == Counter(
        {
            (t, k): n
            for t in ("o1", "o3")
            for k, n in (("received", 1), ("step_completed", 3), ("processed", 1))
        }
    )


async def test_a_task_without_reply_to_has_no_status_messages(store_url: str) -> None:
    saga = Saga(store_url)
    await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
    with pytest.raises(sw.ConfigurationError, match="without reply_to"):
        async for _ in saga.app.watch("o1"):
            pass
    await saga.app.aclose()


async def test_retention_deletes_old_finished_tasks_and_keeps_the_others(
    store_url: str,
) -> None:
    saga = Saga(store_url, on_failure="stop")
    saga.fail["charge"] = sw.PermanentError("card declined")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="failed")
        assert await finish(saga, "failed") == sw.TaskState.ERROR
        del saga.fail["charge"]
        await saga.app.submit_async(saga.order, {"id": 2}, task_id="done")
        assert await saga.app.result_async("done", timeout=20) == "done"
    await saga.app.submit_async(saga.order, {"id": 3}, task_id="waiting")
    store = await app_store(saga.app)
    assert await store.purge(3600, 100) == 0  # nothing is an hour old
    # With a retention of zero seconds the supervisor purges what is finished.
    options = dataclasses.replace(FAST, retention=0.0, roles=frozenset({"supervisor"}))
    async with running(saga.app, options):

        async def purged() -> bool:
            return await store.get_task("done") is None

        await until(purged)
    assert await store.get_steps("done") == []
    assert await store.events(task_id="done") == []
    # A task in error waits for its operator; a pending one is not finished.
    assert (await saga.app.status_async("failed")).process_state == sw.TaskState.ERROR
    assert (await saga.app.status_async("waiting")).process_state == sw.TaskState.PENDING
    await saga.app.aclose()


async def test_a_purged_tasks_status_messages_are_kept_until_delivered_then_deleted(
    store_url: str,
) -> None:
    """The retention deletes a finished task with its delivered status messages; those its
    broker has not taken yet stay until the relay delivers them, and then go too."""
    listed = Destinations.parse("never redis://127.0.0.1:1 *")
    app = sw.App("purged-relay", store=store_url, destinations=listed)
    svc = app.agent("svc")

    @svc.operation
    async def act(call: sw.Call, n: int) -> int:
        return n

    @app.workflow
    async def one(ctx: sw.Context, n: int) -> int:
        return int(await ctx.step(act, n))

    broker = "redis://127.0.0.1:1/never-up"
    async with app:
        no_relay = dataclasses.replace(FAST, roles=frozenset({"scheduler", "agents"}))
        async with running(app, no_relay):
            await app.submit_async("one", 1, task_id="kept", reply_to=broker)
            assert await app.result_async("kept", timeout=20) == 1
        store = await app_store(app)
        undelivered = await store.outbox(task_id="kept")
        assert [m.kind for m in undelivered] == ["received", "step_completed", "processed"]
        assert await store.purge(0.0, 100) == 1
        assert await store.get_task("kept") is None
        assert await store.outbox(task_id="kept") == undelivered  # none delivered: all kept
        due = await store.relay_due(upto=10**12, tasks=10, limit=100)
        assert [m.id for m in due if m.task_id == "kept"] == [m.id for m in undelivered]
        await store.relay_delivered([m.id for m in undelivered[:2]])
        assert await store.outbox(task_id="kept") == undelivered[2:]
        await store.relay_delivered([undelivered[2].id])
        assert await store.outbox(task_id="kept") == []


async def test_a_step_dispatched_too_often_raises_an_alert(store_url: str) -> None:
    """The charge hangs past its complete_by until the alert for its second dispatch is in
    the outbox; then it answers and the task is processed, with that one alert. Each hang
    costs a failure, and the dispatch under way when the alert is seen hangs too, as may the
    next ones on a busy machine (and the task's own deadline may pass): `max_failures` leaves
    room for them, so that the task is never given up here (that would be a second alert)."""
    saga = Saga(store_url, max_failures=10, alert_after=2)
    saga.hang.add("charge")
    async with running(saga.app):
        await saga.app.submit_async(saga.order, {"id": 1}, task_id="o1")
        store = await app_store(saga.app)

        async def alerted() -> bool:
            return bool(await store.outbox(channel="alerts", task_id="o1"))

        await until(alerted)
        saga.hang.clear()
        assert await saga.app.result_async("o1", timeout=20) == "done"
    [alert] = await store.outbox(channel="alerts", task_id="o1")
    await saga.app.aclose()
    assert alert.detail["reason"] == "step_retried"
    assert (alert.detail["seq"], alert.detail["attempt"]) == (2, 2)
