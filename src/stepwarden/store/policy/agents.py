"""The agents' flows (`store.policy`): claims of requests within limits, outcomes and
the writes that depend on them, hand-backs, heartbeats, registry beats, stops of calls."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from ...records import (
    AgentBeat,
    CallStop,
    DispatchedStep,
    NewStep,
    OpLimit,
    Request,
    RequestHandback,
    StepDispatch,
    StepOutcome,
    TaskOutcome,
    step_key,
)
from ...rules import (
    SCAN,
    FairShare,
    TenantTurn,
    call_lost,
    error_text,
    fair_shares,
    holds_up_compensation,
    outcome_recorded,
    pick_within_limits,
    plan_call_stopped,
)
from ...sealing import Keyring
from ...states import TaskState
from .. import _rows
from .._flow import Flow, Query, Rows, Wakeups, fetch, first_of_each, together
from ._shared import T, _by_ord, _holds, _json_text
from .scheduler import dispatch_steps, finish_tasks


def claim_requests(instance: str, agent: str, operations: Sequence[str], limit: int) -> Query:
    """Claim up to `limit` queued requests of these operations, in claim order (priority
    with aging, `rules.head_start`), whoever's they are: one statement."""
    params = {"instance": instance, "agent": agent, "operations": list(operations)}
    return Query("claim_requests", {**params, "limit": limit})


def _turns(found: Rows) -> tuple[list[TenantTurn], float]:
    """The tenants `fair_request_tenants` found, as the claim reads them, and the agent's
    fair clock."""
    clock = float(found[0]["clock"] or 0.0) if found else 0.0
    turns = [
        TenantTurn(r["tenant"], float(r["weight"]), None if r["pass"] is None else float(r["pass"]))
        for r in found
    ]
    return turns, clock


def _advance(agent: str, turns: Sequence[TenantTurn], share: FairShare, rows: Rows) -> list[Query]:
    """The writes of a fair claim: the agent's fair clock moves on, and the passes of the
    tenants served by what they got (`rows`, the requests claimed, with their tenants)."""
    got = Counter(r["tenant"] for r in rows)
    weights = {t.tenant: t.weight for t in turns}
    served = [{"tenant": t, "delta": n / weights.get(t, 1.0)} for t, n in sorted(got.items())]
    writes = [Query("advance_agent_clock", {"agent": agent, "clock": share.clock})]
    if served:
        writes.append(
            Query("advance_agent_tenants", {"agent": agent, "floor": share.clock}, each=served)
        )
    return writes


def claim_fair_requests(
    instance: str, agent: str, operations: Sequence[str], limit: int, wake: Wakeups
) -> Flow[Rows]:
    """`claim_requests`, shared fairly among the tenants with requests queued for these
    operations (`rules.fair_shares`: each in proportion to its weight, by rank within it),
    with the passes of this agent (not the task claim's: what is shared is the agent's
    capacity). With one tenant waiting, or none, the claim is `claim_requests` itself and
    writes no pass. The passes of the tenants served move on by what they got."""
    params = {"instance": instance, "agent": agent, "operations": list(operations)}
    found = yield from fetch("fair_request_tenants", agent=agent, operations=list(operations))
    if len(found) <= 1:
        [rows] = yield [claim_requests(instance, agent, operations, limit)]
        return rows
    turns, clock = _turns(found)
    share = fair_shares(turns, clock, limit)
    tenants = sorted(share.counts)
    counts = [share.counts[t] for t in tenants]
    fair = {**params, "limit": limit, "tenants": tenants, "counts": counts}
    [rows] = yield [Query("claim_fair_requests", fair)]
    yield _advance(agent, turns, share, rows)
    return rows


