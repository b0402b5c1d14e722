"""Alert delivery beside the sweep, and webhook URLs kept secret, on each store.

A receiver that trickles its answer (one byte every few seconds, never done) cannot hold up
the supervisor: a task whose deadline passes meanwhile is recovered while the delivery is
still under way, the delivery fails at its deadline and is tried again. A hostile answer (a
gzip bomb, a large body, a body dripped a byte at a time) costs a delivery kilobytes and
its deadline at most, and never holds the event loop. A webhook's user, password and query
are shown nowhere: not in the outbox, the dashboard, the metrics or the log (httpx's own
request log included); nor is its path (where Slack keeps a webhook's secret) but in the
outbox's record of delivery."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import tracemalloc
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

import stepwarden as sw
from stepwarden.dashboard import create_app
from tests.rawsql import sql
from tests.receivers import answering, gzip_bomb, hostile, trickling

from ..support.worker import FAST, running

SECRETS = ("pa55word", "T0KEN-SECRET", "ana:", "token=", "/hook")
DECODED = 64 * 1024 * 1024
"""What a hostile receiver's compressed answer decodes to."""
HELD = 0.1
"""Seconds of CPU the event loop's thread may spend between two turns of an idle coroutine."""


def _app(store_url: str) -> sw.App:
    app = sw.App("alerting", store=store_url)
    desk = app.agent("desk")
    gate = asyncio.Event()

    @desk.operation
    async def refuse(call: sw.Call, why: str) -> None:
        raise sw.PermanentError(why)

    @desk.operation
    async def hang(call: sw.Call, value: Any) -> None:
        await gate.wait()

    @app.workflow(complete_within=timedelta(seconds=60), on_failure="stop")
    async def failing(ctx: sw.Context, why: str) -> Any:
        return await ctx.step(desk.refuse, why)

    @app.workflow(complete_within=timedelta(seconds=1), on_failure="stop", max_failures=5)
    async def slow(ctx: sw.Context, value: Any) -> Any:
        return await ctx.step(desk.hang, value)

    return app


