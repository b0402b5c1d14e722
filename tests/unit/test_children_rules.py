"""The rules of child workflows: a child's default id, what a task parked on several waits
waits for, which children a cancel or a compensation reaches and what it does to them."""

from __future__ import annotations

import pytest

from stepwarden.rules import (
    ENGINE,
    child_task_id,
    compensable_tasks,
    plan_cascade,
    waiting_for_all,
)
from stepwarden.states import TaskState


def test_a_childs_default_id_is_its_parents_and_its_place() -> None:
    assert child_task_id("order-42", "2.3.1") == "order-42:2.3.1"
    long = "x" * 200
    short = child_task_id(long, "7")
    assert len(short) == 200 and short.endswith(":7")
    assert short == child_task_id(long, "7")  # the same on every replay
    assert child_task_id("y" * 200, "7") != short  # and its parent's own


def test_several_waits_are_named_by_the_first_in_the_workflows_order() -> None:
    assert waiting_for_all([("3", "child", "p:3")]) == "child:p:3"
    waits = [("2.10.1", "timer", ""), ("2.2.1", "event", "go"), ("2.3.1", "child", "p:2.3.1")]
    assert waiting_for_all(waits) == "event:go +2"


def children(*rows: tuple[str, TaskState, float]) -> list[dict[str, object]]:
    return [
        {"task_id": t, "parent_id": "p", "process_state": str(s), "created_at": at}
        for t, s, at in rows
    ]


def test_a_cancel_reaches_the_children_not_ended_newest_first() -> None:
    kids = children(
        ("a", TaskState.PROCESSING, 1.0),
        ("b", TaskState.PROCESSED, 2.0),  # ended: left as it is
        ("c", TaskState.WAITING, 3.0),
        ("d", TaskState.COMPENSATING, 4.0),  # a cancel does not apply: left undoing
        ("e", TaskState.PAUSED, 5.0),
    )
    actions = plan_cascade("p", "cancel", kids, actor="ana", identity="session")
    assert [(a.task_id, a.action) for a in actions] == [
        ("e", "cancel"), ("c", "cancel"), ("a", "cancel"),
    ]  # fmt: skip
    assert {(a.actor, a.identity, a.parent) for a in actions} == {("ana", "session", "p")}
    assert actions[0].reason == "its parent 'p' was cancelled"


def test_a_compensation_or_a_failure_compensates_the_children_not_ended() -> None:
    kids = children(("a", TaskState.PENDING, 1.0), ("b", TaskState.ERROR, 2.0))
    [op] = plan_cascade("p", "compensate", kids, actor="ana")
    assert (op.task_id, op.action, op.actor) == ("a", "compensate", "ana")
    [by_failure] = plan_cascade("p", "failed", kids)
    assert (by_failure.action, by_failure.actor) == ("compensate", ENGINE)
    assert by_failure.reason == "its parent 'p' failed and is compensated"
    with pytest.raises(ValueError):
        plan_cascade("p", "pause", kids)


def test_a_child_not_ended_is_something_to_undo() -> None:
    none = [{"task_id": "p", "state": None, "abandoned": None, "compensation": None,
             "compensates": None}]  # fmt: skip
    assert compensable_tasks(none) == set()
    running = [{"parent_id": "p", "process_state": "processing"}]
    assert compensable_tasks(none, running) == {"p"}
    ended = [{"parent_id": "p", "process_state": "processed"}]
    assert compensable_tasks(none, ended) == set()
