"""The fair share of the agents' queue across tenants, on each store and over each transport
an agent speaks (`rules.fair_shares`, with each agent's own passes): under saturation the
requests of each tenant queued for an agent are claimed in proportion to its weight (1:1,
then 3:1 once a weight is set), within the operations' limits too; a tenant of low weight is
served at least once in every ceil(W / w) + 1 claims; priorities hold within a tenant; a
limit binds before a share; a claim by rank alone takes the oldest whoever's they are."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from stepwarden.records import OpLimit, Request, Submission
from stepwarden.remote import RemoteAgentPort
from stepwarden.store import Store
from stepwarden.store.ports import AgentPort

from ..agentserver import agent_server
from ..dispatching import step_dispatch
from ..support.store import A1

AGENT, OPERATION = "pay", "charge"


class Queue:
    """One task held by scheduler s1 for each tenant (its task id), whose steps it queues
    for the agent `pay`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.attempts: dict[str, int] = {}
        self.seqs: dict[str, int] = {}

    async def add(
        self, tenant: str, n: int, *, priority: int = 0, limit_key: str | None = None
    ) -> None:
        if tenant not in self.attempts:
            task = Submission(
                workflow="wf",
                input="null",
                task_id=tenant,
                complete_within=600.0,
                max_failures=3,
                tenant=tenant,
            )
            await self.store.submit([task])
            [claimed] = await self.store.claim_tasks("s1", ["wf"], 1)
            assert claimed.task.task_id == tenant
            self.attempts[tenant] = claimed.task.attempt
        first = self.seqs.get(tenant, 0) + 1
        self.seqs[tenant] = first + n - 1
        done = await self.store.dispatch_steps(
            [
                step_dispatch(
                    "new", task_id=tenant, task_attempt=self.attempts[tenant], scheduler="s1",
                    seq=seq, name="pay.charge", agent=AGENT, operation=OPERATION, input="[]",
                    priority=priority, complete_within=300, limit_key=limit_key,
                )
                for seq in range(first, first + n)
            ]
        )  # fmt: skip
        assert None not in done


async def _claims(
    agents: AgentPort, n: int, limit: int, limits: Mapping[str, OpLimit] | None = None
) -> list[Request]:
    """`n` claimed requests, in claim order, taken `limit` at a time by instance A1."""
    got: list[Request] = []
    while len(got) < n:
        claimed = await agents.claim_requests(
            A1, AGENT, [OPERATION], min(limit, n - len(got)), limits
        )
        assert claimed, "the backlog ran out"
        got.extend(claimed)
    return got


def _tenants(requests: list[Request]) -> Counter[str]:
    return Counter(r.task_id for r in requests)  # each tenant's task is named after it


async def test_requests_are_shared_by_weight_under_saturation(
    store: Store, agents: AgentPort
) -> None:
    """acme's 1,000 calls were queued first: by rank alone they would all go before any of
    globex's."""
    queue = Queue(store)
    await queue.add("acme", 1000)
    await queue.add("globex", 1000)
    first = _tenants(await _claims(agents, 400, 10))
    assert abs(first["globex"] / 400 - 0.5) <= 0.1, first
    await store.set_tenant_weight("acme", 3)  # read by the next claim
    then = _tenants(await _claims(agents, 400, 10))
    assert abs(then["acme"] / 400 - 0.75) <= 0.1, then


async def test_requests_are_shared_by_weight_within_limits(store: Store, agents: AgentPort) -> None:
    """A limited operation is claimed within its limits and shared by weight all the same:
    acme's 600 calls first, globex's after, each operation within a concurrency that the
    claims never reach."""
    queue = Queue(store)
    await store.set_tenant_weight("acme", 3)
    await queue.add("acme", 600)
    await queue.add("globex", 600)
    limits = {OPERATION: OpLimit(concurrency=10_000)}
    shares = _tenants(await _claims(agents, 400, 10, limits))
    assert abs(shares["acme"] / 400 - 0.75) <= 0.1, shares


