"""New code checked against the tasks in flight (`stepwarden check-upgrade`), read-only.

Each task a scheduler may still run (`REPLAYED_STATES`) is replayed by the new code's
workflow exactly as a scheduler resumes it: the workflow's coroutine runs with a `Context`
fed the task's recorded steps and waits, so the divergence check that runs is the engine's
own (`workflow.Context`, worded by `workflow._diverged`; a wait compared by
`rules.wait_mismatch`). Only the step runner differs (`_Replay`): it calls no agent and writes
nothing. A recorded step returns its result (or raises StepFailed) through the Context's own
path; the first step or wait that is not recorded yet, or still open, is where the task
stands today: the replay stops there, and the task replays.

The recorded tasks come from a store (opened read-only: `Store.read_only`) or from a file
`stepwarden export-tasks` wrote (`export`, `load`): the records as the store holds them, so
a sealed secret stays sealed in the file. It opens only with the keyring (`STEPWARDEN_KEYRING`
or `STEPWARDEN_KEYS`); without it the replay goes on with the secrets masked (a workflow that
reveals one is reported as not checked), and the report says so. A secret stored plain (a
store without a keyring) is masked in the file.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, NoReturn

import orjson

from . import _json
from .agent import AnyOperation
from .errors import KeyringError, NonDeterminismError, PayloadError
from .records import (
    Held,
    NewStep,
    ParkRequest,
    StepDispatch,
    StepRecord,
    TaskRecord,
    WaitOutcome,
    WaitRecord,
    WaitRequest,
)
from .rules import wait_mismatch
from .sealing import Binding, Keyring
from .secret import MASK, Secret
from .states import StepState, TaskState
from .store.ports import ReadPort
from .workflow import Abandon, Context, Workflow, compensation

FORMAT = "stepwarden-tasks"
FORMAT_VERSION = 1
REPLAYED_STATES = tuple(
    s
    for s in TaskState
    if s not in (TaskState.PROCESSED, TaskState.COMPENSATED, TaskState.CANCELLED)
)
"""The states of a task that the new code may still run: those not ended, and those that
wait for an operator (error, compensation_failed: a retry replays them)."""
IDLE_ROUNDS = 100
"""Turns of the event loop without a move of the replay after which it stands where the task
stands (every branch at a step or wait not yet recorded, or open)."""
DEFAULT_LIMIT = 10_000
"""How many tasks of each state a check or an export reads at most, by default."""
REPLAY_WITHIN = 5.0
"""Seconds a replay may take (a workflow that awaits something else than its steps)."""


class Outcome(StrEnum):
    """How a task's replay by the new code ends."""

    REPLAYS = "replays"
    """It takes the recorded steps and waits, up to where the task stands, or returns."""
    DIVERGES = "diverges"
    """It asks for another step or wait than the one recorded at a place, or returns
    before a place where the task recorded one ("the workflow asked for its end")."""
    RAISES = "raises"
    """It raises (an operation the new code does not declare, an error of its own): the task
    would end in error. Not counted for a task in error already."""
    UNDECLARED = "undeclared"
    """The new code does not declare the task's (workflow, version): no scheduler of it
    would run the task."""
    NOT_CHECKED = "not_checked"
    """It reveals a sealed secret and no keyring was given, or it did not stand still within
    REPLAY_WITHIN: what it would do is not known."""


BREAKS = frozenset({Outcome.DIVERGES, Outcome.RAISES, Outcome.UNDECLARED})


