"""The destinations status messages may go to are the operator's list: a `reply_to` naming
another is refused at submit (over HTTP: 422; in Python: ConfigurationError), nothing
stored; over HTTP a client names only the entries its tokens file's line gives it; and the
relay refuses, without connecting, what was stored for an unlisted one before. Attacked as a
`submit` token would, against a real server, a real worker, a Redis of the test's own and a
plain TCP listener of the test's own that must never see a connection; on both stores."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import stepwarden as sw
from stepwarden.destinations import Destinations

from ..agentserver import api_server
from ..rawsql import sql
from ..support.relay import Listener, all_processed, build, until
from ..support.worker import running
from .own import OwnRedis, free_port


@pytest.fixture
def listener() -> Iterator[Listener]:
    own = Listener()
    try:
        yield own
    finally:
        own.close()


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[OwnRedis]:
    own = OwnRedis(tmp_path / "redis")
    own.start()
    try:
        yield own
    finally:
        own.close()


def listing(redis: OwnRedis) -> Destinations:
    broker = f"redis://127.0.0.1:{redis.port}"
    return Destinations.parse(f"shop {broker} status.*\nother {broker} other.*", "listed")


async def test_a_submit_client_names_only_the_destinations_it_is_given(
    store_url: str, tmp_path: Path, listener: Listener, redis: OwnRedis
) -> None:
    listed = listing(redis)
    clients = {"shop": ["submit", "read", "destinations=shop"], "plain": ["submit"]}
    with api_server(lambda: build(store_url, listed), clients, tmp_path) as (url, tokens):
        app = build(store_url, listed)
        async with app, running(app), httpx.AsyncClient(base_url=url) as c:

            async def submit(who: str, reply_to: str) -> httpx.Response:
                return await c.post(
                    "/api/v1/tasks",
                    json={"workflow": "three", "input": 1, "reply_to": reply_to},
                    headers={"Authorization": f"Bearer {tokens[who]}"},
                )

            for reply_to, why in [
                (listener.url("redis", "payments-commands"), "is not listed in the destinations"),
                (listener.url("amqp", "x"), "is not listed in the destinations file"),
                (listener.url("nats", "x"), "is not listed in the destinations file"),
                (f"redis://localhost:{redis.port}/status.x", "is not listed"),  # another host
                (redis.url("payments-commands"), "is not listed in the destinations file"),
                (redis.url("other.x"), "is not a destination this client may name"),
                (redis.url("status"), "is not listed"),  # status.* is names after "status."
            ]:
                answer = await submit("shop", reply_to)
                assert answer.status_code == 422, (reply_to, answer.text)
                assert why in answer.json()["error"], (reply_to, answer.text)
            refused = await submit("plain", redis.url("status.x"))
            assert refused.status_code == 422
            assert refused.json()["error"] == (
                f"reply_to 'redis://127.0.0.1:{redis.port}/status.x' is not a destination this "
                "client may name (its entries of the destinations file: none) (setting "
                "destinations)"
            )
            assert sql(store_url, "SELECT count(*) FROM stepwarden_tasks") == [(0,)]

            made = await submit("shop", redis.url("status.ok"))
            assert made.status_code == 201, made.text
            task_id = made.json()["task_id"]
            await all_processed(redis, "status.ok", [task_id])
            # The App's own code names any listed destination, but no other.
            assert await app.submit_async("three", 2, reply_to=redis.url("other.x"))
            for reply_to in (listener.url("redis", "x"), redis.url("payments-commands")):
                with pytest.raises(sw.ConfigurationError, match="is not listed"):
                    await app.submit_async("three", 3, reply_to=reply_to, task_id="t-unlisted")
            assert await (await app.store()).get_task("t-unlisted") is None
    # Its relay delivered the listed destination's messages: it never reached for another.
    assert listener.accepted == 0


async def test_without_a_list_no_broker_destination_is_taken(store_url: str) -> None:
    app = build(store_url)
    async with app:
        with pytest.raises(sw.ConfigurationError) as refused:
            await app.submit_async("three", 1, reply_to="redis://127.0.0.1:16400/payments")
        assert str(refused.value) == (
            "reply_to 'redis://127.0.0.1:16400/payments': no broker destination is allowed, "
            "for none is listed (the destinations file: $STEPWARDEN_DESTINATIONS, "
            "--destinations FILE, App(destinations=...))"
        )
        assert await app.submit_async("three", 1, reply_to="a-plain-channel")
    assert sql(store_url, "SELECT count(*) FROM stepwarden_tasks") == [(1,)]


async def test_the_relay_refuses_what_was_stored_for_a_destination_no_longer_listed(
    store_url: str,
    listener: Listener,
    redis: OwnRedis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Messages stored for a destination the list once allowed, then dropped: refused,
    recorded with their error, never sent, not tried again, warned of once; the listed
    destination's messages go on."""
    old = listener.url("redis", "old")
    before = build(store_url, Destinations.parse(f"old redis://127.0.0.1:{listener.port} *"))
    async with before:
        stale = await before.submit_async("three", 1, reply_to=old)
    caplog.set_level(logging.WARNING, logger="stepwarden.relay")
    app = build(store_url, redis.listed())
    async with app, running(app):
        assert await app.result_async(stale, timeout=30) == [1, 2, 3]
        marker = await app.submit_async("three", 4, reply_to=redis.url("marker"))
        await all_processed(redis, "marker", [marker])
        store = await app.store()

        async def all_refused() -> list[tuple[object, ...]] | None:
            rows = sql(
                store_url,
                "SELECT error, next_at, delivered_at, attempts FROM stepwarden_outbox "
                f"WHERE task_id = '{stale}' ORDER BY id",
            )
            done = len(rows) == 5 and all(r[1] is None for r in rows)
            return rows if done and not await store.relay_backlog() else None

        rows = await until(all_refused, "the stale task's messages refused")
    for error, _, delivered_at, attempts in rows:
        assert delivered_at is None and attempts == 1
        assert str(error).startswith(
            f"refused: reply_to 'redis://127.0.0.1:{listener.port}/old' is not listed in "
            "the destinations file"
        )
    assert listener.accepted == 0
    warned = [r.getMessage() for r in caplog.records if old in r.getMessage()]
    assert len(warned) == 1 and "refused, never sent" in warned[0], warned


async def test_a_destination_that_keeps_failing_is_warned_of_at_most_once_a_minute(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A listed broker nobody listens at: its messages are tried again and again (the
    backoff of the tests' workers: a few hundredths of a second), one warning said."""
    port = free_port()  # nobody listens there
    gone = f"amqp://127.0.0.1:{port}/gone"
    app = build(store_url, Destinations.parse(f"gone amqp://127.0.0.1:{port} *"))
    caplog.set_level(logging.WARNING, logger="stepwarden.relay")
    async with app, running(app):
        await app.submit_async("three", 1, reply_to=gone, task_id="failing")
        store = await app.store()

        async def tried_often() -> bool:
            backlog = [b for b in await store.relay_backlog() if b.destination == gone]
            return bool(backlog) and backlog[0].attempts >= 20

        await until(tried_often, "twenty tries of the unreachable destination")
    warned = [r.getMessage() for r in caplog.records if gone in r.getMessage()]
    assert len(warned) == 1, warned
    assert "not delivered, tried again later" in warned[0]
    assert "warned at most once every 60 s" in warned[0]
