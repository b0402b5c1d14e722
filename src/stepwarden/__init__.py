"""stepwarden: durable multi-step operations on the Scheduler-Agent-Supervisor pattern."""

from __future__ import annotations

from ._logs import JsonFormatter
from ._text import EscapingFormatter
from .agent import Agent, Call, Limit, Operation
from .alerts import AlertSink, CallableSink, LogSink, WebhookSink
from .app import App, TaskId, TaskTransaction, TaskView
from .breaker import Breaker
from .errors import (
    ActionRefused,
    ChildFailed,
    CircuitOpen,
    ConfigurationError,
    EventRefused,
    EventTimeout,
    KeyringError,
    NonDeterminismError,
    PayloadError,
    PermanentError,
    PermanentStoreError,
    ResultTimeout,
    SchemaVersionError,
    StepFailed,
    StepLost,
    StepwardenError,
    StoreError,
    SubmitConflict,
    TaskFailed,
    TaskNotFound,
    TransientStoreError,
    UnknownNameError,
)
from .metrics import Metrics
from .records import (
    ActionOutcome,
    AgentInstance,
    ChildFact,
    EventPage,
    EventRecord,
    Gate,
    OutboxMessage,
    Redrive,
    SchedulerInstance,
    SendOutcome,
    StepPlan,
    StepRecord,
    StepWhy,
    Submission,
    Submitted,
    TaskRecord,
    TaskStatus,
    WaitFact,
    WaitReason,
    Why,
)
from .retry import Backoff, Retry
from .sealing import Keyring
from .secret import Secret
from .states import OnFailure, StepState, TaskState
from .worker import Worker, WorkerOptions
from .workflow import Context, Workflow

__version__ = "0.1.0"
"""The version, in this one place (pyproject.toml reads it; CHANGELOG.md says what changed)."""

__all__ = [
    "ActionOutcome",
    "ActionRefused",
    "Agent",
    "AgentInstance",
    "AlertSink",
    "App",
    "Backoff",
    "Breaker",
    "Call",
    "CallableSink",
    "ChildFact",
    "ChildFailed",
    "CircuitOpen",
    "ConfigurationError",
    "Context",
    "EscapingFormatter",
    "EventPage",
    "EventRecord",
    "EventRefused",
    "EventTimeout",
    "Gate",
    "JsonFormatter",
    "Keyring",
    "KeyringError",
    "Limit",
    "LogSink",
    "Metrics",
    "NonDeterminismError",
    "OnFailure",
    "Operation",
    "OutboxMessage",
    "PayloadError",
    "PermanentError",
    "PermanentStoreError",
    "Redrive",
    "ResultTimeout",
    "Retry",
    "SchedulerInstance",
    "SchemaVersionError",
    "Secret",
    "SendOutcome",
    "StepFailed",
    "StepLost",
    "StepPlan",
    "StepRecord",
    "StepState",
    "StepWhy",
    "StepwardenError",
    "StoreError",
    "Submission",
    "SubmitConflict",
    "Submitted",
    "TaskFailed",
    "TaskId",
    "TaskNotFound",
    "TaskRecord",
    "TaskState",
    "TaskStatus",
    "TaskTransaction",
    "TaskView",
    "TransientStoreError",
    "UnknownNameError",
    "WaitFact",
    "WaitReason",
    "WebhookSink",
    "Why",
    "Worker",
    "WorkerOptions",
    "Workflow",
    "__version__",
]
