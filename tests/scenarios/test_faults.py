"""The failure modes of docs/RELIABILITY.md, with real worker processes: a zombie agent frozen
past its deadline, an answer lost after the remote effect, a compensation whose agent dies, two
supervisors of which one is frozen past its lease, and workers whose clocks are wrong.

A frozen process is stopped with SIGSTOP and continued with SIGCONT; a dead one is SIGKILLed.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from pathlib import Path

import pytest

import stepwarden as sw

from .harness import COMPLETED, PROCESSED, Cluster, Proc

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_zombie_agent_frozen_past_complete_by_changes_nothing_when_it_wakes(
    cluster: Cluster, kind: str
) -> None:
    """The agents process is frozen mid-call for longer than the step's complete_by; the step
    is dispatched again and completed by another process; then the zombie wakes and its call
    answers. sync: the agent had given up on the call at complete_by and reports nothing.
    async: the call ignores its cancellation and answers; the agent either reports the late
    outcome, which the store refuses, or (when its check of its calls comes first: the step
    was dispatched again) discards the answer of a call it had cancelled. No row changes."""
    c = cluster
    release = c.workdir / "release"
    c.start("control", "--roles", "scheduler,supervisor")
    zombie = c.start("agents-1", "--roles", "agents")
    spec = {"within": 1.0, "block_until": str(release), "block_attempts": [1], "idempotent": True}
    if kind == "async":
        spec.update({"async": True, "ignore_cancel": True})
    # Each second until agents-2 is up the step passes its complete_by again: a busy machine
    # may take several to start it, more than the three failures of the "steps" workflow.
    c.submit("z1", [spec], workflow="steps_patient")
    c.wait_until(lambda: c.calls(key="z1/1"), "the call in agents-1", task_ids=("z1",))
    c.pause(zombie)
    other = c.start("agents-2", "--roles", "agents")

    task = c.wait_finished("z1")
    before = c.app.show("z1")
    assert task.process_state == PROCESSED, c.why("", "z1")
    release.touch()
    c.resume(zombie)
    c.wait_until(
        lambda: [x for x in c.calls(key="z1/1", attempt=1) if x["ended_at"] is not None],
        "the zombie's call to answer",
        task_ids=("z1",),
    )
    if kind == "async":
        c.wait_until(
            lambda: (
                "late outcome of z1/1 attempt 1 discarded" in zombie.log()
                or "for z1/1: cancelled (the step was dispatched again" in zombie.log()
            ),
            "the zombie to have its late outcome refused, or to discard it",
            task_ids=("z1",),
        )
    after = c.app.show("z1")
    calls = c.calls(task_id="z1")
    effects = c.effects(task_id="z1")
    why = c.why(f"calls {calls}\neffects {effects}", "z1")
    assert after.task == before.task and after.steps == before.steps, why
    [step] = after.steps
    # Dispatched again once at least (again if agents-2 was not up before that one's
    # complete_by too), and completed by the other process.
    assert (step.state, step.result["pid"]) == (COMPLETED, other.pid) and step.attempt >= 2, why
    # The remote service saw one key from both processes, and applied it once.
    zombies = [(x["key"], x["attempt"]) for x in calls if x["pid"] == zombie.pid]
    others = [(x["key"], x["attempt"]) for x in calls if x["pid"] == other.pid]
    assert zombies == [("z1/1", 1)] and len(zombies) + len(others) == len(calls), why
    assert others[-1] == ("z1/1", step.attempt) and all(a >= 2 for _, a in others), why
    assert [(x["key"], x["pid"]) for x in effects] == [("z1/1", other.pid)], why
    assert zombie.popen.poll() is None, why  # it carries on serving


def test_an_answer_lost_after_the_effect_is_retried_under_the_same_key_and_applied_once(
    cluster: Cluster,
) -> None:
    """The remote service applies the effect, then the connection drops before the answer
    arrives: the agent retries (a transient error), the service recognises the key."""
    c = cluster
    c.start("worker")
    c.submit("l1", [{"idempotent": True, "drop_answer_times": 1}, {}])

    task = c.wait_finished("l1")
    view = c.app.show("l1")
    calls = c.calls(task_id="l1")
    effects = c.effects(task_id="l1")
    why = c.why(f"calls {calls}\neffects {effects}", "l1")
    assert task.process_state == PROCESSED, why
    first = view.steps[0]
    assert (first.state, first.attempt, first.tries) == (COMPLETED, 1, 2), why
    assert [(x["key"], x["try_number"]) for x in calls] == [
        ("l1/1", 1),
        ("l1/1", 2),
        ("l1/2", 1),
    ], why
    assert calls[0]["outcome"] == "raised ConnectionResetError: answer lost after the effect (1)"
    assert Counter(x["key"] for x in effects) == {"l1/1": 1, "l1/2": 1}, why
    # The second try found the effect already applied: the service did nothing twice.
    assert first.result["applied"] is False and first.result["try"] == 2, why
    assert (task.failure_count, task.attempt) == (0, 1), why


@pytest.mark.parametrize("dies", ["before_its_effect", "after_its_effect"])
def test_a_compensation_whose_agent_is_killed_mid_call_completes_once(
    cluster: Cluster, dies: str
) -> None:
    """Step 1 names its undo; step 2 fails for good; the undo's first call dies with its
    agents process (before or after the remote effect). The undo is dispatched again under
    the same key and the task ends compensated, the effect of the undo applied once."""
    c = cluster
    never = c.workdir / "never"
    undo = {"block_until": str(never), "block_attempts": [1], "idempotent": True}
    if dies == "after_its_effect":
        undo["block_after_effect"] = True
    c.start("control", "--roles", "scheduler,supervisor")
    doomed = c.start("agents-1", "--roles", "agents")
    # steps_short: the undo's complete_by (2.5 s) passes soon after its agent dies.
    c.submit("c1", [{"undo": undo}, {"permanent": "card declined"}], workflow="steps_short")
    if dies == "after_its_effect":
        c.wait_until(lambda: c.effects(task_id="c1", seq=3), "the undo's effect", task_ids=("c1",))
    else:
        c.wait_until(lambda: c.calls(task_id="c1", seq=3), "the undo's call", task_ids=("c1",))
    c.kill(doomed)
    fresh = c.start("agents-2", "--roles", "agents")

    task = wait_state(c, "c1", sw.TaskState.COMPENSATED)
    view = c.app.show("c1")
    calls = c.calls(task_id="c1")
    effects = c.effects(task_id="c1")
    why = c.why(f"calls {calls}\neffects {effects}", "c1")
    assert [(s.seq, s.state, s.compensates) for s in view.steps] == [
        (1, COMPLETED, None),
        (2, sw.StepState.FAILED, None),
        (3, COMPLETED, 1),
    ], why
    undo_step = view.steps[2]
    assert (undo_step.attempt, undo_step.idempotency_key) == (2, "c1/3"), why
    assert [(x["key"], x["attempt"], x["pid"]) for x in calls if x["seq"] == 3] == [
        ("c1/3", 1, doomed.pid),
        ("c1/3", 2, fresh.pid),
    ], why
    applied_by = doomed.pid if dies == "after_its_effect" else fresh.pid
    assert [(x["key"], x["pid"]) for x in effects if x["seq"] == 3] == [("c1/3", applied_by)], why
    assert Counter(x["key"] for x in effects) == {"c1/1": 1, "c1/3": 1}, why
    assert task.error is not None and "card declined" in task.error, why
    assert [e.detail["seq"] for e in view.events if e.kind == "expired"] == [3], why


def test_a_supervisor_frozen_past_its_lease_writes_nothing_under_its_stale_term(
    cluster: Cluster,
) -> None:
    """Two supervisors. The leader is frozen (SIGSTOP) past its lease; the other takes the
    lease at a higher term and sweeps; the frozen one wakes, finds its lease lost and writes
    nothing; when the second dies, the first leads again at a higher term still."""
    c = cluster
    first = c.start("supervisor-1", "--roles", "supervisor")
    term1 = leader_term(c, first)
    c.pause(first)
    second = c.start("supervisor-2", "--roles", "supervisor")
    term2 = leader_term(c, second)
    c.start("work", "--roles", "scheduler,agents")
    never = c.workdir / "never"
    expiring = {"within": 0.5, "block_until": str(never), "block_attempts": [1]}
    c.submit("s1", [expiring])
    c.wait_finished("s1")
    c.resume(first)
    c.wait_until(
        lambda: f"lease lost (term {term1})" in first.log(),
        "the woken supervisor to find its lease lost",
    )
    assert c.lease() == (f"supervisor-{second.instance()}", term2), c.why("", "s1")
    c.kill(second)
    term3 = leader_term(c, first, after=term1)
    c.submit("s2", [expiring])
    c.wait_finished("s2")

    why = c.why(f"terms {term1} {term2} {term3}", "s1", "s2")
    assert term1 < term2 < term3, why
    expired = {
        task_id: [(e.detail["by"], e.detail["term"]) for e in c.app.show(task_id).events
                  if e.kind == "expired"]
        for task_id in ("s1", "s2")
    }  # fmt: skip
    assert expired == {
        "s1": [(f"supervisor-{second.instance()}", term2)],
        "s2": [(f"supervisor-{first.instance()}", term3)],
    }, why
    assert all(c.status(t).process_state == PROCESSED for t in ("s1", "s2")), why


SKEW_SITECUSTOMIZE = """\
import os
import time

