"""The task's page says of a pending task waiting its turn what `stepwarden why` says: its
rank, how many of the tasks ahead are its own tenant's, and its tenant's share of the claims
(on both stores)."""

from __future__ import annotations

import html

import httpx

import stepwarden as sw
from stepwarden.dashboard import create_app
from stepwarden.records import SchedulerBeat

from ..support.store import whole_store

TOKEN = "a-dashboard-token-of-why-share"


async def test_the_task_s_page_says_its_tenant_s_share(store_url: str) -> None:
    app = sw.App("why-share", store=store_url)

    @app.workflow
    async def quick(ctx: sw.Context, n: int) -> int:
        return n

    async with app:
        for n, tenant in enumerate(("acme", "globex", "acme")):
            await app.submit_async(quick, n, task_id=f"t{n}", tenant=tenant)
        beat = SchedulerBeat(
            instance="sched-1",
            workflows=("quick",),
            capacity=10,
            held=0,
            versions=(("quick", 1),),
        )
        async with whole_store(store_url) as store:
            await store.set_tenant_weight("acme", 3)
            await store.beat_schedulers([beat], ttl=60)
        web = create_app(app, token=TOKEN)
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            page = await c.get("/tasks/t2", headers={"Authorization": f"Bearer {TOKEN}"})
            why = await c.get("/api/why/t2", headers={"Authorization": f"Bearer {TOKEN}"})
    assert page.status_code == 200, page.text
    text = " ".join(html.unescape(page.text).split())
    assert (
        "rank 3: behind 2 others (1 of tenant acme, whose share of the claims is 75%), "
        "for sched-1" in text
    ), text
    gate = why.json()["gate"]
    assert (gate["tenant"], gate["tenant_ahead"], gate["share"]) == ("acme", 1, 0.75)
