"""Cancellation that reaches the call, with real processes on each store: an operator cancels
a task from the command line, in a process of its own, while a worker's agent is in the
middle of its step's call (one that would run for 60 s). The call is stopped: an async
operation gets CancelledError, a sync one sees `call.cancelled` and returns early; with
`--compensate`, the step is undone once the call has stopped, long before its complete_by.

Nothing here asserts how fast: each call would otherwise run for a minute, and the test
waits for the call's end with a generous bound (the delay it measured is printed).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import stepwarden as sw

from .harness import ROOT, Cluster

pytestmark = pytest.mark.slow

LONG = 60


def stepwarden_cli(c: Cluster, *args: str) -> None:
    """Run `python -m stepwarden --store URL ARGS` in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-m", "stepwarden", "--store", c.store_url, *args],
        cwd=ROOT,
        env=c.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, c.why(f"stepwarden {' '.join(args)}: {done.stderr}")


def the_call(c: Cluster, task_id: str, seq: int = 1) -> dict[str, Any] | None:
    found = c.calls(task_id=task_id, seq=seq)
    return found[0] if found else None


def ended(c: Cluster, task_id: str) -> dict[str, Any] | None:
    call = the_call(c, task_id)
    return call if call is not None and call["ended_at"] is not None else None


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_cancel_from_the_command_line_stops_the_running_call(cluster: Cluster, kind: str) -> None:
    c = cluster
    c.start("worker")
    c.submit("t1", [{"async": kind == "async", "long": LONG, "within": 90}])
    c.wait_until(lambda: the_call(c, "t1"), "the call to start", task_ids=("t1",))
    stepwarden_cli(c, "cancel", "t1", "--reason", "not wanted")
    call = c.wait_until(lambda: ended(c, "t1"), "the call to end", timeout=30, task_ids=("t1",))
    [op] = [e for e in c.app.show("t1").events if e.kind == "operator"]
    delay = call["ended_at"] - op.at.timestamp()
    print(f"the {kind} call ended {delay:.3f}s after the cancel was recorded (poll 0.05 s)")

    why = c.why(f"call {call}", "t1")
    if kind == "async":
        assert call["outcome"].startswith("raised CancelledError"), why
    else:
        assert call["outcome"] == "stopped early", why
    assert call["cancelled"] == "the task is cancelled", why
    assert call["ended_at"] - call["started_at"] < LONG, why
    assert c.effects(task_id="t1") == [], why  # stopped before its effect

    def stop_recorded() -> sw.StepRecord | None:
        [step] = c.app.show("t1").steps
        return step if step.call_stopped_at is not None else None

    step = c.wait_until(stop_recorded, "the call's stop to be recorded", task_ids=("t1",))
    assert c.status("t1").process_state == sw.TaskState.CANCELLED, why
    assert (step.state, step.abandoned, step.tries, step.attempt) == (
        sw.StepState.FAILED,
        True,
        0,
        1,
    ), why
    assert step.error == "abandoned: the task is cancelled", why
    events = c.app.show("t1").events
    [stopped] = [e for e in events if e.kind == "call_stopped"]
    assert stopped.detail["reason"] == "the task is cancelled", why
    assert not [e for e in events if e.kind in ("step_failed", "expired")], why
    assert len(c.calls(task_id="t1")) == 1, why  # not tried again


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_cancel_compensate_undoes_the_step_once_after_its_call_stopped(
    cluster: Cluster, kind: str
) -> None:
    """The step has 60 s to complete; the compensation does not wait for that: it runs once
    the cancelled call has ended, and exactly once."""
    c = cluster
    c.start("worker")
    spec = {"async": kind == "async", "long": LONG, "within": LONG, "undo": {"idempotent": True}}
    c.submit("t1", [spec])
    c.wait_until(lambda: the_call(c, "t1"), "the call to start", task_ids=("t1",))
    stepwarden_cli(c, "cancel", "--compensate", "t1")

    def compensated() -> bool:
        return c.status("t1").process_state == sw.TaskState.COMPENSATED

    c.wait_until(compensated, "the task to be compensated", timeout=40, task_ids=("t1",))
    view = c.app.show("t1")
    forward_call = ended(c, "t1")
    undo_calls = c.calls(task_id="t1", seq=2)
    why = c.why(f"calls {c.calls()}", "t1")
    assert forward_call is not None, why
    assert forward_call["cancelled"] == "the task is compensating", why
    assert len(undo_calls) == 1 and undo_calls[0]["outcome"] == "returned", why
    assert [e["key"] for e in c.effects(task_id="t1")] == ["t1/2"], why  # the undo, once
    # The undo was called after the cancelled call had ended...
    assert undo_calls[0]["started_at"] >= forward_call["ended_at"], why
    forward, undo = view.steps
    assert (undo.compensates, undo.state, undo.attempt) == (1, sw.StepState.COMPLETED, 1), why
    # ...once the store knew it had stopped, long before the step's complete_by.
    assert forward.call_stopped_at is not None and forward.abandoned, why
    assert forward.call_stopped_at <= undo.created_at < forward.complete_by, why


def test_on_postgresql_a_cancel_wakes_the_agent_before_its_next_poll(pg_cluster: Cluster) -> None:
    """With a poll interval of 30 s, the agent learns of the cancel from the operator's
    NOTIFY: its call ends long before the periodic check would have come."""
    c = pg_cluster
    c.start("worker", "--poll-interval", "30")
    c.submit("t1", [{"async": True, "long": LONG, "within": 90}])
    c.wait_until(lambda: the_call(c, "t1"), "the call to start", task_ids=("t1",))
    stepwarden_cli(c, "cancel", "t1")
    call = c.wait_until(lambda: ended(c, "t1"), "the call to end", timeout=20, task_ids=("t1",))
    why = c.why(f"call {call}", "t1")
    assert call["outcome"].startswith("raised CancelledError"), why
    assert call["cancelled"] == "the task is cancelled", why