_offset = float(os.environ["SKEW_SECONDS"])
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _offset
time.time_ns = lambda: _time_ns() + int(_offset * 1e9)
"""


def test_workers_with_clocks_wrong_by_minutes_cause_no_early_reset_and_no_double_claim(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    """PostgreSQL: deadlines come from the database clock, so two workers (each with every
    role) whose wall clocks are 10 minutes fast and 10 minutes slow share the work without
    expiring anything early or running any task twice."""
    c = pg_cluster
    skew = tmp_path / "skew"
    skew.mkdir()
    (skew / "sitecustomize.py").write_text(SKEW_SITECUSTOMIZE)
    workers: dict[str, tuple[Proc, float]] = {}
    for name, offset in (("fast", 600.0), ("slow", -600.0)):
        # The skew first, then the path the tests run with (the code under test).
        path = os.pathsep.join(filter(None, [str(skew), os.environ.get("PYTHONPATH")]))
        env = {"PYTHONPATH": path, "SKEW_SECONDS": str(offset)}
        workers[name] = (c.start(name, "--concurrency", "8", env=env), offset)
    ids = [f"k{n}" for n in range(40)]
    for task_id in ids:
        c.submit(task_id, [{"within": 5.0, "work": 0.05}, {"within": 5.0, "work": 0.05}])
    for task_id in ids:
        c.wait_finished(task_id)

    calls = c.calls()
    runs = c.runs()
    why = c.why(f"runs {runs}")
    for task_id in ids:
        view = c.app.show(task_id)
        assert view.task.process_state == PROCESSED, c.why("", task_id)
        assert (view.task.attempt, view.task.failure_count) == (1, 0), c.why("", task_id)
        assert [(s.state, s.attempt) for s in view.steps] == [(COMPLETED, 1)] * 2, c.why(
            "", task_id
        )
        assert [e.kind for e in view.events] == [], c.why("", task_id)
    # Each task ran once, in one scheduler; each step was called once.
    assert Counter(r["task_id"] for r in runs) == {t: 1 for t in ids}, why
    assert Counter(x["key"] for x in calls) == {f"{t}/{n}": 1 for t in ids for n in (1, 2)}, why
    # The clocks were wrong as intended: each process stamped the side database with its own.
    now = time.time()
    for proc, offset in workers.values():
        stamps = [r["at"] for r in runs if r["pid"] == proc.pid]
        stamps += [x["started_at"] for x in calls if x["pid"] == proc.pid]
        assert all(abs(at - now - offset) < 120 for at in stamps), why
    assert {r["pid"] for r in runs} | {x["pid"] for x in calls} == {
        p.pid for p, _ in workers.values()
    }, why


# -- helpers ---------------------------------------------------------------------------------
def wait_state(c: Cluster, task_id: str, state: sw.TaskState) -> sw.TaskRecord:
    def reached() -> sw.TaskRecord | None:
        task = c.status(task_id)
        return task if task.process_state == state else None

    return c.wait_until(reached, f"task {task_id} to be {state}", task_ids=(task_id,))


def leader_term(c: Cluster, proc: Proc, after: int = 0) -> int:
    """The term at which `proc`'s supervisor became leader (after term `after`)."""

    def term() -> int | None:
        terms = [int(t) for t in re.findall(r"leader at term (\d+)", proc.log())]
        return next((t for t in reversed(terms) if t > after), None)

    return c.wait_until(term, f"{proc.name} to lead")
