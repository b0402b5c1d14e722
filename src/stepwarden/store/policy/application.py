"""The application's flows (`store.policy`): submits (one answer each: created, the same,
a conflict), the shard map, the events and outbox records, the relay's bookkeeping, the
purge."""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ... import _json
from ..._json import loads
from ...errors import KeyringError, TransientStoreError
from ...placement import ShardMap
from ...records import (
    Submission,
    Submitted,
)
from ...rules import (
    START_WAIT,
    head_start,
    resubmit,
    start_state,
)
from ...sealing import Binding, Keyring, same_digest
from ...states import TaskState
from .._flow import Flow, Query, Row, Rows, Wakeups, fetch
from ._shared import _json_text


def submit(
    tasks: Sequence[Submission], keys: Keyring | None, wake: Wakeups
) -> Flow[list[Submitted]]:
    """Record pending tasks; each answered created, or, under a task_id taken, the same
    submit or a conflict (`rules.resubmit`): that task is left as it is. A task_id given
    twice is created once, by its first occurrence, and the second compared with it."""
    if not tasks:
        return []
    [rows] = yield [Query("insert_tasks", each=_task_params(tasks))]
    return (yield from _answers(tasks, rows, keys, wake))


def submit_fenced(
    generation: int, tasks: Sequence[Submission], keys: Keyring | None, wake: Wakeups
) -> Flow[list[Submitted] | None]:
    """`submit` on a shard, where the shard map's newest generation is `generation` (the one
    the submitter placed the tasks by); None, and nothing written, where it is not. One
    statement: the map's read holds its table until the commit (`lock_shard_map` waits)."""
    if not tasks:
        return []
    query = Query("insert_tasks_fenced", {"generation": generation}, each=_task_params(tasks))
    [rows] = yield [query]
    found = next(int(r["generation"]) for r in rows if r["generation"] is not None)
    if found != generation:
        return None
    inserted = [r for r in rows if r["task_id"] is not None]
    return (yield from _answers(tasks, inserted, keys, wake))


def _answers(
    tasks: Sequence[Submission], rows: Rows, keys: Keyring | None, wake: Wakeups
) -> Flow[list[Submitted]]:
    """The answers to `tasks`, of which the insert's `rows` were created: those not created
    compared with the task of their id. One deleted between the insert and the read (past
    its retention) is submitted again, its id free."""
    created = _created(tasks, rows, wake)
    answers: dict[int, Submitted] = {
        i: Submitted(t.task_id, "created") for i, t in enumerate(tasks) if created[i]
    }
    for _ in range(3):
        taken = [i for i in range(len(tasks)) if i not in answers]
        if not taken:
            break
        ids = sorted({tasks[i].task_id for i in taken})
        found = {r["task_id"]: r for r in (yield from fetch("submit_found", task_ids=ids))}
        for i in taken:
            row = found.get(tasks[i].task_id)
            if row is not None:
                answers[i] = _resubmit(tasks[i], row, keys)
        gone = [tasks[i] for i in taken if i not in answers]
        if gone:
            [again] = yield [Query("insert_tasks", each=_task_params(gone))]
            made = {r["task_id"] for r in again}
            for i in taken:
                if i not in answers and tasks[i].task_id in made:
                    answers[i] = Submitted(tasks[i].task_id, "created")
                    made.discard(tasks[i].task_id)
            if any(not _delayed(t) for t in gone):
                wake.tasks()
    for i, t in enumerate(tasks):
        if i not in answers:  # taken and deleted, over and over, between the two statements
            raise TransientStoreError(f"task {t.task_id!r} was deleted while submitted again")
    return [answers[i] for i in range(len(tasks))]


def _resubmit(new: Submission, row: Row, keys: Keyring | None) -> Submitted:
    return resubmit(
        new,
        workflow=row["workflow"],
        version=int(row["version"]),
        submitted_by=row["submitted_by"],
        tenant=row["tenant"] or None,
        same_input=same_input(new, row["input_digest"], keys),
    )


def same_input(new: Submission, stored: str | None, keys: Keyring | None) -> bool:
    """Whether the new submit's input has the `stored` digest (taken under the same key,
    or, after a rotation, under another: compared then with that key)."""
    if stored is None:
        return False
    if new.input_digest is not None and hmac.compare_digest(new.input_digest, stored):
        return True
    try:
        value = loads(new.input, at=Binding.input(new.task_id), keys=keys)
        return same_digest(stored, _json.plain(value), keys)
    except KeyringError:  # a comparison that cannot be made is not a match
        return False


