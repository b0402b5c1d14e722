"""The application the scenario tests run in real worker processes.

    STEPWARDEN_STORE=sqlite:///x.db SCENARIO_SIDE_DB=/tmp/side.db \\
        stepwarden --app tests.scenarios.scenario_app:app worker

The store URL comes from STEPWARDEN_STORE (the CLI's `--store` overrides it); the "remote
service" the operations call is a SQLite file of its own, SCENARIO_SIDE_DB, which every process
shares and the test reads:

- `calls`: one row per invocation of an operation (written first: the "started" marker), with
  the idempotency key, the step attempt, the try number, the pid, and how it ended (with
  `call.cancelled` as it was then);
- `effects`: one row per effect applied. An effect is applied once per invocation that gets
  that far, unless the step asks for `idempotent`, in which case the service honours the
  idempotency key (a key already applied is not applied again), as a real remote service does;
- `runs`: one row each time a scheduler (re)starts a task's workflow, with the task attempt and
  the pid of the scheduler process.

Two workflows run the same steps: `steps` (a task's complete_within is 30 s: it expires only
through its steps) and `steps_short` (2.5 s: a task whose scheduler died is soon recovered).
A task's input is `{"steps": [spec, ...]}`; each spec is the input of one step, run in order:

- `within`: the step's complete_within, in seconds (default: the workflow's);
- `async`: run the async operation `svc.act_async` (default: the sync `svc.act`, in a thread);
- `block_until` (a file path) and `block_attempts` (default: every attempt): block until the
  file exists (at most `block_limit` seconds, default 60), on those step attempts only; before
  the effect is applied, or after it with `block_after_effect`;
- `ignore_cancel`: (async only) keep blocking when cancelled at complete_by and return late,
  so that the agent reports an answer after the deadline;
- `work`: seconds of simulated remote latency;
- `long`: seconds the call takes unless it is cancelled first (async: an await, which a
  cancel interrupts with CancelledError; sync: a loop that checks `call.cancelled` every
  10 ms and stops, returning early, when it is set); the effect is applied after it;
- `fail_times`: raise a transient error until the key has been called more than this often;
- `permanent`: raise `stepwarden.PermanentError` with this message;
- `drop_answer_times`: apply the effect, then lose the answer (a transient error, as when the
  connection drops before the reply arrives) until the key has been called more than this
  often;
- `undo`: the step's compensation is `svc.undo`, whose own spec is this value (the same keys
  as a step's);
- `op`: another operation than `svc.act`, each doing what `svc.act` does: `edge.act` (agent
  `edge` has a circuit breaker that opens after 3 failures, and retries a request up to 5
  times, so that a request never runs out of tries before the breaker opens; its service is
  down in a process started with SCENARIO_DOWN=1: every call raises ConnectionError before
  the effect);
  `lim.pair` (at most 2 running at once across processes), `lim.each` (1 at once per
  `customer` of the spec), `lim.rated` (4 starts per second), `lim.here` (1 at once per
  agent instance);
- `heartbeat`: `{"for": s, "every": s}`: run `for` seconds, calling `call.heartbeat_sync`
  every `every` seconds (details: the beat's number);
- `pickup_within`, `total_within`: the step's pick-up and total timeouts, in seconds.

A spec `{"sleep": s}` is a durable timer of `s` seconds instead of a step,
`{"wait_event": NAME, "timeout": s}` a wait for the event NAME (its payload is the result), and
`{"parallel": [[spec, ...], ...]}` runs each list of specs as a branch of `ctx.gather` (its
result: the branches' lists of results), and `{"children": [[spec, ...], ...]}` starts each
list of specs as a child task of workflow `steps` (`ctx.child`), all in one `ctx.gather`
(its result: the children's results).

The workflow `versioned` has two versions, of which a process declares those listed in
SCENARIO_VERSIONS (default "1"; e.g. "1,2"): its input is `{"first": spec, "second": spec}`;
version 1 takes the steps "v1 first" and "v1 second", version 2 another path: "v2 first",
"v2 extra" (an empty spec), "v2 second". Each records a run, like the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import stepwarden as sw

STORE_ENV = "STEPWARDEN_STORE"
SIDE_ENV = "SCENARIO_SIDE_DB"
VERSIONS_ENV = "SCENARIO_VERSIONS"
#: Never opened: the test process builds its own App with `build_app(url)`.
DEFAULT_STORE = "sqlite:///stepwarden-scenarios.db"

SIDE_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, task_id TEXT NOT NULL, seq INTEGER NOT NULL,
    attempt INTEGER NOT NULL, try_number INTEGER NOT NULL, pid INTEGER NOT NULL,
    started_at REAL NOT NULL, ended_at REAL, outcome TEXT, cancelled TEXT);
CREATE TABLE IF NOT EXISTS effects (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, task_id TEXT NOT NULL, seq INTEGER NOT NULL,
    attempt INTEGER NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, task_id TEXT NOT NULL, attempt INTEGER NOT NULL,
    pid INTEGER NOT NULL, at REAL NOT NULL);
"""


