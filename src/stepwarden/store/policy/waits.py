"""The flows of waits (`store.policy`): durable timers, events from outside, child tasks,
a task parked on all its waits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._json import loads
from ...records import (
    EventBeyond,
    EventBounds,
    ParkRequest,
    SendOutcome,
    WaitOutcome,
    WaitRequest,
    Woke,
)
from ...rules import (
    event_beyond,
    wait_mismatch,
    waiting_for_all,
)
from ...sealing import Binding, Keyring
from ...states import FINISHED_TASK_STATES, TaskState
from .. import _rows
from .._flow import Flow, Query, Wakeups, fetch
from ._shared import lease_fence
from .application import record_events, submit


def wait(req: WaitRequest, keys: Keyring | None, wake: Wakeups) -> Flow[WaitOutcome]:
    """The wait at `req.seq`: recorded the first time (its wake_at by the database clock; a
    child wait creates its child task with it); done when its timer has fired, an event of
    its name is there to take (the oldest; once timed out, only one sent before the
    timeout) or its child ended processed; child_failed when the child ended otherwise;
    timed_out past its wake_at; otherwise the task is parked (waiting, released, no deadline
    running) until its wake_at, an event or its child's end, or, when the request says not
    to park, the wait is "blocked" (`park` parks it later). All in one transaction with the
    task's row locked, fenced by the hold and the attempt."""
    if not (yield from _held_by(req.task_id, req.task_attempt, req.scheduler)):
        return WaitOutcome(state="fenced")
    key = {"task_id": req.task_id, "seq": req.seq}
    found = yield from fetch("read_wait", **key)
    replayed = bool(found)
    if not found:
        if req.kind == "child":
            refused = yield from _start_child(req, keys, wake)
            if refused is not None:
                return WaitOutcome(state="refused", reason=refused)
        until = None if req.until is None else req.until.timestamp()
        delay = None if req.kind == "child" else float(req.delay)  # a child's has no wake_at
        new = {"kind": req.kind, "name": req.name, "until": until, "delay": delay,
               "position": req.position}  # fmt: skip
        found = yield from fetch("insert_wait", **key, **new)
    [w] = found
    child_workflow = None
    if replayed and (w["kind"], w["name"]) == (req.kind, req.name) and req.kind == "child":
        child = yield from fetch("child_read", task_id=req.name)
        child_workflow = child[0]["workflow"] if child else None
    mismatch = wait_mismatch(req, w["kind"], w["name"], child_workflow)
    if mismatch is not None:
        return mismatch
    if w["state"] == "done":
        return WaitOutcome(state="done", payload=_rows.wait_payload(w, keys))
    if w["state"] == "failed":
        return WaitOutcome(state="child_failed", payload=_rows.wait_payload(w, keys))
    if w["state"] == "timed_out":
        return WaitOutcome(state="timed_out")
    if req.kind == "patch":  # a marker: recorded, nothing to wait for
        yield [Query("end_wait", {**key, "state": "done", "event_id": None, "payload": None})]
        return WaitOutcome(state="done")
    due = bool(w["due"])
    if req.kind == "timer" and due:
        yield [Query("end_wait", {**key, "state": "done", "event_id": None, "payload": None})]
        return WaitOutcome(state="done", now=True)
    if req.kind == "event":
        taken = yield from fetch("take_event", **key, name=req.name, timed_out=due)
        if taken:
            [event] = taken
            ended = {**key, "state": "done", "event_id": event["event_id"]}
            yield [Query("end_wait", {**ended, "payload": event["payload"]})]
            payload = loads(
                event["payload"], at=Binding.event(req.task_id, event["event_id"]), keys=keys
            )
            return WaitOutcome(state="done", payload=payload, now=True)
        if due:
            ended = {**key, "state": "timed_out", "event_id": None, "payload": None}
            yield [Query("end_wait", ended)]
            return WaitOutcome(state="timed_out", now=True)
    if not req.park:
        return WaitOutcome(state="blocked")
    seqs = (req.seq,)
    return (yield from _park(req.task_id, req.task_attempt, req.scheduler, seqs,
                             [(req.position, req.kind, req.name)]))  # fmt: skip


def _start_child(req: WaitRequest, keys: Keyring | None, wake: Wakeups) -> Flow[str | None]:
    """Create the child task of a child wait recorded now; why not, when its task id is
    taken by another task (nothing is written then)."""
    child = req.child
    if child is None or child.task_id != req.name:
        raise ValueError("a child wait names the child task it creates")
    found = yield from fetch("child_read", task_id=child.task_id)
    if not found:
        [answer] = yield from submit([child], keys, wake)
        if answer.created:
            detail = {"child": child.task_id, "workflow": child.workflow, "seq": req.seq,
                      "position": req.position}  # fmt: skip
            yield [record_events([(req.task_id, "child_started", detail)])]
            return None
        found = yield from fetch("child_read", task_id=child.task_id)
    r = found[0]
    if (r["parent_id"], r["parent_position"]) == (req.task_id, req.position):
        return None  # this wait's own child (its wait was not recorded: never the case)
    if r["parent_id"] == req.task_id:
        whose = f"the child this task started at position {r['parent_position']}"
    else:
        whose = (
            "not a child of this task"
            if r["parent_id"] is None
            else (f"the child of task {r['parent_id']!r}")
        )
    return (
        f"ctx.child at position {req.position}: task {child.task_id!r} exists and is "
        f"{whose}; give the child another task_id"
    )


