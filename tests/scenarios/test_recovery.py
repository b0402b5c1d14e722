"""Recovery in seconds, not at the deadline: the tasks of a scheduler SIGKILLed are resumed by
another once it is found gone, and work caught by a database outage goes on as soon as the
database is back, without waiting for any complete_by and without counting a failure."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

from click.testing import CliRunner

import stepwarden as sw
from stepwarden.cli import cli

from .harness import PROCESSED, Cluster
from .own_postgres import OwnPostgres

#: A scheduler found gone quickly: heartbeats every 0.2 s, gone after 1 s of silence.
QUICK_SCHEDULERS = ("--scheduler-heartbeat", "0.2", "--scheduler-gone-after", "1")
GONE_AFTER = 1.0
#: The workflow "steps" gives each task and step 30 s: recovery must come long before.
DEADLINE = 30.0
#: What "a few seconds" allows on a busy machine, still far short of DEADLINE.
SLACK = 8.0


def _seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def test_a_killed_schedulers_tasks_resume_within_its_gone_after(cluster: Cluster) -> None:
    c = cluster
    doomed = c.start("scheduler-a", "--roles", "scheduler", *QUICK_SCHEDULERS)
    c.start("agents", "--roles", "agents,supervisor")
    ids = [f"r1-{i:02d}" for i in range(30)]
    step = {"work": 1.0, "idempotent": True}
    for task_id in ids:
        c.submit(task_id, [step, step])
    doomed_name = f"scheduler-{doomed.instance()}"

    def doomed_holds_tasks() -> list[str]:
        return [t.task_id for t in c.app.tasks(limit=100) if t.locked_by == doomed_name]

    c.wait_until(lambda: len(doomed_holds_tasks()) >= 3, "scheduler-a to hold tasks")
    c.start("scheduler-b", "--roles", "scheduler", *QUICK_SCHEDULERS)
    c.kill(doomed)

    def all_finished() -> list[sw.TaskRecord] | None:
        tasks = c.app.tasks(limit=100)
        return tasks if len(tasks) == len(ids) and all(t.finished_at for t in tasks) else None

    tasks = c.wait_until(all_finished, "every task to finish", timeout=DEADLINE)
    [gone] = [s for s in c.app.scheduler_instances() if s.instance == doomed_name]
    effects = Counter(x["key"] for x in c.effects())
    released = {}
    for t in tasks:
        for e in c.app.show(t.task_id).events:
            if e.kind == "released":
                released[t.task_id] = (e, t)
    why = c.why(f"released {sorted(released)}\neffects {effects}")
    assert all(t.process_state == PROCESSED for t in tasks), why
    assert set(effects.values()) == {1} and len(effects) == 2 * len(ids), why
    # Not a failure: no work was judged, and no deadline was waited for.
    assert all(t.failure_count == 0 for t in tasks), why
    assert not gone.alive and released, why
    shown = CliRunner().invoke(cli, ["--store", c.store_url, "schedulers"])
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.output.splitlines() if doomed_name in x)
    assert " gone " in f" {line} ", shown.output
    for event, task in released.values():
        assert event.detail["from"] == doomed_name, why
        assert event.detail["reason"] == "scheduler gone", why
        assert task.finished_at is not None, why
        # Found gone within its gone-after (and a sweep), by the store's own clock...
        assert _seconds(event.at, gone.heartbeat_at) <= GONE_AFTER + SLACK, why
        # ...and finished a few seconds later, long before the task's complete_by.
        assert _seconds(task.finished_at, gone.heartbeat_at) <= GONE_AFTER + SLACK, why
        assert all(e.kind != "expired" for e in c.app.show(task.task_id).events), why


def test_work_caught_by_a_database_outage_goes_on_when_it_is_back(
    own_pg_cluster: tuple[Cluster, OwnPostgres],
) -> None:
    c, server = own_pg_cluster
    for n in (1, 2):
        c.start(f"worker-{n}", *QUICK_SCHEDULERS, ready=False)
    for p in c.procs:
        c.wait_until(p.instance, f"{p.name} to start")
    ids = [f"r2-{i:02d}" for i in range(60)]
    step = {"work": 0.2, "idempotent": True}
    for task_id in ids:
        c.submit(task_id, [step, step, step])

    def processed() -> int:
        return sum(t.process_state == PROCESSED for t in c.app.tasks(limit=100))

    c.wait_until(lambda: processed() >= 10, "ten tasks to be processed")
    server.stop()
    time.sleep(5)  # the outage: five seconds without a database
    server.start()
    back = time.time()

    def all_finished() -> list[sw.TaskRecord] | None:
        tasks = c.app.tasks(limit=100)
        return tasks if len(tasks) == len(ids) and all(t.finished_at for t in tasks) else None

    tasks = c.wait_until(all_finished, "every task to finish after the restart", timeout=60)
    effects = Counter(x["key"] for x in c.effects())
    late = {t.task_id: t.finished_at.timestamp() - back for t in tasks if t.finished_at}
    why = c.why(f"effects {effects}\nfinished after the restart (s) {late}")
    assert all(t.process_state == PROCESSED for t in tasks), why  # nothing lost
    assert len(effects) == 3 * len(ids) and set(effects.values()) == {1}, why  # none twice
    # Nobody waited for a deadline (30 s): every task finished within seconds of the
    # restart, and no expiry was counted.
    assert max(late.values()) <= SLACK + 5, why
    assert all(t.failure_count == 0 for t in tasks), why