# -- the side database ("the remote service") -----------------------------------------------
def init_side_db(path: Path | str) -> None:
    """Create the side database (the test does it once, before any process starts)."""
    with _connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(SIDE_SCHEMA)


@contextlib.contextmanager
def _connect(path: Path | str | None = None) -> Iterator[sqlite3.Connection]:
    where = path if path is not None else os.environ[SIDE_ENV]
    conn = sqlite3.connect(where, timeout=30, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        yield conn
    finally:
        conn.close()


def side_rows(path: Path | str, table: str, **where: Any) -> list[dict[str, Any]]:
    """Rows of `calls`, `effects` or `runs`, in insertion order, filtered by equality."""
    if table not in ("calls", "effects", "runs"):
        raise ValueError(table)
    sql = f"SELECT * FROM {table}"
    if where:
        sql += " WHERE " + " AND ".join(f"{k} = ?" for k in where)
    with _connect(path) as conn:
        return [dict(r) for r in conn.execute(sql + " ORDER BY id", list(where.values()))]


def _start_call(call: sw.Call) -> tuple[int, int]:
    """Record an invocation; its row id, and how many times the key was called (this one
    included)."""
    with _connect() as conn:
        conn.execute("BEGIN IMMEDIATE")
        cur = conn.execute(
            "INSERT INTO calls (key, task_id, seq, attempt, try_number, pid, started_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                call.idempotency_key,
                call.task_id,
                call.step,
                call.attempt,
                call.try_number,
                os.getpid(),
                time.time(),
            ),
        )
        (count,) = conn.execute(
            "SELECT count(*) FROM calls WHERE key = ?", (call.idempotency_key,)
        ).fetchone()
        conn.execute("COMMIT")
        return int(cur.lastrowid or 0), int(count)


def _end_call(call_id: int, outcome: str, call: sw.Call) -> None:
    with _connect() as conn:
        conn.execute(
            "UPDATE calls SET ended_at = ?, outcome = ?, cancelled = ? WHERE id = ?",
            (time.time(), outcome, call.cancelled, call_id),
        )


def _apply_effect(call: sw.Call, *, idempotent: bool) -> bool:
    """Apply the step's effect; False when the service honoured the key and did nothing."""
    with _connect() as conn:
        conn.execute("BEGIN IMMEDIATE")
        if (
            idempotent
            and conn.execute(
                "SELECT 1 FROM effects WHERE key = ?", (call.idempotency_key,)
            ).fetchone()
        ):
            conn.execute("COMMIT")
            return False
        conn.execute(
            "INSERT INTO effects (key, task_id, seq, attempt, pid, at) VALUES (?, ?, ?, ?, ?, ?)",
            (call.idempotency_key, call.task_id, call.step, call.attempt, os.getpid(), time.time()),
        )
        conn.execute("COMMIT")
        return True


def _record_run(task_id: str, attempt: int) -> None:
    with _connect() as conn:
        conn.execute(
            "INSERT INTO runs (task_id, attempt, pid, at) VALUES (?, ?, ?, ?)",
            (task_id, attempt, os.getpid(), time.time()),
        )


# -- what an operation does ------------------------------------------------------------------
def _effect(call: sw.Call, spec: dict[str, Any], count: int) -> dict[str, Any]:
    """Fail as told, or apply the effect; the call's answer."""
    if count <= spec.get("fail_times", 0):
        raise ConnectionError(f"transient failure {count} of {spec['fail_times']}")
    if "permanent" in spec:
        raise sw.PermanentError(spec["permanent"])
    applied = _apply_effect(call, idempotent=bool(spec.get("idempotent")))
    if count <= spec.get("drop_answer_times", 0):
        raise ConnectionResetError(f"answer lost after the effect ({count})")
    return {
        "key": call.idempotency_key,
        "attempt": call.attempt,
        "try": call.try_number,
        "pid": os.getpid(),
        "applied": applied,
    }


