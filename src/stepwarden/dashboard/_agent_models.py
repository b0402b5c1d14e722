"""The agent protocol's requests and answers as typed models (`_agent_api.py`): its OpenAPI
document is generated from them. Every write about a step names the fencing token its claim
gave: the step (task_id, seq), its attempt, and the agent instance that holds it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, model_validator

from .._check import MAX_INT, MAX_REASON
from .._text import cut
from ..breaker import Breaker
from ..retry import MAX_DELAY, MAX_EXPONENT, Retry
from ..rules import MAX_ERROR, error_text
from ._models import API_BODY, Name, Payload, _Closed, _int

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
MAX_ITEMS = 1000
"""The most items of one write (outcomes, hand-backs, stops) and requests of one claim."""
MAX_CLAIM_WAIT = 30.0
"""The longest wait of a claim's long poll, in seconds."""
MIN_TTL, MAX_TTL = 1.0, 3600.0
"""The bounds of an instance's ttl in the registry, in seconds."""
CutReason = Annotated[
    str,
    AfterValidator(lambda text: cut(text, MAX_REASON)),
    Field(
        description=f"Why, whole: the server keeps its first {MAX_REASON} characters, with "
        "a marker that says how long it was."
    ),
]


class BeatRequest(_Closed):
    """Register or refresh an agent instance in the registry."""

    instance: Instance
    operations: list[Operation] = Field(max_length=1000)
    capacity: Count = Field(description="Calls the instance makes at once.")  # type: ignore[valid-type]
    inflight: Count = 0  # type: ignore[valid-type]
    breaker: Literal["closed", "open", "half_open"] = "closed"
    breaker_detail: dict[str, Any] = Field(default_factory=dict)
    ttl: float = Field(
        ge=MIN_TTL,
        le=MAX_TTL,
        description="Seconds without a beat after which the instance is gone.",
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
    limit: int = Field(ge=1, le=MAX_ITEMS, description="Requests claimed at most.")
    limits: dict[Operation, OpLimitModel] = Field(
        default_factory=dict,
        description="The operations' limits (concurrency, rate per `per` seconds across every "
        "process; `room`: calls this instance may still start).",
    )
    wait: float = Field(
        default=0,
        ge=0,
        le=MAX_CLAIM_WAIT,
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
    error: str | None = Field(
        default=None,
        description=f"The error, or its start (its first {MAX_ERROR} characters at least, "
        "when `error_length` says how long it is): the server keeps its first "
        f"{MAX_ERROR} characters, with a marker that says how long it was.",
    )
    error_length: int | None = Field(
        default=None,
        ge=0,
        le=MAX_INT,
        description="Characters of the whole error, when `error` is its start.",
    )
    tries: int = Field(default=1, ge=1, le=MAX_INT)

    @model_validator(mode="after")
    def _cut(self) -> OutcomeModel:
        if self.error is not None:
            self.error = error_text(self.error, self.error_length)
        return self


class CompleteRequest(_Closed):
    """Record outcomes: each only while its step is held by its attempt and instance, before
    its complete_by."""

    items: list[OutcomeModel] = Field(min_length=1, max_length=MAX_ITEMS)


class Handback(_Closed):
    task_id: Name
    seq: Seq  # type: ignore[valid-type]
    attempt: Attempt  # type: ignore[valid-type]
    instance: Instance
    reason: CutReason


class HandbackRequest(_Closed):
    """Put claimed requests back in the queue (the same attempt), or say that calls of steps
    the instance no longer holds have stopped."""

    items: list[Handback] = Field(min_length=1, max_length=MAX_ITEMS)


class AppliedAnswer(BaseModel):
    applied: list[bool] = Field(description="For each item, whether it was applied.")


class RetryDefaults(BaseModel):
    """How an operation's transient errors are retried when neither it nor its agent names a
    policy (`stepwarden.Retry()`): calls within one dispatch of a step, and the delay after
    the n-th failed call: `initial * multiplier ** min(n - 1, max_exponent)` seconds, at
    most `maximum`, a random part of that with `jitter`."""

    max_attempts: int
    initial: float
    maximum: float
    multiplier: float
    jitter: bool


class RetryBounds(BaseModel):
    """What a retry policy may be: `0 <= initial <= maximum <= max_delay` seconds,
    `multiplier >= 1`, `max_attempts >= 1`; the exponent of the delay is capped."""

    max_delay: float
    max_exponent: int


class BreakerDefaults(BaseModel):
    """An agent's circuit breaker when its declaration names no thresholds
    (`stepwarden.Breaker()`): `failures` consecutive transient failures open it; after
    `reset_after` seconds it lets `trial_calls` calls through at once (half-open)."""

    failures: int
    reset_after: float
    trial_calls: int


class Bounds(BaseModel):
    """What the server accepts of the agent protocol's requests."""

    max_error: int = Field(
        description="Characters of a failed step's error the server keeps (it cuts a longer "
        "one, with a marker that says how long it was)."
    )
    max_reason: int = Field(
        description="Characters of a hand-back's or a stop's reason the server keeps (it "
        "cuts a longer one the same way)."
    )
    max_items: int = Field(
        description="Items of one complete, hand-back or stopped; requests of one claim."
    )
    max_body: int = Field(description="Bytes of a request's body.")
    max_claim_wait: float = Field(description="Seconds a claim's long poll waits at most.")
    min_ttl: float
    max_ttl: float


RETRY_DEFAULTS = RetryDefaults(
    max_attempts=Retry().max_attempts,
    initial=Retry().initial,
    maximum=Retry().maximum,
    multiplier=Retry().multiplier,
    jitter=Retry().jitter,
)
BREAKER_DEFAULTS = BreakerDefaults(
    failures=Breaker().failures,
    reset_after=Breaker().reset_after,
    trial_calls=Breaker().trial_calls,
)
RETRY_BOUNDS = RetryBounds(max_delay=MAX_DELAY, max_exponent=MAX_EXPONENT)
BOUNDS = Bounds(
    max_error=MAX_ERROR,
    max_reason=MAX_REASON,
    max_items=MAX_ITEMS,
    max_body=API_BODY,
    max_claim_wait=MAX_CLAIM_WAIT,
    min_ttl=MIN_TTL,
    max_ttl=MAX_TTL,
)


class WhoAmI(BaseModel):
    """The client, and what every agent runner of the protocol needs to agree on with the
    engine, in whatever language: its retry policy's defaults and bounds, its circuit
    breaker's defaults, and the bounds of the protocol's requests."""

    client: str
    agents: list[str] = Field(description="The agents this client's token may serve.")
    retry: RetryDefaults
    retry_bounds: RetryBounds
    breaker: BreakerDefaults
    bounds: Bounds
