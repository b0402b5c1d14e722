"""A worker process: runs some or all of the roles of an App, and drains on SIGTERM.

Each process gets one instance id (random, never a host name); it is what `locked_by` holds
for the tasks and steps this process has claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from ._check import OptionalSeconds, Seconds
from .alerts import AlertDeliverer, WebhookSink
from .app import App
from .errors import (
    ConfigurationError,
    KeyringError,
    StoreError,
    TransientStoreError,
    UnknownNameError,
)
from .metrics import Metrics, serve
from .relay import Brokers, Relay
from .remote import RemoteAgentPort
from .retry import Backoff, after_store_failure
from .runner import DEFAULT_GONE_AFTER, DEFAULT_HEARTBEAT, AgentRunner
from .scheduler import DEFAULT_GONE_AFTER as DEFAULT_SCHEDULER_GONE_AFTER
from .scheduler import DEFAULT_HEARTBEAT as DEFAULT_SCHEDULER_HEARTBEAT
from .scheduler import Scheduler
from .store import ShardedStore, Store, open_store
from .supervisor import DEFAULT_RETENTION, Supervisor

logger = logging.getLogger("stepwarden.worker")

ROLES = ("scheduler", "agents", "supervisor")


@dataclass(kw_only=True)
class WorkerOptions:
    roles: frozenset[str] = frozenset(ROLES)
    agents: frozenset[str] | None = None
    """Which agents to run (all when None)."""
    concurrency: int = 1000
    """Workflows a scheduler drives at once."""
    admission: bool = True
    """Claim no more tasks than the registered agents have room for (capacity less the steps
    queued and running); False claims up to `concurrency` whatever the agents' load."""
    agent_concurrency: int = 100
    """Calls each agent makes at once (its capacity in the registry)."""
    agent_heartbeat: Seconds = Seconds(DEFAULT_HEARTBEAT)
    """Seconds between an agent instance's heartbeats in the registry."""
    agent_gone_after: Seconds = Seconds(DEFAULT_GONE_AFTER)
    """Seconds without a heartbeat after which an agent instance is gone and the supervisor
    hands its running steps to another."""
    scheduler_heartbeat: Seconds = Seconds(DEFAULT_SCHEDULER_HEARTBEAT)
    """Seconds between a scheduler instance's heartbeats in the registry."""
    scheduler_gone_after: Seconds = Seconds(DEFAULT_SCHEDULER_GONE_AFTER)
    """Seconds without a heartbeat after which a scheduler instance is gone and the
    supervisor gives its tasks back for another scheduler to resume."""
    poll_interval: OptionalSeconds = OptionalSeconds(None)
    supervisor_interval: Seconds = Seconds(1.0)
    lease_ttl: OptionalSeconds = OptionalSeconds(None)
    backoff: Backoff = field(default_factory=Backoff)
    drain_timeout: Seconds = Seconds(30.0)
    store_url: str | None = None
    migrate: bool = True
    retention: OptionalSeconds = OptionalSeconds(DEFAULT_RETENTION)
    """Seconds finished tasks are kept before the supervisor deletes them; None keeps them."""
    alert_webhooks: tuple[str, ...] = ()
    """Webhooks alerts are POSTed to, besides the App's own sinks: each `URL` or `NAME=URL`
    (the name the sink is shown by)."""
    metrics_port: int | None = None
    """Serve the worker's metrics (`Worker.metrics`) at http://HOST:PORT/metrics (0: a free
    port, said in the log); None serves none (they are counted all the same)."""
    metrics_host: str = "127.0.0.1"
    metrics_tenants: frozenset[str] | None = None
    """Tenants the metrics name in their `tenant` label (`Metrics.tenant_label`): every other
    is counted as `_other`, so that the label's values are bounded by this setting (None:
    none named)."""
    brokers: Brokers | None = None
    """The credentials of the brokers status messages are relayed to (`relay.py`); None
    reads the file `STEPWARDEN_BROKERS` names, if any."""
    agent_url: str | None = None
    """Serve the agents over HTTP, from the agent protocol of the stepwarden server at this
    URL (`stepwarden dashboard` with a tokens file), with `agent_token`: the worker opens no
    store, and runs the agents role only."""
    agent_token: str | None = None
    shards: frozenset[str] | None = None
    """With a store of shards: the shards this worker serves (their names in the map: s1,
    s2, ...); None serves every one. Its roles run on each shard apart: a scheduler, the
    agents and a supervisor per shard, each with the concurrency given here."""

    def __post_init__(self) -> None:
        for spec in self.alert_webhooks:
            WebhookSink.parse(spec)  # refused now, not at the first alert
        for role, beat, gone in (
            ("agent", self.agent_heartbeat, self.agent_gone_after),
            ("scheduler", self.scheduler_heartbeat, self.scheduler_gone_after),
        ):
            if gone <= beat:
                raise ConfigurationError(
                    f"--{role}-gone-after ({gone:g}) must be longer than "
                    f"--{role}-heartbeat ({beat:g})"
                )


