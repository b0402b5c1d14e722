"""The fair share of claims across tenants, on each store (`rules.fair_shares`): under
saturation each tenant with tasks waiting gets claims in proportion to its weight (1:1, then
3:1 once a weight is set, read by the next claim); a tenant of low weight is served at least
once in every ceil(W / w) + 1 claims; one that comes back after an idle while starts at the
current minimum and gets its share, not the claims it missed; priorities hold within a
tenant."""

from __future__ import annotations

import math
from collections import Counter

from stepwarden.records import ClaimedTask, Submission
from stepwarden.store import Store

WORKFLOW = ["wf"]


async def _backlog(store: Store, tenant: str, n: int, *, priority: int = 0, start: int = 0) -> None:
    await store.submit(
        [
            Submission(
                workflow="wf",
                input="null",
                task_id=f"{tenant}-{priority}-{start + i}",
                priority=priority,
                complete_within=300.0,
                max_failures=3,
                tenant=tenant,
            )
            for i in range(n)
        ]
    )


async def _claims(store: Store, n: int, limit: int) -> list[str]:
    """The tenants of `n` claims, in claim order, taken `limit` at a time."""
    got: list[str] = []
    while len(got) < n:
        claimed = await store.claim_tasks("s1", WORKFLOW, min(limit, n - len(got)))
        assert claimed, "the backlog ran out"
        got.extend(c.task.tenant or "" for c in claimed)
    return got


async def test_claims_are_shared_by_weight_under_saturation(store: Store) -> None:
    await _backlog(store, "acme", 1000)
    await _backlog(store, "globex", 1000)
    first = Counter(await _claims(store, 400, 10))
    assert abs(first["globex"] / 400 - 0.5) <= 0.1, first
    await store.set_tenant_weight("acme", 3)  # read by the next claim
    weights = {t.tenant: t.weight for t in await store.tenant_weights()}
    assert weights == {"acme": 3.0, "globex": 1.0}
    then = Counter(await _claims(store, 400, 10))
    assert abs(then["acme"] / 400 - 0.75) <= 0.1, then


async def test_a_tenant_of_low_weight_is_served_within_its_bound(store: Store) -> None:
    await store.set_tenant_weight("big", 50)
    await _backlog(store, "big", 400)
    await _backlog(store, "small", 20)
    order = await _claims(store, 300, 1)
    served = [i for i, tenant in enumerate(order) if tenant == "small"]
    bound = math.ceil(51 / 1) + 1
    assert len(served) >= 300 // bound, served
    gaps = [b - a for a, b in zip([-1, *served], served, strict=False)]
    assert max(gaps) <= bound, gaps


async def test_a_tenant_back_from_idle_gets_its_share_not_what_it_missed(store: Store) -> None:
    await _backlog(store, "acme", 1000)
    await _backlog(store, "globex", 1000)
    await _backlog(store, "initech", 20)
    await _claims(store, 90, 10)  # initech's 20 (a third of 60) go, then its backlog is out
    await _claims(store, 300, 10)  # acme and globex alone: their passes move on
    await _backlog(store, "initech", 300, start=20)
    back = Counter(await _claims(store, 90, 10))
    assert abs(back["initech"] / 90 - 1 / 3) <= 0.1, back


async def test_priorities_hold_within_a_tenant(store: Store) -> None:
    await _backlog(store, "acme", 50, priority=0)
    await _backlog(store, "globex", 50, priority=0)
    await _backlog(store, "acme", 10, priority=5)
    claimed: list[ClaimedTask] = []
    while len(claimed) < 40:
        claimed.extend(await store.claim_tasks("s1", WORKFLOW, 10))
    acme = [c.task.priority for c in claimed if c.task.tenant == "acme"]
    assert acme[:10] == [5] * 10 and set(acme[10:]) == {0}, acme
    assert abs(sum(1 for c in claimed if c.task.tenant == "globex") / 40 - 0.5) <= 0.1


async def test_a_claim_by_rank_alone_takes_the_oldest_whatever_their_tenant(store: Store) -> None:
    """A scheduler's claim after one that found fewer tasks than it asked for is made by rank
    alone (`rules.claim_fairly`): the oldest first, whoever's they are, and no pass moves."""
    await _backlog(store, "acme", 6)
    await _backlog(store, "globex", 6)
    claimed = await store.claim_tasks("s1", WORKFLOW, 4, fairly=False)
    assert [c.task.tenant for c in claimed] == ["acme"] * 4  # acme's were submitted first
    assert await store.tenant_weights() == []  # no tenant's pass was written
    fair = Counter(c.task.tenant for c in await store.claim_tasks("s1", WORKFLOW, 4))
    assert fair == {"acme": 2, "globex": 2}