def _task_params(tasks: Sequence[Submission]) -> list[dict[str, Any]]:
    return [
        {
            "task_id": t.task_id,
            "workflow": t.workflow,
            "input": t.input,
            "priority": t.priority,
            "complete_within": float(t.complete_within),
            "max_failures": t.max_failures,
            "on_failure": t.on_failure,
            "reply_to": t.reply_to,
            "start_at": None if t.start_at is None else t.start_at.timestamp(),
            "start_after": float(t.start_after),
            "version": t.version,
            "parent_id": t.parent_id,
            "parent_position": t.parent_position,
            "head_start": head_start(t.priority),
            "trace_context": t.trace_context,
            "submitted_by": t.submitted_by,
            "input_digest": t.input_digest,
            "tenant": t.tenant or "",
            "tags": _json.tags_text(t.tags),
            "process_state": str(_start(t)),
            "waiting_for": START_WAIT if _delayed(t) else None,
        }
        for t in tasks
    ]


def _created(tasks: Sequence[Submission], rows: Rows, wake: Wakeups) -> list[bool]:
    """Which of `tasks` the insert's rows say were created (a task_id given twice, by its
    first occurrence); the schedulers woken when one of them is pending now."""
    inserted = {r["task_id"] for r in rows}
    created = []
    for t in tasks:
        created.append(t.task_id in inserted)
        inserted.discard(t.task_id)
    if any(c and not _delayed(t) for c, t in zip(created, tasks, strict=True)):
        wake.tasks()
    return created


@dataclass(frozen=True, slots=True)
class MapRefused:
    """Why a shard map was not written: `changed` when another process wrote one since it
    was read (read it again), else what is wrong with the database."""

    reason: str
    changed: bool = False


def write_shard_map(
    name: str, shard_map: ShardMap, previous: int, added: bool, wake: Wakeups
) -> Flow[MapRefused | None]:
    """With the map's table locked until the commit: name this database `name` and store the
    generations of `shard_map` it lacks. Refused (nothing written) when the database is
    another shard, when its newest generation is not `previous` (the map changed since it
    was read), or when it is `added` and holds tasks."""
    yield [Query("lock_shard_map")]
    named, stored, tasks = yield [Query("shard_name"), Query("shard_map"), Query("any_task")]
    newest = max((int(r["generation"]) for r in stored), default=0)
    if newest != previous:
        reason = f"the shard map changed meanwhile (generation {newest}, read {previous})"
        return MapRefused(reason, changed=True)
    if named and named[0]["name"] != name:
        return MapRefused(f"the database is shard {named[0]['name']!r} already, not {name!r}")
    if added and tasks[0]["present"]:
        return MapRefused("the database holds tasks already: a shard added must hold none")
    writes = [Query("name_shard", {"name": name})]
    for gen in shard_map.generations:
        if gen.number > newest:
            shards, slots = gen.encoded()
            params = {"generation": gen.number, "shards": shards, "slots": slots}
            writes.append(Query("put_shard_generation", params))
    yield writes
    return None


def _delayed(task: Submission) -> bool:
    return _start(task) == TaskState.WAITING


def _start(task: Submission) -> TaskState:
    return start_state(start_at=task.start_at, start_after=float(task.start_after))


def record_events(events: Sequence[tuple[str | None, str, Any]]) -> Query:
    each = [{"task_id": t, "kind": k, "detail": _json_text(d)} for t, k, d in events]
    return Query("insert_events", each=each)


def record_delivery(
    message_id: int, delivered_to: Sequence[str], done: bool, retry_in: float
) -> Query:
    params = {
        "id": message_id,
        "delivered_to": _json_text(list(delivered_to)),
        "done": done,
        "retry_in": float(retry_in),
    }
    return Query("outbox_delivered", params)


def relay_delivered(message_ids: Sequence[int]) -> Query:
    """Status messages a broker acknowledged: delivered."""
    return Query("relay_delivered", each=[{"id": i} for i in message_ids])


def relay_failed(message_id: int, error: str, retry_in: float) -> Query:
    """A status message a broker did not take: its error, and its next try."""
    return Query("relay_failed", {"id": message_id, "error": error, "retry_in": float(retry_in)})


def relay_refused(refused: Sequence[tuple[int, str]]) -> Query:
    """Status messages the relay never sends: done, with their error."""
    return Query("relay_refused", each=[{"id": i, "error": e} for i, e in refused])


def purge(older_than: float, limit: int, tenant: str | None = None) -> Query:
    """The finished tasks past `older_than` seconds deleted, of one tenant only when given
    (None: of every tenant; "" the tasks of none)."""
    return Query("purge", {"older_than": float(older_than), "limit": limit, "tenant": tenant})
