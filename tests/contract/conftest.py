"""Fixtures of the contract tests: the agent-facing part of the store contract (and the
engine's agents) over each transport an agent runner speaks (`store.ports.AgentPort`): the Store
itself, the agent protocol of a stepwarden server over HTTP (`remote.RemoteAgentPort`),
served in a thread of the test's process over the same store, and that protocol spoken by
the TypeScript library (`typescript.py`: its protocol module, and its agent runner)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import stepwarden as sw
from stepwarden.remote import RemoteAgentPort
from stepwarden.store import Store
from stepwarden.store.ports import AgentPort

from ..agentserver import AgentServer, Workers, agent_server, split_workers
from ..support.typescript import compiled_library
from ..support.worker import FAST, running
from .typescript import TypeScriptAgentPort, TypeScriptWorkers

TRANSPORTS = ["store", "http", "typescript"]
AGENTS = ("pay", "ship", "svc", "twin")
"""The agents the store contract's tests serve (their path in the agent protocol)."""


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """How the agents reach the store: directly, over HTTP, or over HTTP from TypeScript."""
    return str(request.param)


@pytest.fixture(scope="session")
def typescript_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TypeScript library and its tests, compiled once for the test process."""
    return compiled_library(tmp_path_factory.mktemp("typescript") / "dist")


@pytest.fixture
async def agents(
    store: Store, store_url: str, transport: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[AgentPort]:
    """The agent-facing calls of the store contract: `store` itself, or a RemoteAgentPort of
    a server over the same store whose token (client `tester`) serves AGENTS, or the same
    calls made by the TypeScript library's protocol module."""
    if transport == "store":
        yield store
        return
    with agent_server(store_url, AGENTS, tmp_path) as served:
        if transport == "typescript":
            build: Path = request.getfixturevalue("typescript_build")
            port: RemoteAgentPort = await TypeScriptAgentPort.start(build, served.url, served.token)
        else:
            port = RemoteAgentPort(served.url, served.token)
        try:
            yield port
        finally:
            await port.aclose()


@pytest.fixture
def workers(transport: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Workers]:
    """`running(app, options)` over each transport: one worker with every role, or the
    scheduler and the supervisor in one worker and the agents in another, served over HTTP
    by a server over the App's store (started at the first use, stopped with the test), or
    the agents served by the TypeScript runner over that server."""
    if transport == "store":
        yield running
        return
    if transport == "typescript":
        ts = TypeScriptWorkers(request.getfixturevalue("typescript_build"), tmp_path)
        with ts.stack:
            yield ts
        return
    split = _Split(tmp_path)
    with split.stack:
        yield split


class _Split:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.stack = contextlib.ExitStack()
        self.served: AgentServer | None = None

    @contextlib.asynccontextmanager
    async def __call__(
        self, app: sw.App, options: sw.WorkerOptions = FAST
    ) -> AsyncIterator[sw.Worker]:
        if self.served is None:
            self.served = self.stack.enter_context(
                agent_server(app.store_url, app.agents, self.tmp_path)
            )
        async with split_workers(app, options, self.served) as (back, _):
            yield back
