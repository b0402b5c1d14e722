"""The exception tree of stepwarden.

StepwardenError
├── ConfigurationError        bad store URL, unknown role, bad option
│   └── KeyringError          no keyring, a wrong one, or a sealed value that does not open
├── PayloadError              a value that is not JSON, or too large
├── UnknownNameError          an unknown workflow, agent or operation
├── StoreError                the database failed; the driver's error is the __cause__
│   ├── TransientStoreError   connection lost, failover, serialization failure, lock timeout:
│   │                         the same call may succeed if tried again
│   └── PermanentStoreError   refused by the database (a constraint, a bug): trying again
│       │                     gives the same answer
│       └── SchemaVersionError  the database schema is not the one this code needs
├── TaskNotFound
├── TaskFailed                a task did not succeed; raised by App.result
├── ActionRefused             an operator action does not apply to the task's state
├── ResultTimeout             App.result gave up waiting
├── NonDeterminismError       a resumed workflow asked for a different step
├── StepFailed                a step failed permanently; raised inside the workflow
├── EventTimeout              ctx.wait_for_event: no event came in time; raised inside it
├── ChildFailed               ctx.child: the child task ended otherwise than processed
├── SubmitConflict            App.submit: a task of this id exists, made by another submit
│                             (another client, workflow, version or input)
├── EventRefused              App.send_event: the task is finished, or the event is beyond
│                             max_events_per_task or max_event_payload
├── StepLost                  Call.heartbeat: this call no longer holds the step
├── CircuitOpen               a call refused by the agent's open circuit breaker (transient)
└── PermanentError            raised by an operation: do not retry, report the failure
"""

from __future__ import annotations


class StepwardenError(Exception):
    """Base class of every error stepwarden raises."""


class ConfigurationError(StepwardenError):
    """The configuration is invalid."""


class KeyringError(ConfigurationError):
    """A sealed secret cannot be opened or sealed here: the process holds no keyring, or a
    wrong one, or one without the value's key; or the value was moved from another record,
    or altered."""


class PayloadError(StepwardenError):
    """A payload is not JSON-serialisable, or breaks a size or depth limit."""


class UnknownNameError(StepwardenError):
    """No workflow, agent or operation is registered under this name."""


class StoreError(StepwardenError):
    """The state store failed."""


class TransientStoreError(StoreError):
    """The database could not be reached or could not finish the call this time (connection
    lost, failover, serialization failure, deadlock, lock timeout, a busy SQLite file): the
    call may be tried again; a write that was fenced is applied at most once."""


class PermanentStoreError(StoreError):
    """The database refused the call (a constraint, a query it cannot run): trying again
    would give the same answer."""


class SchemaVersionError(PermanentStoreError):
    """The database schema is newer than this version of stepwarden understands, or older
    than it needs."""


class TaskNotFound(StepwardenError):
    """No task has this id."""


class TaskFailed(StepwardenError):
    """The task did not succeed: it ended in error, compensated, compensation_failed or
    cancelled (`state`)."""

    def __init__(self, task_id: str, error: str | None, state: str = "error") -> None:
        super().__init__(f"task {task_id!r} ended {state}: {error}")
        self.task_id = task_id
        self.error = error
        self.state = state


class ActionRefused(StepwardenError):
    """An operator action does not apply to the task in its present state."""


class ResultTimeout(StepwardenError):
    """The task did not finish in the time given."""


class NonDeterminismError(StepwardenError):
    """A resumed workflow asked for a step other than the one recorded at that position.

    As data: the task, the `position` (None when not known), what the workflow `asked` for
    and what is `recorded` there (each None where the message alone says it)."""

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        position: str | None = None,
        asked: str | None = None,
        recorded: str | None = None,
    ) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.position = position
        self.asked = asked
        self.recorded = recorded


class StepFailed(StepwardenError):
    """A step of the workflow failed permanently."""

    def __init__(self, step: str, error: str | None) -> None:
        super().__init__(f"step {step!r} failed: {error}")
        self.step = step
        self.error = error


