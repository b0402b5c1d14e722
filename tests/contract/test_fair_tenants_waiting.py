"""A fair claim reads only the few tenants of least pass (from the tenants with work
waiting, migration 0023), and shares exactly as `rules.fair_shares` over every tenant
waiting would: over many tenants of several weights, each draining in its turn and one
coming back; a task given back makes its tenant one with work waiting again; and submits
and claims side by side lose no tenant waiting."""

from __future__ import annotations

import asyncio
from collections import Counter

from stepwarden.records import Submission
from stepwarden.rules import TenantTurn, fair_shares
from stepwarden.store import Store

from ..rawsql import sql

WORKFLOW = ["wf"]


async def _backlog(store: Store, tenant: str, n: int, start: int = 0) -> None:
    await store.submit(
        [
            Submission(
                workflow="wf",
                input="null",
                task_id=f"{tenant}-{start + i}",
                complete_within=300.0,
                max_failures=3,
                tenant=tenant,
            )
            for i in range(n)
        ]
    )


async def _expected(store: Store, waiting: Counter[str], limit: int) -> Counter[str]:
    """What a claim of `limit` takes of each tenant by the rule over every tenant waiting."""
    tenants = [t for t, n in waiting.items() if n > 0]
    if len(tenants) <= 1:
        return Counter({t: min(limit, waiting[t]) for t in tenants})
    rows = {r.tenant: r for r in await store.tenant_weights()}
    clock = next(iter(rows.values())).clock if rows else 0.0
    turns = [
        TenantTurn(t, rows[t].weight, rows[t].pass_) if t in rows else TenantTurn(t, 1.0, None)
        for t in tenants
    ]
    share = fair_shares(turns, clock, limit)
    return Counter({t: min(n, waiting[t]) for t, n in share.counts.items()})


async def test_claims_over_many_tenants_share_as_over_every_tenant_waiting(store: Store) -> None:
    waiting: Counter[str] = Counter()
    for i in range(40):
        tenant = f"t{i:02d}"
        if i % 3:
            await store.set_tenant_weight(tenant, 1 + i % 3)
        waiting[tenant] = 3 + (i * 7) % 25
        await _backlog(store, tenant, waiting[tenant])
    claims = 0
    while sum(waiting.values()):
        if claims == 30:  # a tenant drained early comes back, at the clock
            back = min(t for t, n in waiting.items() if n == 0)
            await _backlog(store, back, 20, start=100)
            waiting[back] = 20
        expected = await _expected(store, waiting, 6)
        got = Counter(c.task.tenant or "" for c in await store.claim_tasks("s1", WORKFLOW, 6))
        assert got == expected, (claims, got, expected)
        waiting.subtract(got)
        claims += 1
    assert await store.claim_tasks("s1", WORKFLOW, 6) == []


async def test_a_task_given_back_makes_its_tenant_wait_again(store: Store) -> None:
    await _backlog(store, "solo", 1)
    [solo] = await store.claim_tasks("s2", WORKFLOW, 1)
    await _backlog(store, "acme", 10)
    await _backlog(store, "globex", 10)
    # solo has no task waiting: these claims share between acme and globex alone.
    first = Counter(c.task.tenant for c in await store.claim_tasks("s1", WORKFLOW, 4))
    assert first == {"acme": 2, "globex": 2}
    await store.release_held("s2")  # solo's task is pending again
    back = Counter(c.task.tenant for c in await store.claim_tasks("s1", WORKFLOW, 3))
    assert back["solo"] == 1 and solo.task.task_id == "solo-0", back


async def test_submits_and_claims_side_by_side_lose_no_tenant_waiting(
    store: Store, store_url: str
) -> None:
    """Claims that drain tenants (and delete their rows of the tenants waiting) while those
    tenants submit again, side by side: every tenant left with a task pending is one with
    work waiting, and every task is claimed."""

    async def submitter(tenant: str) -> None:
        for i in range(40):
            await _backlog(store, tenant, 1, start=i)

    claimed: list[str] = []

    async def claimer(name: str) -> None:
        for _ in range(60):
            claimed.extend(c.task.task_id for c in await store.claim_tasks(name, WORKFLOW, 2))

    tenants = [f"t{i}" for i in range(4)]
    await asyncio.gather(*(submitter(t) for t in tenants), claimer("s1"), claimer("s2"))
    lost = sql(
        store_url,
        "SELECT DISTINCT t.tenant FROM stepwarden_tasks t WHERE t.process_state = 'pending'"
        " AND NOT EXISTS (SELECT 1 FROM stepwarden_tenant_work k WHERE k.tenant = t.tenant"
        " AND k.workflow = t.workflow AND k.version = t.version)",
    )
    assert lost == []
    while batch := await store.claim_tasks("s1", WORKFLOW, 10):
        claimed.extend(c.task.task_id for c in batch)
    assert sorted(claimed) == sorted(f"{t}-{i}" for t in tenants for i in range(40))