def _marker(call: sw.Call, spec: dict[str, Any], *, after_effect: bool) -> Path | None:
    """The file this call blocks on at this point (before or after its effect), if any."""
    if "block_until" not in spec or bool(spec.get("block_after_effect")) != after_effect:
        return None
    if call.attempt not in spec.get("block_attempts", [call.attempt]):
        return None
    return Path(spec["block_until"])


def _block(call: sw.Call, spec: dict[str, Any], *, after_effect: bool) -> None:
    marker = _marker(call, spec, after_effect=after_effect)
    limit = time.monotonic() + spec.get("block_limit", 60)
    while marker is not None and not marker.exists():
        if time.monotonic() > limit:
            raise TimeoutError(f"{marker} did not appear")
        time.sleep(0.01)


async def _block_async(call: sw.Call, spec: dict[str, Any], *, after_effect: bool) -> bool:
    """Block like `_block`; True when a cancellation was ignored (`ignore_cancel`)."""
    marker = _marker(call, spec, after_effect=after_effect)
    limit = time.monotonic() + spec.get("block_limit", 60)
    cancelled = False
    while marker is not None:
        if time.monotonic() > limit:
            raise TimeoutError(f"{marker} did not appear")
        try:  # the cancellation at complete_by may come in either await
            if await asyncio.to_thread(marker.exists):
                break
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if not spec.get("ignore_cancel"):
                raise
            cancelled = True  # a remote call that answers after its deadline
    return cancelled


DOWN_ENV = "SCENARIO_DOWN"
RELEASE_ENV = "SCENARIO_RELEASE"
"""The release of the code the `deploy` workflow runs: "1" (the default) reserves then
charges; "2" adds a fraud check between them, behind `ctx.patched("fraud-check")`."""


def _act(call: sw.Call, spec: dict[str, Any]) -> dict[str, Any]:
    call_id, count = _start_call(call)
    try:
        if os.environ.get(DOWN_ENV) == "1" and spec.get("op") == "edge.act":
            raise ConnectionError("the service is down (from this process)")
        _block(call, spec, after_effect=False)
        if spec.get("work"):
            time.sleep(spec["work"])  # simulated latency of the remote service
        if spec.get("long"):
            end = time.monotonic() + spec["long"]
            while call.cancelled is None and time.monotonic() < end:
                time.sleep(0.01)
            if call.cancelled is not None:
                _end_call(call_id, "stopped early", call)
                return {"stopped": call.cancelled}  # discarded by the agent
        if "heartbeat" in spec:
            end = time.monotonic() + spec["heartbeat"]["for"]
            beat = 0
            while time.monotonic() < end:
                time.sleep(spec["heartbeat"]["every"])
                beat += 1
                call.heartbeat_sync({"beat": beat})
        result = _effect(call, spec, count)
        _block(call, spec, after_effect=True)
    except BaseException as exc:
        _end_call(call_id, f"raised {type(exc).__name__}: {exc}", call)
        raise
    _end_call(call_id, "returned", call)
    return result


async def _act_async(call: sw.Call, spec: dict[str, Any]) -> dict[str, Any]:
    call_id, count = _start_call(call)
    try:
        late = await _block_async(call, spec, after_effect=False)
        if spec.get("work"):
            await asyncio.sleep(spec["work"])
        if spec.get("long"):
            await asyncio.sleep(spec["long"])
        result = _effect(call, spec, count)
        late = await _block_async(call, spec, after_effect=True) or late
    except BaseException as exc:
        _end_call(call_id, f"raised {type(exc).__name__}: {exc}", call)
        raise
    _end_call(call_id, "returned late" if late else "returned", call)
    return result


def _undo(call: sw.Call, spec: dict[str, Any]) -> dict[str, Any]:
    return _act(call, spec["undo"])