async def test_a_tenant_of_low_weight_is_served_within_its_bound(
    store: Store, agents: AgentPort
) -> None:
    """Weights 20 and 1, claims of one request at a time: the small tenant gets one in every
    ceil(21 / 1) + 1 = 23 at least, with or without limits."""
    queue = Queue(store)
    await store.set_tenant_weight("big", 20)
    await queue.add("big", 400)
    await queue.add("small", 40)
    bound = math.ceil(21 / 1) + 1
    for limits in (None, {OPERATION: OpLimit(concurrency=10_000)}):
        order = [r.task_id for r in await _claims(agents, 120, 1, limits)]
        served = [i for i, tenant in enumerate(order) if tenant == "small"]
        assert len(served) >= 120 // bound, served
        gaps = [b - a for a, b in zip([-1, *served], served, strict=False)]
        assert max(gaps) <= bound, gaps


async def test_priorities_hold_within_a_tenant(store: Store, agents: AgentPort) -> None:
    queue = Queue(store)
    await queue.add("acme", 50)
    await queue.add("globex", 50)
    await queue.add("acme", 10, priority=5)
    claimed = await _claims(agents, 40, 10)
    acme = [r.seq for r in claimed if r.task_id == "acme"]
    assert sorted(acme[:10]) == list(range(51, 61)), acme  # its priority 5 first
    assert all(seq <= 50 for seq in acme[10:]), acme
    assert abs(_tenants(claimed)["globex"] / 40 - 0.5) <= 0.1


async def test_a_limit_binds_before_a_share(store: Store, agents: AgentPort) -> None:
    """acme's calls all go to one key of concurrency 2: of a claim of 10, acme gets the 2 its
    key allows and globex the 8 left, not the 5 of its share: the claim takes what the limits
    allow."""
    queue = Queue(store)
    await queue.add("acme", 20, limit_key="one")
    for i in range(20):
        await queue.add("globex", 1, limit_key=f"k{i}")
    limits = {OPERATION: OpLimit(concurrency=2)}
    claimed = await agents.claim_requests(A1, AGENT, [OPERATION], 10, limits)
    assert _tenants(claimed) == {"acme": 2, "globex": 8}


async def test_a_claim_by_rank_alone_takes_the_oldest_whatever_their_tenant(
    store: Store,
) -> None:
    """An agent instance's claim after one that found fewer requests than it asked for is
    made by rank alone (`rules.claim_fairly`, one statement): the oldest first, whoever's
    they are; the next, fair, claim shares what is left."""
    queue = Queue(store)
    await queue.add("acme", 6)
    await queue.add("globex", 6)
    claimed = await store.claim_requests(A1, AGENT, [OPERATION], 4, fairly=False)
    assert [r.task_id for r in claimed] == ["acme"] * 4  # acme's were queued first
    fair = await store.claim_requests(A1, AGENT, [OPERATION], 4)
    assert _tenants(fair) == {"acme": 2, "globex": 2}


async def test_over_http_the_server_decides_from_the_last_claim_it_answered(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """An instance over HTTP gets what one claiming from the store gets
    (`rules.claim_fairly`, decided by the server, whatever the client asks): its first claim
    is shared; after one that took fewer than it asked for, the next goes by rank alone;
    once one takes all it asked for, the next is shared again."""
    queue = Queue(store)
    with agent_server(store_url, (AGENT,), tmp_path) as served:
        port = RemoteAgentPort(served.url, served.token)
        try:
            await queue.add("acme", 2)
            assert len(await port.claim_requests(A1, AGENT, [OPERATION], 4)) == 2  # short
            await queue.add("acme", 6)
            await queue.add("globex", 6)
            by_rank = await port.claim_requests(A1, AGENT, [OPERATION], 4)
            assert _tenants(by_rank) == {"acme": 4}  # acme's were queued first
            fair = await port.claim_requests(A1, AGENT, [OPERATION], 4)
            assert _tenants(fair) == {"acme": 2, "globex": 2}
        finally:
            await port.aclose()
