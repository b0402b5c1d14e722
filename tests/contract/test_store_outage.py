"""PostgreSQL out of reach, then back: one probe per store tries the server while it is away,
and when it answers again every call waiting on the store goes at once: those waiting to be
tried again (`Store.wait_to_retry`), on a pool made anew rather than left to reconnect at its
own pace; while it is away, a call fails at once rather than wait for a connection. On a
server of the test's own, which it stops and starts; the wait itself on every store."""

from __future__ import annotations

import asyncio
import time

import pytest

from stepwarden.errors import TransientStoreError
from stepwarden.store import Store
from stepwarden.store.postgres import PostgresStore

from ..scenarios.own_postgres import own_postgres

#: Long enough for the pool's own reconnection to fall seconds behind (1, 2, 4 s apart).
OUTAGE = 5.0
#: A probe's interval (0.5 s) and a new connection; with slack for a loaded machine.
BACK_WITHIN = 1.5
#: The five tries of a read (1.5 s of delays between them), with slack for a loaded machine.
FAILS_WITHIN = 5.0


async def test_calls_waiting_on_postgres_go_as_soon_as_it_answers_again() -> None:
    with own_postgres() as server:
        store = PostgresStore(server.url)
        await store.open()
        try:
            assert await store.schema_version() > 0
            before = store.lost_at
            await asyncio.to_thread(server.stop)
            with pytest.raises(TransientStoreError):
                await store.schema_version()  # its connection lost: the probe starts
            waiting = asyncio.create_task(store.wait_to_retry(60.0))
            await asyncio.sleep(OUTAGE)
            assert not waiting.done()
            # Meanwhile an application's read is tried its five times and fails, at once
            # each: no try waits for a connection the pool cannot make (30 s each).
            started = time.monotonic()
            with pytest.raises(TransientStoreError, match="out of reach"):
                await store.get_task("t")
            assert time.monotonic() - started < FAILS_WITHIN
            lost_at = store.lost_at
            await asyncio.to_thread(server.start)
            back = time.monotonic()
            async with asyncio.timeout(BACK_WITHIN):
                await waiting
                assert await store.schema_version() > 0
            assert time.monotonic() - back <= BACK_WITHIN
            # Each refused probe noted the loss: a supervisor here waits its grace from then.
            assert lost_at > before + OUTAGE - 1
        finally:
            await store.close()


async def test_a_wait_to_retry_lasts_its_delay_unless_something_ends_it(store: Store) -> None:
    # Nothing lost, nothing probed (a failure the server answered with): the whole delay.
    started = time.monotonic()
    await store.wait_to_retry(0.3)
    assert time.monotonic() - started >= 0.29
    stop = asyncio.Event()
    stop.set()
    started = time.monotonic()
    await store.wait_to_retry(60.0, stop)  # a worker stopping ends it
    assert time.monotonic() - started < 5
