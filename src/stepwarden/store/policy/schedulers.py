"""The schedulers' registry and the release of what a gone or draining scheduler held
(`store.policy`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ...records import (
    Released,
    SchedulerBeat,
)
from ...rules import (
    release_state,
)
from ...states import TaskState
from .. import _rows
from .._flow import Flow, Query, Rows, Wakeups, fetch
from ._shared import _json_text, lease_fence


def scheduler_beat(beats: Sequence[SchedulerBeat], ttl: float) -> Query:
    each = [
        {
            "instance": b.instance,
            "workflows": _json_text(list(b.workflows)),
            "versions": _json_text([list(p) for p in b.versions]),
            "capacity": b.capacity,
            "held": b.held,
        }
        for b in beats
    ]
    return Query("scheduler_beat", {"ttl": float(ttl)}, each=each)


def scheduler_leave(instance: str) -> Query:
    return Query("scheduler_leave", {"instance": instance})


def release_held(
    scheduler: str, only: Collection[tuple[str, int]] | None, wake: Wakeups
) -> Flow[list[Released]]:
    """A scheduler gives back the tasks it holds (those of `only`, by task_id and attempt,
    when given: tasks it holds but does not drive), at once: each where
    `rules.release_state` says, fenced by the attempt read and its own hold."""
    held = yield from fetch("held_by", scheduler=scheduler)
    if only is not None:
        held = [r for r in held if (r["task_id"], r["attempt"]) in only]
    reason = "drained" if only is None else "held but not driven"
    by = {"by": scheduler, "term": None, "reason": reason}
    return (yield from _release(held, by, wake))


def held_in_time(rows: Rows) -> list[tuple[str, int]]:
    """Of a scheduler's tasks (`held_by`), those whose complete_by is still to come: past it,
    the supervisor expires the task and counts a failure."""
    return [(r["task_id"], int(r["attempt"])) for r in rows if r["in_time"]]


def release_gone_schedulers(
    *, lease: str, holder: str, term: int, limit: int, forget_after: float, wake: Wakeups
) -> Flow[list[Released]]:
    """Under the lease: the tasks held by scheduler instances gone silent are given back
    (`rules.release_state`; no failure counted), for another scheduler to resume by replay
    at once; instances gone for `forget_after` seconds are forgotten."""
    if limit <= 0:
        return []
    held, gone = yield [
        lease_fence(lease, holder, term),
        Query("gone_scheduler_tasks", {"limit": limit}),
    ]
    if not held:
        return []
    by = {"by": holder, "term": term, "reason": "scheduler gone"}
    released = yield from _release(gone, by, wake)
    yield [Query("forget_schedulers", {"forget_after": float(forget_after)})]
    return released


def _release(rows: Rows, by: Mapping[str, Any], wake: Wakeups) -> Flow[list[Released]]:
    each = [
        {
            "task_id": r["task_id"],
            "attempt": r["attempt"],
            "scheduler": r["locked_by"],
            "held_as": r["process_state"],
            "state": str(release_state(TaskState(r["process_state"]))),
        }
        for r in rows
    ]
    if not each:
        return []
    [released] = yield [Query("release_tasks", by, each=each)]
    if released:
        wake.tasks()
    return [_rows.released(r) for r in released]
