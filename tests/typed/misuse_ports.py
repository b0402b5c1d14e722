"""Each role's port of the store (`stepwarden.store.ports`), as mypy (strict) sees it: every
role's own calls pass, and a call of a method of every other role's port is an error on its
line (`# E: <code>`), as is an actor given another role's port or a store of shards. Kept out
of the project's own mypy run (pyproject's `exclude`); `tests/typed/test_mypy.py` checks it."""

from __future__ import annotations

import stepwarden as sw
from stepwarden.remote import RemoteAgentPort
from stepwarden.runner import AgentRunner
from stepwarden.scheduler import Scheduler
from stepwarden.store import ShardedStore, Store
from stepwarden.store.ports import (
    AgentPort,
    ApplicationPort,
    ApplicationStore,
    ReadPort,
    SchedulerPort,
    SupervisorPort,
)
from stepwarden.supervisor import Supervisor

app = sw.App("ports", store="sqlite:///ports.db")
payments = app.agent("payments")


def every_store_serves_every_port(store: Store, sharded: ShardedStore) -> None:
    ports: tuple[ApplicationStore, SchedulerPort, SupervisorPort, AgentPort] = (
        store,
        store,
        store,
        store,
    )
    remote: AgentPort = RemoteAgentPort("http://localhost:8000", "token")
    users: ApplicationStore = sharded
    print(ports, remote, users)


async def the_application(store: ApplicationPort) -> None:
    await store.submit([])
    await store.get_task("t1")
    await store.claim_tasks("s1", ["order"], 10)  # E: attr-defined
    await store.try_lease("supervisor", "s1", 30.0)  # E: attr-defined
    await store.claim_requests("a1", "payments", ["charge"], 10)  # E: attr-defined
    await store.step_stats()  # E: attr-defined
    # What only one database serves: the App asks for it of a Store, and refuses a store of
    # shards with a ConfigurationError.
    await store.outbox(task_id="t1", channel="shop")
    await store.outbox(channel="shop")  # E: call-arg
    store.transaction()  # E: attr-defined


async def one_database(store: Store, sharded: ShardedStore) -> None:
    await store.outbox(channel="shop")
    store.transaction()
    await sharded.outbox(channel="shop")  # E: call-arg
    sharded.transaction()  # E: attr-defined


async def the_reads(store: ReadPort) -> None:
    await store.step_stats()
    await store.get_task("t1")
    await store.submit([])  # E: attr-defined
    await store.claim_tasks("s1", ["order"], 10)  # E: attr-defined
    await store.try_lease("supervisor", "s1", 30.0)  # E: attr-defined
    await store.claim_requests("a1", "payments", ["charge"], 10)  # E: attr-defined


async def the_scheduler(store: SchedulerPort) -> None:
    await store.claim_tasks("s1", ["order"], 10)
    await store.submit([])  # E: attr-defined
    await store.step_stats()  # E: attr-defined
    await store.try_lease("supervisor", "s1", 30.0)  # E: attr-defined
    await store.claim_requests("a1", "payments", ["charge"], 10)  # E: attr-defined


async def the_supervisor(store: SupervisorPort) -> None:
    await store.try_lease("supervisor", "s1", 30.0)
    await store.due_alerts(100)
    await store.submit([])  # E: attr-defined
    await store.step_stats()  # E: attr-defined
    await store.claim_tasks("s1", ["order"], 10)  # E: attr-defined
    await store.claim_requests("a1", "payments", ["charge"], 10)  # E: attr-defined


async def the_agents(store: AgentPort) -> None:
    await store.claim_requests("a1", "payments", ["charge"], 10)
    await store.submit([])  # E: attr-defined
    await store.step_stats()  # E: attr-defined
    await store.claim_tasks("s1", ["order"], 10)  # E: attr-defined
    await store.try_lease("supervisor", "s1", 30.0)  # E: attr-defined


async def what_the_app_gives() -> None:
    store = await app.store()
    await store.submit([])
    await store.step_stats()
    await store.claim_tasks("s1", ["order"], 10)  # E: attr-defined
    await store.try_lease("supervisor", "s1", 30.0)  # E: attr-defined
    await store.claim_requests("a1", "payments", ["charge"], 10)  # E: attr-defined


def each_actor_takes_its_port(
    reads: ReadPort,
    scheduler: SchedulerPort,
    supervisor: SupervisorPort,
    agents: AgentPort,
    sharded: ShardedStore,
) -> None:
    Scheduler(scheduler, {}, instance="s1")
    Supervisor(supervisor, instance="s1")
    AgentRunner(agents, payments, instance="a1")
    Scheduler(reads, {}, instance="s1")  # E: arg-type
    Scheduler(agents, {}, instance="s1")  # E: arg-type
    Supervisor(scheduler, instance="s1")  # E: arg-type
    AgentRunner(scheduler, payments, instance="a1")  # E: arg-type
    AgentRunner(reads, payments, instance="a1")  # E: arg-type
    # A store of shards serves no actor: a worker runs the roles on each shard's own store.
    Scheduler(sharded, {}, instance="s1")  # E: arg-type
    Supervisor(sharded, instance="s1")  # E: arg-type
    AgentRunner(sharded, payments, instance="a1")  # E: arg-type
    Scheduler(sharded.parts[0], {}, instance="s1")