def claim_within_limits(
    instance: str,
    agent: str,
    operations: Sequence[str],
    limit: int,
    limits: Mapping[str, OpLimit],
    wake: Wakeups,
) -> Flow[Rows]:
    """`claim_requests`, the operations in `limits` only within them
    (`rules.pick_within_limits`), the claims of one agent's limited operations one at a
    time. With the requests of several tenants among the candidates (or more candidates
    than it reads: a backlog), each tenant's share (`rules.fair_shares`) is picked first from
    its own requests, read through the tenants' index, and what the limits leave goes by
    rank. Such a claim decides by what it reads, not by the last claim
    (`rules.claim_fairly`): one that its limits hold to fewer requests than it asks for is no
    sign that the queue is empty. With one tenant's requests alone, fewer than it reads, it
    reads nothing more."""
    params = {"instance": instance, "agent": agent, "operations": list(operations)}
    rated = [{"operation": op, "per": float(lim.per)}
             for op, lim in limits.items() if lim.rate is not None]  # fmt: skip
    _, found, running, _, started = yield [
        Query("limits_lock", params),
        Query("limited_candidates", {**params, "scan": SCAN}),
        Query("running_counts", params),
        Query("forget_starts", params, each=rated),
        Query("start_counts", params, each=rated),
    ]
    share: FairShare | None = None
    turns: list[TenantTurn] = []
    backlog = len(found) >= SCAN  # more may wait than were read, of other tenants too
    if backlog or len({r["tenant"] for r in found}) > 1:
        waiting = yield from fetch("fair_request_tenants", agent=agent, operations=list(operations))
        if len(waiting) > 1:
            turns, clock = _turns(waiting)
            share = fair_shares(turns, clock, limit)
    if share is not None and backlog:  # the shares' requests may be past those read
        tenants = sorted(share.counts)
        scan = max(limit, SCAN // len(tenants))
        [theirs] = yield [
            Query("limited_fair_candidates", {**params, "tenants": tenants, "scan": scan})
        ]
        seen = {(r["task_id"], r["seq"]) for r in found}
        found = sorted(
            [*found, *(r for r in theirs if (r["task_id"], r["seq"]) not in seen)],
            key=lambda r: r["ranked_at"],
        )
    chosen = pick_within_limits(
        [(r["operation"], r["limit_key"]) for r in found],
        limits,
        {(r["operation"], r["limit_key"]): r["n"] for r in running},
        {(r["operation"], r["limit_key"]): r["n"] for r in started},
        limit,
        tenants=[r["tenant"] for r in found],
        shares=None if share is None else share.counts,
    )
    if not chosen:
        return []
    picked = [{"task_id": found[i]["task_id"], "seq": found[i]["seq"]} for i in chosen]
    rate_limited = {**params, "rated": [r["operation"] for r in rated]}
    [rows] = yield [Query("claim_chosen", rate_limited, each=picked)]
    if share is not None:
        yield _advance(agent, turns, share, rows)
    return rows


def requests(rows: Rows, keys: Keyring | None = None) -> list[Request]:
    """Claimed requests, in claim order (`ranked_at`: priority with aging)."""
    return [_rows.request(r, keys) for r in sorted(rows, key=lambda r: r["ranked_at"])]


def hand_back(batch: Sequence[RequestHandback], wake: Wakeups) -> Flow[list[bool]]:
    if not batch:
        return []
    each = [
        {
            "task_id": h.task_id,
            "seq": h.seq,
            "attempt": h.attempt,
            "instance": h.agent_instance,
            "reason": h.reason,
        }
        for h in batch
    ]
    [rows] = yield [Query("hand_back", each=each)]
    back = _by_ord(rows, range(len(batch)))
    wake.requests([r["agent"] for r in back.values()])
    return [i in back for i in range(len(batch))]


def note_run(task_id: str, attempt: int, scheduler: str, run_trace: str) -> Query:
    """Record the trace context of a run's span with its task, while the run holds it."""
    params = {"task_id": task_id, "attempt": attempt, "scheduler": scheduler}
    return Query("note_run", {**params, "run_trace": run_trace})


def heartbeat_step(
    task_id: str, seq: int, attempt: int, instance: str, detail: str | None
) -> Query:
    params = {"task_id": task_id, "seq": seq, "attempt": attempt, "instance": instance}
    return Query("heartbeat_step", {**params, "detail": detail})


def beat(beats: Sequence[AgentBeat], ttl: float) -> Query:
    each = [
        {
            "instance": b.instance,
            "agent": b.agent,
            "operations": _json_text(list(b.operations)),
            "capacity": b.capacity,
            "inflight": b.inflight,
            "breaker": b.breaker,
            "breaker_detail": _json_text(b.breaker_detail),
        }
        for b in beats
    ]
    return Query("agent_beat", {"ttl": float(ttl)}, each=each)


def leave(instance: str, agents: Sequence[str]) -> Query:
    return Query("agent_leave", {"instance": instance, "agents": list(agents)})


def complete_steps(
    batch: Sequence[StepOutcome], wake: Wakeups, *, notify: bool = True
) -> Flow[list[bool]]:
    """Record results, each only while the step is running under the given attempt, held by
    the given instance, before its complete_by; True also for one the step holds already
    (`recorded_already`). `notify`: wake the schedulers waiting for them (not when the
    scheduler writing them is the one that waits)."""
    done = yield from _complete_steps(batch, wake, notify=notify)
    return (yield from recorded_already(batch, done))


def recorded_already(batch: Sequence[StepOutcome], done: list[bool]) -> Flow[list[bool]]:
    """`done`, with True for each outcome refused that its step holds already: a try of the
    same write whose answer was lost (`rules.outcome_recorded`). One more read, only when
    one was refused."""
    missed = [i for i, ok in enumerate(done) if not ok]
    if not missed:
        return done
    calls = [(batch[i].task_id, batch[i].seq, batch[i].attempt) for i in missed]
    [rows] = yield [call_facts(calls)]
    found = {(r["task_id"], r["seq"]): _rows.call_facts(r) for r in rows}
    out = list(done)
    for i in missed:
        o = batch[i]
        out[i] = outcome_recorded(
            state=o.state,
            attempt=o.attempt,
            instance=o.agent_instance,
            found=found.get((o.task_id, o.seq)),
        )
    return out


def _complete_steps(
    batch: Sequence[StepOutcome], wake: Wakeups, *, notify: bool = True
) -> Flow[list[bool]]:
    """`complete_steps` in one round: what the write applied."""
    if not batch:
        return []
    keep = first_of_each(batch, lambda o: (o.task_id, o.seq, o.attempt, o.agent_instance))
    each = [
        {
            "task_id": o.task_id,
            "seq": o.seq,
            "attempt": o.attempt,
            "instance": o.agent_instance,
            "state": str(o.state),
            "result": o.result,
            "error": None if o.error is None else error_text(o.error),
            "tries": o.tries,
        }
        for o in (batch[i] for i in keep)
    ]
    [rows] = yield [Query("complete_steps", each=each)]
    applied = _by_ord(rows, keep)
    if notify:
        wake.results([step_key(batch[i].task_id, batch[i].seq) for i in sorted(applied)])
    return [i in applied for i in range(len(batch))]


def advance_alone(
    outcomes: Sequence[StepOutcome],
    dispatches: Sequence[StepDispatch],
    finishes: Sequence[TaskOutcome],
) -> bool:
    """Whether a scheduler's group commit is one statement that owes no wake-up, so that it
    may run alone (`Store._write_alone`): new steps only, each taken at once by an agent
    instance of the scheduler's process (no request queued), as a task's first step called
    where its workflow runs; `dispatch_steps` of them is one query."""
    return (
        not outcomes
        and not finishes
        and bool(dispatches)
        and all(isinstance(d, NewStep) and d.claimed_by for d in dispatches)
    )


def advance(
    outcomes: Sequence[StepOutcome],
    dispatches: Sequence[StepDispatch],
    finishes: Sequence[TaskOutcome],
    wake: Wakeups,
) -> Flow[tuple[list[bool], list[DispatchedStep | None], list[bool]]]:
    """A scheduler's writes of one group commit, in one transaction: the outcomes of the
    steps its own agent instances called (its workflows went on with their results), then
    the steps and task outcomes those workflows wrote next. A dispatch or a task outcome of a
    task one of whose outcomes here is refused is not applied: it was decided on a result
    that is not recorded. This is the one home of that rule: a task's drive carries an
    outcome refused once with each of its later writes (`drive.TaskDrive`), so that none of
    them is applied either.

    The outcomes and what depends on them are sent together, what depends on them behind a
    savepoint: an outcome is seldom refused, and then the savepoint is rolled back and the
    others' writes made again without the refused task's."""
    if not outcomes:
        done: list[bool] = []
        both = yield from together(dispatch_steps(dispatches, wake), finish_tasks(finishes, wake))
        return done, *both
    inner = Wakeups()
    recording = _complete_steps(outcomes, wake, notify=False)
    depending = together(dispatch_steps(dispatches, inner), finish_tasks(finishes, inner))
    first = next(recording)
    try:
        then = next(depending)
    except StopIteration:  # nothing depends on them
        alone = yield first
        return (yield from recorded_already(outcomes, _returned(recording, alone))), [], []
    rows = yield [*first, Query("savepoint_dependents"), *then]
    done = yield from recorded_already(outcomes, _returned(recording, rows[: len(first)]))
    refused = {o.task_id for o, ok in zip(outcomes, done, strict=True) if not ok}
    if not refused & {w.task_id for w in (*dispatches, *finishes)}:
        later = rows[len(first) + 1 :]
        dispatched, finished = yield from _resumed(depending, later)
        wake.add(inner)
        return done, dispatched, finished
    depending.close()
    yield [Query("rollback_dependents")]
    go = [i for i, d in enumerate(dispatches) if d.task_id not in refused]
    end = [i for i, f in enumerate(finishes) if f.task_id not in refused]
    got, ok = yield from together(
        dispatch_steps([dispatches[i] for i in go], wake),
        finish_tasks([finishes[i] for i in end], wake),
    )
    dispatched_: list[DispatchedStep | None] = [None] * len(dispatches)
    finished_ = [False] * len(finishes)
    for i, g in zip(go, got, strict=True):
        dispatched_[i] = g
    for i, f in zip(end, ok, strict=True):
        finished_[i] = f
    return done, dispatched_, finished_


def _returned(flow: Flow[T], rows: list[Rows]) -> T:
    """The result of a flow of one round, sent its rows."""
    try:
        flow.send(rows)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    raise RuntimeError("a flow of one round asked for more")


def _resumed(flow: Flow[T], rows: list[Rows]) -> Flow[T]:
    """Go on with a flow whose first round was sent, from its rows."""
    try:
        batch = flow.send(rows)
        while True:
            batch = flow.send((yield batch))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def call_facts(calls: Sequence[tuple[str, int, int]]) -> Query:
    """The facts of the steps of these calls (task_id, seq, attempt), for `lost`: a batch
    (SQLite: a lookup by key each; PostgreSQL: one statement)."""
    return Query("call_facts", each=[{"task_id": t, "seq": q} for t, q, _ in calls])


def lost(
    rows: Rows, calls: Sequence[tuple[str, int, int]], instance: str
) -> dict[tuple[str, int, int], str]:
    """Of the calls (task_id, seq, attempt) `instance` makes, those that no longer hold
    their step, with why (`rules.call_lost`), from `call_facts` rows."""
    found = {(r["task_id"], r["seq"]): _rows.call_facts(r) for r in rows}
    out: dict[tuple[str, int, int], str] = {}
    for task_id, seq, attempt in calls:
        why = call_lost(attempt=attempt, instance=instance, found=found.get((task_id, seq)))
        if why is not None:
            out[(task_id, seq, attempt)] = why
    return out


def held(rows: Rows, instance: str, keys: Keyring | None = None) -> list[Request]:
    """Of the steps `held_steps` found running and locked by `instance`, those its call
    holds (`rules.call_lost`), as requests in claim order."""
    return requests(
        [
            r
            for r in rows
            if call_lost(attempt=r["attempt"], instance=instance, found=_rows.call_facts(r)) is None
        ],
        keys,
    )


def stop_calls(batch: Sequence[CallStop], wake: Wakeups) -> Flow[list[bool]]:
    """Agents' word that their calls of steps they no longer hold have ended, each written
    as `rules.plan_call_stopped` says, fenced by the attempt, instance and state read (the
    tasks locked first). A compensating task no scheduler holds whose abandoned steps no
    longer hold it up (`rules.holds_up_compensation`) becomes eligible now, never before
    the end of its backoff, and the schedulers are woken."""
    if not batch:
        return []
    keep = first_of_each(batch, lambda c: (c.task_id, c.seq, c.attempt, c.agent_instance))
    calls = [(batch[i].task_id, batch[i].seq, batch[i].attempt) for i in keep]
    _, rows = yield [
        Query("lock_tasks", {"task_ids": sorted({c[0] for c in calls})}),
        call_facts(calls),
    ]
    found = {(r["task_id"], r["seq"]): r for r in rows}
    each, positions, freed = [], [], {}
    for i in keep:
        c = batch[i]
        f = found.get((c.task_id, c.seq))
        facts = None if f is None else _rows.call_facts(f)
        plan = plan_call_stopped(attempt=c.attempt, instance=c.agent_instance, found=facts)
        if plan is None or f is None:
            continue
        each.append(
            {"task_id": c.task_id, "seq": c.seq, "attempt": c.attempt,
             "instance": c.agent_instance, "state": f["state"], "plan": plan,
             "reason": c.reason}
        )  # fmt: skip
        positions.append(i)
        held_up = holds_up_compensation(remaining=float(f["remaining"]), call_stopped=False)
        if (
            plan == "stopped"
            and held_up
            and f["process_state"] == TaskState.COMPENSATING
            and f["task_locked_by"] is None
        ):
            freed[c.task_id] = f["task_attempt"]
    if not each:
        return [False] * len(batch)
    [stopped] = yield [Query("stop_calls", each=each)]
    applied = _by_ord(stopped, positions)
    handed = [i for i, e in zip(positions, each, strict=True) if e["plan"] == "hand_back"]
    wake.requests(
        [found[(batch[i].task_id, batch[i].seq)]["agent"] for i in handed if i in applied]
    )
    ids = sorted({batch[i].task_id for i in applied} & set(freed))
    if ids:
        holds = _holds((yield from fetch("hold_facts", task_ids=ids)))
        sooner = [{"task_id": t, "attempt": freed[t], "hold": holds.get(t, 0.0)} for t in ids]
        [moved] = yield [Query("compensate_sooner", each=sooner)]
        if any(r["due"] for r in moved):
            wake.tasks()
    return [i in applied for i in range(len(batch))]