@dataclass(frozen=True, slots=True)
class InFlight:
    """A task as recorded: its row, its steps, its waits, and the workflow of each child
    task its waits name (by the child's task id)."""

    task: TaskRecord
    steps: list[StepRecord]
    waits: list[WaitRecord]
    children: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskCheck:
    task_id: str
    workflow: str
    version: int
    state: str
    outcome: Outcome
    breaks: bool
    position: str | None = None
    """Where it diverges, or where the replay stands (None: the workflow returns, or not
    known)."""
    asked: str | None = None
    """What the new code asks for there (a divergence)."""
    recorded: str | None = None
    """What is recorded there (a divergence)."""
    message: str | None = None
    """The divergence or the error, worded as a run would record it; or where it stands."""
    sealed: bool = False
    """The task holds sealed secrets, replayed masked (no keyring)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionSummary:
    workflow: str
    version: int
    declared: bool
    tasks: int
    counts: dict[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    checked: int
    breaking: int
    tasks: list[TaskCheck]
    summary: list[VersionSummary]
    masked: int
    """Tasks with sealed secrets replayed masked (no keyring given)."""
    masked_in_file: int = 0
    """Secrets stored plain that the export masked."""
    declared: list[tuple[str, int]] = field(default_factory=list)
    """The (workflow, version)s the new code declares."""

    @property
    def ok(self) -> bool:
        return self.breaking == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "breaking": self.breaking,
            "masked": self.masked,
            "masked_in_file": self.masked_in_file,
            "declared": [{"workflow": n, "version": v} for n, v in self.declared],
            "summary": [
                {
                    "workflow": s.workflow,
                    "version": s.version,
                    "declared": s.declared,
                    "tasks": s.tasks,
                    **{str(o): s.counts.get(str(o), 0) for o in Outcome},
                }
                for s in self.summary
            ],
            "tasks": [
                {
                    "task_id": t.task_id,
                    "workflow": t.workflow,
                    "version": t.version,
                    "state": t.state,
                    "outcome": str(t.outcome),
                    "breaks": t.breaks,
                    "position": t.position,
                    "asked": t.asked,
                    "recorded": t.recorded,
                    "message": t.message,
                    "sealed": t.sealed,
                }
                for t in self.tasks
            ],
        }


# -- the replay --------------------------------------------------------------------------


class _Replay:
    """The step runner of a replay (`workflow.StepRunner`): it answers from the records
    alone, calls no agent and writes nothing; a step or wait not recorded, or open, holds
    its branch there (`_stand`) until the replay stands still."""

    def __init__(
        self,
        recorded: InFlight,
        workflows: Mapping[tuple[str, int], Workflow],
        operations: Mapping[str, AnyOperation] | None,
        keys: Keyring | None,
    ) -> None:
        self.instance = "check-upgrade"
        self.operations = operations
        self.keys = keys
        self._workflows = workflows
        self._waits = {w.seq: w for w in recorded.waits}
        self._children = recorded.children
        self._places = {s.seq: s.position for s in recorded.steps}
        self.moves = 0
        """Calls of the runner so far: the replay stands still while it counts no more."""
        self.stands: list[tuple[str | None, str]] = []
        """Where each branch of the replay stands: (position, what)."""

    @property
    def workflows(self) -> Mapping[tuple[str, int], Workflow]:
        return self._workflows

    def workflow_of(self, held: Held) -> Workflow:
        return self._workflows[(held.workflow, held.version)]

    async def run_step(
        self,
        held: Held,
        dispatch: StepDispatch,
        step_name: str,
        *,
        fallback: StepDispatch | None = None,
    ) -> Any:
        self.moves += 1
        if isinstance(dispatch, NewStep):
            place = dispatch.position
            await self._stand(place, f"step {step_name!r}, not yet recorded")
        await self._stand(self._places.get(dispatch.seq), f"step {step_name!r}, under way")

    async def tag(self, held: Held, key: str, value: str) -> None:
        """A tag takes no place and is no record to match: the replay goes on (nothing
        written)."""
        self.moves += 1

    async def wait(self, request: WaitRequest) -> WaitOutcome:
        self.moves += 1
        found = self._waits.get(request.seq)
        if found is None:
            if request.kind == "patch":
                return WaitOutcome(state="done")  # a marker: nothing to wait for
            await self._stand(
                request.position, f"{_wait(request.kind, request.name)}, not yet recorded"
            )
        mismatch = wait_mismatch(request, found.kind, found.name, self._children.get(found.name))
        if mismatch is not None:
            return mismatch
        if found.state == "done" or found.kind == "patch":
            return WaitOutcome(state="done", payload=found.payload)
        if found.state == "failed":
            return WaitOutcome(state="child_failed", payload=found.payload)
        if found.state == "timed_out":
            return WaitOutcome(state="timed_out")
        await self._stand(request.position, f"{_wait(found.kind, found.name)}, open")

    async def park(self, request: ParkRequest) -> WaitOutcome:
        self.moves += 1
        await self._stand(None, "every branch waits")

    async def _stand(self, position: str | None, what: str) -> NoReturn:
        self.stands.append((position, what))
        await asyncio.get_running_loop().create_future()  # cancelled once the replay is still
        raise AssertionError("unreachable")


def _wait(kind: str, name: str) -> str:
    return {
        "timer": "a timer",
        "patch": f"patch marker {name!r}",
        "child": f"child task {name!r}",
    }.get(kind, f"a wait for event {name!r}")


async def replay(
    recorded: InFlight,
    workflows: Mapping[tuple[str, int], Workflow],
    operations: Mapping[str, AnyOperation] | None = None,
    keys: Keyring | None = None,
) -> TaskCheck:
    """Replay one recorded task with the new code's `workflows` (by (name, version)) and
    `operations` (by "agent.operation"; None accepts any), and say how it ends."""
    task = recorded.task
    sealed = keys is None and _holds_sealed(recorded)

    def made(outcome: Outcome, breaks: bool, **said: str | None) -> TaskCheck:
        return TaskCheck(
            task_id=task.task_id,
            workflow=task.workflow,
            version=task.version,
            state=str(task.process_state),
            sealed=sealed,
            outcome=outcome,
            breaks=breaks,
            **said,
        )

    wf = workflows.get((task.workflow, task.version))
    if wf is None:
        declared = sorted(v for n, v in workflows if n == task.workflow)
        said = ", ".join(str(v) for v in declared) or "none"
        message = (
            f"the new code declares no version {task.version} of workflow {task.workflow!r} "
            f"(its versions: {said})"
        )
        return made(outcome=Outcome.UNDECLARED, breaks=True, message=message)
    runner = _Replay(recorded, workflows, operations, keys)
    held = Held(task.task_id, task.attempt, task.workflow, task.priority, task.version)
    waits = {w.position: (w.seq, w.kind, w.name) for w in recorded.waits if w.position is not None}
    ctx = Context(runner, held, list(recorded.steps), waits)
    compensating = task.process_state == TaskState.COMPENSATING

    async def run() -> None:
        if compensating:
            await compensation(ctx, recorded.steps)
        else:
            await wf.fn(ctx, task.input)
            await ctx.settle()

    running = asyncio.create_task(run())
    try:
        still = await _until_still(running, runner)
        ended = running.done()
    finally:
        ctx.close()
        if not running.done():
            running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    if not still and not ended:
        return made(
            outcome=Outcome.NOT_CHECKED,
            breaks=False,
            message=f"the replay did not stand still within {REPLAY_WITHIN:g} s",
        )
    if still:
        position, what = runner.stands[0]
        return made(
            outcome=Outcome.REPLAYS,
            breaks=False,
            position=position,
            message=f"stands at {what}",
        )
    error = running.exception() if not running.cancelled() else None
    if error is None and not compensating:
        error = ctx.left_behind()  # returned before what the task recorded further on
    if error is None or isinstance(error, Abandon):
        return made(outcome=Outcome.REPLAYS, breaks=False, message="the workflow returns")
    if isinstance(error, NonDeterminismError):
        return made(
            outcome=Outcome.DIVERGES,
            breaks=True,
            position=error.position,
            asked=error.asked,
            recorded=error.recorded,
            message=str(error),
        )
    if isinstance(error, KeyringError):
        return made(
            outcome=Outcome.NOT_CHECKED,
            breaks=False,
            message=f"the workflow reveals a sealed secret that does not open here: {error}",
        )
    failed_before = task.process_state in (TaskState.ERROR, TaskState.COMPENSATION_FAILED)
    return made(
        outcome=Outcome.RAISES,
        breaks=not failed_before,
        message=f"{type(error).__name__}: {error}",
    )


async def _until_still(running: asyncio.Task[None], runner: _Replay) -> bool:
    """Wait until the replay ends (False) or stands still where its task stands (True):
    every branch held by `_stand`, none moving for IDLE_ROUNDS turns of the loop."""
    give_up = time.monotonic() + REPLAY_WITHIN
    while not running.done():
        moves = runner.moves
        for _ in range(IDLE_ROUNDS):
            await asyncio.sleep(0)
            if running.done():
                return False
        if runner.moves == moves and runner.stands:
            return True
        if time.monotonic() > give_up:
            return False
        if runner.moves == moves:
            await asyncio.sleep(0.01)  # the workflow awaits something of its own
    return False


async def check(
    tasks: Iterable[InFlight],
    workflows: Mapping[tuple[str, int], Workflow],
    operations: Mapping[str, AnyOperation] | None = None,
    keys: Keyring | None = None,
    *,
    masked_in_file: int = 0,
) -> Report:
    """Replay every task and sum up per (workflow, version)."""
    checks = [await replay(t, workflows, operations, keys) for t in tasks]
    groups: dict[tuple[str, int], list[TaskCheck]] = {}
    for c in checks:
        groups.setdefault((c.workflow, c.version), []).append(c)
    summary = [
        VersionSummary(
            workflow=name,
            version=version,
            declared=(name, version) in workflows,
            tasks=len(group),
            counts={str(o): sum(1 for c in group if c.outcome == o) for o in Outcome},
        )
        for (name, version), group in sorted(groups.items())
    ]
    return Report(
        checked=len(checks),
        breaking=sum(1 for c in checks if c.breaks),
        tasks=checks,
        summary=summary,
        masked=sum(1 for c in checks if c.sealed),
        masked_in_file=masked_in_file,
        declared=sorted(workflows),
    )


# -- the records: from a store, to and from a file ----------------------------------------


async def in_flight(
    store: ReadPort, *, workflow: str | None = None, limit: int = DEFAULT_LIMIT
) -> list[InFlight]:
    """The tasks of `store` in REPLAYED_STATES (at most `limit` of each state, oldest
    first), with their steps, waits and children's workflows: reads only."""
    found: list[InFlight] = []
    for state in REPLAYED_STATES:
        for task in await store.list_tasks(state=state, workflow=workflow, limit=limit):
            steps = await store.get_steps(task.task_id)
            waits = await store.waits(task.task_id)
            children: dict[str, str] = {}
            for w in waits:
                if w.kind == "child":
                    child = await store.get_task(w.name)
                    if child is not None:
                        children[w.name] = child.workflow
            found.append(InFlight(task, steps, waits, children))
    return found


