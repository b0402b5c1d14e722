"""The agent protocol: an agent served over HTTP, by a process in any language that holds no
database connection (`remote.RemoteAgentPort` is its Python client). Its routes, under
`/api/v1/agents/{agent}/`, are what an agent runner asks of the store, asked of this server:
register and beat, claim requests (a long poll), beat a call, complete or fail it, hand it
back, say it stopped, and a stream of wake-ups.

A client's token serves the agents its scopes name (`agent:NAME`, 403 otherwise), and its
instances are named after it (`CLIENT/...`, 403 otherwise): every write about a step names
the fencing token its claim gave (task_id, seq, attempt, instance), and the store applies it
only while the step is held so (`Store.complete_steps`, `heartbeat_step`, ...). A late or
zombie remote agent changes nothing, exactly as one in a worker's process; and a client can
only ever touch the steps its own instances claimed, for the agents it may serve.

A client's settings in the tokens file bound its alive registrations, their capacity and
ttl, and its claims that wait and its wake-up streams at once (`_quotas.py`).

An instance's wake-up stream tells it of the tasks whose calls may have to stop only when it
holds one of their steps: the server remembers the steps it handed each instance (`Held`),
from the answers of its claims and of `held`, until they are written or their complete_by
passes. The tasks of other clients and instances are never named to it.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations.

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from starlette.responses import Response

from .. import _json, _tokens
from ..app import App
from ..errors import ConfigurationError, StoreError
from ..records import (
    AgentBeat,
    CallStop,
    OpLimit,
    RequestHandback,
    StepOutcome,
)
from ..records import (
    Request as StepRequest,
)
from ..rules import claim_fairly
from ..sealing import Binding
from ..states import StepState
from ..store import CHANNEL_CALLS, CHANNEL_REQUESTS, Store
from ._agent_models import (
    BOUNDS,
    BREAKER_DEFAULTS,
    RETRY_BOUNDS,
    RETRY_DEFAULTS,
    AppliedAnswer,
    BeatRequest,
    BreakerRequest,
    ClaimRequest,
    CompleteRequest,
    Handback,
    HandbackRequest,
    HeartbeatAnswer,
    HeartbeatRequest,
    InstanceRequest,
    LostAnswer,
    LostRequest,
    RequestsAnswer,
    WhoAmI,
)
from ._api import json_response
from ._app_api import (
    AGENTS,
    ANY_AGENT,
    INVALID,
    SCOPES_KEY,
    TOO_BIG,
    ClientEntry,
    ClientName,
    _answers,
    _as_json,
    _scoped,
)
from ._quotas import HeldStream, Quotas

KEEPALIVE = 15.0
"""Seconds of silence after which the wake-up stream sends a comment (proxies keep it)."""

FORBIDDEN_INSTANCE = (
    "an instance of this client is named CLIENT/...: {instance!r} is not {client}'s"
)


def _mine(client: str, *instances: str) -> None:
    """Refused (403) when one of `instances` is not named after `client`: a client acts only
    as instances of its own."""
    for instance in instances:
        if not instance.startswith(client + "/"):
            detail = FORBIDDEN_INSTANCE.format(instance=instance, client=client)
            raise HTTPException(403, detail=detail)


def _fence(h: Handback) -> dict[str, Any]:
    """A hand-back's or a stop's fields, as its record names them."""
    return {
        "task_id": h.task_id,
        "seq": h.seq,
        "attempt": h.attempt,
        "agent_instance": h.instance,
        "reason": h.reason,
    }


HELD_GRACE = 5.0
"""Seconds past a step's complete_by that a wake-up about its task still reaches the instance
that held it (the supervisor may end the step after its deadline)."""
PRUNE_EVERY = 60.0


class Held:
    """The steps this server handed each agent instance (agent, instance -> task_id, seq ->
    when its hold ends, on this process's clock), from the answers of its claims and of
    `held`, until a write of the instance about them (complete, hand-back, stopped) or
    HELD_GRACE seconds past their complete_by (a heartbeat moves it on). Only what this
    server answered is known: an instance that claims through another server too is told of
    those steps' tasks by its poll (`lost`), as of any wake-up lost."""

    def __init__(self) -> None:
        self.steps: dict[tuple[str, str], dict[tuple[str, int], float]] = {}
        self.pruned = time.monotonic()

    def took(self, agent: str, instance: str, requests: Iterable[StepRequest]) -> None:
        now = time.monotonic()
        mine = None
        for r in requests:
            mine = mine if mine is not None else self.steps.setdefault((agent, instance), {})
            mine[(r.task_id, r.seq)] = now + r.remaining + HELD_GRACE
        if now - self.pruned > PRUNE_EVERY:
            self.pruned = now
            for key in list(self.steps):
                self._live(key, now)

    def beat(self, agent: str, instance: str, task_id: str, seq: int, left: float) -> None:
        mine = self.steps.get((agent, instance), {})
        if (task_id, seq) in mine:
            mine[(task_id, seq)] = time.monotonic() + left + HELD_GRACE

    def wrote(self, agent: str, instance: str, keys: Iterable[tuple[str, int]]) -> None:
        mine = self.steps.get((agent, instance))
        if mine is not None:
            for key in keys:
                mine.pop(key, None)
            if not mine:
                del self.steps[(agent, instance)]

    def left(self, instance: str, agents: Iterable[str]) -> None:
        for agent in agents:
            self.steps.pop((agent, instance), None)

    def tasks(self, agent: str, instance: str) -> set[str]:
        """The tasks of the steps the instance holds of `agent`."""
        mine = self._live((agent, instance), time.monotonic())
        return {task_id for task_id, _ in mine}

    def _live(self, key: tuple[str, str], now: float) -> dict[tuple[str, int], float]:
        mine = self.steps.get(key, {})
        for step in [step for step, until in mine.items() if until < now]:
            del mine[step]
        if not mine:
            self.steps.pop(key, None)
        return mine


class LastClaims:
    """The last claim this server made for each agent instance (agent, instance -> how
    many requests it took, of how many it asked for), which decides whether the next is
    shared among the tenants waiting or made by rank alone (`rules.claim_fairly`), as an
    instance claiming from the store itself decides from its own: an instance over HTTP gets
    the same fair share, whatever its client says. Forgotten when the instance leaves; an
    instance that claims through several servers is judged by each on its own claims."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], tuple[int, int]] = {}

    def fairly(self, agent: str, instance: str) -> bool:
        claimed, asked = self.last.get((agent, instance), (None, 0))
        return claim_fairly(last_claimed=claimed, last_asked=asked)

    def took(self, agent: str, instance: str, claimed: int, asked: int) -> None:
        self.last[(agent, instance)] = (claimed, asked)

    def left(self, instance: str, agents: Iterable[str]) -> None:
        for agent in agents:
            self.last.pop((agent, instance), None)


def _request_dict(r: StepRequest) -> dict[str, Any]:
    return {
        "task_id": r.task_id,
        "seq": r.seq,
        "attempt": r.attempt,
        "agent": r.agent,
        "operation": r.operation,
        "input": r.input,
        "idempotency_key": r.idempotency_key,
        "complete_by": r.complete_by,
        "remaining": r.remaining,
        "compensates": r.compensates,
        "queued": r.queued,
        "workflow": r.workflow,
        "trace_context": r.trace_context,
    }


def _requests(found: list[StepRequest]) -> Response:
    """The requests claimed, their inputs' secrets revealed (`_json.wire`): the agent's
    operations need them, as an agent in a worker's process gets them."""
    body = _json.wire({"requests": [_request_dict(r) for r in found]})
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})


