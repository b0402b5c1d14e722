"""Recovery in seconds, not at the deadline: the tasks of a scheduler SIGKILLed are resumed by
another once it is found gone (the supervisor leader's own worker too), and work caught by a
database outage goes on as soon as the database is back, without waiting for any complete_by
and without counting a failure."""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import psycopg
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
    # The first steps wait for the gate, opened after the kill: however slow the machine,
    # the tasks scheduler-a holds are still under way when it dies.
    gate = c.workdir / "gate"
    for task_id in ids:
        c.submit(task_id, [{"block_until": str(gate), "idempotent": True}, {"work": 0.2}])
    doomed_name = f"scheduler-{doomed.instance()}"

    def doomed_holds_tasks() -> list[str]:
        return [t.task_id for t in c.app.tasks(limit=100) if t.locked_by == doomed_name]

    c.wait_until(lambda: len(doomed_holds_tasks()) >= 3, "scheduler-a to hold tasks")
    c.start("scheduler-b", "--roles", "scheduler", *QUICK_SCHEDULERS)
    c.kill(doomed)
    gate.touch()

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


def test_a_killed_workers_task_is_released_once_and_its_resumed_run_ends_as_its_own(
    cluster: Cluster,
) -> None:
    """A worker holding tasks whose steps its own agents run is killed: each task is given
    back once (its scheduler gone), and the run of the scheduler that resumes it is not
    taken from it when the step is reassigned."""
    c = cluster
    quick = (*QUICK_SCHEDULERS, "--agent-heartbeat", "0.2", "--agent-gone-after", "2")
    doomed = c.start("worker-a", *quick)
    ids = [f"k1-{i:02d}" for i in range(12)]
    gate = c.workdir / "gate"
    for task_id in ids:
        c.submit(task_id, [{"block_until": str(gate), "idempotent": True}, {"work": 0.1}])
    doomed_name = f"scheduler-{doomed.instance()}"

    def doomed_holds_tasks() -> list[str]:
        return [t.task_id for t in c.app.tasks(limit=100) if t.locked_by == doomed_name]

    c.wait_until(lambda: len(doomed_holds_tasks()) >= 3, "worker-a to hold tasks")
    survivor = c.start("worker-b", *quick)
    c.kill(doomed)
    gate.touch()

    def all_finished() -> list[sw.TaskRecord] | None:
        tasks = c.app.tasks(limit=100)
        return tasks if len(tasks) == len(ids) and all(t.finished_at for t in tasks) else None

    tasks = c.wait_until(all_finished, "every task to finish", timeout=DEADLINE)
    released = {
        t.task_id: [e.detail for e in c.app.show(t.task_id).events if e.kind == "released"]
        for t in tasks
    }
    reassigned = [
        t.task_id for t in tasks for e in c.app.show(t.task_id).events if e.kind == "reassigned"
    ]
    why = c.why(f"released {released}\nreassigned {reassigned}")
    assert all(t.process_state == PROCESSED for t in tasks), why
    # Both happened: tasks given back for their scheduler, steps for their agent instance.
    assert any(released.values()) and reassigned, why
    assert all(len(r) <= 1 for r in released.values()), why
    assert "outcome discarded" not in survivor.log(), why


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


#: The lease and both gone-afters at 3 s. The promise: a killed worker's tasks are taken over
#: within max(lease, gone-after) + 2 s, whoever it was (a new leader that has been reaching the
#: store all along does not wait for its grace again).
LEADER_ARGS = (
    "--lease-ttl", "3",
    "--scheduler-heartbeat", "0.5", "--scheduler-gone-after", "3",
    "--agent-heartbeat", "0.5", "--agent-gone-after", "3",
)  # fmt: skip
TAKEOVER_WITHIN = 3.0 + 2.0
GRACE = 3.0  # max(--agent-gone-after, --scheduler-gone-after)