_TASK_PAYLOADS = ("input", "result")
_STEP_PAYLOADS = ("input", "result", "compensation_input", "heartbeat")
_WAIT_PAYLOADS = ("payload",)
_DATES = frozenset(
    {
        "complete_by",
        "created_at",
        "updated_at",
        "finished_at",
        "wake_at",
        "claimed_at",
        "heartbeat_at",
        "call_stopped_at",
    }
)


def export(tasks: Sequence[InFlight], *, source: str, now: datetime) -> tuple[bytes, int]:
    """The JSON document of `tasks` (`stepwarden export-tasks`), and how many secrets
    stored plain it masked. Sealed secrets are written as the store holds them."""
    masked = [0]
    document = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "exported_at": now.isoformat(),
        "source": source,
        "tasks": [
            {
                "task": _record(t.task, _TASK_PAYLOADS, masked),
                "steps": [_record(s, _STEP_PAYLOADS, masked) for s in t.steps],
                "waits": [_record(w, _WAIT_PAYLOADS, masked) for w in t.waits],
                "children": dict(t.children),
            }
            for t in tasks
        ],
    }
    document["masked"] = masked[0]
    return orjson.dumps(document, option=orjson.OPT_INDENT_2), masked[0]


def _record(record: Any, payloads: Sequence[str], masked: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if f.name in payloads:
            value = orjson.loads(_json.dumps(_masked(value, masked), what=f.name))
        elif isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, StrEnum):
            value = str(value)
        out[f.name] = value
    return out


