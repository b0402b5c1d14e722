"""Workflow versions with real worker processes: tasks in flight when workers running version 1
are replaced by workers that declare versions 1 and 2 finish on version 1, while the tasks
submitted by the new code run version 2; a worker with only version 2 leaves version 1 tasks
pending and says so in its log."""

from __future__ import annotations

import re
import time

import stepwarden as sw
from stepwarden.scheduler import VERSIONS_EVERY

from . import scenario_app
from .harness import PROCESSED, Cluster

PENDING = sw.TaskState.PENDING
V1_STEPS = ["v1 first", "v1 second"]
V2_STEPS = ["v2 first", "v2 extra", "v2 second"]


def _steps(c: Cluster, task_id: str) -> list[str]:
    return [s.name for s in c.app.show(task_id).steps]


def test_tasks_in_flight_finish_on_their_version_after_a_deploy(cluster: Cluster) -> None:
    c = cluster
    gate = c.workdir / "gate"
    old_code = scenario_app.build_app(c.store_url, versions=(1,))
    new_code = scenario_app.build_app(c.store_url, versions=(1, 2))
    try:
        before = c.start("worker-v1", "--drain-timeout", "1", env={scenario_app.VERSIONS_ENV: "1"})
        old = [f"old-{i}" for i in range(4)]
        for task_id in old:  # the second step blocks until the gate opens: in flight
            spec = {"first": {}, "second": {"block_until": str(gate), "idempotent": True}}
            old_code.submit("versioned", spec, task_id=task_id)
        c.wait_until(
            lambda: all(c.calls(task_id=t, seq=2) for t in old),
            "every old task in its second step",
            task_ids=tuple(old),
        )
        c.terminate(before)  # a deploy: it drains, and hands its tasks back after 1 s
        before.popen.wait(timeout=60)

        after = c.start("worker-v12", env={scenario_app.VERSIONS_ENV: "1,2"})
        new = [f"new-{i}" for i in range(4)]
        for task_id in new:
            new_code.submit("versioned", {"first": {}, "second": {}}, task_id=task_id)
        gate.touch()
        done = {t: c.wait_finished(t, timeout=60) for t in old + new}
        why = c.why("", *old[:2], *new[:2])
        assert all(t.process_state == PROCESSED for t in done.values()), why
        for task_id in old:
            assert done[task_id].version == 1, why
            assert _steps(c, task_id) == V1_STEPS, c.why(task_id, task_id)
            # Started by the old worker, resumed (by replay, on version 1) by the new one.
            pids = {r["pid"] for r in c.runs(task_id=task_id)}
            assert {before.pid, after.pid} <= pids, (task_id, pids, why)
        for task_id in new:
            assert done[task_id].version == 2, why
            assert _steps(c, task_id) == V2_STEPS, c.why(task_id, task_id)
            assert {r["pid"] for r in c.runs(task_id=task_id)} == {after.pid}, why
        # Each step's effect once, under its key.
        keys = [e["key"] for e in c.effects() if e["task_id"] in old]
        assert sorted(keys) == sorted(f"{t}/{seq}" for t in old for seq in (1, 2)), why
    finally:
        old_code.close()
        new_code.close()


def test_a_worker_without_the_version_leaves_its_tasks_pending_and_says_so(
    cluster: Cluster,
) -> None:
    c = cluster
    old_code = scenario_app.build_app(c.store_url, versions=(1,))
    new_code = scenario_app.build_app(c.store_url, versions=(2,))
    try:
        old = [f"old-{i}" for i in range(3)]
        for task_id in old:
            old_code.submit("versioned", {"first": {}, "second": {}}, task_id=task_id)
        started = time.monotonic()
        worker = c.start("worker-v2", env={scenario_app.VERSIONS_ENV: "2"})
        warning = re.compile(
            r"WARNING stepwarden\.scheduler: scheduler \S+: 3 task\(s\) of workflow "
            r"'versioned' version 1 wait for a scheduler with that version \(this one runs "
            r"version 2 of it\)"
        )
        c.wait_until(lambda: warning.search(worker.log()), "the worker's warning")
        # The worker claims and runs what it has: a version 2 task, submitted after the old
        # ones (which it would have claimed first, were they its own).
        new_code.submit("versioned", {"first": {}, "second": {}}, task_id="new-1")
        finished = c.wait_finished("new-1", timeout=60)
        assert (finished.process_state, finished.version) == (PROCESSED, 2), c.why("", "new-1")
        assert _steps(c, "new-1") == V2_STEPS
        for task_id in old:
            task = c.status(task_id)
            assert (task.process_state, task.attempt, task.version) == (PENDING, 0, 1), c.why(
                "", task_id
            )
            assert c.runs(task_id=task_id) == []
        # Said at start, then once a minute at most.
        elapsed = time.monotonic() - started
        assert 1 <= len(warning.findall(worker.log())) <= 1 + elapsed // VERSIONS_EVERY
    finally:
        old_code.close()
        new_code.close()
