"""Healthy, capable agents, with real worker processes on each store: circuit breakers that
send work to the instance whose service answers, the registry's heartbeats (a killed agent's
steps go to another long before their complete_by), priorities, concurrency and rate limits
across processes, heartbeating steps, pick-up and total timeouts.

Limits and priorities are asserted on recorded start times and counts (the side database's
calls, the store's claims), never on how fast anything ran.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pytest
from click.testing import CliRunner

import stepwarden as sw
from stepwarden.cli import cli

from .harness import COMPLETED, PROCESSED, Cluster

pytestmark = pytest.mark.slow

QUICK_REGISTRY = ("--agent-heartbeat", "0.2", "--agent-gone-after", "1")


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one moment (an end before a start at the same time)."""
    points = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    most = now = 0
    for _, step in points:
        now += step
        most = max(most, now)
    return most


def wait_processed(c: Cluster, ids: list[str], timeout: float = 60.0) -> None:
    def done() -> bool:
        return all(c.status(t).process_state == PROCESSED for t in ids)

    c.wait_until(done, f"{len(ids)} tasks to be processed", timeout=timeout, task_ids=tuple(ids))


def test_work_goes_around_an_instance_whose_service_is_down(cluster: Cluster) -> None:
    """Two instances of agent `edge`; from one of them the service is down. The three early
    requests are queued before it starts, so that it holds all three at once. Its breaker
    opens after 3 failures, before any request runs out of tries (edge retries 5 times); it
    hands every request it holds back and claims no more; every step completes through the
    other, none through its complete_by passing, and the open breaker shows in the registry
    and the CLI."""
    c = cluster
    # Beyond capacity: the scheduler queues the early steps while no agent is alive yet.
    c.start("scheduler", "--roles", "scheduler,supervisor", "--beyond-capacity")
    first = [f"early{i}" for i in range(3)]
    for t in first:
        c.submit(t, [{"op": "edge.act", "within": 20, "idempotent": True}])

    def queued() -> bool:
        return all(
            [s.state for s in c.app.show(t).steps] == [sw.StepState.NOT_STARTED] for t in first
        )

    c.wait_until(queued, "the early steps to be queued", task_ids=(*first,))
    down = c.start("down", "--roles", "agents", "--agents", "edge", env={"SCENARIO_DOWN": "1"})

    def breaker_open() -> sw.AgentInstance | None:
        found = [a for a in c.app.agent_instances() if a.breaker == "open"]
        return found[0] if found else None

    opened = c.wait_until(breaker_open, "the down instance's breaker to open", task_ids=(*first,))
    healthy = c.start("healthy", "--roles", "agents", "--agents", "edge")
    later = [f"later{i}" for i in range(10)]
    for t in later:
        c.submit(t, [{"op": "edge.act", "within": 20, "idempotent": True}])
    wait_processed(c, first + later)

    calls = c.calls()
    why = c.why(f"calls {calls}", *first)
    effects = c.effects()
    assert sorted(e["task_id"] for e in effects) == sorted(first + later), why
    assert {e["pid"] for e in effects} == {healthy.pid}, why
    # Once open, the down instance called nothing: it claimed none of the later requests, and
    # each early one it held was handed back after at most a try or two (a retry allowed
    # while the third failure was on its way), never called by it again.
    down_calls = [x for x in calls if x["pid"] == down.pid]
    assert {x["task_id"] for x in down_calls} <= set(first) and len(down_calls) <= 6, why
    assert all(x["outcome"].startswith("raised ConnectionError") for x in down_calls), why
    events = {t: c.app.show(t).events for t in first + later}
    for t in first:
        [handed] = [e for e in events[t] if e.kind == "handed_back"]
        assert handed.detail["from"] == opened.instance, why
        mine = [x["started_at"] for x in down_calls if x["task_id"] == t]
        assert mine and max(mine) < handed.at.timestamp(), why
    assert all(e.kind != "handed_back" for t in later for e in events[t]), why
    # The registry shows both instances alive, one breaker open, one closed.
    agents = {a.instance: a for a in c.app.agent_instances() if a.agent == "edge"}
    assert agents[opened.instance].breaker == "open" and agents[opened.instance].alive, agents
    others = [a for i, a in agents.items() if i != opened.instance]
    assert [(a.breaker, a.alive) for a in others] == [("closed", True)], agents
    assert agents[opened.instance].breaker_detail["failures"] >= 3, agents
    shown = CliRunner().invoke(cli, ["--store", c.store_url, "agents"])
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.output.splitlines() if opened.instance in x)
    assert " open " in f" {line} " and "alive" in line, shown.output
    # Every step went around the down instance at once, none waited out its complete_by.
    assert all(e.kind != "expired" for t in first + later for e in events[t]), why


