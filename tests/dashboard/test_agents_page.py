"""The agents page: a gone instance shows no calls in flight (its steps are given back), not
the count of its last heartbeat."""

from __future__ import annotations

import re

import httpx

import stepwarden as sw
from stepwarden.dashboard import create_app
from stepwarden.records import AgentBeat
from tests.stores import app_store

TOKEN = "a-token-of-24-characters"


def _beat(instance: str, inflight: int) -> AgentBeat:
    return AgentBeat(
        instance=instance,
        agent="desk",
        operations=("stamp",),
        capacity=10,
        inflight=inflight,
        breaker="closed",
        breaker_detail={},
    )


def _row(page: str, instance: str) -> str:
    found = re.search(rf'<tr [^>]*data-instance="{instance}".*?</tr>', page, re.DOTALL)
    assert found, page
    return found.group(0)


async def test_a_gone_instance_shows_no_calls_in_flight(sqlite_url: str) -> None:
    app = sw.App("agents-page", store=sqlite_url)
    try:
        store = await app_store(app)
        await store.beat([_beat("agent-alive", 3), _beat("agent-gone", 2)], ttl=30)
        await store.leave("agent-gone", ["desk"])
        transport = httpx.ASGITransport(app=create_app(app, token=TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            page = (await client.get("/agents")).text
        alive, gone = _row(page, "agent-alive"), _row(page, "agent-gone")
        assert "3 / 10" in alive and 'aria-label="3 of 10 in flight"' in alive
        assert "none / 10" in gone and "2 / 10" not in gone and "in flight" not in gone
    finally:
        await app.aclose()