def router(app: App, stopping: asyncio.Event, quotas: Quotas | None = None) -> APIRouter:
    """The agent protocol's routes, each under the scope of the agent its path names, each
    client within its bounds (`quotas`: by default, of this router's own); the claims' long
    polls and the wake-up streams end when `stopping` is set."""
    api = APIRouter()
    quotas = quotas or Quotas(app.destinations)
    held_by = Held()
    last_claims = LastClaims()
    scoped = _scoped("agent:{agent}")
    names: Any = Literal[tuple(sorted(app.agents))] if app.agents else str
    AgentName = Annotated[names, Path(description="An agent the App declares.")]

    async def store() -> Store:
        # The agents' calls are outside the application's port that `App.store()` gives
        # (`store.ports.ApplicationStore`): this API serves them from the Store it opened,
        # which a store of shards is not (each shard's agents are served on its own).
        db = await app.store()
        if not isinstance(db, Store):
            raise ConfigurationError(
                "the agent protocol is served over a store of one database, not of shards"
            )
        return db

    Db = Annotated[Store, Depends(store)]

    @api.get(
        f"{AGENTS}/whoami",
        operation_id="agentWhoAmI",
        summary="The client this token names, and the agents it may serve.",
        openapi_extra=_scoped(ANY_AGENT),
        responses=_answers(r200=(WhoAmI, "The client.")),
    )
    async def whoami(request: Request, client: ClientName) -> Response:
        scopes = request.scope.get("state", {}).get(SCOPES_KEY, ())
        agents = sorted(s.removeprefix("agent:") for s in scopes if s.startswith("agent:"))
        answer = WhoAmI(
            client=client,
            agents=agents,
            retry=RETRY_DEFAULTS,
            retry_bounds=RETRY_BOUNDS,
            breaker=BREAKER_DEFAULTS,
            bounds=BOUNDS,
        )
        return json_response(answer.model_dump(mode="json"))

    @api.post(
        f"{AGENTS}/{{agent}}/beat",
        operation_id="agentBeat",
        summary="Register or refresh an agent instance (its operations, capacity, breaker). "
        "A client's instances, their capacity and ttl are bounded by its settings (instances: "
        "429 past it; capacity, ttl: 422).",
        status_code=204,
        openapi_extra=scoped,
        responses=_answers(r413=TOO_BIG, r422=INVALID),
    )
    async def beat(
        agent: AgentName, body: BeatRequest, client: ClientName, entry: ClientEntry, db: Db
    ) -> Response:
        _mine(client, body.instance)
        quotas.check_beat(entry, body.capacity, body.ttl)
        async with quotas.registering(entry, body.instance, agent, db.client_agents):
            await db.beat(
                [
                    AgentBeat(
                        instance=body.instance,
                        agent=agent,
                        operations=tuple(sorted(set(body.operations))),
                        capacity=body.capacity,
                        inflight=body.inflight,
                        breaker=body.breaker,
                        breaker_detail=body.breaker_detail,
                    )
                ],
                body.ttl,
            )
        return Response(status_code=204)

    @api.post(
        f"{AGENTS}/{{agent}}/leave",
        operation_id="agentLeave",
        summary="An instance stopping: it leaves the registry, its running steps go to others.",
        status_code=204,
        openapi_extra=scoped,
        responses=_answers(r422=INVALID),
    )
    async def leave(
        agent: AgentName, body: InstanceRequest, client: ClientName, db: Db
    ) -> Response:
        _mine(client, body.instance)
        await db.leave(body.instance, [agent])
        held_by.left(body.instance, [agent])
        last_claims.left(body.instance, [agent])
        return Response(status_code=204)

    @api.post(
        f"{AGENTS}/{{agent}}/breaker",
        operation_id="agentBreaker",
        summary="Record a transition of the instance's circuit breaker.",
        status_code=204,
        openapi_extra=scoped,
        responses=_answers(r422=INVALID),
    )
    async def breaker(
        agent: AgentName, body: BreakerRequest, client: ClientName, db: Db
    ) -> Response:
        _mine(client, body.instance)
        detail = {"instance": body.instance, "agent": agent, "state": body.state}
        await db.record_events([(None, "breaker", detail)])
        return Response(status_code=204)

    @api.post(
        f"{AGENTS}/{{agent}}/claim",
        operation_id="agentClaim",
        summary="Claim queued requests of these operations, by priority (a long poll with "
        "`wait`): each is a step to call, with the fencing token of its writes.",
        openapi_extra=scoped,
        responses=_answers(
            r200=(RequestsAnswer, "The requests claimed (maybe none)."), r413=TOO_BIG, r422=INVALID
        ),
    )
    async def claim(
        agent: AgentName,
        body: ClaimRequest,
        client: ClientName,
        entry: ClientEntry,
        db: Db,
        request: Request,
    ) -> Response:
        _mine(client, body.instance)
        limits = {
            op: OpLimit(concurrency=x.concurrency, rate=x.rate, per=x.per, room=x.room)
            for op, x in body.limits.items()
        }

        async def take() -> list[StepRequest]:
            """The requests claimed, or none once the client has gone (an instance that
            stopped waiting, stopping itself): what a claim took as the client went is
            handed back at once rather than held by an instance that will never call it."""
            if await request.is_disconnected():
                return []
            fairly = last_claims.fairly(agent, body.instance)
            found = await db.claim_requests(
                body.instance, agent, body.operations, body.limit, limits, fairly=fairly
            )
            last_claims.took(agent, body.instance, len(found), body.limit)
            if found and await request.is_disconnected():
                await db.hand_back(
                    [
                        RequestHandback(
                            task_id=r.task_id,
                            seq=r.seq,
                            attempt=r.attempt,
                            agent_instance=body.instance,
                            reason="its claim's client went before the answer",
                        )
                        for r in found
                    ]
                )
                return []
            return found

        if body.wait <= 0:
            found = await take()
            held_by.took(agent, body.instance, found)
            return _requests(found)
        held = quotas.hold(entry, _tokens.POLLS)
        sub = db.subscribe(CHANNEL_REQUESTS)
        try:
            with contextlib.suppress(StoreError):
                await db.listen()
            loop = asyncio.get_running_loop()
            until = loop.time() + body.wait
            while True:
                found = await take()
                left = until - loop.time()
                if found or left <= 0 or stopping.is_set() or await request.is_disconnected():
                    held_by.took(agent, body.instance, found)
                    return _requests(found)
                await _woken(sub, agent, left, stopping, request.is_disconnected)
        finally:
            db.unsubscribe(CHANNEL_REQUESTS, sub)
            held.release()

    @api.post(
        f"{AGENTS}/{{agent}}/held",
        operation_id="agentHeld",
        summary="The steps of this agent the instance holds (a claim whose answer was lost "
        "leaves them so): call those it is not calling.",
        openapi_extra=scoped,
        responses=_answers(r200=(RequestsAnswer, "The steps held."), r422=INVALID),
    )
    async def held(agent: AgentName, body: InstanceRequest, client: ClientName, db: Db) -> Response:
        _mine(client, body.instance)
        found = await db.held_steps(body.instance, agent)
        held_by.took(agent, body.instance, found)
        return _requests(found)

    @api.post(
        f"{AGENTS}/{{agent}}/lost",
        operation_id="agentLost",
        summary="Which of these calls of the instance no longer hold their step (its task "
        "cancelled, paused or compensating, the step reassigned...): stop them.",
        openapi_extra=scoped,
        responses=_answers(
            r200=(LostAnswer, "The calls to stop, each with why."), r413=TOO_BIG, r422=INVALID
        ),
    )
    async def lost(agent: AgentName, body: LostRequest, client: ClientName, db: Db) -> Response:
        _mine(client, body.instance)
        keys = [(c.task_id, c.seq, c.attempt) for c in body.calls]
        found = await db.lost_calls(body.instance, keys)
        return json_response(
            {
                "lost": [
                    {"task_id": t, "seq": s, "attempt": a, "why": why}
                    for (t, s, a), why in found.items()
                ]
            }
        )

    @api.post(
        f"{AGENTS}/{{agent}}/heartbeat",
        operation_id="agentHeartbeat",
        summary="A running call's heartbeat: its step's complete_by moves on, never past its "
        "task's nor its total timeout.",
        openapi_extra=scoped,
        responses=_answers(
            r200=(HeartbeatAnswer, "The seconds left, or null: stop."), r422=INVALID
        ),
    )
    async def heartbeat(
        agent: AgentName, body: HeartbeatRequest, client: ClientName, db: Db
    ) -> Response:
        _mine(client, body.instance)
        detail = (
            None
            if body.detail is None
            else _json.dumps(
                _json.revive(body.detail),
                what="the detail",
                seal=_json.Seal(db.keys, Binding.step(body.task_id, body.seq)),
            )
        )
        remaining = await db.heartbeat_step(
            body.task_id, body.seq, body.attempt, body.instance, detail
        )
        if remaining is not None:
            held_by.beat(agent, body.instance, body.task_id, body.seq, remaining)
        return json_response({"remaining": remaining})

    @api.post(
        f"{AGENTS}/{{agent}}/complete",
        operation_id="agentComplete",
        summary="Record calls' outcomes (completed with a result, or failed with an error): "
        "each only while its step is held by its attempt and instance, before complete_by.",
        openapi_extra=scoped,
        responses=_answers(
            r200=(AppliedAnswer, "Which were recorded."), r413=TOO_BIG, r422=INVALID
        ),
    )
    async def complete(
        agent: AgentName, body: CompleteRequest, client: ClientName, db: Db
    ) -> Response:
        _mine(client, *(o.instance for o in body.items))
        outcomes = [
            StepOutcome(
                task_id=o.task_id,
                seq=o.seq,
                attempt=o.attempt,
                agent_instance=o.instance,
                state=StepState.COMPLETED if o.state == "completed" else StepState.FAILED,
                result=None
                if o.state == "failed"
                else _json.dumps(
                    _json.revive(o.result),
                    what=f"the result of {o.task_id}/{o.seq}",
                    seal=_json.Seal(db.keys, Binding.step(o.task_id, o.seq)),
                ),
                error=o.error if o.state == "failed" else None,
                tries=o.tries,
            )
            for o in body.items
        ]
        applied = await db.complete_steps(outcomes)
        _forget(held_by, agent, body.items)
        return json_response({"applied": applied})

    @api.post(
        f"{AGENTS}/{{agent}}/hand-back",
        operation_id="agentHandBack",
        summary="Put claimed requests back in the queue for another instance (its breaker "
        "opened, it is stopping): each only while held by its attempt and instance.",
        openapi_extra=scoped,
        responses=_answers(r200=(AppliedAnswer, "Which were handed back."), r422=INVALID),
    )
    async def hand_back(
        agent: AgentName, body: HandbackRequest, client: ClientName, db: Db
    ) -> Response:
        _mine(client, *(h.instance for h in body.items))
        applied = await db.hand_back([RequestHandback(**_fence(h)) for h in body.items])
        _forget(held_by, agent, body.items)
        return json_response({"applied": applied})

    @api.post(
        f"{AGENTS}/{{agent}}/stopped",
        operation_id="agentStopped",
        summary="Say that calls of steps the instance no longer holds have stopped.",
        openapi_extra=scoped,
        responses=_answers(r200=(AppliedAnswer, "Which were recorded."), r422=INVALID),
    )
    async def stopped(
        agent: AgentName, body: HandbackRequest, client: ClientName, db: Db
    ) -> Response:
        _mine(client, *(h.instance for h in body.items))
        applied = await db.stop_calls([CallStop(**_fence(h)) for h in body.items])
        _forget(held_by, agent, body.items)
        return json_response({"applied": applied})

    @api.get(
        f"{AGENTS}/{{agent}}/wakeups",
        operation_id="agentWakeups",
        summary="Wake-ups as server-sent events: `requests` (requests queued for the agent) "
        "and `calls` (tasks of steps the instance holds whose calls may have to stop: ask "
        "`lost`). A lost one costs a poll.",
        openapi_extra=scoped,
        response_class=Response,
        responses=_as_json(_answers(r422=INVALID))
        | {
            200: {
                "description": "The stream (text/event-stream).",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            }
        },
    )
    async def wakeups(
        agent: AgentName,
        client: ClientName,
        entry: ClientEntry,
        db: Db,
        instance: Annotated[str, Query(min_length=3, max_length=200)],
        seconds: Annotated[
            float,
            Query(
                ge=0,
                le=3600,
                description="Seconds after which the stream ends (the client opens it again).",
            ),
        ] = 300,
    ) -> Response:
        _mine(client, instance)
        with contextlib.suppress(StoreError):
            await db.listen()
        return HeldStream(
            _wakeup_stream(db, agent, stopping, seconds, lambda: held_by.tasks(agent, instance)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
            held=quotas.hold(entry, _tokens.STREAMS),
        )

    return api


async def _woken(
    sub: Any,
    agent: str,
    timeout: float,
    stopping: asyncio.Event,
    gone: Callable[[], Awaitable[bool]],
) -> None:
    """Wait until a wake-up names `agent`, `timeout` passes, the server stops or the client
    is `gone` (asked each second)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout
    while not stopping.is_set():
        left = until - loop.time()
        if left <= 0:
            return
        payloads = await sub.wait(min(left, 1.0))
        if (payloads is not None and agent in payloads) or await gone():
            return


def _forget(held_by: Held, agent: str, items: Iterable[Any]) -> None:
    """The instances of `items` (outcomes, hand-backs, stops) no longer call their steps."""
    for item in items:
        held_by.wrote(agent, item.instance, [(item.task_id, item.seq)])


async def _wakeup_stream(
    db: Store,
    agent: str,
    stopping: asyncio.Event,
    seconds: float,
    holds: Callable[[], set[str]],
) -> AsyncIterator[str]:
    """`requests` when requests are queued for `agent`, `calls` with the tasks whose calls
    may have to stop among those of the steps the instance holds (`holds`), a comment after
    KEEPALIVE seconds of neither; until the server stops (or the client goes)."""
    requests = db.subscribe(CHANNEL_REQUESTS)
    calls = db.subscribe(CHANNEL_CALLS)
    loop = asyncio.get_running_loop()
    ends = loop.time() + seconds
    try:
        yield ": wake-ups\n\n"
        while not stopping.is_set() and loop.time() < ends:
            quiet = max(0.0, min(KEEPALIVE, ends - loop.time()))
            woken = asyncio.create_task(requests.wait(quiet))
            told = asyncio.create_task(calls.wait(quiet))
            stop = asyncio.create_task(stopping.wait())
            done, pending = await asyncio.wait(
                {woken, told, stop}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:  # a payload it was waiting for stays for the next wait
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            named = woken.result() if woken in done else None
            tasks = told.result() if told in done else None
            if named is not None and agent in named:
                yield f"event: requests\ndata: {_json.dumps([agent])}\n\n"
            mine = sorted(set(tasks) & holds()) if tasks else []
            if mine:
                yield f"event: calls\ndata: {_json.dumps(mine)}\n\n"
            if named is None and tasks is None and not stopping.is_set():
                yield ": keepalive\n\n"
    finally:
        db.unsubscribe(CHANNEL_REQUESTS, requests)
        db.unsubscribe(CHANNEL_CALLS, calls)
