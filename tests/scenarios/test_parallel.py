"""Parallel branches (`ctx.gather`) with real processes: the scheduler driving them is killed
with SIGKILL mid-gather and another resumes the task by replay."""

from __future__ import annotations

from collections import Counter

import pytest

from .harness import COMPLETED, PROCESSED, Cluster

pytestmark = pytest.mark.slow


def test_branches_replayed_after_a_sigkill_keep_their_places_and_run_no_step_again(
    cluster: Cluster,
) -> None:
    """Branch 1 is two quick steps; branch 2's first step blocks until released. The
    scheduler is killed once branch 1 is done; branch 2 is released while no scheduler holds
    the task. The successor replays in another interleaving (both branches' first steps now
    answer at once): every step keeps its place and its record, none is called twice, and
    the steps not yet taken run once, at their places."""
    c = cluster
    release = c.workdir / "release"
    doomed = c.start("scheduler-1", "--roles", "scheduler")
    c.start("agents", "--roles", "agents,supervisor")
    branches = [
        [{"idempotent": True}, {"idempotent": True}],
        [{"block_until": str(release), "idempotent": True}, {"idempotent": True}],
    ]
    c.submit("p1", [{"idempotent": True}, {"parallel": branches}, {}])

    def branch_one_done() -> bool:
        steps = c.app.show("p1").steps
        done = {s.position for s in steps if s.state == COMPLETED}
        return {"2.1.1", "2.1.2"} <= done and any(s.position == "2.2.1" for s in steps)

    c.wait_until(branch_one_done, "branch 1 to finish while branch 2 waits", task_ids=("p1",))
    [blocked] = [s for s in c.app.show("p1").steps if s.position == "2.2.1"]
    c.wait_until(lambda: c.calls(task_id="p1", seq=blocked.seq),
                 "branch 2's first call to start", task_ids=("p1",))  # fmt: skip
    before = {s.seq: s.position for s in c.app.show("p1").steps}
    c.kill(doomed)
    release.touch()
    successor = c.start("scheduler-2", "--roles", "scheduler")

    task = c.wait_finished("p1", timeout=60)  # once scheduler-1 is found gone
    view = c.app.show("p1")
    calls = c.calls(task_id="p1")
    effects = c.effects(task_id="p1")
    runs = c.runs(task_id="p1")
    why = c.why(f"calls {calls}\neffects {effects}\nruns {runs}\nbefore {before}", "p1")
    assert task.process_state == PROCESSED, why
    assert [r["pid"] for r in runs] == [doomed.pid, successor.pid], why
    places = {s.seq: s.position or "" for s in view.steps}
    assert {seq: places[seq] for seq in before} == before, why
    assert sorted(places.values()) == ["1", "2.1.1", "2.1.2", "2.2.1", "2.2.2", "3"], why
    assert all(s.state == COMPLETED for s in view.steps), why
    # Each step was called once (the blocked one included: it was not re-dispatched while
    # its agent lived), and applied its effect once.
    assert Counter(x["key"] for x in calls) == {f"p1/{s.seq}": 1 for s in view.steps}, why
    assert Counter(x["key"] for x in effects) == {f"p1/{s.seq}": 1 for s in view.steps}, why
    by_place = {s.position: s.result for s in view.steps}
    assert task.result == [
        by_place["1"],
        [[by_place["2.1.1"], by_place["2.1.2"]], [by_place["2.2.1"], by_place["2.2.2"]]],
        by_place["3"],
    ], why