def parse_roles(roles: Iterable[str]) -> frozenset[str]:
    chosen = frozenset(r.strip() for r in roles if r.strip())
    unknown = chosen - set(ROLES)
    if unknown or not chosen:
        raise ConfigurationError(
            f"unknown role(s) {', '.join(sorted(unknown)) or '(none given)'}; "
            f"choose from {', '.join(ROLES)}"
        )
    return chosen


class Worker:
    def __init__(self, app: App, options: WorkerOptions | None = None) -> None:
        self.app = app
        self.options = options or WorkerOptions()
        self.instance = uuid.uuid4().hex[:16]
        self.stop = asyncio.Event()
        self.metrics = Metrics(self.options.metrics_tenants or ())
        """This worker's metrics, in a registry of its own (`metrics.registry`)."""
        opts = self.options
        if opts.agents is not None:
            missing = opts.agents - set(app.agents)
            if missing:
                known = ", ".join(sorted(app.agents)) or "none"
                raise UnknownNameError(
                    f"unknown agent(s): {', '.join(sorted(missing))} (declared: {known})"
                )

    async def run(self) -> None:
        """Run the roles until `stop` is set (or SIGTERM/SIGINT when run by `run_forever`)."""
        opts = self.options
        if opts.agent_url is not None:
            await self._run_remote_agents(opts.agent_url, opts.agent_token or "")
            return
        store = open_store(opts.store_url or self.app.store_url, keys=self.app.keys)
        store.write_observer = self.metrics.observe_write
        self.metrics.describe_worker(self.instance, opts.roles)
        server = None
        if opts.metrics_port is not None:
            try:
                server = await serve(self.metrics, opts.metrics_host, opts.metrics_port)
            except OSError as exc:
                raise ConfigurationError(
                    f"--metrics-port: cannot listen on {opts.metrics_host} port "
                    f"{opts.metrics_port}: {exc.strerror or exc}"
                ) from exc
            host, port = server.sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            logger.info("worker %s: metrics at http://%s:%d/metrics", self.instance, shown, port)
        try:
            await store.open(migrate=opts.migrate)
            try:
                await self._check_keyring(store)
                if isinstance(store, ShardedStore):
                    await self._run_shards(store)
                else:
                    if opts.shards is not None:
                        raise ConfigurationError("--shards: the store is one database")
                    await store.listen()
                    await self._run_roles(store)
            finally:
                await store.close()
        finally:
            if server is not None:
                server.close()
                await server.wait_closed()

    async def _check_keyring(self, store: Store | ShardedStore) -> None:
        """Every role opens or seals secrets (the scheduler hands a task's input to its
        workflow, an agent its step's to the operation, the supervisor a schedule's to its
        tasks): a store whose secrets are sealed is refused without a keyring, at start
        rather than at the first secret."""
        if self.app.keys is not None:
            return
        sealed = await store.sealing_keys()
        if sealed:
            raise KeyringError(
                f"this store holds secrets sealed under the key(s) {', '.join(sealed)}, and "
                "this worker has no keyring to open them: give it the keyring "
                "(STEPWARDEN_KEYRING, a file, or STEPWARDEN_KEYS)"
            )

    async def _run_remote_agents(self, url: str, token: str) -> None:
        """The agents, served over HTTP (`remote.RemoteAgentPort`), as instances named after
        the token's client; until `stop`, then drained as in `_run_roles`."""
        opts = self.options
        if opts.roles != frozenset({"agents"}):
            raise ConfigurationError("an agent server's URL serves the agents role alone")
        port = RemoteAgentPort(url, token)
        try:
            found = await self._whoami(port)
            if found is None:  # stopped before the server answered
                return
            client, allowed = found
            # The agents named (--agents), each one the token may serve; by default, those
            # of the App's agents it may serve.
            wanted = set(self.app.agents) & set(allowed) if opts.agents is None else opts.agents
            served = sorted(wanted)
            refused = sorted(set(served) - set(allowed))
            if refused or not served:
                raise ConfigurationError(
                    f"the token of client {client!r} may not serve agent(s) "
                    f"{', '.join(refused or sorted(self.app.agents))} "
                    f"(its agents: {', '.join(allowed) or 'none'})"
                )
            runners = [
                AgentRunner(
                    port,
                    self.app.agents[name],
                    instance=f"{client}/agent-{self.instance}",
                    concurrency=opts.agent_concurrency,
                    poll_interval=opts.poll_interval,
                    heartbeat=opts.agent_heartbeat,
                    gone_after=opts.agent_gone_after,
                    metrics=self.metrics,
                )
                for name in served
            ]
            logger.info(
                "worker %s serving agent(s) %s over %s as %s",
                self.instance,
                ", ".join(served),
                url,
                client,
            )
            logger.info("worker %s running agents", self.instance)
            roles = [asyncio.create_task(r.run(self.stop)) for r in runners]
            try:
                await asyncio.wait(
                    [asyncio.create_task(self.stop.wait()), *roles],
                    return_when=asyncio.FIRST_COMPLETED,
                )
                crashed = [r for r in roles if r.done() and not r.cancelled() and r.exception()]
                self.stop.set()
                if crashed:
                    raise crashed[0].exception()  # type: ignore[misc]
                await asyncio.gather(*roles)
            finally:
                for runner in runners:
                    await runner.drain(opts.drain_timeout)
                for role in roles:
                    role.cancel()
                await asyncio.gather(*roles, return_exceptions=True)
        finally:
            await port.aclose()
        logger.info("worker %s stopped", self.instance)

    async def _whoami(self, port: RemoteAgentPort) -> tuple[str, list[str]] | None:
        """Who the token names, asked until the agent server answers: one out of reach, or
        still starting, is waited for (under a process supervisor an exit would be a crash
        loop), each failure said once, the tries a growing delay apart
        (`retry.after_store_failure`); None when stopped meanwhile. A refusal is raised."""
        failures = 0
        while True:
            try:
                return await port.whoami()
            except TransientStoreError as exc:
                if self.stop.is_set():
                    return None
                failures += 1
                what = f"worker {self.instance}: cannot reach the agent server"
                delay = after_store_failure(logger, what, exc, failures)
                await port.wait_to_retry(delay, self.stop)

    async def _run_shards(self, store: ShardedStore) -> None:
        """The roles on each shard served, each on its shard's own store: a shard out of
        reach stops none of the others."""
        served = store.names if self.options.shards is None else sorted(self.options.shards)
        unknown = set(served) - set(store.names)
        if unknown:
            raise ConfigurationError(
                f"--shards: no shard {', '.join(sorted(unknown))} in the store "
                f"(its shards: {', '.join(store.names)})"
            )
        logger.info("worker %s serving shards %s", self.instance, ", ".join(served))

        async def serve(name: str) -> None:
            part = store.part(name)
            with contextlib.suppress(StoreError):  # out of reach: it polls until it is back
                await part.listen()
            await self._run_roles(part, schedules=name == store.schedules_shard)

        await asyncio.gather(*(serve(name) for name in served))

    async def _run_roles(self, store: Store, *, schedules: bool = True) -> None:
        """The roles on `store`; its supervisor ticks the App's schedules when `schedules`
        (with a store of shards, only the shard that keeps them does)."""
        # On stop the scheduler drains first, while this process's agents keep serving the
        # steps its workflows still dispatch; then the agents and the supervisor stop.
        opts = self.options
        later = asyncio.Event()
        first_roles: list[asyncio.Task[None]] = []
        other_roles: list[asyncio.Task[None]] = []
        runners: list[AgentRunner] = []
        if "scheduler" in opts.roles and self.app.workflow_versions:
            scheduler = Scheduler(
                store,
                self.app.workflow_versions,
                instance=f"scheduler-{self.instance}",
                concurrency=opts.concurrency,
                poll_interval=opts.poll_interval,
                admission=opts.admission,
                heartbeat=opts.scheduler_heartbeat,
                gone_after=opts.scheduler_gone_after,
                metrics=self.metrics,
                operations={
                    op.qualname: op
                    for agent in self.app.agents.values()
                    for op in agent.operations.values()
                },
            )
            first_roles.append(
                asyncio.create_task(scheduler.run(self.stop, drain_timeout=opts.drain_timeout))
            )
        if "agents" in opts.roles:
            for name, agent in sorted(self.app.agents.items()):
                if opts.agents is not None and name not in opts.agents:
                    continue
                runner = AgentRunner(
                    store,
                    agent,
                    instance=f"agent-{self.instance}",
                    concurrency=opts.agent_concurrency,
                    poll_interval=opts.poll_interval,
                    heartbeat=opts.agent_heartbeat,
                    gone_after=opts.agent_gone_after,
                    metrics=self.metrics,
                )
                runners.append(runner)
                other_roles.append(asyncio.create_task(runner.run(later)))
        if first_roles and runners:
            # Steps of this process's agents are handed to them at once (no queue, no wake-up),
            # while they have room.
            scheduler.local_agents = {r.agent.name: r for r in runners}
        if "supervisor" in opts.roles:
            sinks = [*self.app.alert_sinks, *(WebhookSink.parse(s) for s in opts.alert_webhooks)]
            supervisor = Supervisor(
                store,
                instance=f"supervisor-{self.instance}",
                interval=opts.supervisor_interval,
                lease_ttl=opts.lease_ttl,
                backoff=opts.backoff,
                alerts=AlertDeliverer(store, sinks) if sinks else None,
                relay=Relay(
                    store,
                    opts.brokers or Brokers.from_env(),
                    destinations=self.app.destinations,
                    backoff=opts.backoff,
                ),
                retention=opts.retention,
                gone_grace=max(opts.agent_gone_after, opts.scheduler_gone_after),
                schedules=list(self.app.schedule_specs.values()) if schedules else [],
                metrics=self.metrics,
                stuck={
                    wf.name: wf.stuck_after
                    for wf in self.app.workflows.values()
                    if wf.stuck_after is not None
                },
                limits=self.app.operation_limits(),
                # A standby looks at the lease beside this process's registry beats.
                beat_every=(
                    opts.scheduler_heartbeat
                    if first_roles
                    else opts.agent_heartbeat
                    if runners
                    else None
                ),
            )
            other_roles.append(asyncio.create_task(supervisor.run(later)))
        logger.info("worker %s running %s", self.instance, ", ".join(sorted(opts.roles)))
        roles = first_roles + other_roles
        try:
            stopping = asyncio.create_task(self.stop.wait())
            await asyncio.wait([stopping, *roles], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            crashed = [r for r in roles if r.done() and not r.cancelled() and r.exception()]
            if crashed:
                self.stop.set()
                raise crashed[0].exception()  # type: ignore[misc]
            await asyncio.gather(*first_roles)
            later.set()
            await asyncio.gather(*other_roles)
        finally:
            later.set()
            for runner in runners:
                await runner.drain(opts.drain_timeout)
            for role in roles:
                role.cancel()
            await asyncio.gather(*roles, return_exceptions=True)
        logger.info("worker %s stopped", self.instance)

    def run_forever(self) -> None:
        """Run in a new event loop until SIGTERM or SIGINT, then drain and return."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
            await self.run()

        asyncio.run(main())

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.stop.is_set():
            return
        logger.info("worker %s: %s received, draining", self.instance, sig.name)
        self.stop.set()