class EventTimeout(StepwardenError):
    """No event of the name waited for came before the wait's timeout (raised by
    `ctx.wait_for_event` inside the workflow, which decides: compensate, remind, escalate)."""

    def __init__(self, name: str, timeout: float) -> None:
        super().__init__(f"no event {name!r} came within {timeout:g} s")
        self.name = name


class ChildFailed(StepwardenError):
    """A child task (`ctx.child`) ended in another state than processed (error,
    compensated, compensation_failed, cancelled): raised by `ctx.child` inside the parent's
    workflow, which decides (the task fails by its on_failure when it does not catch it)."""

    def __init__(self, task_id: str, state: str, error: str | None) -> None:
        super().__init__(f"child task {task_id!r} ended {state}: {error}")
        self.task_id = task_id
        self.state = state
        self.error = error


class EventRefused(StepwardenError):
    """An event a task does not take, and did not keep: the task is finished (`state`; an
    event_id it took before is answered as sent before instead), or
    the event is beyond a bound of the App that sent it (`bound`: "max_events_per_task",
    the task keeps that many events already, or "max_event_payload", its payload has more
    bytes; `limit`: the bound's value, `found`: the events kept, or the payload's bytes).
    `state` is None for a bound, `bound` None for a finished task."""

    def __init__(
        self,
        task_id: str,
        state: str | None = None,
        *,
        name: str | None = None,
        bound: str | None = None,
        limit: int | None = None,
        found: int | None = None,
    ) -> None:
        if bound is None:
            message = f"task {task_id!r} is {state}: it takes no event"
        elif bound == "max_events_per_task":
            message = (
                f"event {name!r} refused: task {task_id!r} keeps {found} events, its "
                f"{bound} ({limit})"
            )
        else:
            message = (
                f"event {name!r} refused: its payload is {found} bytes, over {bound} ({limit})"
            )
        super().__init__(message)
        self.task_id = task_id
        self.state = state
        self.bound = bound
        self.limit = limit
        self.found = found


class SubmitConflict(StepwardenError):
    """A submit under a task id that a task already has, made by another submit: by another
    client, or with another workflow, version or input (`differs`: those that differ, of
    "client", "workflow", "version" and "input"; only "client" when another client
    submitted it, as nothing else of that task is compared). Nothing was written. The
    application API answers 409 for it. A submit that is the same as the first (same
    workflow, version, input and client) is no conflict: it returns the task's id, and its
    other options (priority, reply_to, start_at, start_after) are ignored."""

    def __init__(
        self,
        task_id: str,
        differs: tuple[str, ...],
        *,
        workflow: tuple[str | None, str] | None = None,
        version: tuple[int | None, int] | None = None,
    ) -> None:
        if "client" in differs:
            message = (
                f"task {task_id!r} exists, submitted by another client: a task id names one "
                "submit (leave task_id out for a new one)"
            )
        else:
            told = []
            for name in differs:
                if name == "workflow" and workflow is not None:
                    told.append(f"workflow {workflow[0]!r} (this submit: {workflow[1]!r})")
                elif name == "version" and version is not None:
                    told.append(f"version {version[0]} (this submit: {version[1]})")
                else:
                    told.append(f"another {name}")
            message = (
                f"task {task_id!r} was submitted before with {', '.join(told)}: a task id "
                "names one submit"
            )
        super().__init__(message)
        self.task_id = task_id
        self.differs = differs


class PermanentError(StepwardenError):
    """Raise from an operation when retrying cannot help: the step fails at once."""


class StepLost(StepwardenError):
    """Raised by `Call.heartbeat` when this call no longer holds its step (its complete_by
    passed, or the step was reassigned or closed): stop; whatever it returns is discarded."""


class CircuitOpen(StepwardenError):
    """The agent's circuit breaker is open: the call was not made (a transient failure)."""