async def _until(what: str, check: Any, timeout: float = 30) -> Any:
    """Poll the store until `check` finds something (the store has no event to wait on)."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                found = await check()
                if found:
                    return found
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not reached within {timeout}s: {what}") from None


async def test_a_trickling_receiver_holds_up_neither_recovery_nor_the_other_sinks(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = _app(store_url)
    paged: list[dict[str, Any]] = []
    app.add_alert_sink(sw.CallableSink(paged.append, name="pager"))
    async with trickling(every=2.0) as slow_hook:
        app.add_alert_sink(sw.WebhookSink(slow_hook.url(), timeout=3.0))
        try:
            async with running(app):
                await app.submit_async("failing", "card declined", task_id="alerting")
                assert slow_hook.got_request is not None
                await asyncio.wait_for(slow_hook.got_request.wait(), 30)
                # While the delivery trickles: a task's deadline passes and it is recovered,
                # and the other sink has the alert.
                await app.submit_async("slow", None, task_id="expiring")
                store = await app.store()

                async def expired() -> bool:
                    return bool(await store.events(task_id="expiring", kind="expired"))

                await _until("the expiring task recovered", expired)
                assert slow_hook.open_connections == 1  # the delivery is still under way
                assert [a["task_id"] for a in paged] == ["alerting"]

                # At its deadline the delivery fails; the alert is tried again later.
                async def tried_again() -> bool:
                    return len(slow_hook.requests) >= 2

                await _until("a second try", tried_again)
                [alert] = await store.outbox(channel="alerts", task_id="alerting")
                assert "pager" in alert.delivered_to and alert.attempts >= 1
                assert f"webhook:{slow_hook.url()}" not in alert.delivered_to
                # The failure is logged under the sink's scheme, host and port only.
                logged = "\n".join(r.getMessage() for r in caplog.records)
                assert f"sink webhook:http://127.0.0.1:{slow_hook.port} failed" in logged
                assert "/hook" not in logged
        finally:
            await app.aclose()


async def test_a_webhook_url_is_shown_nowhere(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app = _app(store_url)
    async with answering() as hook:
        options = dataclasses.replace(FAST, alert_webhooks=(hook.url(secret=True),))
        try:
            async with running(app, options):
                await app.submit_async("failing", "card declined", task_id="t1")
                store = await app.store()

                async def delivered() -> list[sw.OutboxMessage] | None:
                    found = await store.outbox(channel="alerts", task_id="t1")
                    return found if found and len(found[0].delivered_to) == 2 else None

                [alert] = await _until("the alert delivered", delivered)
            # Delivery is recorded by the sink's name, its URL's path included (as it was).
            assert set(alert.delivered_to) == {"log", f"webhook:{hook.url()}"}
            # The request reached the URL as given: its credentials and token were used.
            assert b"token=T0KEN-SECRET" in hook.requests[0]
            assert b"authorization: basic" in hook.requests[0].lower()
            # A row written by an earlier version under the whole URL is shown without it.
            sql(
                store_url,
                "UPDATE stepwarden_outbox SET delivered_to = "
                f'\'["log", "webhook:{hook.url(secret=True)}"]\'',
            )
            dashboard = create_app(app, token="t" * 24)
            transport = httpx.ASGITransport(app=dashboard)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as web:
                pages = {
                    path: (await web.get(path)).text
                    for path in ("/", "/alerts", "/api/overview", "/api/alerts", "/metrics")
                }
            assert f'"webhook:http://127.0.0.1:{hook.port}"' in pages["/api/alerts"]
            for path, text in pages.items():
                for secret in SECRETS:
                    assert secret not in text, (path, secret)
            logged = "\n".join(r.getMessage() for r in caplog.records)
            assert any(r.name == "httpx" for r in caplog.records), "httpx logged no request"
            for secret in SECRETS:
                assert secret not in logged, secret
        finally:
            await app.aclose()


def test_a_webhook_given_by_name_or_with_a_bad_url() -> None:
    named = sw.WebhookSink.parse("ops=https://ana:pw@hooks.example.com/T0/B0/SECRET?x=1")
    assert named.name == "ops" and named.url.startswith("https://ana:pw@")
    plain = sw.WebhookSink.parse("https://hooks.example.com/a?token=x=y")
    assert plain.name == "webhook:https://hooks.example.com/a"
    assert plain.shown == "webhook:https://hooks.example.com"
    slack = sw.WebhookSink("https://hooks.slack.com/services/T0/B0/S3CR3T")
    assert slack.shown == "webhook:https://hooks.slack.com" and "S3CR3T" in slack.name
    for bad in ("ftp://example.com/x", "example.com/hook", "ops=", "https://"):
        with pytest.raises(sw.ConfigurationError, match="must be an http:// or https:// URL"):
            sw.WebhookSink.parse(bad)
    with pytest.raises(sw.ConfigurationError) as refused:
        sw.WorkerOptions(alert_webhooks=("ftp://ana:pw@example.com/x?token=s",))
    assert "pw" not in str(refused.value) and "token" not in str(refused.value)


@dataclasses.dataclass
class _Loop:
    held: float = 0.0
    """The most CPU time the loop's thread spent between two turns of a coroutine that only
    sleeps: how long the loop was held by work, whatever else the machine runs."""
    turns: int = 0


@contextlib.asynccontextmanager
async def _watching_the_loop() -> AsyncIterator[_Loop]:
    seen = _Loop()
    stop = asyncio.Event()

    async def turn() -> None:
        last = time.thread_time()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.thread_time()
            seen.held = max(seen.held, now - last)
            seen.turns += 1
            last = now

    turning = asyncio.create_task(turn())
    try:
        yield seen
    finally:
        stop.set()
        await turning


@pytest.mark.parametrize(
    ("body", "encoding", "status"),
    [
        pytest.param(lambda: gzip_bomb(DECODED), "gzip", 200, id="gzip-bomb"),
        pytest.param(lambda: gzip_bomb(DECODED, layers=2), "gzip, gzip", 500, id="gzip-twice"),
        pytest.param(lambda: bytes(16 * 1024 * 1024), None, 200, id="16-MB-body"),
    ],
)
async def test_a_hostile_answer_costs_kilobytes_and_never_holds_the_event_loop(
    body: Any, encoding: str | None, status: int
) -> None:
    """The answer's status is what counts: its body is asked for unencoded, and whatever
    comes (labelled gzip, once or twice, regardless) is read a few KiB at most, never
    decoded. The memory the delivery allocates stays under 4 MiB, and the loop is never
    held for more than HELD seconds of CPU at a time."""
    async with answering() as ordinary, hostile(body(), status=status, encoding=encoding) as hook:
        # The first delivery of a process imports httpx's transport: not what is measured.
        await sw.WebhookSink(ordinary.url()).send({"id": 0})
        sink = sw.WebhookSink(hook.url(), timeout=20)
        async with _watching_the_loop() as loop:
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                try:
                    await sink.send({"id": 1, "task_id": "t1"})
                except RuntimeError as failed:  # its status says so, whatever its body
                    assert str(failed).endswith(f"answered {status}") and status != 200
                peak = tracemalloc.get_traced_memory()[1] - before
            finally:
                tracemalloc.stop()
    assert b"accept-encoding: identity" in hook.requests[0].lower()
    assert peak < 4 * 1024 * 1024, f"the delivery allocated {peak / 2**20:.0f} MiB"
    assert loop.turns > 0 and loop.held < HELD, f"the loop was held {loop.held:.3f} s"


async def test_a_failed_answer_is_a_failed_delivery_whatever_its_body() -> None:
    async with hostile(gzip_bomb(DECODED, layers=2), status=503, encoding="gzip, gzip") as hook:
        sink = sw.WebhookSink(hook.url(), name="ops")
        with pytest.raises(RuntimeError, match=r"^ops answered 503$"):
            await sink.send({"id": 1})


async def test_the_deadline_covers_the_answer_s_body() -> None:
    """A receiver that drips its body a byte at a time: the delivery ends at its deadline,
    whatever the status said, and its connection is closed."""
    async with hostile(b"x" * 100_000, drip=0.2) as hook:
        sink = sw.WebhookSink(hook.url(), name="drip", timeout=1.0)
        began = time.monotonic()
        with pytest.raises(TimeoutError, match=r"drip: no answer within 1\.0 s"):
            await sink.send({"id": 1})
        assert time.monotonic() - began < 3.0

        async def closed() -> bool:
            return hook.open_connections == 0

        await _until("the connection closed", closed, timeout=5)
