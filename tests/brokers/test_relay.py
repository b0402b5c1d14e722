"""Status messages relayed to the application's own broker, on brokers of the test's own:
each task's messages arrive in order, under stable ids, at least once, across a restart of
the broker; credentials come from the workers' file and are never shown."""

from __future__ import annotations

import asyncio
import dataclasses
import html
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import stepwarden as sw
from stepwarden.dashboard._data import Reader
from stepwarden.dashboard._models import Overview
from stepwarden.destinations import destination
from stepwarden.records import RelayBacklog
from stepwarden.relay import (
    _PUBLISHERS,
    DEADLINE,
    AmqpPublisher,
    BrokerAccess,
    Brokers,
    Relay,
    Unreachable,
)

from ..agentserver import DASHBOARD_TOKEN, api_server
from ..cli.helpers import assert_ok, invoke
from ..conftest import unique
from ..support.relay import (
    KINDS,
    Outbox,
    all_processed,
    assert_delivered,
    build,
    outbox_of,
    until,
)
from ..support.worker import FAST, running
from .own import OwnBroker, OwnRedis, free_port, running_broker


@pytest.fixture(scope="module", params=["amqp", "nats", "redis"])
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OwnBroker]:
    with running_broker(request.param, tmp_path_factory.mktemp(f"broker-{request.param}")) as own:
        yield own


async def test_each_tasks_messages_arrive_in_order_under_stable_ids(
    store_url: str, broker: OwnBroker
) -> None:
    name = unique("orders").replace("-", "_")
    await broker.prepare(name)
    app = build(store_url, broker.listed())
    async with app, running(app):
        task_ids = [await app.submit_async("three", n, reply_to=broker.url(name)) for n in range(8)]
        received = await all_processed(broker, name, task_ids)
        assert assert_delivered(received, await outbox_of(app, task_ids)) == 0
        store = await app.store()
        await until(lambda: _none_pending(store), "the relay's backlog to empty")
    await assert_none_left_open(broker)


def _overview_page(make_app: Callable[[], sw.App], tmp_path: Path) -> str:
    """The dashboard's overview page, as an operator sees it."""
    with api_server(make_app, {}, tmp_path) as (url, _):
        answer = httpx.get(f"{url}/", headers={"Authorization": f"Bearer {DASHBOARD_TOKEN}"})
        assert answer.status_code == 200, answer.text
        return answer.text


async def _none_pending(store: Any) -> bool:
    return not await store.relay_backlog()


async def assert_none_left_open(broker: OwnBroker) -> None:
    """A stopped worker's relay left no connection to the broker open (Redis tells)."""
    if isinstance(broker, OwnRedis):
        redis = broker

        seen: list[str] = []

        async def none_open() -> bool:
            seen[:] = await redis.clients()
            return not seen

        try:
            await until(none_open, "the relay's connections to Redis to close", timeout=10)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; open: {seen}") from None


async def test_a_broker_restart_loses_nothing_and_keeps_the_order(
    store_url: str, broker: OwnBroker, tmp_path: Path
) -> None:
    name = unique("restart").replace("-", "_")
    await broker.prepare(name)
    app = build(store_url, broker.listed())
    async with app, running(app):
        before = [await app.submit_async("three", n, reply_to=broker.url(name)) for n in range(3)]
        await all_processed(broker, name, before)
        await asyncio.to_thread(broker.stop)
        # Submitted while the broker is down: their messages are due, and fail.
        during = [await app.submit_async("three", n, reply_to=broker.url(name)) for n in range(4)]
        for n, task_id in enumerate(during):
            assert await app.result_async(task_id, timeout=30) == [n, n + 1, n + 2]
        store = await app.store()

        async def failing() -> list[RelayBacklog] | None:
            found = [b for b in await store.relay_backlog() if b.destination == broker.url(name)]
            return found if found and found[0].failing and found[0].error else None

        [backlog] = await until(failing, "the relay to fail while the broker is down")
        assert backlog.pending >= len(during) * len(KINDS)
        shown = assert_ok(await asyncio.to_thread(invoke, "--store", store_url, "relay"))
        assert broker.url(name) in shown and (backlog.error or "")[:40] in shown
        listed = assert_ok(
            await asyncio.to_thread(invoke, "--store", store_url, "relay", "--json")
        ).splitlines()
        [line] = [json.loads(s) for s in listed if broker.url(name) in s]
        assert line["failing"] >= 1 and line["lag"] > 0
        overview = Overview.model_validate(await Reader(app).overview())
        [shown_there] = [d for d in overview.relay if d.destination == broker.url(name)]
        assert shown_there.failing >= 1 and shown_there.error
        page = await asyncio.to_thread(_overview_page, lambda: build(store_url), tmp_path)
        table = page[page.index('<table id="relay">') :]
        table = table[: table.index("</table>")]
        assert broker.url(name) in table and html.escape(shown_there.error)[:40] in table

        await asyncio.to_thread(broker.start)
        received = await all_processed(broker, name, before + during)
        assert_delivered(received, await outbox_of(app, before + during))
        await until(lambda: _none_pending(store), "the relay's backlog to empty")
    await assert_none_left_open(broker)
    shown = assert_ok(await asyncio.to_thread(invoke, "--store", store_url, "relay"))
    assert "every status message for a broker is delivered" in shown


