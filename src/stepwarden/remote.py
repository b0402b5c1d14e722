"""An agent served over HTTP: what an agent runner asks of the store (`store.ports.AgentPort`),
asked of a stepwarden server's agent protocol instead (`/api/v1/agents/{agent}/...`, served by
`stepwarden dashboard` with a tokens file), so that the agent's process holds no database
connection, and a service in another language can do the same with the same routes.

Every write names the fencing token its claim gave: the step (task id, seq), its attempt and
the agent instance that holds it; the server applies it only while the step is still held so,
exactly as the store does for an agent in the worker's process: a late or zombie remote agent
changes nothing. The token names the agents it may serve (`agent:NAME` scopes), and the
instance names of its agents start with the client's name (`CLIENT/...`).

Wake-ups come from one server-sent event stream per agent (`/wakeups`: requests queued for
the agent, calls to stop): a lost one costs a poll interval. A connection refused, a timeout
or a 5xx answer is a TransientStoreError (tried again as a store's); a refusal (4xx) is a
PermanentStoreError with the server's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import httpx

from . import _json
from ._aio import first
from .errors import ConfigurationError, PermanentStoreError, TransientStoreError
from .records import (
    AgentBeat,
    CallStop,
    OpLimit,
    Request,
    RequestHandback,
    StepOutcome,
)
from .sealing import Keyring
from .store import CHANNEL_CALLS, CHANNEL_REQUESTS, Subscription
from .store.base import Notifier

logger = logging.getLogger("stepwarden.remote")

PREFIX = "/api/v1/agents"
TIMEOUT = httpx.Timeout(30.0, connect=5.0)
_CHANNELS = {CHANNEL_REQUESTS: CHANNEL_REQUESTS, CHANNEL_CALLS: CHANNEL_CALLS}
"""The wake-up stream's events, and the channel each feeds."""
RECONNECT = 1.0
"""Seconds before the wake-up stream is opened again after it failed."""


