"""The flows of schedules (`store.policy`): storing them, their due ticks, a pause."""

from __future__ import annotations

from collections.abc import Sequence

from ... import _json
from ..._json import loads
from ...errors import ConfigurationError
from ...records import (
    ScheduleSpec,
    Submission,
    TicksMade,
)
from ...rules import (
    first_tick,
    plan_ticks,
    schedule_task_id,
)
from ...sealing import Binding, Keyring, input_digest
from .. import _rows
from .._flow import Flow, Query, Wakeups, fetch
from ._shared import lease_fence
from .application import submit


def _tick_input(spec: ScheduleSpec, task_id: str, keys: Keyring | None) -> tuple[str, str]:
    """The input of a schedule's tick task, its secrets sealed for that task (they are
    sealed for the schedule where it is stored), and its digest."""
    value = loads(spec.input, at=Binding.schedule(spec.name), keys=keys)
    digest = input_digest(_json.plain(value), keys)
    if not _json.holds_secret(spec.input):
        return spec.input, digest
    seal = _json.Seal(keys, Binding.input(task_id))
    return _json.dumps(value, what=f"the input of schedule {spec.name!r}", seal=seal), digest


def store_schedules(specs: Sequence[ScheduleSpec], wake: Wakeups) -> Flow[dict[str, str]]:
    """The application's schedules as declared: new ones start at their first tick after
    now (the database's clock); one whose timing changed starts again from there. A schedule
    whose first tick cannot be worked out is not stored, and the others are: returns those
    refused, by name, with why."""
    if not specs:
        return {}
    [[clock]] = yield [Query("db_now")]
    now = float(clock["now"])
    firsts: dict[str, float] = {}
    refused: dict[str, str] = {}
    for s in specs:
        try:
            firsts[s.name] = first_tick(s, now)
        except ConfigurationError as exc:
            refused[s.name] = str(exc)
    each = [
        {
            "name": s.name,
            "workflow": s.workflow,
            "cron": s.cron,
            "every": s.every,
            "input": s.input,
            "timezone": s.timezone,
            "catch_up": s.catch_up,
            "complete_within": s.complete_within,
            "max_failures": s.max_failures,
            "on_failure": s.on_failure,
            "next_at": firsts[s.name],
            "version": s.version,
            "tenant": s.tenant or "",
        }
        for s in specs
        if s.name in firsts
    ]
    if each:
        yield [Query("upsert_schedules", each=each)]
    return refused


def create_ticks(
    *, lease: str, holder: str, term: int, limit: int, keys: Keyring | None, wake: Wakeups
) -> Flow[TicksMade]:
    """Under the lease: for each schedule whose next tick has come, the tasks of its due
    ticks (`rules.plan_ticks`), each id derived from the schedule and the tick so that a tick
    makes one task however many supervisors race; the schedule moves on past them. A
    schedule whose ticks cannot be worked out, or whose sealed input `keys` cannot seal
    again for its tasks, is set aside (paused), and the others go on."""
    held, due = yield [lease_fence(lease, holder, term), Query("due_schedules", {"limit": limit})]
    if not held or not due:
        return TicksMade([], {})
    tasks: list[Submission] = []
    moves = []
    set_aside: dict[str, str] = {}
    for row in due:
        spec = _rows.schedule_spec(row)
        try:
            ticks, after = plan_ticks(spec, float(row["next_at"]), float(row["now"]))
            inputs = [_tick_input(spec, schedule_task_id(spec.name, t), keys) for t in ticks]
        except ConfigurationError as exc:
            set_aside[spec.name] = str(exc)
            continue
        tasks.extend(
            Submission(
                task_id=schedule_task_id(spec.name, tick),
                workflow=spec.workflow,
                input=text,
                priority=0,
                complete_within=spec.complete_within,
                max_failures=spec.max_failures,
                on_failure=spec.on_failure,
                version=spec.version,
                tenant=spec.tenant,
                input_digest=digest,
            )
            for tick, (text, digest) in zip(ticks, inputs, strict=True)
        )
        last = ticks[-1] if ticks else None
        moves.append({"name": spec.name, "next_at": after, "last_tick": last})
    if moves:
        yield [Query("advance_schedules", each=moves)]
    if set_aside:
        yield [Query("set_aside_schedules", each=[{"name": n} for n in set_aside])]
    if not tasks:
        return TicksMade([], set_aside)
    answers = yield from submit(tasks, keys, wake)
    return TicksMade([a.task_id for a in answers if a.created], set_aside)


def pause_schedule(name: str, paused: bool, wake: Wakeups) -> Flow[bool]:
    """An operator pauses or resumes a schedule (False: there is none of that name). The
    ticks that come while it is paused are never made: resumed, it goes on from its first
    tick after now (`rules.first_tick`, by the database's clock), and catch_up covers only
    the ticks missed while no supervisor ran."""
    found = yield from fetch("lock_schedule", name=name)
    if not found:
        return False
    [row] = found
    next_at = float(row["next_at"])
    if row["paused"] and not paused:
        next_at = first_tick(_rows.schedule_spec(row), float(row["now"]))
    yield [Query("pause_schedule", {"name": name, "paused": paused, "next_at": next_at})]
    return True
