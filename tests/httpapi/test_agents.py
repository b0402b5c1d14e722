"""The agent protocol: an agent served over HTTP by a worker that holds no store connection
(`stepwarden worker --agent-url`), beside the in-process agents of another worker. Its steps
are called with their idempotency key and recorded; a token serves only the agents its
scopes name, as instances named after its client; every write is fenced by the claim's
token (a late or wrong one changes nothing); a cancel reaches the remote call."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

import stepwarden as sw
from stepwarden import _tokens
from stepwarden._check import MAX_REASON
from stepwarden.retry import MAX_DELAY, MAX_EXPONENT, after_transient
from stepwarden.rules import MAX_ERROR, error_text

from ..agentserver import api_server
from ..support.worker import running
from .conftest import FAST, TIMEOUT, until

AGENTS = "/api/v1/agents"


class Remote:
    """The App: `local.double` in the worker's process, `remote.ship` served over HTTP."""

    def __init__(self, store_url: str) -> None:
        self.app = sw.App("remote", store=store_url)
        self.calls: list[tuple[str, str]] = []
        self.started = asyncio.Event()
        self.gate: asyncio.Event | None = None
        self.cancelled: list[str] = []
        local = self.app.agent("local")
        remote = self.app.agent("remote")

        @local.operation
        async def double(call: sw.Call, n: int) -> int:
            return 2 * n

        @remote.operation
        async def ship(call: sw.Call, n: int) -> dict[str, Any]:
            self.calls.append((call.idempotency_key, call.task_id))
            self.started.set()
            if self.gate is not None:
                try:
                    await self.gate.wait()
                except asyncio.CancelledError:
                    self.cancelled.append(call.task_id)
                    raise
            return {"shipped": n}

        @remote.operation
        async def charge(call: sw.Call, payment: dict[str, Any]) -> dict[str, Any]:
            card = payment["card"]
            return {"secret": isinstance(card, sw.Secret), "last4": card.reveal()[-4:]}

        @self.app.workflow(name="pay")
        async def pay(ctx: sw.Context, payment: dict[str, Any]) -> dict[str, Any]:
            charged: dict[str, Any] = await ctx.step(charge, payment)
            return charged

        @self.app.workflow(name="order")
        async def order(ctx: sw.Context, n: int) -> dict[str, Any]:
            doubled: int = await ctx.step(double, n)
            shipped: dict[str, Any] = await ctx.step(ship, doubled)
            return shipped


@dataclasses.dataclass
class Server:
    url: str
    tokens: dict[str, str]

    def auth(self, client: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[client]}"}


CLIENTS: dict[str, Iterable[str]] = {
    "shipper": ("agent:remote",),
    "other": ("agent:local",),
    "billing": ("read",),
}


@pytest.fixture
async def served(store_url: str, tmp_path: Path) -> AsyncIterator[Server]:
    """The dashboard's server with the clients' tokens (a thread of its own), and a worker
    that runs the workflow and the local agent, not the remote one."""
    with api_server(lambda: Remote(store_url).app, CLIENTS, tmp_path) as (url, tokens):
        worker_app = Remote(store_url).app
        options = dataclasses.replace(FAST, agents=frozenset({"local"}))
        async with worker_app, running(worker_app, options):
            yield Server(url, tokens)


@contextlib.asynccontextmanager
async def remote_worker(
    remote: Remote, server: Server, client: str = "shipper"
) -> AsyncIterator[sw.Worker]:
    options = dataclasses.replace(
        FAST,
        roles=frozenset({"agents"}),
        agent_url=server.url,
        agent_token=server.tokens[client],
        agent_heartbeat=0.2,
        agent_gone_after=1.0,
    )
    worker = sw.Worker(remote.app, options)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop.set()
        await asyncio.wait_for(task, 30)


