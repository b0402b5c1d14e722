"""Waiting tasks with real processes: tasks asleep when their worker is SIGKILLed still wake
once and finish, and a thousand tasks waiting for events hold no scheduler: other work runs
at full speed beside them."""

from __future__ import annotations

from collections import Counter

import stepwarden as sw

from .harness import PROCESSED, Cluster

WAITING = sw.TaskState.WAITING


def test_tasks_asleep_when_their_worker_is_killed_wake_once_and_finish(cluster: Cluster) -> None:
    c = cluster
    doomed = c.start("worker-a")
    ids = [f"s-{i:02d}" for i in range(20)]
    step = {"idempotent": True}
    for task_id in ids:
        c.submit(task_id, [step, {"sleep": 8}, step])

    def all_asleep() -> bool:
        return all(c.status(t).process_state == WAITING for t in ids)

    c.wait_until(all_asleep, "every task asleep", timeout=30)
    assert all(c.status(t).locked_by is None for t in ids)
    c.kill(doomed)  # nothing of theirs is held: nothing waits for this process
    c.start("worker-b")
    finished = [c.wait_finished(t, timeout=60) for t in ids]
    why = c.why("", *ids[:3])
    assert all(t.process_state == PROCESSED for t in finished), why
    assert all(t.failure_count == 0 for t in finished), why
    # Each step's effect once, under its key; each task woke once, after its timer.
    effects = Counter(x["key"] for x in c.effects())
    assert effects == Counter({f"{t}/{seq}": 1 for t in ids for seq in (1, 3)}), why
    for task_id in ids:
        kinds = [e.kind for e in c.app.show(task_id).events]
        assert kinds.count("woke") == 1 and kinds.count("waiting") == 1, (task_id, kinds)


def test_a_thousand_waiting_tasks_hold_no_scheduler(cluster: Cluster) -> None:
    c = cluster
    c.start("worker", "--concurrency", "20")
    app = c.app
    waiting = [f"w-{i:04d}" for i in range(1000)]
    tasks = [
        app.new_task("steps", {"steps": [{"wait_event": "go"}, {}]}, task_id=t) for t in waiting
    ]
    for i in range(0, len(tasks), 200):
        app.submit_many(tasks[i : i + 200])

    def all_waiting() -> bool:
        return all(c.status(t).process_state == WAITING for t in waiting[::50] + waiting[-1:])

    c.wait_until(all_waiting, "the tasks waiting for their event", timeout=120)
    # Twenty other tasks, with a scheduler of twenty slots: they run beside the thousand.
    others = [f"o-{i:02d}" for i in range(20)]
    for task_id in others:
        c.submit(task_id, [{}, {}])
    done = [c.wait_finished(t, timeout=60) for t in others]
    assert all(t.process_state == PROCESSED for t in done), c.why("", *others[:3])
    # The events come: the waiting tasks finish too, each with its payload.
    for task_id in waiting[:50]:
        app.send_event(task_id, "go", task_id, event_id="go-1")
    for task_id in waiting[:50]:
        finished = c.wait_finished(task_id, timeout=60)
        assert finished.process_state == PROCESSED
        assert finished.result[0] == task_id
    assert c.status(waiting[-1]).process_state == WAITING