def _masked(value: Any, masked: list[int]) -> Any:
    """`value` with each secret stored plain as MASK (a sealed one kept as it is)."""
    if isinstance(value, Secret):
        if value.sealed is not None:
            return value
        masked[0] += 1
        return Secret(MASK)
    if isinstance(value, dict):
        return {k: _masked(v, masked) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v, masked) for v in value]
    return value


def load(data: bytes, keys: Keyring | None = None) -> tuple[list[InFlight], int]:
    """The tasks of a document `export` wrote, their sealed secrets bound to their records
    (opened with `keys` when revealed), and how many secrets the export masked;
    PayloadError when it is not one."""
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise PayloadError(f"not a JSON document: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise PayloadError(
            f"not a file of `stepwarden export-tasks` (its format is not {FORMAT!r})"
        )
    if document.get("version") != FORMAT_VERSION:
        raise PayloadError(
            f"an export of format version {document.get('version')!r}; this stepwarden "
            f"reads {FORMAT_VERSION}"
        )
    tasks = []
    try:
        for entry in document["tasks"]:
            t = entry["task"]
            task_id = t["task_id"]
            task = _built(
                TaskRecord,
                t,
                {"input": Binding.input(task_id), "result": Binding.result(task_id)},
                keys,
            )
            steps = [
                _built(
                    StepRecord,
                    s,
                    dict.fromkeys(_STEP_PAYLOADS, Binding.step(task_id, s["seq"])),
                    keys,
                )
                for s in entry["steps"]
            ]
            waits = [
                _built(WaitRecord, w, {"payload": _wait_binding(task_id, w)}, keys)
                for w in entry["waits"]
            ]
            for r in (*steps, *waits):
                if r.task_id != task_id or not _place(r.position) or type(r.seq) is not int:
                    raise ValueError(f"a record of {task_id!r} with task {r.task_id!r}, "
                                     f"position {r.position!r}")  # fmt: skip
            children = {str(k): str(v) for k, v in dict(entry.get("children") or {}).items()}
            tasks.append(InFlight(task, steps, waits, children))
        masked = int(document.get("masked") or 0)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PayloadError(
            f"a task of the export is not as `stepwarden export-tasks` writes it: {exc!r}"
        ) from None
    return tasks, masked