def test_a_killed_agents_steps_go_to_another_within_a_few_heartbeats(cluster: Cluster) -> None:
    """An agent instance SIGKILLed mid-call stops heartbeating; after `--agent-gone-after`
    (1 s, heartbeats every 0.2 s) the supervisor reassigns its running step, long before the
    step's complete_by (60 s): a new attempt under the same key, failure_count unchanged."""
    c = cluster
    never = c.workdir / "never"
    spec = {"block_until": str(never), "block_attempts": [1], "within": 60, "idempotent": True}
    c.start("scheduler", "--roles", "scheduler,supervisor", *QUICK_REGISTRY)
    doomed = c.start("agents-1", "--roles", "agents", *QUICK_REGISTRY)
    c.submit("t1", [spec])
    c.wait_until(lambda: c.calls(task_id="t1"), "the call in agents-1", task_ids=("t1",))
    c.kill(doomed)
    killed_at = time.time()
    fresh = c.start("agents-2", "--roles", "agents", *QUICK_REGISTRY)
    task = c.wait_finished("t1", timeout=30)

    view = c.app.show("t1")
    calls = c.calls(task_id="t1")
    why = c.why(f"calls {calls}", "t1")
    assert task.process_state == PROCESSED, why
    assert task.failure_count == 0, why
    [step] = view.steps
    assert (step.state, step.attempt, step.reassignments) == (COMPLETED, 2, 1), why
    assert [(x["attempt"], x["pid"]) for x in calls] == [(1, doomed.pid), (2, fresh.pid)], why
    [moved] = [e for e in view.events if e.kind == "reassigned"]
    assert moved.detail["seq"] == 1 and moved.detail["attempt"] == 2, why
    assert moved.detail["from"].endswith(doomed.instance() or "?"), why
    assert not [e for e in view.events if e.kind == "expired"], why
    # Reassigned long before the step's complete_by (60 s after it was claimed).
    assert calls[1]["started_at"] < calls[0]["started_at"] + 30, why
    assert calls[1]["started_at"] > killed_at, why
    gone = [a for a in c.app.agent_instances() if a.instance.endswith(doomed.instance() or "?")]
    assert gone and not any(a.alive for a in gone), gone


def test_high_priority_work_overtakes_a_backlog(cluster: Cluster) -> None:
    """One worker drives 2 workflows at once and makes 1 call at a time; 30 low-priority
    tasks queue up, and 3 high-priority ones submitted after the first low one started are
    claimed and called before most of that backlog."""
    c = cluster
    c.start("worker", "--concurrency", "2", "--agent-concurrency", "1")
    lows = [f"low{i:02d}" for i in range(30)]
    for t in lows:
        c.app.submit("steps", {"steps": [{"work": 0.1}]}, task_id=t, priority=0)
    c.wait_until(lambda: c.calls(), "the first low-priority call")
    highs = [f"high{i}" for i in range(3)]
    for t in highs:
        c.app.submit("steps", {"steps": [{"work": 0.1}]}, task_id=t, priority=10)
    wait_processed(c, lows + highs, timeout=90)

    order = [x["task_id"] for x in sorted(c.calls(), key=lambda x: x["started_at"])]
    why = c.why(f"call order {order}")
    assert sorted(order) == sorted(lows + highs), why
    last_high = max(order.index(t) for t in highs)
    lows_after = [t for t in order[last_high:] if t in lows]
    assert len(lows_after) >= 15, why


def test_limits_hold_across_processes(cluster: Cluster) -> None:
    """Two agent processes, each able to make 10 calls at once, share the limits of `lim`:
    `lim.pair` at most 2 running at once, `lim.each` 1 at once per customer, `lim.rated` 4
    starts per second, `lim.here` 1 at once in each process."""
    c = cluster
    c.start("scheduler", "--roles", "scheduler,supervisor")
    agents = [
        c.start(f"agents-{i}", "--roles", "agents", "--agents", "lim", "--agent-concurrency", "10")
        for i in (1, 2)
    ]
    specs: dict[str, dict[str, Any]] = {}
    for i in range(8):
        specs[f"pair{i}"] = {"op": "lim.pair", "work": 0.2, "within": 30}
        specs[f"rated{i}"] = {"op": "lim.rated", "within": 30}
    for i in range(6):
        specs[f"each{i}"] = {"op": "lim.each", "customer": "ab"[i % 2], "work": 0.2, "within": 30}
        specs[f"here{i}"] = {"op": "lim.here", "work": 0.2, "within": 30}
    for task_id, spec in specs.items():
        c.submit(task_id, [spec])
    wait_processed(c, list(specs), timeout=90)

    calls = c.calls()
    why = c.why(f"calls {calls}")
    assert len(calls) == len(specs), why  # one call each: nothing failed or ran twice
    by: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    for x in calls:
        op = specs[x["task_id"]]["op"]
        span = (x["started_at"], x["ended_at"])
        by[op].append(span)
        if op == "lim.each":
            by[("each", specs[x["task_id"]]["customer"])].append(span)
        if op == "lim.here":
            by[("here", x["pid"])].append(span)
    assert max_overlap(by["lim.pair"]) <= 2, why
    assert max_overlap(by[("each", "a")]) == 1 and max_overlap(by[("each", "b")]) == 1, why
    assert {k[1] for k in by if k[0] == "here"} <= {a.pid for a in agents}, why
    for pid in (a.pid for a in agents):
        assert max_overlap(by.get(("here", pid), [])) <= 1, why
    # The store's claim times of the rated steps: any 5 in a row span at least a second.
    claimed = sorted(
        c.app.show(t).steps[0].claimed_at.timestamp()  # type: ignore[union-attr]
        for t in specs
        if t.startswith("rated")
    )
    gaps = [b - a for a, b in zip(claimed, claimed[4:], strict=False)]
    assert gaps and min(gaps) >= 1.0, (gaps, why)