async def test_credentials_come_from_the_workers_file_and_are_never_shown(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cret-of-the-broker-9f2"
    redis = OwnRedis(tmp_path / "redis", password=secret)
    redis.start()
    try:
        name = unique("auth")
        wrong = tmp_path / "wrong.json"
        broker = f"redis://127.0.0.1:{redis.port}"
        wrong.write_text(json.dumps({broker: {"password": "n0t-" + secret}}))
        os.chmod(wrong, 0o600)
        app = build(store_url, redis.listed())
        options = dataclasses.replace(FAST, brokers=Brokers.from_file(str(wrong)))
        async with app, running(app, options):
            task_id = await app.submit_async("three", 1, reply_to=redis.url(name))
            store = await app.store()

            async def refused() -> list[RelayBacklog] | None:
                found = await store.relay_backlog()
                return found if found and found[0].error else None

            [backlog] = await until(refused, "the broker to refuse the wrong password")
            assert secret not in (backlog.error or "")
        await assert_none_left_open(redis)  # refused logins included
        assert secret not in repr(Brokers.from_file(str(wrong)))
        task = await app.status_async(task_id)
        assert task.reply_to == redis.url(name)  # the destination alone

        right = tmp_path / "brokers.json"
        right.write_text(json.dumps({broker: {"password": secret}}))
        right.chmod(0o644)
        with pytest.raises(sw.ConfigurationError, match="chmod 600"):
            Brokers.from_file(str(right))
        right.chmod(0o600)
        os.environ["STEPWARDEN_BROKERS"] = str(right)
        try:
            async with app, running(app):
                received = await all_processed(redis, name, [task_id])
                assert_delivered(received, await outbox_of(app, [task_id]))
            await assert_none_left_open(redis)
        finally:
            del os.environ["STEPWARDEN_BROKERS"]
        assert secret not in caplog.text
    finally:
        redis.close()


async def test_a_broker_that_stops_answering_mid_round_leaves_no_connection_open(
    tmp_path: Path,
) -> None:
    """Redis frozen under sends in flight, past the relay's deadline, with more tasks due than
    the relay serves at once: the sends given up on and the sends that went on after them
    (tasks that took a freed place, answered once the broker resumed) leave nothing open,
    whichever publisher they used; every message is delivered."""
    redis = OwnRedis(tmp_path / "redis")
    redis.start()
    try:
        outbox = Outbox({f"t{n}": 10 for n in range(40)}, channel=redis.url("frozen"))
        store: Any = outbox
        relay = Relay(
            store,
            destinations=redis.listed(),
            backoff=sw.Backoff(initial=0.01, maximum=0.05),
            deadline=1.0,
        )

        async def rounds() -> None:
            while len(outbox.delivered) < len(outbox.due):
                await relay.deliver_due()
                await asyncio.sleep(0.01)

        delivering = asyncio.create_task(rounds())
        try:
            await asyncio.sleep(0.05)
            assert redis.proc is not None
            os.kill(redis.proc.pid, signal.SIGSTOP)
            await asyncio.sleep(1.3)
            os.kill(redis.proc.pid, signal.SIGCONT)
            await asyncio.wait_for(delivering, 60)
        finally:
            delivering.cancel()
            await relay.close()
        assert await redis.clients() == []
        received = await redis.received("frozen")
        assert {b["id"] for b in received} == {f"{m.task_id}:{m.id}" for m in outbox.due}
    finally:
        redis.close()


def test_a_task_records_no_credentials(store_url: str) -> None:
    app = build(store_url)
    with app, pytest.raises(sw.ConfigurationError, match="credentials") as refused:
        app.submit("three", 1, reply_to="amqp://me:pa55word@127.0.0.1/orders")
    assert "pa55word" not in str(refused.value)


async def test_an_amqp_connection_that_fails_to_open_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A RabbitMQ that does not answer: the connection the publisher made is closed, not left
    for aio-pika to close when it is collected (which, out of its event loop, leaves its
    close never awaited)."""
    import aio_pika

    made: list[aio_pika.Connection] = []
    init = aio_pika.Connection.__init__

    def recorded(self: aio_pika.Connection, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(aio_pika.Connection, "__init__", recorded)
    dest = destination(f"amqp://127.0.0.1:{free_port()}/nobody-listens")
    publisher = AmqpPublisher(dest, BrokerAccess())
    with pytest.raises(Unreachable):
        await publisher.publish(dest, "t:1", "received", b"{}")
    assert len(made) == 1 and made[0].is_closed


@pytest.mark.parametrize(("scheme", "name"), [("amqp", "q"), ("nats", "subject"), ("redis", "s")])
async def test_a_broker_refusing_connections_is_unreachable_and_says_refused(
    scheme: str, name: str
) -> None:
    """Nobody listens on the port: the publisher says the connection was refused (the
    relay's error for the broker's messages), rather than running into the relay's deadline
    ("no acknowledgement within 10.0 s")."""
    dest = destination(f"{scheme}://127.0.0.1:{free_port()}/{name}")
    publisher = _PUBLISHERS[scheme](dest, BrokerAccess())
    try:
        async with asyncio.timeout(3 * DEADLINE):  # a backstop: nats-py tried for ever
            with pytest.raises(Unreachable, match="Connect call failed"):
                await publisher.publish(dest, "t:1", "received", b"{}")
    finally:
        await publisher.close()