PLACE = re.compile(r"[1-9][0-9]{0,8}(\.[1-9][0-9]{0,8})*")
"""A place as the Context numbers them: "3", "3.2.1"."""


def _place(position: object) -> bool:
    """Whether a record's position is a place (or none: a compensation, an old wait)."""
    return position is None or (isinstance(position, str) and PLACE.fullmatch(position) is not None)


def _wait_binding(task_id: str, w: Mapping[str, Any]) -> Binding | None:
    if w["kind"] == "event" and w.get("event_id") is not None:
        return Binding.event(task_id, w["event_id"])
    if w["kind"] == "child":
        return Binding.result(w["name"])
    return None


def _built(
    cls: Any, raw: Mapping[str, Any], payloads: Mapping[str, Binding | None], keys: Keyring | None
) -> Any:
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in raw:
            continue
        value = raw[f.name]
        if f.name in payloads:
            value = _json.loads(orjson.dumps(value), what=f.name, at=payloads[f.name], keys=keys)
        elif f.name in _DATES and value is not None:
            value = datetime.fromisoformat(value)
        elif f.name == "process_state":
            value = TaskState(value)
        elif f.name == "state" and cls is StepRecord:
            value = StepState(value)
        values[f.name] = value
    return cls(**values)


def _holds_sealed(recorded: InFlight) -> bool:
    values: list[Any] = [recorded.task.input]
    for s in recorded.steps:
        values += [s.result, s.input]
    values += [w.payload for w in recorded.waits]
    while values:
        v = values.pop()
        if isinstance(v, Secret):
            if v.sealed is not None:
                return True
        elif isinstance(v, dict):
            values.extend(v.values())
        elif isinstance(v, list | tuple):
            values.extend(v)
    return False