async def test_a_step_served_over_http_is_called_once_with_its_key_and_recorded(
    store_url: str, served: Server
) -> None:
    remote = Remote(store_url)
    async with remote.app:
        ids = [await remote.app.submit_async("order", n, task_id=f"o-{n}") for n in range(5)]
        async with remote_worker(remote, served):
            results = [await remote.app.result_async(t, timeout=TIMEOUT) for t in ids]
        assert results == [{"shipped": 2 * n} for n in range(5)]
        assert sorted(t for _, t in remote.calls) == sorted(ids)
        for key, task_id in remote.calls:
            [step] = [s for s in await (await remote.app.store()).get_steps(task_id) if s.seq == 2]
            assert key == step.idempotency_key and step.state == sw.StepState.COMPLETED
            assert step.locked_by is not None and step.locked_by.startswith("shipper/")
        agents = await remote.app.agent_instances_async()
        assert any(a.agent == "remote" and a.instance.startswith("shipper/") for a in agents)


async def test_bursts_of_wrong_tokens_from_its_address_do_not_stop_a_remote_agent(
    store_url: str, served: Server
) -> None:
    """A remote worker serves its agent from an address that also sends bursts of wrong
    tokens (any process of that machine could, or a page its browser shows), to the agent
    protocol and to the application API: its beats, claims and outcomes are taken all the
    same, and its steps are called and recorded."""
    remote = Remote(store_url)
    wrong = {"Authorization": "Bearer sw_wrong-0123456789"}
    async with remote.app, httpx.AsyncClient(base_url=served.url, timeout=TIMEOUT) as http:
        async with remote_worker(remote, served):
            for n in range(3):
                for path in (f"{AGENTS}/remote/beat", "/api/v1/tasks"):
                    for _ in range(12):
                        answer = await http.post(path, json={}, headers=wrong)
                        assert answer.status_code in (401, 429), answer.text
                task_id = await remote.app.submit_async("order", n, task_id=f"burst-{n}")
                result = await remote.app.result_async(task_id, timeout=TIMEOUT)
                assert result == {"shipped": 2 * n}
        assert (await http.post(f"{AGENTS}/remote/beat", json={}, headers=wrong)).status_code == 429


async def test_a_token_serves_only_its_agents_as_instances_of_its_client(
    store_url: str, served: Server
) -> None:
    async with httpx.AsyncClient(base_url=served.url, timeout=TIMEOUT) as http:
        claim = {"instance": "other/x", "operations": ["ship"], "limit": 5}
        answer = await http.post(f"{AGENTS}/remote/claim", json=claim, headers=served.auth("other"))
        assert answer.status_code == 403 and "agent:remote" in answer.json()["error"]
        claim["instance"] = "other/x"
        answer = await http.post(
            f"{AGENTS}/remote/claim", json=claim, headers=served.auth("shipper")
        )
        assert answer.status_code == 403 and "named CLIENT/" in answer.json()["error"]
        answer = await http.post(
            f"{AGENTS}/remote/claim", json=claim, headers=served.auth("billing")
        )
        assert answer.status_code == 403
        answer = await http.get(f"{AGENTS}/whoami", headers=served.auth("shipper"))
        assert answer.json()["client"] == "shipper"
        assert answer.json()["agents"] == ["remote"]
        answer = await http.get(f"{AGENTS}/whoami", headers=served.auth("billing"))
        assert answer.status_code == 403
        answer = await http.post(f"{AGENTS}/remote/claim", json=claim)
        assert answer.status_code == 401
    remote = Remote(store_url)
    async with remote.app:
        with pytest.raises(sw.ConfigurationError, match="'billing' may not do this"):
            async with remote_worker(remote, served, client="billing"):
                pass


