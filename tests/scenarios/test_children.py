"""Child workflows with real processes: a parent and its children held by a scheduler killed
with SIGKILL are finished by another worker, every effect applied once; a parent cancelled
with `--compensate` from the command line, in a process of its own, cancels and compensates
its children."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

import stepwarden as sw

from .harness import APP_REF, COMPLETED, PROCESSED, ROOT, Cluster

pytestmark = pytest.mark.slow


def test_a_parent_and_its_children_survive_a_sigkill_of_their_scheduler(
    cluster: Cluster,
) -> None:
    """The parent runs, side by side, a gather of three children and a step of its own; each
    child's first step, and the parent's, block until released. The worker running the
    scheduler (which holds the parent and the three children) is killed; another one takes
    them all up by replay once it is found gone: no child is started twice, every step
    applies its effect once, and the parent returns its children's results."""
    c = cluster
    release = c.workdir / "release"
    doomed = c.start("scheduler-1", "--roles", "scheduler")
    c.start("agents", "--roles", "agents,supervisor")
    blocked = {"block_until": str(release), "idempotent": True}
    kids = [[blocked, {"idempotent": True}] for _ in range(3)]
    c.submit(
        "p1",
        [
            {"idempotent": True},
            {"parallel": [[{"children": kids}], [blocked]]},
            {"idempotent": True},
        ],
    )
    children = [f"p1:2.1.1.{i}.1" for i in (1, 2, 3)]

    def all_blocked() -> bool:
        started = {x["task_id"] for x in c.calls()}
        return set(children) <= started and len(c.calls(task_id="p1")) == 2

    c.wait_until(all_blocked, "the children and the parent to block", task_ids=("p1",))
    held = {t: c.status(t) for t in ["p1", *children]}
    assert all(t.locked_by is not None for t in held.values()), c.why(str(held), "p1")
    c.kill(doomed)
    release.touch()
    successor = c.start("scheduler-2", "--roles", "scheduler")

    task = c.wait_finished("p1", timeout=90)
    view = c.app.show("p1")
    why = c.why(f"calls {c.calls()}\neffects {c.effects()}\nruns {c.runs()}", "p1", *children)
    assert task.process_state == PROCESSED, why
    assert [k.task_id for k in sorted(view.children, key=lambda k: k.task_id)] == children, why
    results = {}
    for child in children:
        kid = c.app.show(child)
        assert kid.task.process_state == PROCESSED, why
        assert kid.task.parent_id == "p1", why
        assert all(s.state == COMPLETED for s in kid.steps), why
        runs = c.runs(task_id=child)
        assert [r["pid"] for r in runs] == [doomed.pid, successor.pid], why
        results[child] = kid.task.result
    parent_runs = [r["pid"] for r in c.runs(task_id="p1")]
    assert parent_runs[0] == doomed.pid and set(parent_runs[1:]) == {successor.pid}, why
    # Every step of the four tasks applied its effect once (and so no child ran twice).
    keys = {f"{t}/{s.seq}" for t in ["p1", *children] for s in c.app.show(t).steps}
    assert Counter(x["key"] for x in c.effects()) == {k: 1 for k in keys}, why
    by_place = {s.position: s.result for s in view.steps}
    assert task.result == [
        by_place["1"],
        [[[results[k] for k in children]], [by_place["2.2.1"]]],
        by_place["3"],
    ], why


def test_a_parent_cancelled_with_compensate_from_the_command_line_compensates_its_children(
    cluster: Cluster,
) -> None:
    c = cluster
    c.start("worker", "--roles", "scheduler,agents,supervisor")
    undoable = {"undo": {"idempotent": True}, "idempotent": True}
    kids = [[undoable, {"wait_event": "never"}] for _ in range(3)]
    c.submit("p1", [undoable, {"children": kids}])
    children = [f"p1:2.{i}.1" for i in (1, 2, 3)]

    def all_waiting() -> bool:
        states = {t.task_id: t.process_state for t in c.app.tasks(limit=10)}
        return all(states.get(t) == sw.TaskState.WAITING for t in ["p1", *children])

    c.wait_until(all_waiting, "the parent and its children to wait", task_ids=("p1",))
    cancel = subprocess.run(
        [
            sys.executable, "-c", "from stepwarden.cli import main; main()",
            "--app", APP_REF, "--store", c.store_url,
            "cancel", "p1", "--compensate", "--reason", "order withdrawn",
        ],
        cwd=ROOT, env=c.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert cancel.returncode == 0, c.why(f"{cancel.stdout}\n{cancel.stderr}", "p1")

    def all_compensated() -> bool:
        states = {t.task_id: t.process_state for t in c.app.tasks(limit=10)}
        return all(states.get(t) == sw.TaskState.COMPENSATED for t in ["p1", *children])

    c.wait_until(all_compensated, "the parent and its children to be compensated",
                 task_ids=("p1", *children))  # fmt: skip
    why = c.why(f"effects {c.effects()}", "p1", *children)
    [asked] = [e for e in c.app.show("p1").events if e.kind == "operator"]
    for task_id in ["p1", *children]:
        view = c.app.show(task_id)
        [done] = [s for s in view.steps if s.compensates is None and s.state == COMPLETED]
        [undo] = [s for s in view.steps if s.compensates == done.seq]
        assert undo.state == COMPLETED, why
        # The step and its undo each applied their effect once.
        assert len(c.effects(key=done.idempotency_key)) == 1, why
        assert len(c.effects(key=undo.idempotency_key)) == 1, why
        [action] = [e for e in view.events if e.kind == "operator"]
        assert action.detail["action"] == "compensate", why
        assert action.detail["by"] == asked.detail["by"], why  # the operator, for each
        if task_id == "p1":
            assert action.detail["reason"] == "order withdrawn", why
        else:
            assert action.detail["parent"] == "p1", why
            assert action.detail["reason"] == "its parent 'p1' is compensated", why
