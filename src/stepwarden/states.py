"""The states of a task and of a step, and the transitions allowed between them.

Every transition is applied by the store as one conditional update naming the state and the
attempt it expects (the fencing token), so that a late or zombie writer changes nothing.

Task (the pattern's ProcessState)::

    pending ──claim──▶ processing ──workflow returns──▶ processed
       ▲                   │ │
       └──supervisor reset─┘ └──permanent error / max_failures──▶ compensating ──▶ compensated
                                  (on_failure="stop": error)            └──▶ compensation_failed

A task whose workflow waits (a durable timer, an event from outside, a child task) or whose
start is delayed is `waiting`: no scheduler holds it and no deadline runs; it becomes pending
when its timer fires, its wait times out, its event arrives or its child ends
(processing ──wait──▶ waiting ──wake──▶ pending).

A compensating task is held like a processing one (claimed by a scheduler, which runs the
compensations of its steps in reverse order; reset by the supervisor when it expires). With
on_failure="retry", max_failures sends the task back to pending with an escalating backoff.
An operator may pause and resume, cancel, compensate and retry (see `app.py`).

Step::

    not_started ──agent claims──▶ running ──result──▶ completed
         ▲   │                      │
         │   └──────────────────────┴──permanent error, or its task finished──▶ failed
         └── re-dispatch (attempt + 1) by a scheduler resuming the task after expiry

A running step goes back to not_started, under the same attempt, when its agent hands it
back (its breaker open) or says its call stopped while the task was paused (then past its
complete_by, for the scheduler resuming the task to dispatch it again).
"""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    PROCESSED = "processed"
    ERROR = "error"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    WAITING = "waiting"


class OnFailure(StrEnum):
    """What a workflow's task does when it cannot succeed (a permanent error, or the
    supervisor's max_failures reached)."""

    COMPENSATE = "compensate"
    """Undo the steps done, in reverse order, with their compensations (the default)."""
    RETRY = "retry"
    """At max_failures, wait for the fault to clear: back to pending, with a backoff that
    keeps growing (up to its maximum). A permanent error is compensated."""
    STOP = "stop"
    """Stop in Error for the operator."""


class StepState(StrEnum):
    NOT_STARTED = "not_started"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset(
        {TaskState.PROCESSING, TaskState.PAUSED, TaskState.CANCELLED, TaskState.COMPENSATING}
    ),
    TaskState.WAITING: frozenset(
        {TaskState.PENDING, TaskState.PAUSED, TaskState.CANCELLED, TaskState.COMPENSATING}
    ),
    TaskState.PROCESSING: frozenset(
        {
            TaskState.PENDING,
            TaskState.WAITING,
            TaskState.PROCESSED,
            TaskState.ERROR,
            TaskState.COMPENSATING,
            TaskState.PAUSED,
            TaskState.CANCELLED,
        }
    ),
    TaskState.COMPENSATING: frozenset(
        {TaskState.COMPENSATED, TaskState.COMPENSATION_FAILED, TaskState.COMPENSATING}
    ),
    TaskState.PAUSED: frozenset({TaskState.PENDING, TaskState.CANCELLED, TaskState.COMPENSATING}),
    TaskState.ERROR: frozenset({TaskState.PENDING, TaskState.COMPENSATING, TaskState.CANCELLED}),
    TaskState.COMPENSATION_FAILED: frozenset({TaskState.COMPENSATING, TaskState.CANCELLED}),
    TaskState.PROCESSED: frozenset(),
    TaskState.COMPENSATED: frozenset(),
    TaskState.CANCELLED: frozenset(),
}

STEP_TRANSITIONS: dict[StepState, frozenset[StepState]] = {
    StepState.NOT_STARTED: frozenset({StepState.RUNNING, StepState.FAILED, StepState.NOT_STARTED}),
    StepState.RUNNING: frozenset({StepState.COMPLETED, StepState.FAILED, StepState.NOT_STARTED}),
    StepState.COMPLETED: frozenset(),
    StepState.FAILED: frozenset(),
}

FINISHED_TASK_STATES = frozenset(
    {
        TaskState.PROCESSED,
        TaskState.ERROR,
        TaskState.COMPENSATED,
        TaskState.COMPENSATION_FAILED,
        TaskState.CANCELLED,
    }
)
"""States in which no scheduler will take the task up again unless an operator acts."""
HELD_TASK_STATES = frozenset({TaskState.PROCESSING, TaskState.COMPENSATING})
COMPENSATION_STATES = frozenset(
    {TaskState.COMPENSATING, TaskState.COMPENSATED, TaskState.COMPENSATION_FAILED}
)
"""States of a task whose compensation has begun."""
OPEN_STEP_STATES = frozenset({StepState.NOT_STARTED, StepState.RUNNING})
OPERATOR_ACTIONS: dict[str, dict[TaskState, TaskState]] = {
    # The operator's resubmission: the failed steps run again, the completed ones are kept.
    "retry": {
        TaskState.ERROR: TaskState.PENDING,
        TaskState.COMPENSATION_FAILED: TaskState.COMPENSATING,
    },
    "pause": {
        TaskState.PENDING: TaskState.PAUSED,
        TaskState.PROCESSING: TaskState.PAUSED,
        TaskState.WAITING: TaskState.PAUSED,
    },
    "resume": {TaskState.PAUSED: TaskState.PENDING},
    "cancel": {
        s: TaskState.CANCELLED
        for s in (
            TaskState.PENDING,
            TaskState.WAITING,
            TaskState.PROCESSING,
            TaskState.PAUSED,
            TaskState.ERROR,
            TaskState.COMPENSATION_FAILED,
        )
    },
    "compensate": {
        s: TaskState.COMPENSATING
        for s in (
            TaskState.PENDING,
            TaskState.WAITING,
            TaskState.PROCESSING,
            TaskState.PAUSED,
            TaskState.ERROR,
            TaskState.COMPENSATION_FAILED,
        )
    },
    # A step marked completed by hand; the task stays where it is.
    "skip": {
        s: s
        for s in (
            TaskState.PENDING,
            TaskState.PROCESSING,
            TaskState.PAUSED,
            TaskState.ERROR,
            TaskState.COMPENSATING,
            TaskState.COMPENSATION_FAILED,
        )
    },
}
"""For each operator action, the states a task may be in and where the action takes it."""