# -- the App ---------------------------------------------------------------------------------
def build_app(store: str, versions: tuple[int, ...] = (1,)) -> sw.App:
    """The scenario App on `store`, declaring these versions of `versioned`: the workers
    import `app`; the test builds its own."""
    app = sw.App("scenarios", store=store)
    svc = app.agent("svc", retry=sw.Retry(max_attempts=5, initial=0.05, maximum=0.2))
    act = svc.operation(_act, name="act")
    act_async = svc.operation(_act_async, name="act_async")
    undo = svc.operation(_undo, name="undo")
    # More tries than the breaker's threshold: a request's own failures open the breaker
    # before its tries run out, so the instance hands it back instead of giving up on it.
    edge = app.agent(
        "edge",
        retry=sw.Retry(max_attempts=5, initial=0.05, maximum=0.1),
        breaker=sw.Breaker(failures=3, reset_after=60),
    )
    lim = app.agent("lim")
    ops = {
        "svc.act": act,
        "edge.act": edge.operation(_act, name="act"),
        "lim.pair": lim.operation(_act, name="pair", limit=sw.Limit(concurrency=2)),
        "lim.each": lim.operation(
            _act, name="each", limit=sw.Limit(concurrency=1, key=lambda spec: spec["customer"])
        ),
        "lim.rated": lim.operation(_act, name="rated", limit=sw.Limit(rate=4, per=1.0)),
        "lim.here": lim.operation(_act, name="here", limit=sw.Limit(per_instance=1)),
    }

    def seconds(value: float | None) -> timedelta | None:
        return None if value is None else timedelta(seconds=value)

    async def run_steps(ctx: sw.Context, spec: dict[str, Any]) -> list[Any]:
        _record_run(ctx.task_id, ctx.attempt)
        return await run_list(ctx, spec["steps"])

    async def run_list(ctx: sw.Context, specs: list[dict[str, Any]]) -> list[Any]:
        results: list[Any] = []
        for step in specs:
            if "parallel" in step:  # branches side by side, each a list of specs
                branches = [run_list(ctx, branch) for branch in step["parallel"]]
                results.append(await ctx.gather(*branches))
                continue
            if "children" in step:  # child tasks side by side, each a list of specs
                kids = [ctx.child("steps", {"steps": specs}) for specs in step["children"]]
                results.append(await ctx.gather(*kids))
                continue
            if "sleep" in step:  # a durable timer, not a step
                await ctx.sleep(timedelta(seconds=step["sleep"]))
                continue
            if "wait_event" in step:  # an event from outside, not a step
                timeout = timedelta(seconds=step.get("timeout", 600))
                results.append(await ctx.wait_for_event(step["wait_event"], timeout=timeout))
                continue
            results.append(
                await ctx.step(
                    act_async if step.get("async") else ops[step.get("op", "svc.act")],
                    step,
                    complete_within=seconds(step.get("within")),
                    compensate=undo if "undo" in step else None,
                    pickup_within=seconds(step.get("pickup_within")),
                    total_within=seconds(step.get("total_within")),
                )
            )
        return results

    release = int(os.environ.get(RELEASE_ENV, "1"))

    async def deploy(ctx: sw.Context, spec: dict[str, Any]) -> list[Any]:
        """`reserve`, then (release 2, for tasks that had not passed this place) `fraud`,
        then `charge`, whose spec is the task's input (to block it, say)."""
        done = [await ctx.step(act_async, {"idempotent": True}, name="reserve")]
        if release >= 2 and ctx.patched("fraud-check"):
            done.append(await ctx.step(act_async, {"idempotent": True}, name="fraud"))
        done.append(await ctx.step(act_async, spec, name="charge"))
        return done

    app.workflow(deploy, name="deploy", complete_within=timedelta(seconds=60), max_failures=3)
    # A long task deadline: a task expires only through its steps.
    app.workflow(run_steps, name="steps", complete_within=timedelta(seconds=30), max_failures=3)
    # Steps that may pass their complete_by many times while the agent that will finish them
    # starts (a frozen agent's step, dispatched again each second until another is up).
    app.workflow(
        run_steps, name="steps_patient", complete_within=timedelta(seconds=60), max_failures=30
    )
    # A short task deadline: a task held by a dead scheduler is recovered quickly.
    app.workflow(
        run_steps, name="steps_short", complete_within=timedelta(seconds=2.5), max_failures=3
    )

    async def versioned_v1(ctx: sw.Context, spec: dict[str, Any]) -> list[Any]:
        _record_run(ctx.task_id, ctx.attempt)
        return [
            await ctx.step(act, spec["first"], name="v1 first"),
            await ctx.step(act, spec["second"], name="v1 second"),
        ]

    async def versioned_v2(ctx: sw.Context, spec: dict[str, Any]) -> list[Any]:
        _record_run(ctx.task_id, ctx.attempt)
        return [
            await ctx.step(act, spec["first"], name="v2 first"),
            await ctx.step(act, {}, name="v2 extra"),
            await ctx.step(act, spec["second"], name="v2 second"),
        ]

    paths = {1: versioned_v1, 2: versioned_v2}
    for version in versions:
        app.workflow(
            paths[version],
            name="versioned",
            version=version,
            complete_within=timedelta(seconds=30),
            max_failures=3,
        )
    return app


def _versions() -> tuple[int, ...]:
    return tuple(int(v) for v in os.environ.get(VERSIONS_ENV, "1").split(","))


app = build_app(os.environ.get(STORE_ENV, DEFAULT_STORE), _versions())
