"""rules.await_next: what a waiter for a task's result does so that the task's end wakes it."""

from __future__ import annotations

import pytest

from stepwarden.rules import await_next
from stepwarden.states import FINISHED_TASK_STATES, TaskState


@pytest.mark.parametrize("state", sorted(FINISHED_TASK_STATES))
def test_an_ended_task_is_read_not_waited_for(state: TaskState) -> None:
    assert await_next(state=state, held=False, awaited=False, noted=False) == "wait"


def test_an_unknown_task_is_not_waited_for() -> None:
    assert await_next(state=None, held=False, awaited=False, noted=False) == "wait"


@pytest.mark.parametrize("state", [TaskState.PROCESSING, TaskState.COMPENSATING])
def test_a_held_task_has_its_row_marked(state: TaskState) -> None:
    assert await_next(state=state, held=True, awaited=False, noted=False) == "mark"
    assert await_next(state=state, held=True, awaited=False, noted=True) == "mark"


@pytest.mark.parametrize(
    "state",
    [TaskState.PENDING, TaskState.WAITING, TaskState.PAUSED, TaskState.COMPENSATING],
)
def test_a_task_no_scheduler_holds_has_the_wait_noted_then_read_again(state: TaskState) -> None:
    """Its row is not locked: schedulers claim such rows skipping locked ones."""
    assert await_next(state=state, held=False, awaited=False, noted=False) == "note"
    assert await_next(state=state, held=False, awaited=False, noted=True) == "wait"


def test_a_marked_row_is_waited_for() -> None:
    assert await_next(state=TaskState.PROCESSING, held=True, awaited=True, noted=False) == "wait"
    assert await_next(state=TaskState.PENDING, held=False, awaited=True, noted=False) == "wait"
