"""The rules of cancellation that reaches the call (no store): why a call no longer holds its
step, what its agent's word that it stopped writes, and how long a compensation waits for
the calls of its abandoned steps."""

from __future__ import annotations

from typing import Any

import pytest

from stepwarden.rules import (
    CALL_TASK_STATES,
    CallFacts,
    call_lost,
    compensation_wait,
    holds_up_compensation,
    plan_call_stopped,
    plan_gone_step,
)
from stepwarden.states import StepState, TaskState


def found(
    state: StepState = StepState.RUNNING,
    task: TaskState = TaskState.PROCESSING,
    *,
    attempt: int = 1,
    locked_by: str | None = "a1",
    abandoned: bool = False,
    call_stopped: bool = False,
) -> CallFacts:
    """A step and its task as the store reads them for these rules."""
    return CallFacts(
        state=state,
        task_state=task,
        attempt=attempt,
        locked_by=locked_by,
        abandoned=abandoned,
        call_stopped=call_stopped,
    )


@pytest.mark.parametrize("task", sorted(CALL_TASK_STATES))
def test_a_running_step_of_a_task_that_goes_on_is_held_by_its_call(task: TaskState) -> None:
    assert call_lost(attempt=1, instance="a1", found=found(task=task)) is None


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (None, "the step no longer exists"),
        (found(task=TaskState.PAUSED), "the task is paused"),
        (
            found(StepState.FAILED, TaskState.CANCELLED, abandoned=True),
            "the task is cancelled",
        ),
        (
            found(StepState.FAILED, TaskState.COMPENSATING, abandoned=True),
            "the task is compensating",
        ),
        (found(StepState.FAILED, TaskState.ERROR, abandoned=True), "the task is error"),
        # Past its total timeout (its task still processing): abandoned all the same.
        (found(StepState.FAILED, abandoned=True), "the step was abandoned"),
        (found(attempt=2, locked_by="a2"), "the step was dispatched again (attempt 2)"),
        (
            found(StepState.NOT_STARTED, attempt=2, locked_by=None),
            "the step was dispatched again (attempt 2)",
        ),
        (found(locked_by="a2"), "the step is held by another agent instance"),
        (found(StepState.NOT_STARTED, locked_by=None), "the step was handed back to the queue"),
        (
            found(StepState.COMPLETED),
            "the step is no longer held by this call (it is completed)",
        ),
        (
            found(StepState.FAILED),
            "the step is no longer held by this call (it is failed)",
        ),
    ],
)
def test_why_a_call_no_longer_holds_its_step(step: CallFacts | None, expected: str) -> None:
    assert call_lost(attempt=1, instance="a1", found=step) == expected


def test_a_stop_writes_by_what_the_step_and_its_task_are_now() -> None:
    def plan(step: CallFacts | None, attempt: int = 1, instance: str = "a1") -> Any:
        return plan_call_stopped(attempt=attempt, instance=instance, found=step)

    cancelled = found(StepState.FAILED, TaskState.CANCELLED, abandoned=True)
    assert plan(cancelled) == "stopped"
    # Only from the instance and the attempt that held the step, and only once.
    assert plan(cancelled, instance="a2") is None
    assert plan(cancelled, attempt=2) is None
    assert plan(found(StepState.FAILED, abandoned=True, call_stopped=True)) is None
    assert plan(None) is None
    # A step still running: its task paused (queued again, past due), or going on again.
    assert plan(found(task=TaskState.PAUSED)) == "requeue"
    assert plan(found(task=TaskState.PENDING)) == "hand_back"
    assert plan(found(task=TaskState.PROCESSING)) == "hand_back"
    # A step that ended otherwise takes no stop.
    assert plan(found(StepState.COMPLETED)) is None
    assert plan(found(StepState.FAILED)) is None


def test_an_abandoned_step_holds_up_compensation_until_its_call_stopped_or_its_time_passed() -> (
    None
):
    assert holds_up_compensation(remaining=30.0, call_stopped=False)
    assert not holds_up_compensation(remaining=30.0, call_stopped=True)
    assert not holds_up_compensation(remaining=0.0, call_stopped=False)
    assert not holds_up_compensation(remaining=-5.0, call_stopped=False)
    steps = [
        {"remaining": 30.0, "call_stopped": True},  # stopped
        {"remaining": -1.0, "call_stopped": False},  # its complete_by passed
        {"remaining": 12.5, "call_stopped": False},  # may still be calling
        {"remaining": 4.0, "call_stopped": 0},  # SQLite's false
    ]
    assert compensation_wait(steps) == 12.5
    assert compensation_wait(steps[:2]) == 0.0
    assert compensation_wait([]) == 0.0


@pytest.mark.parametrize("task", list(TaskState))
def test_a_gone_instances_step_is_given_back_whatever_the_state_of_its_task(
    task: TaskState,
) -> None:
    """Queued in time while the task's calls go on, past its complete_by otherwise (as the
    instance's own word that its call stopped would be); a task held by a gone scheduler
    is released as that scheduler's release would be; one held by an alive scheduler, or
    by none, is left as it is."""
    for held, holder_gone in ((True, True), (True, False), (False, False)):
        plan = plan_gone_step(task_state=task, task_held=held, holder_gone=holder_gone)
        assert plan.in_time == (task in CALL_TASK_STATES)
        stopped = plan_call_stopped(attempt=1, instance="a1", found=found(task=task))
        assert plan.in_time == (stopped == "hand_back")
        if holder_gone and task in (TaskState.PROCESSING, TaskState.COMPENSATING):
            assert plan.release_as == (
                TaskState.PENDING if task == TaskState.PROCESSING else TaskState.COMPENSATING
            )
        else:
            assert plan.release_as is None