async def test_every_write_is_fenced_by_the_claims_token(store_url: str, served: Server) -> None:
    remote = Remote(store_url)
    async with remote.app, httpx.AsyncClient(base_url=served.url, timeout=TIMEOUT) as http:
        await remote.app.submit_async("order", 3, task_id="fenced")
        me = "shipper/by-hand"
        beat = {"instance": me, "operations": ["ship"], "capacity": 1, "ttl": 30}
        auth = served.auth("shipper")
        answer = await http.post(f"{AGENTS}/remote/beat", json=beat, headers=auth)
        assert answer.status_code == 204

        async def claimed() -> list[dict[str, Any]]:
            claim = {"instance": me, "operations": ["ship"], "limit": 1, "wait": 1}
            answer = await http.post(f"{AGENTS}/remote/claim", json=claim, headers=auth)
            assert answer.status_code == 200, answer.text
            found: list[dict[str, Any]] = answer.json()["requests"]
            return found

        [request] = await until("the remote step to be queued", claimed)
        assert request["input"] == [6] and request["idempotency_key"] == "fenced/2"
        fence = {"task_id": "fenced", "seq": request["seq"], "instance": me}
        done = {"state": "completed", "result": {"shipped": 6}}

        async def complete(**changes: Any) -> Any:
            item = {**fence, "attempt": request["attempt"], **done, **changes}
            body = {"items": [item]}
            answer = await http.post(f"{AGENTS}/remote/complete", json=body, headers=auth)
            return answer.status_code, answer.json()

        # Another attempt's, another instance's of this client: refused by the store.
        assert await complete(attempt=request["attempt"] + 1) == (200, {"applied": [False]})
        assert await complete(instance="shipper/zombie") == (200, {"applied": [False]})
        # Another client's instance: refused by the server.
        status, _ = await complete(instance="other/x")
        assert status == 403
        beat_again = {
            "task_id": "fenced",
            "seq": request["seq"],
            "attempt": request["attempt"],
            "instance": me,
        }
        answer = await http.post(f"{AGENTS}/remote/heartbeat", json=beat_again, headers=auth)
        assert answer.status_code == 200 and answer.json()["remaining"] > 0
        assert await complete() == (200, {"applied": [True]})
        # The same outcome again (its answer lost, say) is the one recorded: said applied,
        # nothing changes; another outcome is refused.
        assert await complete() == (200, {"applied": [True]})
        failed = {"state": "failed", "error": "too late", "result": None}
        assert await complete(**failed) == (200, {"applied": [False]})
        answer = await http.post(f"{AGENTS}/remote/heartbeat", json=beat_again, headers=auth)
        assert answer.json() == {"remaining": None}  # not held any more: stop
        assert await remote.app.result_async("fenced", timeout=TIMEOUT) == {"shipped": 6}


async def test_a_cancel_reaches_the_remote_call(store_url: str, served: Server) -> None:
    remote = Remote(store_url)
    remote.gate = asyncio.Event()
    async with remote.app:
        await remote.app.submit_async("order", 1, task_id="to-cancel")
        async with remote_worker(remote, served):
            await asyncio.wait_for(remote.started.wait(), TIMEOUT)
            await remote.app.cancel_async("to-cancel", reason="changed my mind")

            async def stopped() -> bool:
                return remote.cancelled == ["to-cancel"]

            await until("the remote call to be cancelled", stopped)
        task = await remote.app.status_async("to-cancel")
        assert task.process_state == sw.TaskState.CANCELLED


async def test_a_remote_agent_gets_the_secrets_of_its_input_as_secrets(
    store_url: str, served: Server
) -> None:
    remote = Remote(store_url)
    async with remote.app:
        card = sw.Secret("4242424242424242")
        task = await remote.app.submit_async("pay", {"card": card}, task_id="pay-1")
        async with remote_worker(remote, served):
            result = await remote.app.result_async(task, timeout=TIMEOUT)
    assert result == {"secret": True, "last4": "4242"}


