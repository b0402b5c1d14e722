"""The agent contract over the TypeScript library (transport `typescript`): its protocol
module and its agent runner, in a Node process that talks JSON lines with the test
(clients/typescript/test/contract.ts).

- `TypeScriptAgentPort`: a `store.ports.AgentPort` whose every call of the agent protocol is
  forwarded as a JSON line to a Node process that makes it with the library's
  `AgentProtocol` (the wire's JSON is built and read as `RemoteAgentPort` does).
- `TypeScriptWorkers`: `running(app, options)` with the App's agents served by the library's
  `Agent` runner in a Node process: each agent and operation the App declares, with its retry
  policy and circuit breaker; each call is reported back to the test, which calls the App's
  operation (its `Call` says what the TypeScript call was given) and answers what it
  returned or raised (and whether its retry policy takes that error as permanent); its log
  goes to the Python runner's logger. The scheduler and the supervisor run in a Python worker
  on the store."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import shutil
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, cast

import stepwarden as sw
from stepwarden.agent import Call, CallHold
from stepwarden.deadline import Deadline
from stepwarden.errors import ConfigurationError, PermanentStoreError, TransientStoreError
from stepwarden.remote import RemoteAgentPort
from stepwarden.retry import Retry

from ..agentserver import AgentServer, agent_server

LINE_LIMIT = 64 * 1024 * 1024
"""The longest JSON line read from the Node process (an operation's argument may be big)."""
STARTS_WITHIN = 30.0
AGENT_LOG = logging.getLogger("stepwarden.agent")
"""Where the TypeScript runner's log goes: the Python runner's logger."""


class _Node:
    """A Node process of contract.js in `mode`, talking JSON lines."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.next = 0

    @classmethod
    async def start(cls, build: Path, mode: str, config: Mapping[str, Any]) -> _Node:
        process = await asyncio.create_subprocess_exec(
            _node(),
            str(build / "test" / "contract.js"),
            mode,
            json.dumps(config),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=sys.stderr,
            limit=LINE_LIMIT,
        )
        return cls(process)

    async def send(self, line: Mapping[str, Any]) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(json.dumps(line).encode() + b"\n")
        await stdin.drain()

    async def lines(self) -> AsyncIterator[dict[str, Any]]:
        stdout = self.process.stdout
        assert stdout is not None
        while text := await stdout.readline():
            yield json.loads(text)

    async def close(self) -> None:
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


def _node() -> str:
    found = shutil.which("node")
    assert found, "node is not installed: the TypeScript library needs Node 20+"
    return found


class TypeScriptAgentPort(RemoteAgentPort):
    """RemoteAgentPort whose requests are made by the TypeScript library's protocol module,
    in a Node process (`start`). No wake-up stream: the calls are polled."""

    def __init__(self, url: str, token: str, node: _Node) -> None:
        super().__init__(url, token)
        self.node = node
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, build: Path, url: str, token: str) -> TypeScriptAgentPort:
        node = await _Node.start(build, "protocol", {"url": url, "token": token})
        return cls(url, token, node)

    async def _read(self) -> None:
        async for line in self.node.lines():
            future = self.node.waiting.pop(int(line["id"]), None)
            if future is not None and not future.done():
                future.set_result(line)
        for future in self.node.waiting.values():
            if not future.done():
                future.set_exception(TransientStoreError("the Node process ended"))

    async def _call(self, agent: str, route: str, body: Mapping[str, Any] | None) -> Any:
        self.node.next += 1
        key = self.node.next
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.node.waiting[key] = future
        await self.node.send({"id": key, "agent": agent, "route": route, "body": body})
        line = await future
        if "error" not in line:
            self._answered()
            return line["answer"]
        status, message = int(line["error"]["status"]), str(line["error"]["message"])
        if status == 0 or status == 429 or status >= 500:
            raise TransientStoreError(f"the agent server at {self.url}: {message}")
        if status < 0:
            raise AssertionError(f"the TypeScript protocol module failed: {message}")
        raise PermanentStoreError(
            f"the agent server at {self.url} refused {route} for agent {agent!r} "
            f"({status}): {message}"
        )

    async def _post(self, agent: str, path: str, body: Mapping[str, Any]) -> Any:
        return await self._call(agent, path, body)

    async def whoami(self) -> tuple[str, list[str]]:
        try:
            answer = await self._call("", "whoami", None)
        except PermanentStoreError as exc:
            raise ConfigurationError(str(exc)) from exc
        return str(answer["client"]), [str(a) for a in answer["agents"]]

    def _follow(self, agent: str, instance: str) -> None:
        return None

    async def aclose(self) -> None:
        await self.node.close()
        await self.reader
        await super().aclose()


@dataclasses.dataclass
class _Forwarded:
    """The hold of a call the TypeScript runner makes: what the App's operation reads."""

    loop: asyncio.AbstractEventLoop
    deadline: Deadline
    cancelled: str | None = None

    async def heartbeat(self, details: Any) -> None:
        if self.cancelled is not None:
            raise sw.StepLost(self.cancelled)
        raise AssertionError("the operations of the contract tests beat only once stopped")


def _forget(held: dict[int, Any], key: int, _: object) -> None:
    held.pop(key, None)


def _retry(retry: Retry) -> dict[str, Any]:
    """A retry policy as the TypeScript runner's options say it."""
    return {
        "maxAttempts": retry.max_attempts,
        "initialMs": retry.initial * 1000,
        "maxMs": retry.maximum * 1000,
        "multiplier": retry.multiplier,
        "jitter": retry.jitter,
    }


class TypeScriptWorkers:
    """`running(app, options)`: the App's agents served by the TypeScript runner (see the
    module's description) over a server started at the first use and stopped with `stack`."""

    def __init__(self, build: Path, tmp_path: Path) -> None:
        self.build = build
        self.tmp_path = tmp_path
        self.stack = contextlib.ExitStack()
        self.served: AgentServer | None = None

    @contextlib.asynccontextmanager
    async def __call__(
        self, app: sw.App, options: sw.WorkerOptions | None = None
    ) -> AsyncIterator[sw.Worker]:
        from ..support.worker import FAST

        options = options or FAST
        if self.served is None:
            self.served = self.stack.enter_context(
                agent_server(app.store_url, app.agents, self.tmp_path)
            )
        config = {
            "url": self.served.url,
            "token": self.served.token,
            "agents": [
                {
                    "name": name,
                    "operations": {
                        op_name: {"retry": _retry(op.retry)}
                        for op_name, op in agent.operations.items()
                    },
                    "breaker": None
                    if agent.breaker is None
                    else {
                        "failures": agent.breaker.failures,
                        "resetAfterMs": agent.breaker.reset_after * 1000,
                        "trialCalls": agent.breaker.trial_calls,
                    },
                }
                for name, agent in sorted(app.agents.items())
                if agent.operations
            ],
            "options": {
                "concurrency": min(options.agent_concurrency, 1000),
                "heartbeatMs": options.agent_heartbeat * 1000,
                "goneAfterMs": options.agent_gone_after * 1000,
                # The runner's own default when the options leave it to the store's.
                **(
                    {}
                    if options.poll_interval is None
                    else {"pollMs": options.poll_interval * 1000}
                ),
                "drainMs": options.drain_timeout * 1000,
            },
        }
        back = sw.Worker(
            app, dataclasses.replace(options, roles=frozenset({"scheduler", "supervisor"}))
        )
        running = asyncio.create_task(back.run())
        node = await _Node.start(self.build, "agents", config)
        registered = asyncio.get_running_loop().create_future()
        calls: set[asyncio.Task[None]] = set()
        failures: list[str] = []

        held: dict[int, tuple[asyncio.Task[None], _Forwarded, bool]] = {}

        async def serve() -> None:
            async for line in node.lines():
                if line.get("kind") == "call":
                    hold = _Forwarded(asyncio.get_running_loop(), Deadline.after(60.0))
                    task = asyncio.create_task(self._answer(app, node, line, hold))
                    calls.add(task)
                    op = app.agents[str(line["agent"])].operations[str(line["operation"])]
                    held[int(line["id"])] = (task, hold, op.is_async)
                    task.add_done_callback(calls.discard)
                    task.add_done_callback(functools.partial(_forget, held, int(line["id"])))
                elif line.get("kind") == "aborted" and int(line["id"]) in held:
                    # As the Python runner stops a call: `call.cancelled` says why, and an
                    # async operation is cancelled.
                    task, hold, is_async = held[int(line["id"])]
                    hold.cancelled = str(line["reason"])
                    if is_async:  # a sync one sees `call.cancelled`
                        task.cancel()
                elif line.get("kind") == "registered" and not registered.done():
                    registered.set_result(line["instances"])
                elif line.get("kind") == "log":
                    level = logging.getLevelName(str(line["level"]).upper())
                    AGENT_LOG.log(level, "%s", line["message"])
                elif line.get("kind") == "failed":
                    failures.append(str(line["error"]))
            if not registered.done():
                registered.set_exception(AssertionError("the TypeScript agents ended"))

        reading = asyncio.create_task(serve())
        try:
            await asyncio.wait_for(asyncio.shield(registered), STARTS_WITHIN)
            yield back
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                await node.send({"kind": "stop"})
            await node.close()
            await reading
            for task in list(calls):
                task.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            back.stop.set()
            await asyncio.wait_for(running, 30)
        assert not failures, failures

    async def _answer(
        self, app: sw.App, node: _Node, line: Mapping[str, Any], hold: _Forwarded
    ) -> None:
        """Call the App's operation the TypeScript runner called, and answer it (also once
        it was cancelled: the TypeScript call then ends)."""
        op = app.agents[str(line["agent"])].operations[str(line["operation"])]
        given = line["call"]
        call = Call(
            task_id=given["taskId"],
            step=given["seq"],
            attempt=given["attempt"],
            try_number=given["tryNumber"],
            idempotency_key=given["idempotencyKey"],
            hold=cast(CallHold, hold),
            compensates_key=given["compensatesKey"],
        )
        answer: dict[str, Any]
        try:
            value = await op.invoke(call, list(line["args"]))
            answer = {"id": line["id"], "value": value}
        except (Exception, asyncio.CancelledError) as exc:
            answer = {
                "id": line["id"],
                "error": {
                    "name": type(exc).__name__,
                    "message": str(exc),
                    "permanent": op.retry.is_permanent(exc),
                },
            }
        with contextlib.suppress(OSError, RuntimeError):
            await node.send(answer)
