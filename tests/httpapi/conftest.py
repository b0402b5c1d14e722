"""Fixtures of the application API's tests: clients and their tokens file, and a real server
(uvicorn, on a port of its own) serving `create_app(..., api_tokens=...)` beside a worker,
both in a thread of their own with their event loop, as another process would run them."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson
import pytest
import uvicorn

import stepwarden as sw
from stepwarden import _tokens
from stepwarden.dashboard import bind, create_app, server

from .api_app import build

T = TypeVar("T")
DASHBOARD_TOKEN = "dashboard-token-51f0c2"
TIMEOUT = 20.0
FAST = sw.WorkerOptions(
    poll_interval=0.01,
    supervisor_interval=0.05,
    lease_ttl=1.0,
    backoff=sw.Backoff(initial=0.01, maximum=0.05),
    drain_timeout=5,
)
CLIENTS = {
    "billing": ("submit", "read", "events", "cancel", "agent:desk", "channels=orders,r"),
    "reader": ("read", "channels=orders,r", "tenants=billing,submitter"),
    "submitter": ("submit",),
}
"""Each client's scopes, and its settings (`SETTING=VALUE`): the reader sees billing's tasks
and submitter's (`tenants=`)."""


def new_client(name: str, spec: Iterable[str]) -> tuple[str, _tokens.Client]:
    """A client of `spec`: its scopes, and its settings (those holding `=`)."""
    given = list(spec)
    return _tokens.new_client(
        name, [s for s in given if "=" not in s], [s for s in given if "=" in s]
    )


@dataclass(frozen=True)
class Tokens:
    """The tokens file, and the token of each client it names."""

    path: Path
    tokens: dict[str, str]

    def auth(self, client: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[client]}"}


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    made = {name: new_client(name, spec) for name, spec in CLIENTS.items()}
    path = tmp_path / "api-tokens"
    lines = ["# NAME SCOPES SHA256(TOKEN)", *(client.line() for _, client in made.values())]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return Tokens(path, {name: token for name, (token, _) in made.items()})


@dataclass
class Served:
    """A server of the application API (and the dashboard) and a worker, running in a thread
    of their own, on one store."""

    store_url: str
    url: str = ""
    loop: asyncio.AbstractEventLoop | None = None
    uvicorn_server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    failure: list[BaseException] = field(default_factory=list)

    def call(self, coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        """Run `coro` on the server's event loop; its answer, to await in the test's."""
        assert self.loop is not None
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        if self.uvicorn_server is not None:
            self.uvicorn_server.should_exit = True
        if self.thread is not None:
            self.thread.join(30)
            assert not self.thread.is_alive(), "the server did not stop"
        if self.failure:
            raise self.failure[0]


@contextlib.contextmanager
def serving(
    store_url: str, api_tokens: Path | None, *, worker: bool = True, waits: bool = True
) -> Iterator[Served]:
    """Serve `build(store_url)` with the clients of `api_tokens` on a free port of 127.0.0.1;
    with `worker`, a worker runs the store's tasks (an App of its own, as another process's
    would be)."""
    served = Served(store_url)
    sock = bind("127.0.0.1", 0)
    served.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    ready = threading.Event()

    async def main() -> None:
        app = build(store_url, waits=waits)
        web = create_app(app, token=DASHBOARD_TOKEN, api_tokens=api_tokens)
        config = uvicorn.Config(web, log_level="warning", access_log=False, lifespan="on")
        served.uvicorn_server = server(config, web.state.stopping)
        served.loop = asyncio.get_running_loop()
        runner = build(store_url, waits=waits)
        running = sw.Worker(runner, FAST) if worker else None
        work = asyncio.create_task(running.run()) if running else None
        ready.set()
        try:
            await served.uvicorn_server.serve(sockets=[sock])
        finally:
            if running is not None and work is not None:
                running.stop.set()
                await asyncio.wait_for(work, 30)
            await runner.aclose()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            served.failure.append(exc)
        finally:
            ready.set()
            sock.close()

    served.thread = threading.Thread(target=run, name="api-server", daemon=True)
    served.thread.start()
    try:
        assert ready.wait(TIMEOUT)
        wait_for(
            "the server to start", lambda: served.uvicorn_server and served.uvicorn_server.started
        )
        yield served
    finally:
        served.stop()


def wait_for(what: str, check: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    """Poll `check` until it returns something true; that value. Fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


async def until(what: str, check: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Poll the coroutine function `check` until it returns something true; that value."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {TIMEOUT}s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
def served(store_url: str, tokens: Tokens) -> Iterator[Served]:
    with serving(store_url, tokens.path) as s:
        yield s


@pytest.fixture
async def client(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, timeout=TIMEOUT) as c:
        yield c


async def submit(
    client: httpx.AsyncClient, tokens: Tokens, workflow: str, input: Any = None, **options: Any
) -> str:
    """Submit through the API as billing; the task's id."""
    answer = await client.post(
        "/api/v1/tasks",
        json={"workflow": workflow, "input": input, **options},
        headers=tokens.auth("billing"),
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["task_id"])


async def status(client: httpx.AsyncClient, tokens: Tokens, task_id: str) -> dict[str, Any]:
    answer = await client.get(f"/api/v1/tasks/{task_id}", headers=tokens.auth("reader"))
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def waiting_for_approval(client: httpx.AsyncClient, tokens: Tokens, task_id: str) -> None:
    """Until the task's workflow waits for the event "approve"."""

    async def waits() -> bool:
        return bool((await status(client, tokens, task_id))["waiting_for"] == "event:approve")

    await until(f"{task_id} waiting for approve", waits)


@dataclass(frozen=True)
class Event:
    """One server-sent event."""

    id: int
    event: str
    data: dict[str, Any]


async def events(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of a text/event-stream response, as they arrive (comments and the
    reconnection delay skipped)."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "data" in fields:
                yield Event(int(fields["id"]), fields["event"], orjson.loads(fields["data"]))
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
