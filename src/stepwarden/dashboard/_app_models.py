"""The application API's requests and answers as typed models (`_app_api.py`): its OpenAPI
document is generated from them. The submit's model names the workflows the App declares."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, create_model, model_validator
from pydantic.json_schema import SkipJsonSchema

from .._check import MAX_INT
from .._text import TENANT_PATTERN
from ..records import SUBMIT_OPTIONS
from ..states import TaskState
from ..workflow import MAX_WAIT
from ._models import Flag, Name, Payload, Reason, Tags, _Closed, _int

Priority = _int(-MAX_INT - 1, MAX_INT)
Tenant = Annotated[str, Field(pattern=f"^{TENANT_PATTERN.pattern}$")]
Version = _int(1, MAX_INT)


class _Submit(_Closed):
    """A task to run: the workflow and its JSON input, and the options of a submit."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"not": {"required": ["start_at", "start_after"]}},
    )

    input: Payload = Field(
        default=None,
        description='The workflow\'s input, a JSON value ({"$secret": VALUE} is a secret: '
        "its operation gets it, everything shown prints ***).",
    )
    task_id: Name | None = Field(
        default=None,
        json_schema_extra={"not": {"enum": [".", ".."]}},
        description="The task's id (default: a new one). A submit is idempotent by it: a task "
        "of this id submitted before by this client, with the same workflow, version and "
        "input, is left as it is (200, created false; the other options are ignored); with "
        "another workflow, version or input, or by another client, the submit is refused "
        "(409).",
    )
    priority: Priority = Field(  # type: ignore[valid-type]
        default=0, description="Higher runs first among the tasks waiting for a scheduler."
    )
    reply_to: Name | None = Field(
        default=None,
        json_schema_extra={"not": {"type": "string", "pattern": "^\\s*$"}},
        description="The channel of the task's status messages (received, step_completed, "
        "processed, ...), which GET /api/v1/messages/{task_id} streams; or a broker's "
        "destination (amqp://, nats://, redis://). Without it, the task has none.",
    )
    # Each may be left out, but not sent as null: SkipJsonSchema keeps None out of the schema.
    start_at: SkipJsonSchema[None] | AwareDatetime = Field(
        default=None,
        description="Start no sooner than this time, with its offset (the task waits until then).",
    )
    start_after: (
        SkipJsonSchema[None] | Annotated[float, Field(ge=0, le=MAX_WAIT.total_seconds())]
    ) = Field(
        default=None,
        description="Start no sooner than this many seconds after the submit, by the store's "
        "clock (not with start_at).",
    )
    version: Version | None = Field(  # type: ignore[valid-type]
        default=None,
        description="The version of the workflow to run (default: the newest declared).",
    )
    tenant: SkipJsonSchema[None] | Tenant = Field(
        default=None,
        description="Who the task belongs to (default: this client). Another tenant only "
        "when the client's tokens entry grants it (its tenants setting; otherwise 403). A "
        "client sees only the tasks of its own tenants and of the workflows it is granted: "
        "any other task is answered 404, as one that does not exist.",
    )
    tags: SkipJsonSchema[None] | Tags = Field(default=None)

    def options(self) -> dict[str, Any]:
        """The submit's options as `App.new_task` takes them (`records.SUBMIT_OPTIONS`: a
        unit test keeps this model's fields the same)."""
        return {name: getattr(self, name) for name in SUBMIT_OPTIONS}

    @model_validator(mode="after")
    def _one_start(self) -> _Submit:
        for name in ("start_at", "start_after", "tenant", "tags"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} may be left out, not null")
        if self.start_at is not None and self.start_after is not None:
            raise ValueError("give start_at or start_after, not both")
        return self


def submit_request(workflows: Sequence[str]) -> type[_Submit]:
    """The submit's model, its `workflow` one of `workflows` (the App's), or any name when
    the App declares none (every submit is then refused, naming none)."""
    kind: Any = Literal[tuple(workflows)] if workflows else Name
    model: type[_Submit] = create_model(
        "SubmitRequest",
        __base__=_Submit,
        workflow=(kind, Field(description="The workflow to run: one the App declares.")),
    )
    return model


class SubmitAnswer(_Closed):
    task_id: str
    created: bool = Field(
        description="False when a task of this id was submitted before, with the same workflow, "
        "version and input: it is left as it is."
    )


class TaskStatus(_Closed):
    """A task's state and what it waits for."""

    task_id: str
    workflow: str
    version: int = Field(ge=1, description="The version of its workflow the task runs.")
    state: TaskState
    finished: bool = Field(
        description="The task is in a finished state (processed, error, compensated, "
        "compensation_failed, cancelled): GET /api/v1/results/{task_id} answers at once."
    )
    priority: int
    reply_to: str | None
    parent_id: str | None = Field(description="A child task's parent.")
    tenant: str | None = Field(
        description="Who the task belongs to: its submitting client, the tenant its submit "
        "named, or its parent's (null: none, a task submitted in Python without one)."
    )
    error: str | None
    waiting_for: str | None = Field(
        description='A waiting task\'s: "timer", "event:NAME", "child:ID" or "start".'
    )
    wake_at: datetime | None = Field(
        description="A waiting task's: when its timer fires, its wait times out or it starts."
    )
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class TaskResult(_Closed):
    """A finished task's outcome: its result when processed, its error otherwise."""

    task_id: str
    state: TaskState = Field(
        description="processed (the result is the workflow's), or error, compensated, "
        "compensation_failed or cancelled (the error says why)."
    )
    result: Payload = None
    error: str | None
    finished_at: datetime | None


class CancelRequest(_Closed):
    reason: Reason | None = Field(default=None, description="Why, for the task's history.")
    compensate: Flag = Field(
        default=False,
        description="Undo the task's completed steps first: it ends compensated, or "
        "compensation_failed.",
    )


class StatusMessage(BaseModel):
    """The data of each server-sent event of GET /api/v1/messages/{task_id}: one status
    message of the task (its SSE `id` is the message's id, its `event` the kind)."""

    model_config = ConfigDict(extra="forbid")

    id: int = Field(description="Unique and rising: the Last-Event-ID to resume after.")
    task_id: str
    kind: str = Field(
        description="received, step_completed, or the state the task entered (processing, "
        "waiting, processed, error, compensating, ...)."
    )
    detail: Payload = None
    at: datetime