def _held_by(task_id: str, attempt: int, scheduler: str) -> Flow[bool]:
    """Whether the scheduler holds the task, processing, under this attempt (its row locked
    until commit): the fence of a wait and of a park."""
    task = yield from fetch("wait_read_task", task_id=task_id)
    return bool(task) and (task[0]["process_state"], task[0]["attempt"], task[0]["locked_by"]) == (
        str(TaskState.PROCESSING),
        attempt,
        scheduler,
    )


def park(req: ParkRequest, wake: Wakeups) -> Flow[WaitOutcome]:
    """A task whose workflow waits in every branch, on the waits at `req.seqs` (recorded
    and open): with its row locked, fenced by the hold and the attempt, each wait is checked
    (its timer due or its wait timed out, an event kept for its name, its child ended); if
    one can end now the task is not parked ("ready": the workflow takes its waits up
    again), else it is parked until the earliest of their wake_at, an event or a child's
    end."""
    if not (yield from _held_by(req.task_id, req.task_attempt, req.scheduler)):
        return WaitOutcome(state="fenced")
    if not req.seqs:
        raise ValueError("a park names the waits it parks on")
    waits = yield from fetch("park_waits", task_id=req.task_id, seqs=list(req.seqs))
    if len(waits) != len(set(req.seqs)):
        raise ValueError(f"task {req.task_id!r}: a park names waits that are not recorded")
    if any(w["state"] != "open" or w["due"] or w["kept"] for w in waits):
        return WaitOutcome(state="ready")
    places = [(w["position"], w["kind"], w["name"]) for w in waits]
    return (yield from _park(req.task_id, req.task_attempt, req.scheduler, req.seqs, places))


def _park(
    task_id: str,
    attempt: int,
    scheduler: str,
    seqs: Sequence[int],
    waits: Sequence[tuple[str | None, str, str]],
) -> Flow[WaitOutcome]:
    """Park the held task on its open waits at `seqs` (none of which can end now): waiting,
    released, until the earliest of their wake_at; a `waiting` event."""
    what = waiting_for_all(waits)
    parked = yield from fetch(
        "park_task",
        task_id=task_id,
        attempt=attempt,
        scheduler=scheduler,
        seqs=list(seqs),
        waiting_for=what,
    )
    if not parked:
        return WaitOutcome(state="fenced")
    until = parked[0]["wake_at"]
    detail: dict[str, Any] = {"seq": min(seqs), "for": what,
                              "until": None if until is None else str(until)}  # fmt: skip
    if len(seqs) > 1:
        detail["seqs"] = sorted(seqs)
    yield [record_events([(task_id, "waiting", detail)])]
    return WaitOutcome(state="parked")


def send_event(
    task_id: str, name: str, payload: str, event_id: str, bounds: EventBounds, wake: Wakeups
) -> Flow[SendOutcome | TaskState | EventBeyond | None]:
    """An event for a task, kept in its inbox until a wait of its workflow takes it; a task
    waiting with an open wait for it becomes pending at once, in the same transaction.
    Returns the outcome (not sent, when the task took this event_id before, whatever its
    state now: a sender whose answer was lost is told it was taken, even once the event has
    finished the task), or the state of a task that takes no new event (finished), or the
    bound a new event is beyond (`rules.event_beyond`: the events the task keeps are counted
    with its row locked, so that concurrent sends cannot pass the bound), or None when there
    is no task."""
    task = yield from fetch("send_read_task", task_id=task_id)
    if not task:
        return None
    state = TaskState(task[0]["process_state"])
    [kept] = yield from fetch("inbox_kept", task_id=task_id, event_id=event_id)
    if kept["sent_before"]:
        return SendOutcome(task_id=task_id, sent=False, woke=False)
    if state in FINISHED_TASK_STATES:
        return state
    beyond = event_beyond(bounds, kept=int(kept["kept"]), size=len(payload.encode()))
    if beyond is not None:
        return beyond
    new = {"task_id": task_id, "event_id": event_id, "name": name, "payload": payload}
    sent = yield from fetch("insert_inbox", **new)
    woke = False
    if sent and state == TaskState.WAITING:
        woken = yield from fetch("wake_task", task_id=task_id, name=name)
        woke = bool(woken)
    if sent:
        detail = {"name": name, "event_id": event_id, "woke": woke}
        yield [record_events([(task_id, "event_received", detail)])]
    if woke:
        wake.tasks()
    return SendOutcome(task_id=task_id, sent=bool(sent), woke=woke)


def wake_due(*, lease: str, holder: str, term: int, limit: int, wake: Wakeups) -> Flow[list[Woke]]:
    """Under the lease: waiting tasks whose wake_at has come (a timer, a wait's timeout, a
    delayed start) are pending again, each with a `woke` event."""
    if limit <= 0:
        return []
    held, due = yield [lease_fence(lease, holder, term), Query("due_waiting", {"limit": limit})]
    if not held or not due:
        return []
    by = {"by": holder, "term": term}
    each = [{"task_id": r["task_id"], "waiting_for": r["waiting_for"]} for r in due]
    [woken] = yield [Query("wake_due", by, each=each)]
    if woken:
        wake.tasks()
    return [_rows.woke(r) for r in woken]