def test_a_heartbeating_step_runs_past_its_first_complete_by(cluster: Cluster) -> None:
    """A step given 1 s runs 3 s, heartbeating every 0.2 s: each beat moves its complete_by
    on, so it is never expired, reset or dispatched again; the last beat's details are kept."""
    c = cluster
    c.start("worker")
    c.submit("t1", [{"within": 1.0, "heartbeat": {"for": 3.0, "every": 0.2}}])
    task = c.wait_finished("t1")

    view = c.app.show("t1")
    why = c.why("", "t1")
    assert task.process_state == PROCESSED and task.failure_count == 0, why
    [step] = view.steps
    assert (step.state, step.attempt, step.tries) == (COMPLETED, 1, 1), why
    assert step.finished_at is not None and step.claimed_at is not None, why
    assert (step.finished_at - step.claimed_at).total_seconds() >= 3.0, why
    assert step.heartbeat is not None and step.heartbeat["beat"] >= 10, why
    assert not [e for e in view.events if e.kind in ("expired", "reassigned")], why
    assert len(c.calls(task_id="t1")) == 1, why


@pytest.mark.parametrize("timeout", ["pickup", "total"])
def test_a_step_past_its_pickup_or_total_timeout_fails(cluster: Cluster, timeout: str) -> None:
    """pickup: no instance of agent `edge` runs, so nobody claims the step within 1 s: it
    fails, never called. total: every dispatch of the step blocks past its 1 s complete_by;
    at 2.5 s after the first dispatch the step fails as abandoned (it may have taken effect)."""
    c = cluster
    if timeout == "pickup":
        c.start("worker", "--agents", "svc")
        spec: dict[str, Any] = {"op": "edge.act", "pickup_within": 1.0}
    else:
        c.start("worker")
        never = str(c.workdir / "never")
        spec = {"block_until": never, "block_limit": 5, "within": 1.0, "total_within": 2.5}
    c.submit("t1", [spec])
    task = c.wait_finished("t1")

    view = c.app.show("t1")
    why = c.why("", "t1")
    [step] = view.steps
    assert task.process_state == sw.TaskState.ERROR, why
    assert step.state == sw.StepState.FAILED, why
    if timeout == "pickup":
        assert step.error == "not picked up: no agent claimed the step within 1s", why
        assert c.calls() == [], why
        assert step.attempt == 1, why
    else:
        assert step.error == (
            "abandoned: total timeout: not completed within 2.5s of its first dispatch"
        ), why
        assert len(c.calls(task_id="t1")) >= 1, why
    assert step.error in (task.error or ""), why


@pytest.mark.parametrize("beyond", [False, True])
def test_a_scheduler_claims_no_more_than_the_agents_have_room_for(
    cluster: Cluster, beyond: bool
) -> None:
    """One worker whose three agents make one call at a time each (capacity 3); ten tasks
    whose step blocks. The scheduler holds at most 3 tasks (one running, the rest queued):
    the others stay pending, their deadlines not running. With --beyond-capacity it claims
    all ten, and their steps wait in the queue while their complete_by runs."""
    c = cluster
    gate = c.workdir / "gate"
    args = ["--agent-concurrency", "1", *(["--beyond-capacity"] if beyond else [])]
    c.start("worker", *args)
    c.wait_until(lambda: len(c.app.agent_instances()) == 3, "the three agents to register")
    ids = [f"t{i}" for i in range(10)]
    for t in ids:
        c.submit(t, [{"block_until": str(gate), "within": 30}])
    c.wait_until(lambda: c.calls(), "the first call")

    def held() -> int:
        return sum(c.status(t).process_state == sw.TaskState.PROCESSING for t in ids)

    if beyond:
        c.wait_until(lambda: held() == 10, "every task to be claimed")
    else:
        seen = [held() for _ in range(20)]  # read twenty times while the first call blocks
        why = c.why(f"held {seen} calls {c.calls()}", *ids[:4])
        assert max(seen) <= 3 and len(c.calls()) == 1, why
        pending = [t for t in ids if c.status(t).process_state == sw.TaskState.PENDING]
        assert len(pending) >= 7 and all(c.status(t).complete_by is None for t in pending)
    gate.touch()
    wait_processed(c, ids)
    assert len(c.calls()) == 10, c.why("one call per task")