async def test_a_claim_whose_client_went_claims_nothing_after(
    store_url: str, served: Server
) -> None:
    """An instance stopping gives up its claim's long poll: a request queued after that goes
    to another instance, not to the one that left (which would never call it)."""
    remote = Remote(store_url)
    auth = served.auth("shipper")
    async with remote.app, httpx.AsyncClient(base_url=served.url, timeout=TIMEOUT) as http:
        for me in ("shipper/leaving", "shipper/staying"):
            beat = {"instance": me, "operations": ["ship"], "capacity": 1, "ttl": 30}
            answer = await http.post(f"{AGENTS}/remote/beat", json=beat, headers=auth)
            assert answer.status_code == 204
        # The whole claim sent, then the connection closed: its long poll has begun (or
        # begins) on the server with its client gone.
        body = json.dumps(
            {"instance": "shipper/leaving", "operations": ["ship"], "limit": 1, "wait": 20}
        ).encode()
        url = httpx.URL(served.url)
        _, writer = await asyncio.open_connection(url.host, url.port)
        writer.write(
            f"POST {AGENTS}/remote/claim HTTP/1.1\r\nHost: {url.host}\r\n"
            f"Authorization: {auth['Authorization']}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()

        await remote.app.submit_async("order", 4, task_id="after-leaving")
        store = await remote.app.store()

        async def queued() -> Any:
            return [s for s in await store.get_steps("after-leaving") if s.seq == 2]

        [step] = await until("the remote step to be queued", queued)
        assert step.locked_by is None, step.locked_by
        claim = {"instance": "shipper/staying", "operations": ["ship"], "limit": 1, "wait": 10}
        answer = await http.post(f"{AGENTS}/remote/claim", json=claim, headers=auth)
        [request] = answer.json()["requests"]
        assert request["task_id"] == "after-leaving"
        [step] = await queued()
        assert step.locked_by == "shipper/staying"


REMOTE_APP = """\
import stepwarden as sw

app = sw.App("remote", store="sqlite:///never-opened.db")
remote = app.agent("remote")


@remote.operation
async def ship(call: sw.Call, n: int) -> dict:
    return {"shipped": n, "by": "process"}
"""
UNREACHED = "cannot reach the agent server"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_remote_worker_started_before_its_server_waits_for_it_and_logs_no_requests(
    store_url: str, tmp_path: Path
) -> None:
    """`stepwarden worker --agent-url` whose agent server is not up yet (under a process
    supervisor, an exit would be a crash loop) tries again, each failure said once, the tries
    further and further apart; once the server is up it serves its agent. At --log-level
    info its log holds no line per HTTP request (the client's `httpx`, `httpcore` loggers)."""
    (tmp_path / "remote_app.py").write_text(REMOTE_APP)
    port = _free_port()
    made = {name: _tokens.new_client(name, scopes) for name, scopes in CLIENTS.items()}
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("STEPWARDEN_")},
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "STEPWARDEN_AGENT_TOKEN": made["shipper"][0],
    }
    log_path = tmp_path / "remote.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(  # noqa: ASYNC220 - started once, not waited for here
            [sys.executable, "-c", "from stepwarden.cli import main; main()",
             "--app", "remote_app:app", "worker", "--agent-url", f"http://127.0.0.1:{port}",
             "--poll-interval", "0.05", "--agent-heartbeat", "0.2", "--agent-gone-after", "1"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def said() -> list[str]:
            return [line for line in log_path.read_text().splitlines() if UNREACHED in line]

        async def tried_four_times() -> list[str] | None:
            assert proc.poll() is None, log_path.read_text()
            found = said()
            return found if len(found) >= 4 else None

        unreached = await until("the remote worker to try four times", tried_four_times)
        # Each failure said once, each try after the growing delay of the one before.
        stamps = [
            datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() for line in unreached
        ]
        gaps = [later - earlier for earlier, later in itertools.pairwise(stamps)]
        for failures, gap in enumerate(gaps, start=1):
            assert gap >= 0.9 * after_transient(failures), (gaps, unreached)
        assert "ConnectError" in unreached[0], unreached[0]
        with api_server(lambda: Remote(store_url).app, CLIENTS, tmp_path, port=port, made=made):
            worker_app = Remote(store_url).app
            options = dataclasses.replace(FAST, agents=frozenset({"local"}))
            async with worker_app, running(worker_app, options):
                task_id = await worker_app.submit_async("order", 4)
                done = await worker_app.result_async(task_id, timeout=TIMEOUT)
                assert done == {"shipped": 8, "by": "process"}
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(proc.wait, TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log_path.read_text()
    assert "serving agent(s) remote" in text, text
    assert len(said()) == len([x for x in text.splitlines() if "WARNING" in x and UNREACHED in x])
    assert not [x for x in text.splitlines() if " httpx: " in x or " httpcore" in x], text


class TwoServices:
    """An App whose two agents are served over HTTP by clients of their own: `payments` by
    `payer`, `shipping` by `shipper`; each workflow is one step of one of them."""

    CLIENTS: dict[str, Iterable[str]] = {
        "payer": ("agent:payments",),
        "shipper": ("agent:shipping",),
    }

    def __init__(self, store_url: str) -> None:
        self.app = sw.App("two-services", store=store_url)
        payments = self.app.agent("payments")
        shipping = self.app.agent("shipping")

        @payments.operation
        async def charge(call: sw.Call, n: int) -> int:
            return n

        @shipping.operation
        async def ship(call: sw.Call, n: int) -> int:
            return n

        @self.app.workflow(name="pay")
        async def pay(ctx: sw.Context, n: int) -> int:
            charged: int = await ctx.step(charge, n)
            return charged

        @self.app.workflow(name="ship")
        async def ship_it(ctx: sw.Context, n: int) -> int:
            shipped: int = await ctx.step(ship, n)
            return shipped


async def test_a_wake_up_names_to_an_instance_only_the_tasks_of_the_steps_it_holds(
    store_url: str, tmp_path: Path
) -> None:
    """The wake-up stream says which tasks' calls may have to stop: to each instance, only
    those of the steps it holds. A shipping task cancelled reaches the shipping instance that
    holds its step, not another instance of that client, nor the payments client's."""
    services = TwoServices(store_url)
    with api_server(lambda: TwoServices(store_url).app, TwoServices.CLIENTS, tmp_path) as (
        url,
        tokens,
    ):
        options = dataclasses.replace(FAST, roles=frozenset({"scheduler", "supervisor"}))
        async with (
            services.app,
            running(services.app, options),
            httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as http,
        ):
            streams: dict[str, asyncio.Queue[list[str]]] = {}
            readers = []
            agent_of = {"payer": "payments", "shipper": "shipping"}

            def auth(instance: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {tokens[instance.partition('/')[0]]}"}

            async def follow(instance: str, ready: asyncio.Event) -> None:
                """Each `calls` event of the instance's stream, in order."""
                agent = agent_of[instance.partition("/")[0]]
                async with http.stream(
                    "GET",
                    f"{AGENTS}/{agent}/wakeups",
                    params={"instance": instance},
                    headers=auth(instance),
                    timeout=httpx.Timeout(None, connect=TIMEOUT),
                ) as answer:
                    assert answer.status_code == 200
                    event = ""
                    async for line in answer.aiter_lines():
                        ready.set()
                        if line.startswith("event:"):
                            event = line.removeprefix("event:").strip()
                        elif line.startswith("data:") and event == "calls":
                            await streams[instance].put(json.loads(line.removeprefix("data:")))

            operation_of = {"payments": "charge", "shipping": "ship"}
            for instance in ("payer/a", "shipper/a", "shipper/b"):
                agent = agent_of[instance.partition("/")[0]]
                beat = {"instance": instance, "operations": [operation_of[agent]], "ttl": 60}
                answer = await http.post(
                    f"{AGENTS}/{agent}/beat", json={**beat, "capacity": 1}, headers=auth(instance)
                )
                assert answer.status_code == 204, answer.text
                streams[instance] = asyncio.Queue()
                ready = asyncio.Event()
                readers.append(asyncio.create_task(follow(instance, ready)))
                await asyncio.wait_for(ready.wait(), TIMEOUT)
            try:

                async def claim(instance: str, task_id: str) -> None:
                    """Submit `task_id`, and have `instance` claim its step."""
                    agent = agent_of[instance.partition("/")[0]]
                    workflow = "pay" if agent == "payments" else "ship"
                    await services.app.submit_async(workflow, 1, task_id=task_id)
                    body = {"instance": instance, "operations": [operation_of[agent]]}

                    async def claimed() -> Any:
                        answer = await http.post(
                            f"{AGENTS}/{agent}/claim",
                            json={**body, "limit": 1, "wait": 1},
                            headers=auth(instance),
                        )
                        assert answer.status_code == 200, answer.text
                        return answer.json()["requests"]

                    [request] = await until(f"{instance} to claim {task_id}", claimed)
                    assert request["task_id"] == task_id

                async def told(instance: str) -> list[str]:
                    return await asyncio.wait_for(streams[instance].get(), TIMEOUT)

                await claim("shipper/a", "ship-1")
                await claim("payer/a", "pay-1")
                await services.app.cancel_async("ship-1")
                assert await told("shipper/a") == ["ship-1"]
                await claim("shipper/b", "ship-2")
                await services.app.cancel_async("ship-2")
                assert await told("shipper/b") == ["ship-2"]  # not ship-1: it never held it
                await services.app.cancel_async("pay-1")
                assert await told("payer/a") == ["pay-1"]  # neither shipping task came before
                await claim("shipper/a", "ship-3")
                await services.app.cancel_async("ship-3")
                assert await told("shipper/a") == ["ship-3"]  # not ship-2, nor pay-1
                assert all(queue.empty() for queue in streams.values())
            finally:
                for reader in readers:
                    reader.cancel()
                await asyncio.gather(*readers, return_exceptions=True)


async def test_the_server_serves_what_every_runner_agrees_on_and_cuts_long_errors(
    store_url: str, served: Server
) -> None:
    remote = Remote(store_url)
    async with remote.app, httpx.AsyncClient(base_url=served.url, timeout=TIMEOUT) as http:
        auth = served.auth("shipper")
        me = (await http.get(f"{AGENTS}/whoami", headers=auth)).json()
        # The engine's own retry policy and bounds: a runner in another language copies none.
        default = sw.Retry()
        assert me["retry"] == {
            "max_attempts": default.max_attempts,
            "initial": default.initial,
            "maximum": default.maximum,
            "multiplier": default.multiplier,
            "jitter": default.jitter,
        }
        assert me["retry_bounds"] == {"max_delay": MAX_DELAY, "max_exponent": MAX_EXPONENT}
        breaker = sw.Breaker()
        assert me["breaker"] == {
            "failures": breaker.failures,
            "reset_after": breaker.reset_after,
            "trial_calls": breaker.trial_calls,
        }
        assert me["bounds"]["max_error"] == MAX_ERROR
        assert me["bounds"]["max_reason"] == MAX_REASON
        await remote.app.submit_async("order", 3, task_id="long-error")
        instance = "shipper/by-hand"
        beat = {"instance": instance, "operations": ["ship"], "capacity": 1, "ttl": 30}
        assert (await http.post(f"{AGENTS}/remote/beat", json=beat, headers=auth)).is_success

        async def claimed() -> list[dict[str, Any]]:
            claim = {"instance": instance, "operations": ["ship"], "limit": 1, "wait": 1}
            answer = await http.post(f"{AGENTS}/remote/claim", json=claim, headers=auth)
            found: list[dict[str, Any]] = answer.json()["requests"]
            return found

        [request] = await until("the remote step to be queued", claimed)
        error = "RuntimeError: " + "x" * (3 * MAX_ERROR)
        item = {
            "task_id": "long-error",
            "seq": request["seq"],
            "attempt": request["attempt"],
            "instance": instance,
            "state": "failed",
            "error": error,
        }
        answer = await http.post(f"{AGENTS}/remote/complete", json={"items": [item]}, headers=auth)
        assert answer.json() == {"applied": [True]}, answer.text
        with pytest.raises(sw.TaskFailed):
            await remote.app.result_async("long-error", timeout=TIMEOUT)
        store = await remote.app.store()
        [step] = [s for s in await store.get_steps("long-error") if s.seq == request["seq"]]
        # Cut as the Python runner cuts its own: the stored error says how long it was.
        assert step.error == error_text(error)
        assert step.error is not None and len(step.error) == MAX_ERROR
        assert step.error.endswith(f"[cut: {len(error)} characters in all]")
