"""A stepwarden server of the agent protocol (`/api/v1/agents/...`), for the tests that run
the agent contract over HTTP: uvicorn serving `create_app` on a free port of 127.0.0.1, in a
thread of its own with its event loop (as another process would run it), over the store of
the test, with one client whose token serves the agents named."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import uvicorn

import stepwarden as sw
from stepwarden import _tokens
from stepwarden.dashboard import bind, create_app, server

CLIENT = "tester"
"""The client of the agents served over HTTP: their instances are named `tester/...`."""
DASHBOARD_TOKEN = "dashboard-token-agents-7c1e"
Workers = Callable[..., AbstractAsyncContextManager[sw.Worker]]
"""`running(app, options)`: the fixture `workers` of the contract tests."""
STARTS_WITHIN = 20.0


@dataclasses.dataclass(frozen=True)
class AgentServer:
    url: str
    token: str
    """The token of CLIENT, with the scope `agent:NAME` of each agent served."""


@contextlib.contextmanager
def api_server(
    make_app: Callable[[], sw.App],
    clients: Mapping[str, Iterable[str]],
    tmp_path: Path,
    *,
    port: int = 0,
    made: Mapping[str, tuple[str, _tokens.Client]] | None = None,
) -> Iterator[tuple[str, dict[str, str]]]:
    """Serve `make_app()`'s dashboard and /api/v1 (uvicorn on a free port of 127.0.0.1, or
    `port`, in a thread of its own with its event loop, as another process would) with these
    clients (name: scopes, and settings as `SETTING=VALUE`; or their tokens `made` already,
    by `_tokens.new_client`), until the block ends: its URL, and each client's token."""
    if made is None:
        made = {
            name: _tokens.new_client(
                name, [s for s in spec if "=" not in s], [s for s in spec if "=" in s]
            )
            for name, spec in ((n, list(given)) for n, given in clients.items())
        }
    path = tmp_path / "api-tokens"
    path.write_text("".join(client.line() + "\n" for _, client in made.values()))
    path.chmod(0o600)
    sock = bind("127.0.0.1", port)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    holder: dict[str, uvicorn.Server] = {}
    failure: list[BaseException] = []

    async def main() -> None:
        web = create_app(make_app(), token=DASHBOARD_TOKEN, api_tokens=path)
        config = uvicorn.Config(web, log_level="warning", access_log=False, lifespan="on")
        holder["server"] = served = server(config, web.state.stopping)
        await served.serve(sockets=[sock])  # its lifespan closes the App

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            failure.append(exc)
        finally:
            sock.close()

    thread = threading.Thread(target=run, name="api-server", daemon=True)
    thread.start()
    try:
        _wait_for(lambda: failure or (holder.get("server") and holder["server"].started))
        if failure:
            raise failure[0]
        yield url, {name: token for name, (token, _) in made.items()}
    finally:
        if "server" in holder:
            holder["server"].should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"
    if failure:
        raise failure[0]


@contextlib.contextmanager
def agent_server(store_url: str, agents: Iterable[str], tmp_path: Path) -> Iterator[AgentServer]:
    """Serve the agent protocol of an App that declares `agents`, over `store_url`, until the
    block ends."""
    names = sorted(set(agents))

    def make_app() -> sw.App:
        app = sw.App("agent-server", store=store_url)
        for name in names:
            app.agent(name)
        return app

    scopes = [f"agent:{name}" for name in names]
    with api_server(make_app, {CLIENT: scopes}, tmp_path) as (url, tokens):
        yield AgentServer(url, tokens[CLIENT])


def _wait_for(check: Callable[[], Any]) -> None:
    deadline = time.monotonic() + STARTS_WITHIN
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"the agent server did not start within {STARTS_WITHIN}s")
        time.sleep(0.005)


@contextlib.asynccontextmanager
async def split_workers(
    app: sw.App, options: sw.WorkerOptions, served: AgentServer
) -> AsyncIterator[tuple[sw.Worker, sw.Worker]]:
    """Two workers of `app`: the scheduler and the supervisor on the store, and its agents
    served over HTTP by `served` (as CLIENT); both stopped, the agents' first, at the end."""
    back = sw.Worker(
        app, dataclasses.replace(options, roles=frozenset({"scheduler", "supervisor"}))
    )
    remote = sw.Worker(
        app,
        dataclasses.replace(
            options, roles=frozenset({"agents"}), agent_url=served.url, agent_token=served.token
        ),
    )
    tasks = [asyncio.create_task(w.run()) for w in (back, remote)]
    try:
        yield back, remote
    finally:
        remote.stop.set()
        back.stop.set()
        ended = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        for outcome in ended:
            if isinstance(outcome, BaseException):
                raise outcome
