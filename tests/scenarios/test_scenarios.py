"""Scenarios with real worker processes on each store: processes killed with SIGKILL mid-run,
drained with SIGTERM, steps past their complete_by, transient and permanent errors, a
supervisor leader replaced, two schedulers sharing tasks.

Each operation call and each effect applied is recorded in a side database (see
`scenario_app`), so that a test knows when a step has started (to kill at that moment) and can
check that no effect was applied twice.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

import stepwarden as sw

from .harness import COMPLETED, FINISHED, PROCESSED, Cluster

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dies", ["before_its_effect", "after_its_effect"])
def test_an_agent_killed_mid_step_is_retried_under_the_same_key(
    cluster: Cluster, dies: str
) -> None:
    """The agents process dies with SIGKILL while its call blocks: before the call applied its
    effect, or after (but before the outcome was recorded; the service then honours the key
    on the second call)."""
    c = cluster
    never = c.workdir / "never"  # the first call blocks until it is killed
    spec = {"block_until": str(never), "block_attempts": [1], "within": 2.0}
    if dies == "after_its_effect":
        spec.update({"block_after_effect": True, "idempotent": True})
    c.start("scheduler", "--roles", "scheduler,supervisor")
    doomed = c.start("agents-1", "--roles", "agents")
    # Another agents process is up before the kill, so that the step's second dispatch does
    # not wait for a process to start (on a busy machine, longer than the step's 2 s), and
    # frozen until it, so that the first dispatch is agents-1's.
    fresh = c.start("agents-2", "--roles", "agents")
    c.pause(fresh)
    c.submit("t1", [spec])
    if dies == "after_its_effect":
        c.wait_until(lambda: c.effects(task_id="t1"), "the effect in agents-1", task_ids=("t1",))
    else:
        c.wait_until(lambda: c.calls(task_id="t1"), "the call in agents-1", task_ids=("t1",))
    c.kill(doomed)
    c.resume(fresh)

    task = c.wait_finished("t1")
    view = c.app.show("t1")
    calls = c.calls(task_id="t1")
    effects = c.effects(task_id="t1")
    why = c.why(f"calls {calls}\neffects {effects}", "t1")
    assert task.process_state == PROCESSED, why
    [step] = view.steps
    assert (step.state, step.attempt, step.tries) == (COMPLETED, 2, 1), why
    assert step.idempotency_key == "t1/1", why
    # Both dispatches called the operation under the one key; the first never returned.
    assert [(x["key"], x["attempt"], x["pid"]) for x in calls] == [
        ("t1/1", 1, doomed.pid),
        ("t1/1", 2, fresh.pid),
    ], why
    assert calls[0]["outcome"] is None and calls[1]["outcome"] == "returned", why
    # The effect was applied once: by the second call, or by the first and not again.
    applied_by = (1, doomed.pid) if dies == "after_its_effect" else (2, fresh.pid)
    assert [(x["key"], x["attempt"], x["pid"]) for x in effects] == [("t1/1", *applied_by)], why
    assert step.result["applied"] == (dies == "before_its_effect"), why
    # The supervisor counted one failure; the scheduler claimed the task a second time.
    assert (task.failure_count, task.attempt) == (1, 2), why
    assert [(e.kind, e.detail["seq"]) for e in view.events] == [("expired", 1)], why
    assert step.result["attempt"] == 2 and task.result == [step.result], why


def test_a_scheduler_killed_mid_workflow_is_resumed_without_rerunning_steps(
    cluster: Cluster,
) -> None:
    c = cluster
    release = c.workdir / "release"
    doomed = c.start("scheduler-1", "--roles", "scheduler")
    c.start("agents", "--roles", "agents,supervisor")
    # steps_short: the task's complete_by (2.5 s) passes soon after its scheduler dies.
    c.submit("t2", [{}, {"block_until": str(release)}], workflow="steps_short")
    c.wait_until(lambda: c.calls(key="t2/2"), "step 2 to start", task_ids=("t2",))
    assert c.effects(key="t2/1"), c.why("step 1 is not applied although step 2 runs", "t2")
    c.kill(doomed)
    release.touch()  # step 2 answers while no scheduler holds the task
    successor = c.start("scheduler-2", "--roles", "scheduler")

    task = c.wait_finished("t2")
    view = c.app.show("t2")
    calls = c.calls(task_id="t2")
    effects = c.effects(task_id="t2")
    runs = c.runs(task_id="t2")
    why = c.why(f"calls {calls}\neffects {effects}\nruns {runs}", "t2")
    assert task.process_state == PROCESSED, why
    # The workflow ran twice, once in each scheduler; step 1 was called and applied once.
    assert [(r["attempt"], r["pid"]) for r in runs] == [(1, doomed.pid), (2, successor.pid)], why
    assert Counter(x["key"] for x in calls) == {"t2/1": 1, "t2/2": 1}, why
    assert Counter(x["key"] for x in effects) == {"t2/1": 1, "t2/2": 1}, why
    assert [(s.seq, s.state, s.attempt) for s in view.steps] == [
        (1, COMPLETED, 1),
        (2, COMPLETED, 1),
    ], why
    assert (task.failure_count, task.attempt) == (1, 2), why
    assert [(e.kind, e.detail["seq"]) for e in view.events] == [("expired", None)], why
    assert task.result == [s.result for s in view.steps], why


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_step_past_its_complete_by_is_retried_and_its_late_answer_discarded(
    cluster: Cluster, kind: str
) -> None:
    """sync: the call goes on in its thread after the agent gave up on it at complete_by.
    async: the call ignores its cancellation and answers late: the agent reports the late
    outcome, which the store must refuse, or (when its check of its calls saw the step
    dispatched again first) discards the answer of the call it had cancelled."""
    c = cluster
    release = c.workdir / "release"
    worker = c.start("worker")
    spec = {"within": 1.0, "block_until": str(release), "block_attempts": [1], "idempotent": True}
    if kind == "async":
        spec.update({"async": True, "ignore_cancel": True})
    c.submit("t3", [spec])

    task = c.wait_finished("t3")  # by the second dispatch, while the first still blocks
    before = c.app.show("t3")
    assert task.process_state == PROCESSED, c.why("", "t3")
    release.touch()  # now the first call answers, late
    late = c.wait_until(
        lambda: [x for x in c.calls(key="t3/1", attempt=1) if x["ended_at"] is not None],
        "the first call to answer",
        task_ids=("t3",),
    )[0]
    if kind == "async":
        c.wait_until(
            lambda: (
                "late outcome of t3/1 attempt 1 discarded" in worker.log()
                or "for t3/1: cancelled (the step was dispatched again" in worker.log()
            ),
            "the agent to have the late outcome refused, or to discard it",
            task_ids=("t3",),
        )
    after = c.app.show("t3")
    calls = c.calls(task_id="t3")
    effects = c.effects(task_id="t3")
    why = c.why(f"calls {calls}\neffects {effects}", "t3")
    [step] = after.steps
    assert (step.state, step.attempt, step.idempotency_key) == (COMPLETED, 2, "t3/1"), why
    # The recorded result is the second dispatch's, before and after the late answer.
    assert step.result["attempt"] == 2 and after.task.result == [step.result], why
    assert after.steps == before.steps and after.task == before.task, why
    assert [(x["key"], x["attempt"]) for x in calls] == [("t3/1", 1), ("t3/1", 2)], why
    assert late["outcome"] == ("returned" if kind == "sync" else "returned late"), why
    assert step.finished_at is not None and late["ended_at"] > step.finished_at.timestamp(), why
    # The service honoured the key: the late call applied nothing.
    assert [(x["key"], x["attempt"]) for x in effects] == [("t3/1", 2)], why
    assert (after.task.failure_count, after.task.attempt) == (1, 2), why
    assert [(e.kind, e.detail["seq"]) for e in after.events] == [("expired", 1)], why


def test_transient_errors_are_retried_until_the_operation_succeeds(cluster: Cluster) -> None:
    c = cluster
    c.start("scheduler", "--roles", "scheduler,supervisor")
    c.start("agents", "--roles", "agents")
    c.submit("t4", [{"fail_times": 2}])

    task = c.wait_finished("t4")
    view = c.app.show("t4")
    calls = c.calls(task_id="t4")
    why = c.why(f"calls {calls}", "t4")
    assert task.process_state == PROCESSED, why
    [step] = view.steps
    assert (step.state, step.attempt, step.tries) == (COMPLETED, 1, 3), why
    assert [(x["key"], x["attempt"], x["try_number"], x["outcome"]) for x in calls] == [
        ("t4/1", 1, 1, "raised ConnectionError: transient failure 1 of 2"),
        ("t4/1", 1, 2, "raised ConnectionError: transient failure 2 of 2"),
        ("t4/1", 1, 3, "returned"),
    ], why
    assert [x["key"] for x in c.effects(task_id="t4")] == ["t4/1"], why
    assert (task.failure_count, task.attempt) == (0, 1) and view.events == [], why
    assert task.result == [step.result] and step.result["try"] == 3, why


def test_a_permanent_error_fails_the_step_and_the_task_with_an_alert(cluster: Cluster) -> None:
    c = cluster
    c.start("scheduler", "--roles", "scheduler,supervisor")
    c.start("agents", "--roles", "agents")
    c.submit("t5", [{}, {"permanent": "card declined"}, {}])

    task = c.wait_finished("t5")
    view = c.app.show("t5")
    calls = c.calls(task_id="t5")
    why = c.why(f"calls {calls}", "t5")
    assert task.process_state == sw.TaskState.ERROR, why
    assert task.error is not None and "card declined" in task.error, why
    # Step 3 was never recorded; step 2 was called once, not retried.
    assert [(s.seq, s.state) for s in view.steps] == [
        (1, COMPLETED),
        (2, sw.StepState.FAILED),
    ], why
    assert view.steps[1].error == "PermanentError: card declined", why
    assert [(x["key"], x["try_number"]) for x in calls] == [("t5/1", 1), ("t5/2", 1)], why
    assert [x["key"] for x in c.effects(task_id="t5")] == ["t5/1"], why
    assert [e.kind for e in view.events] == ["alert", "step_failed"], why  # newest first
    alert, failed = view.events
    assert failed.detail == {"seq": 2, "attempt": 1, "error": "PermanentError: card declined"}, why
    assert alert.detail["reason"] == "task_error", why
    assert "card declined" in alert.detail["error"], why
    assert task.failure_count == 0, why


def test_a_killed_supervisor_leader_is_replaced_and_its_successor_sweeps(
    cluster: Cluster,
) -> None:
    c = cluster
    supervisors = [c.start(f"supervisor-{n}", "--roles", "supervisor") for n in (1, 2)]
    # A scheduler and no agents: each dispatch of a step expires unserved.
    c.start("scheduler", "--roles", "scheduler")
    by_holder = {f"supervisor-{p.instance()}": p for p in supervisors}
    holder, term = c.wait_until(c.lease, "a supervisor to take the lease")
    leader = by_holder[holder]
    [survivor] = [p for p in supervisors if p is not leader]
    c.kill(leader)
    c.submit("t6", [{"within": 0.5}])

    c.wait_until(
        lambda: any(e.kind == "expired" for e in c.app.show("t6").events),
        "the new leader to sweep the expired step",
        task_ids=("t6",),
    )
    new_holder, new_term = c.lease() or ("", 0)
    why = c.why(f"lease was {(holder, term)}, is {(new_holder, new_term)}", "t6")
    assert new_holder == f"supervisor-{survivor.instance()}" and new_term > term, why
    assert f"leader at term {new_term}" in survivor.log(), why
    # It goes on: each expiry counts, and at max_failures the task is set to error.
    task = c.wait_finished("t6")
    view = c.app.show("t6")
    why = c.why("", "t6")
    assert task.process_state == sw.TaskState.ERROR and task.failure_count == 3, why
    expired = [e.detail for e in view.events if e.kind == "expired"]  # newest first
    assert [(e["seq"], e["failure_count"]) for e in expired] == [(1, 3), (1, 2), (1, 1)], why
    assert view.events[0].kind == "alert", why
    assert view.events[0].detail["reason"] == "max_failures", why
    # Every sweep of the task was the survivor's (the leader died before it was submitted).
    swept = re.findall(r"task t6: step 1 expired", survivor.log())
    assert len(swept) == 3 and "t6" not in leader.log(), why
    assert c.calls() == [], why


def test_two_schedulers_share_tasks_and_apply_each_effect_once(cluster: Cluster) -> None:
    c = cluster
    schedulers = [
        c.start(f"scheduler-{n}", "--roles", "scheduler", "--concurrency", "10", ready=False)
        for n in ("a", "b")
    ]
    c.start("agents", "--roles", "agents", ready=False)
    c.start("supervisor", "--roles", "supervisor", ready=False)
    for p in c.procs:
        c.wait_until(p.instance, f"{p.name} to start")
    ids = [f"t7-{i:02d}" for i in range(50)]
    for task_id in ids:
        c.submit(task_id, [{"work": 0.02}, {"work": 0.02}])

    def all_finished() -> list[sw.TaskRecord] | None:
        tasks = c.app.tasks(limit=100)
        done = len(tasks) == len(ids) and all(t.process_state in FINISHED for t in tasks)
        return tasks if done else None

    tasks = c.wait_until(all_finished, "the 50 tasks to finish", timeout=60)
    calls = Counter(x["key"] for x in c.calls())
    effects = Counter(x["key"] for x in c.effects())
    runs = c.runs()
    keys = {f"{t}/{seq}" for t in ids for seq in (1, 2)}
    why = c.why(
        f"calls called more than once {[k for k, n in calls.items() if n != 1]}\n"
        f"effects applied more than once {[k for k, n in effects.items() if n != 1]}\n"
        f"tasks run more than once {Counter(r['task_id'] for r in runs).most_common(3)}\n"
        f"tasks {[(t.task_id, t.process_state, t.attempt) for t in tasks]}"
    )
    assert all(t.process_state == PROCESSED for t in tasks), why
    # Each task was claimed once, by one scheduler, and never reset.
    assert all((t.attempt, t.failure_count) == (1, 0) for t in tasks), why
    assert sorted(r["task_id"] for r in runs) == ids, why
    assert {r["pid"] for r in runs} == {p.pid for p in schedulers}, why  # both took a share
    # Each step was called once and its effect applied once.
    assert set(calls) == keys and set(calls.values()) == {1}, why
    assert set(effects) == keys and set(effects.values()) == {1}, why


def test_one_of_two_schedulers_killed_mid_run_loses_nothing_and_repeats_nothing(
    cluster: Cluster,
) -> None:
    c = cluster
    doomed, survivor = (
        c.start(f"scheduler-{n}", "--roles", "scheduler", "--concurrency", "10", ready=False)
        for n in ("a", "b")
    )
    c.start("agents", "--roles", "agents", ready=False)
    c.start("supervisor", "--roles", "supervisor", ready=False)
    for p in c.procs:
        c.wait_until(p.instance, f"{p.name} to start")
    ids = [f"t10-{i:02d}" for i in range(50)]
    for task_id in ids:
        # steps_short: the tasks the killed scheduler held expire 2.5 s after their claim. On
        # a loaded machine other steps may overrun their deadline too and run again: the
        # service honours the key, so that each effect still applies once.
        step = {"work": 0.02, "idempotent": True}
        c.submit(task_id, [step, step], workflow="steps_short")

    def doomed_holds_tasks_midway() -> bool:
        tasks = c.app.tasks(limit=100)
        done = sum(t.process_state == PROCESSED for t in tasks)
        held = sum(t.locked_by == f"scheduler-{doomed.instance()}" for t in tasks)
        return done >= 10 and held >= 1

    c.wait_until(doomed_holds_tasks_midway, "scheduler-a to hold tasks, 10 tasks done")
    c.kill(doomed)
    killed_at = time.time()

    def all_finished() -> list[sw.TaskRecord] | None:
        tasks = c.app.tasks(limit=100)
        done = len(tasks) == len(ids) and all(t.process_state in FINISHED for t in tasks)
        return tasks if done else None

    tasks = c.wait_until(all_finished, "the 50 tasks to finish", timeout=60)
    calls = Counter(x["key"] for x in c.calls())
    effects = Counter(x["key"] for x in c.effects())
    runs: dict[str, list[tuple[int, int, float]]] = {}
    for r in c.runs():
        runs.setdefault(r["task_id"], []).append((r["attempt"], r["pid"], r["at"]))
    keys = {f"{t}/{seq}" for t in ids for seq in (1, 2)}
    why = c.why(
        f"calls called more than once {[k for k, n in calls.items() if n != 1]}\n"
        f"effects applied more than once {[k for k, n in effects.items() if n != 1]}\n"
        f"runs {runs}\ntasks {[(t.task_id, t.process_state, t.attempt) for t in tasks]}"
    )
    assert all(t.process_state == PROCESSED for t in tasks), why
    assert set(effects) == keys and set(effects.values()) == {1}, why
    assert set(calls) == keys, why
    # Each run of a task's workflow was under a new claim (attempts rise), none in the killed
    # scheduler after its death; the tasks it held were resumed by the survivor.
    resumed = set()
    for t in tasks:
        attempts = [a for a, _, _ in runs[t.task_id]]
        assert attempts == sorted(set(attempts)) and attempts[-1] == t.attempt, why
        assert all(at < killed_at for _, pid, at in runs[t.task_id] if pid == doomed.pid), why
        if t.attempt > 1 and runs[t.task_id][-1][1] == survivor.pid:
            resumed.add(t.task_id)
    assert resumed, why  # at least those the killed one held when it died


def test_sigterm_drains_the_work_under_way_and_exits_0(cluster: Cluster) -> None:
    c = cluster
    release = c.workdir / "release"
    worker = c.start("worker", "--drain-timeout", "20")
    c.submit("t8", [{"block_until": str(release)}, {}])
    c.wait_until(lambda: c.calls(key="t8/1"), "step 1 to start", task_ids=("t8",))
    c.terminate(worker)
    c.wait_until(lambda: "SIGTERM received, draining" in worker.log(), "the worker to drain")
    c.submit("t8-later", [{}])  # a draining worker claims nothing new
    release.touch()
    c.wait_until(lambda: worker.popen.poll() is not None, "the worker to exit", task_ids=("t8",))

    task = c.status("t8")
    view = c.app.show("t8")
    calls = c.calls(task_id="t8")
    effects = c.effects(task_id="t8")
    why = c.why(f"calls {calls}\neffects {effects}", "t8", "t8-later")
    assert worker.popen.returncode == 0, why
    # Step 1 finished and step 2 ran in the draining worker, which then recorded the outcome.
    assert task.process_state == PROCESSED and (task.attempt, task.failure_count) == (1, 0), why
    assert [(s.state, s.attempt) for s in view.steps] == [(COMPLETED, 1), (COMPLETED, 1)], why
    ran_here = [("t8/1", worker.pid), ("t8/2", worker.pid)]
    assert [(x["key"], x["pid"]) for x in calls] == ran_here, why
    assert [(x["key"], x["pid"]) for x in effects] == ran_here, why
    later = c.status("t8-later")
    assert (later.process_state, later.attempt) == (sw.TaskState.PENDING, 0), why


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_sigterm_past_the_drain_timeout_leaves_the_step_to_another_worker(
    cluster: Cluster, kind: str
) -> None:
    """The call under way outlasts the drain timeout: the worker still exits 0
    (docs/howto/operating.md: it "lets the work under way finish (up to --drain-timeout),
    records the outcomes and exits"), and the step is dispatched again to another worker once
    its complete_by has passed. A sync operation runs in a thread that cannot be cancelled:
    the worker must not wait for it."""
    c = cluster
    never = c.workdir / "never"  # the first call blocks (20 s at most)
    first = c.start("worker-1", "--drain-timeout", "0.5")
    spec = {"block_until": str(never), "block_attempts": [1], "within": 1.5, "block_limit": 20}
    if kind == "async":
        spec["async"] = True
    c.submit("t9", [spec])
    c.wait_until(lambda: c.calls(key="t9/1"), "the step to start", task_ids=("t9",))
    c.terminate(first)
    # Half a second for the scheduler, half a second for the agents, then it exits.
    c.wait_until(
        lambda: first.popen.poll() is not None,
        f"worker-1 to exit soon after its drain timeout, with a {kind} operation under way",
        timeout=6,
        task_ids=("t9",),
    )
    second = c.start("worker-2")

    task = c.wait_finished("t9")
    view = c.app.show("t9")
    calls = c.calls(task_id="t9")
    effects = c.effects(task_id="t9")
    why = c.why(f"calls {calls}\neffects {effects}", "t9")
    assert first.popen.returncode == 0, why
    # At its drain timeout worker-1 handed the task back at once, for another scheduler.
    [released] = [e for e in view.events if e.kind == "released"]
    assert released.detail["reason"] == "drained", why
    assert released.detail["from"] == f"scheduler-{first.instance()}", why
    # worker-1 left the agent registry as it stopped. The step runs again, attempt 2, in
    # worker-2: reassigned, or dispatched again by worker-2's scheduler resuming the task
    # (no failure counted either way), or, on a slow machine, after the supervisor found its
    # 1.5 s complete_by passed first (one failure).
    expired = [e for e in view.events if e.kind == "expired"]
    assert task.process_state == PROCESSED and task.attempt >= 2, why
    assert task.failure_count == len(expired) <= 1, why
    [step] = view.steps
    assert (step.state, step.attempt, step.idempotency_key) == (COMPLETED, 2, "t9/1"), why
    assert [(x["attempt"], x["pid"]) for x in calls] == [(1, first.pid), (2, second.pid)], why
    assert [(x["attempt"], x["pid"]) for x in effects] == [(2, second.pid)], why