class RemoteAgentPort:
    """The agent protocol's client for one process's agent runners (`AgentRunner(store=...)`):
    `url` is the server's base URL (`https://ops.example.com`), `token` a client's token
    with an `agent:NAME` scope for each agent served."""

    default_poll_interval = 1.0
    wakeups_live = False
    """Its wake-up stream may miss some: the poll interval stays."""
    keys: Keyring | None = None
    """Results go to the server plain (over its TLS): the server seals them."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"the agent server's URL is http(s)://..., not {url!r}")
        if not token:
            raise ConfigurationError("the agent server needs a client's token")
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=TIMEOUT,
            transport=transport,
        )
        self.notifier = Notifier()
        self.lost_at = -float("inf")
        self._streams: dict[str, asyncio.Task[None]] = {}
        self._back: asyncio.Event | None = None
        self._agents: dict[tuple[str, int], str] = {}
        """The agent of each step claimed (task id, seq), whose routes its writes take;
        forgotten once its outcome, stop or hand-back is written."""
        self._spoken: dict[str, str] = {}
        """For each instance, the last agent it beat or claimed for: the route of a write
        about a step whose agent is not known here (forgotten after a refused outcome, say,
        when the call then asks whether it lost its step and says it stopped). The server
        fences every write by the step's instance and attempt, whichever of the instance's
        agents the route names."""

    async def aclose(self) -> None:
        for task in self._streams.values():
            task.cancel()
        await asyncio.gather(*self._streams.values(), return_exceptions=True)
        self._streams.clear()
        await self._client.aclose()

    # -- calls ----------------------------------------------------------------------------
    async def _post(self, agent: str, path: str, body: Mapping[str, Any]) -> Any:
        try:
            answer = await self._client.post(f"{PREFIX}/{agent}/{path}", json=body)
        except httpx.HTTPError as exc:
            self.lost_at = time.monotonic()
            raise TransientStoreError(f"the agent server at {self.url}: {exc!r}") from exc
        if answer.status_code >= 500 or answer.status_code == 429:
            raise TransientStoreError(
                f"the agent server at {self.url} answered {answer.status_code}: {_said(answer)}"
            )
        if answer.status_code >= 400:
            raise PermanentStoreError(
                f"the agent server at {self.url} refused {path} for agent {agent!r} "
                f"({answer.status_code}): {_said(answer)}"
            )
        self._answered()
        return None if answer.status_code == 204 else answer.json()

    def _answered(self) -> None:
        back, self._back = self._back, None
        if back is not None:
            back.set()

    async def wait_to_retry(self, seconds: float, stop: asyncio.Event | None = None) -> None:
        if self._back is None:
            self._back = asyncio.Event()
        waits = [self._back.wait(), asyncio.sleep(seconds)]
        if stop is not None:
            waits.append(stop.wait())
        await first(*waits)

    async def whoami(self) -> tuple[str, list[str]]:
        """The client the token names, and the agents it may serve."""
        try:
            answer = await self._client.get(f"{PREFIX}/whoami")
        except httpx.HTTPError as exc:
            raise TransientStoreError(f"the agent server at {self.url}: {exc!r}") from exc
        if answer.status_code >= 500 or answer.status_code == 429:
            raise TransientStoreError(
                f"the agent server at {self.url} answered {answer.status_code}: {_said(answer)}"
            )
        if answer.status_code != 200:
            raise ConfigurationError(
                f"the agent server at {self.url} refused the token ({answer.status_code}): "
                f"{_said(answer)}"
            )
        body = answer.json()
        return str(body["client"]), [str(a) for a in body["agents"]]

    # -- the registry ---------------------------------------------------------------------
    async def beat(self, beats: Sequence[AgentBeat], ttl: float) -> None:
        for b in beats:
            body = {
                "instance": b.instance,
                "operations": list(b.operations),
                "capacity": b.capacity,
                "inflight": b.inflight,
                "breaker": b.breaker,
                "breaker_detail": b.breaker_detail,
                "ttl": ttl,
            }
            await self._post(b.agent, "beat", body)
            self._spoken[b.instance] = b.agent
            self._follow(b.agent, b.instance)

    async def leave(self, instance: str, agents: Sequence[str]) -> None:
        for agent in agents:
            await self._post(agent, "leave", {"instance": instance})

    async def record_events(self, events: Sequence[tuple[str | None, str, Any]]) -> None:
        for task_id, kind, detail in events:
            if kind != "breaker" or task_id is not None:
                raise PermanentStoreError(f"an agent served over HTTP records no {kind!r} event")
            await self._post(str(detail["agent"]), "breaker", {
                "instance": detail["instance"], "state": detail["state"]
            })  # fmt: skip

    # -- requests -------------------------------------------------------------------------
    async def claim_requests(
        self,
        instance: str,
        agent: str,
        operations: Sequence[str],
        limit: int,
        limits: Mapping[str, OpLimit] | None = None,
        *,
        fairly: bool = True,
    ) -> list[Request]:
        # Whether the claim is shared among the tenants is the server's to decide, from the
        # claims of this instance it answered (`dashboard._agent_api.LastClaims`): `fairly`
        # is not sent.
        if limit <= 0 or not operations:
            return []
        body = {
            "instance": instance,
            "operations": list(operations),
            "limit": limit,
            "limits": {
                op: {"concurrency": x.concurrency, "rate": x.rate, "per": x.per, "room": x.room}
                for op, x in (limits or {}).items()
            },
        }
        answer = await self._post(agent, "claim", body)
        return self._claimed(instance, agent, answer["requests"])

    async def held_steps(self, instance: str, agent: str) -> list[Request]:
        answer = await self._post(agent, "held", {"instance": instance})
        return self._claimed(instance, agent, answer["requests"])

    def _claimed(
        self, instance: str, agent: str, rows: Sequence[Mapping[str, Any]]
    ) -> list[Request]:
        self._spoken[instance] = agent
        requests = [_request(r) for r in rows]
        for r in requests:
            self._agents[(r.task_id, r.seq)] = agent
        return requests

    def _agent_of(self, task_id: str, seq: int, instance: str) -> str:
        """The agent whose route takes a write about step (task_id, seq) by `instance`: the
        one it was claimed for, else the last one the instance spoke for."""
        agent = self._agents.get((task_id, seq)) or self._spoken.get(instance)
        if agent is None:
            raise PermanentStoreError(
                f"agent instance {instance!r} has neither beat nor claimed through this "
                f"client of {self.url}: no agent to write about {task_id}/{seq} for"
            )
        return agent

    async def lost_calls(
        self, instance: str, calls: Sequence[tuple[str, int, int]]
    ) -> dict[tuple[str, int, int], str]:
        if not calls:
            return {}
        found: dict[tuple[str, int, int], str] = {}
        for agent, group in self._by_agent(instance, calls).items():
            body = {
                "instance": instance,
                "calls": [{"task_id": t, "seq": s, "attempt": a} for t, s, a in group],
            }
            answer = await self._post(agent, "lost", body)
            for c in answer["lost"]:
                found[(c["task_id"], c["seq"], c["attempt"])] = c["why"]
        return found

    def _by_agent(
        self, instance: str, calls: Sequence[tuple[str, int, int]]
    ) -> dict[str, list[Any]]:
        """Calls grouped by the agent of their route (`_agent_of`)."""
        groups: dict[str, list[Any]] = {}
        for call in calls:
            groups.setdefault(self._agent_of(call[0], call[1], instance), []).append(call)
        return groups

    # -- a step's calls -------------------------------------------------------------------
    async def heartbeat_step(
        self, task_id: str, seq: int, attempt: int, instance: str, detail: str | None
    ) -> float | None:
        body = {
            "task_id": task_id,
            "seq": seq,
            "attempt": attempt,
            "instance": instance,
            "detail": None if detail is None else json.loads(detail),
        }
        answer = await self._post(self._agent_of(task_id, seq, instance), "heartbeat", body)
        remaining = answer["remaining"]
        return None if remaining is None else float(remaining)

    async def complete_steps(self, batch: Sequence[StepOutcome]) -> list[bool]:
        return await self._fenced("complete", batch, lambda o: {
            "state": str(o.state),
            "result": None if o.result is None else json.loads(o.result),
            "error": o.error,
            "tries": o.tries,
        })  # fmt: skip

    async def stop_calls(self, batch: Sequence[CallStop]) -> list[bool]:
        return await self._fenced("stopped", batch, lambda s: {"reason": s.reason})

    async def hand_back(self, batch: Sequence[RequestHandback]) -> list[bool]:
        return await self._fenced("hand-back", batch, lambda h: {"reason": h.reason})

    async def _fenced(self, path: str, batch: Sequence[Any], more: Any) -> list[bool]:
        """Each item of `batch` (a write fenced by task, seq, attempt and instance) to the
        route `path` of its agent; True for each the server applied."""
        answers: dict[int, bool] = {}
        groups: dict[str, list[int]] = {}
        for i, item in enumerate(batch):
            agent = self._agent_of(item.task_id, item.seq, item.agent_instance)
            groups.setdefault(agent, []).append(i)
        for agent, indexes in groups.items():
            items = [
                {
                    "task_id": batch[i].task_id,
                    "seq": batch[i].seq,
                    "attempt": batch[i].attempt,
                    "instance": batch[i].agent_instance,
                    **more(batch[i]),
                }
                for i in indexes
            ]
            answer = await self._post(agent, path, {"items": items})
            answers.update(zip(indexes, answer["applied"], strict=True))
        for item in batch:
            self._agents.pop((item.task_id, item.seq), None)
        return [answers[i] for i in range(len(batch))]

    # -- wake-ups -------------------------------------------------------------------------
    def subscribe(self, channel: str) -> Subscription:
        return self.notifier.subscribe(channel)

    def unsubscribe(self, channel: str, sub: Subscription) -> None:
        self.notifier.unsubscribe(channel, sub)

    def _follow(self, agent: str, instance: str) -> None:
        """Keep a wake-up stream open for `agent` (from its first beat on)."""
        if agent not in self._streams:
            self._streams[agent] = asyncio.create_task(
                self._wakeups(agent, instance), name=f"stepwarden-wakeups-{agent}"
            )

    async def _wakeups(self, agent: str, instance: str) -> None:
        while True:
            try:
                async with self._client.stream(
                    "GET",
                    f"{PREFIX}/{agent}/wakeups",
                    params={"instance": instance},
                    timeout=httpx.Timeout(None, connect=5.0),
                ) as answer:
                    if answer.status_code != 200:
                        logger.warning(
                            "agent %s: the wake-up stream was refused (%d); polling",
                            agent,
                            answer.status_code,
                        )
                        return
                    event = ""
                    async for line in answer.aiter_lines():  # until the server ends it
                        if line.startswith("event:"):
                            event = line[6:].strip()
                        elif line.startswith("data:") and event in _CHANNELS:
                            payloads = json.loads(line[5:])
                            self.notifier.publish(_CHANNELS[event], payloads)
                continue  # it ended in time: opened again at once
            except httpx.HTTPError as exc:
                logger.debug("agent %s: the wake-up stream ended: %r", agent, exc)
            await asyncio.sleep(RECONNECT)


def _request(row: Mapping[str, Any]) -> Request:
    request = Request(
        task_id=row["task_id"],
        seq=row["seq"],
        attempt=row["attempt"],
        agent=row["agent"],
        operation=row["operation"],
        input=_json.revive(row["input"], what=f"the input of {row['task_id']}/{row['seq']}"),
        idempotency_key=row["idempotency_key"],
        complete_by=datetime.fromisoformat(row["complete_by"]),
        remaining=float(row["remaining"]),
        compensates=row.get("compensates"),
        queued=row.get("queued"),
        workflow=row.get("workflow"),
        trace_context=row.get("trace_context"),
    )
    return request


def _said(answer: httpx.Response) -> str:
    with contextlib.suppress(ValueError):
        body = answer.json()
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            return str(body["error"])
    return answer.text[:300]


__all__ = ["RemoteAgentPort"]