def test_the_supervisor_leaders_own_worker_killed_its_tasks_are_taken_over_in_time(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    leader = c.start("leader", *LEADER_ARGS)
    leader_name = f"supervisor-{leader.instance()}"
    c.wait_until(lambda: (c.lease() or ("",))[0] == leader_name, "the first worker to lead")
    gate = tmp_path / "gate"
    ids = [f"l1-{i:02d}" for i in range(20)]
    doomed = f"scheduler-{leader.instance()}"

    def leader_holds() -> list[str]:
        return [t.task_id for t in c.app.tasks(limit=100) if t.locked_by == doomed]

    # The first half is submitted while the leader's worker runs alone, so that it holds some
    # tasks; how the second half splits between the two is up to which claims first. The
    # promise is about every task the leader's worker held, however many.
    for task_id in ids[:10]:
        c.submit(task_id, [{"block_until": str(gate), "idempotent": True}])
    c.wait_until(leader_holds, "the leader's worker to hold tasks")
    standby = c.start("standby", *LEADER_ARGS)
    for task_id in ids[10:]:
        c.submit(task_id, [{"block_until": str(gate), "idempotent": True}])
    c.wait_until(
        lambda: len({r["task_id"] for r in c.calls()}) >= len(ids), "every task's step to run"
    )
    held = leader_holds()
    survivor = f"scheduler-{standby.instance()}"

    def standby_reached_the_store_for_its_grace() -> bool:
        rows = [s for s in c.app.scheduler_instances() if s.instance == survivor]
        return bool(rows) and _seconds(rows[0].heartbeat_at, rows[0].started_at) > GRACE + 0.5

    c.wait_until(standby_reached_the_store_for_its_grace, "the standby to run for its grace")
    lease = c.lease()
    assert lease is not None and lease[0] == leader_name, c.why("the leader changed")
    killed = time.time()
    c.kill(leader)
    gate.touch()
    for task_id in ids:
        c.wait_finished(task_id)
    taken = {
        task_id: min(r["at"] for r in c.runs(task_id=task_id, pid=standby.pid)) - killed
        for task_id in held
    }
    effects = Counter(x["key"] for x in c.effects())
    why = c.why(f"taken over after the kill (s) {taken}\neffects {effects}", *held)
    assert all(c.status(t).process_state == PROCESSED for t in ids), why
    assert set(effects.values()) == {1} and len(effects) == len(ids), why
    assert all(c.status(t).failure_count == 0 for t in ids), why
    assert max(taken.values()) <= TAKEOVER_WITHIN, why


#: Long enough for the pool's own reconnection (1, 2, 4, 8 s apart) to fall seconds behind.
OUTAGE = 10.0
#: The first write after the database is back: it lands within a probe's interval (0.5 s) and
#: a connection, 1 s at most; with slack for a loaded machine.
FIRST_WRITE_WITHIN = 2.0
#: Tries of one writer in OUTAGE seconds, 0.1 s apart doubling to 5 s (7), and one to spare
#: for the try the probe cuts short when the server is back.
MAX_TRIES_IN_OUTAGE = 8


def test_the_first_write_after_a_database_outage_lands_within_a_second(
    own_pg_cluster: tuple[Cluster, OwnPostgres], tmp_path: Path
) -> None:
    c, server = own_pg_cluster
    for n in (1, 2):
        c.start(f"worker-{n}", ready=False)
    for p in c.procs:
        c.wait_until(p.instance, f"{p.name} to start")
    gate = tmp_path / "gate"
    ids = [f"r3-{i:02d}" for i in range(40)]
    for task_id in ids:
        c.submit(task_id, [{"block_until": str(gate), "idempotent": True}, {"work": 0.05}])
    c.wait_until(
        lambda: len({r["task_id"] for r in c.calls()}) >= len(ids), "every first step to run"
    )
    server.stop()
    gate.touch()  # the calls return while the database is down: their outcomes wait
    time.sleep(OUTAGE)
    server.start()
    for task_id in ids:
        c.wait_finished(task_id)
    with psycopg.connect(server.url) as conn:
        row = conn.execute(
            "SELECT pg_postmaster_start_time(), min(s.finished_at), max(t.finished_at)"
            " FROM stepwarden_steps s JOIN stepwarden_tasks t USING (task_id)"
            " WHERE s.finished_at >= pg_postmaster_start_time()"
        ).fetchone()
    assert row is not None
    back, first, last = row
    why = c.why(
        f"back at {back}, first step finished {first} ({_seconds(first, back):.2f} s), "
        f"last task {last} ({_seconds(last, back):.2f} s)"
    )
    assert all(c.status(t).process_state == PROCESSED for t in ids), why
    assert _seconds(first, back) <= FIRST_WRITE_WITHIN, why
    # Each outcome waiting for the database is tried again at a growing pace (0.1 s doubling
    # to 5 s: eight tries in the outage), one writer per task, and said once a try: the
    # worker's log says the outage, it is not flooded by it.
    said = Counter(
        re.findall(r"task (r3-\d+): cannot record the outcome", "".join(p.log() for p in c.procs))
    )
    assert max(said.values(), default=0) <= MAX_TRIES_IN_OUTAGE, f"said per task: {said}"
