"""The agent protocol's requests and answers as typed models (`_agent_api.py`): its OpenAPI
document is generated from them. Every write about a step names the fencing token its claim
gave: the step (task_id, seq), its attempt, and the agent instance that holds it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from .._check import MAX_INT
from ._models import Name, Payload, Reason, _Closed, _int

Seq = _int(1, MAX_INT)
Attempt = _int(1, MAX_INT)
Count = _int(0, MAX_INT)
Instance = Annotated[
    str,
    Field(
        min_length=3,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}/[A-Za-z0-9_.:@-]{1,120}$",
        description="The agent instance: the client's name, '/', and a name of the "
        "instance's own, unique among the client's processes (`billing/host-1-4242`).",
    ),
]
Operation = Annotated[str, Field(min_length=1, max_length=200)]


class BeatRequest(_Closed):
    """Register or refresh an agent instance in the registry."""

    instance: Instance
    operations: list[Operation] = Field(max_length=1000)
    capacity: Count = Field(description="Calls the instance makes at once.")  # type: ignore[valid-type]
    inflight: Count = 0  # type: ignore[valid-type]
    breaker: Literal["closed", "open", "half_open"] = "closed"
    breaker_detail: dict[str, Any] = Field(default_factory=dict)
    ttl: float = Field(
        ge=1, le=3600, description="Seconds without a beat after which the instance is gone."
    )


class InstanceRequest(_Closed):
    instance: Instance


class BreakerRequest(_Closed):
    """Record a transition of the instance's circuit breaker (an event of the history)."""

    instance: Instance
    state: Literal["closed", "open", "half_open"]


class OpLimitModel(_Closed):
    concurrency: Count | None = None  # type: ignore[valid-type]
    rate: Count | None = None  # type: ignore[valid-type]
    per: float = Field(default=1.0, gt=0, le=86400)
    room: Count | None = None  # type: ignore[valid-type]


class ClaimRequest(_Closed):
    """Claim queued requests of these operations, by priority."""

    instance: Instance
    operations: list[Operation] = Field(min_length=1, max_length=1000)
    limit: int = Field(ge=1, le=1000, description="Requests claimed at most.")
    limits: dict[Operation, OpLimitModel] = Field(
        default_factory=dict,
        description="The operations' limits (concurrency, rate per `per` seconds across every "
        "process; `room`: calls this instance may still start).",
    )
    wait: float = Field(
        default=0,
        ge=0,
        le=30,
        description="Seconds to wait for a request to be queued when none is (a long poll).",
    )


class RequestModel(BaseModel):
    """A claimed request: a step to call, with the fencing token of its writes (task_id,
    seq, attempt, and the instance that claimed it)."""

    task_id: str
    seq: int
    attempt: int
    agent: str
    operation: str
    input: Payload
    idempotency_key: str = Field(
        description="The same on every attempt of the step: pass it to the service."
    )
    complete_by: datetime
    remaining: float = Field(description="Seconds left before complete_by, at the claim.")
    compensates: int | None = None
    queued: float | None = None
    workflow: str | None = None
    trace_context: str | None = None


class RequestsAnswer(BaseModel):
    requests: list[RequestModel]


class CallKey(_Closed):
    task_id: Name
    seq: Seq  # type: ignore[valid-type]
    attempt: Attempt  # type: ignore[valid-type]


class LostRequest(_Closed):
    """Which of these calls of the instance no longer hold their step (and must stop)."""

    instance: Instance
    calls: list[CallKey] = Field(max_length=10_000)


class LostCall(BaseModel):
    task_id: str
    seq: int
    attempt: int
    why: str


class LostAnswer(BaseModel):
    lost: list[LostCall]


class HeartbeatRequest(_Closed):
    """A running call's heartbeat: its step's complete_by moves on."""

    task_id: Name
    seq: Seq  # type: ignore[valid-type]
    attempt: Attempt  # type: ignore[valid-type]
    instance: Instance
    detail: Payload = None


class HeartbeatAnswer(BaseModel):
    remaining: float | None = Field(
        description="Seconds now left to the step; null when the step is no longer held by "
        "this attempt and instance, or its complete_by passed: stop the call."
    )


class OutcomeModel(_Closed):
    task_id: Name
    seq: Seq  # type: ignore[valid-type]
    attempt: Attempt  # type: ignore[valid-type]
    instance: Instance
    state: Literal["completed", "failed"]
    result: Payload = None
    error: str | None = Field(default=None, max_length=65536)
    tries: int = Field(default=1, ge=1, le=MAX_INT)


class CompleteRequest(_Closed):
    """Record outcomes: each only while its step is held by its attempt and instance, before
    its complete_by."""

    items: list[OutcomeModel] = Field(min_length=1, max_length=1000)


class Handback(_Closed):
    task_id: Name
    seq: Seq  # type: ignore[valid-type]
    attempt: Attempt  # type: ignore[valid-type]
    instance: Instance
    reason: Reason


class HandbackRequest(_Closed):
    """Put claimed requests back in the queue (the same attempt), or say that calls of steps
    the instance no longer holds have stopped."""

    items: list[Handback] = Field(min_length=1, max_length=1000)


class AppliedAnswer(BaseModel):
    applied: list[bool] = Field(description="For each item, whether it was applied.")


class WhoAmI(BaseModel):
    client: str
    agents: list[str] = Field(description="The agents this client's token may serve.")
