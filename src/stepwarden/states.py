"""The states of a task and of a step, and the transitions allowed between them.

Every transition is applied by the store as one conditional update naming the state and the
attempt it expects (the fencing token), so that a late or zombie writer changes nothing.

Task (the pattern's ProcessState)::

    pending ──claim──▶ processing ──workflow returns──▶ processed
       ▲                   │ │
       └──supervisor reset─┘ └──permanent error / max_failures reached──▶ error

Step::

    not_started ──agent claims──▶ running ──result──▶ completed
         ▲   │                      │
         │   └──────────────────────┴──permanent error──▶ failed
         └── re-dispatch (attempt + 1) by a scheduler resuming the task after expiry
"""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    PROCESSED = "processed"
    ERROR = "error"


class StepState(StrEnum):
    NOT_STARTED = "not_started"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset({TaskState.PROCESSING}),
    TaskState.PROCESSING: frozenset({TaskState.PENDING, TaskState.PROCESSED, TaskState.ERROR}),
    TaskState.PROCESSED: frozenset(),
    TaskState.ERROR: frozenset(),
}

STEP_TRANSITIONS: dict[StepState, frozenset[StepState]] = {
    StepState.NOT_STARTED: frozenset({StepState.RUNNING, StepState.FAILED, StepState.NOT_STARTED}),
    StepState.RUNNING: frozenset({StepState.COMPLETED, StepState.FAILED, StepState.NOT_STARTED}),
    StepState.COMPLETED: frozenset(),
    StepState.FAILED: frozenset(),
}

FINISHED_TASK_STATES = frozenset({TaskState.PROCESSED, TaskState.ERROR})
OPEN_STEP_STATES = frozenset({StepState.NOT_STARTED, StepState.RUNNING})
