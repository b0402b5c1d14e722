"""A failover of PostgreSQL under load: the primary dies (immediate shutdown), its streaming
standby is promoted, and the workers, given both servers in one multi-host URL, find the new
primary and go on. Synchronous replication loses no committed transaction: every task
finishes, no effect is applied twice, no failure is counted, and the supervisor's leader
holds a new term. Asynchronous replication may lose the last transactions the primary
committed: a submit the application re-sends (idempotent by task id) still runs its task,
the service applies each effect once (the idempotency key holds across a re-run), and the
leader's term never goes back to one already held. The old primary, started again
read-only, keeps no worker."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import psycopg

import stepwarden as sw

from .harness import PROCESSED, Cluster
from .own_postgres import OwnPair, own_pair

#: The lease at 2 s: a failover longer than that ends the leader's term.
LEASE = 2
WORKER_ARGS = (
    "--lease-ttl", str(LEASE),
    "--scheduler-heartbeat", "0.5", "--scheduler-gone-after", "3",
    "--agent-heartbeat", "0.5", "--agent-gone-after", "3",
)  # fmt: skip
STEP = {"work": 0.1, "idempotent": True}
#: The workers' part of a failover: the first task finished on the new primary within this
#: many seconds of the promotion (measured: under 0.5 s; the rest is slack for a busy machine).
RECOVERS_WITHIN = 8.0
TASKS = 40


def _terms(*logs: str) -> list[int]:
    return sorted(int(t) for log in logs for t in re.findall(r"leader at term (\d+)", log))


def _stepwarden_sessions(server_url: str) -> int:
    with psycopg.connect(server_url) as db:
        row = db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'stepwarden'"
        ).fetchone()
    return int(row[0]) if row else 0


def _run_failover(
    c: Cluster, pair: OwnPair, *, kill_one: bool = False
) -> tuple[list[sw.TaskRecord], float, list[str]]:
    """Two workers under load; the primary crashes once some tasks are done and the standby
    is promoted a lease later (with `kill_one`, a worker is SIGKILLed then too, so that the
    new primary's leader recovers its tasks). Returns the tasks when every one has finished,
    the seconds from the promotion to the first task finished on the new primary, and the ids
    submitted."""
    workers = [c.start(f"worker-{n}", *WORKER_ARGS, ready=False) for n in (1, 2)]
    for p in workers:
        c.wait_until(p.instance, f"{p.name} to start")
    ids = [f"f-{i:02d}" for i in range(TASKS)]
    for task_id in ids:
        c.submit(task_id, [STEP, STEP, STEP])

    def processed() -> list[str]:
        return [t.task_id for t in c.app.tasks(limit=100) if t.process_state == PROCESSED]

    c.wait_until(lambda: len(processed()) >= 5, "five tasks to be processed")
    c.wait_until(lambda: _terms(*(p.log() for p in workers)), "a leader")
    pair.crash_primary()
    crashed = time.time()
    # The failover manager's time to decide the primary is gone: longer than the lease.
    time.sleep(LEASE + 1)
    pair.promote()
    promoted = time.time()
    if kill_one:
        c.kill(workers[0])
    # What an application does after a failover that may have lost its last submits: it
    # sends them again (a submit under a task id already there changes nothing).
    for task_id in ids:
        c.submit(task_id, [STEP, STEP, STEP])

    def all_finished() -> list[sw.TaskRecord] | None:
        tasks = c.app.tasks(limit=100)
        return tasks if len(tasks) == len(ids) and all(t.finished_at for t in tasks) else None

    tasks = c.wait_until(all_finished, "every task to finish on the new primary", timeout=90)
    after = [
        t.finished_at.timestamp()
        for t in tasks
        if t.finished_at and t.finished_at.timestamp() > crashed
    ]
    assert after, c.why("no task finished after the crash: the failover was not under load")
    return tasks, min(after) - promoted, ids


def test_a_synchronous_failover_loses_nothing_and_applies_no_effect_twice(
    tmp_path: Path,
) -> None:
    with own_pair() as pair:
        pair.synchronous()
        c = Cluster(pair.url, tmp_path)  # the store asks for the primary by default
        try:
            tasks, recovered, ids = _run_failover(c, pair)
            effects = Counter(x["key"] for x in c.effects())
            terms = _terms(*(p.log() for p in c.procs))
            why = c.why(f"effects {effects}\nterms {terms}\nrecovered after {recovered:.2f} s")
            print(f"synchronous failover: a task finished {recovered:.2f} s after the promotion")
            assert recovered <= RECOVERS_WITHIN, why
            assert all(t.process_state == PROCESSED for t in tasks), why
            assert len(effects) == 3 * len(ids) and set(effects.values()) == {1}, why
            assert all(t.failure_count == 0 for t in tasks), why
            # A new term after the failover: the lease (2 s) ran out while there was no
            # primary, and a leader took the next term on the new primary.
            assert len(terms) >= 2 and terms[-1] > terms[0], why
            # The old primary comes back read-only: no worker stays on it, work goes on.
            pair.restart_old_primary_read_only()
            c.submit("after", [STEP])
            assert c.wait_finished("after").process_state == PROCESSED, c.why()
            assert _stepwarden_sessions(pair.primary.url) == 0, c.why()
        finally:
            c.close()


def _holders_by_term(c: Cluster, task_ids: list[str]) -> dict[int, set[str]]:
    """The leaders that recorded recoveries (released, expired...) in the tasks' histories,
    by the term they wrote under."""
    found: dict[int, set[str]] = {}
    for task_id in task_ids:
        for e in c.app.show(task_id).events:
            if isinstance(e.detail, dict) and "term" in e.detail and "by" in e.detail:
                found.setdefault(int(e.detail["term"]), set()).add(str(e.detail["by"]))
    return found


def test_an_asynchronous_failover_may_lose_commits_but_never_applies_an_effect_twice(
    tmp_path: Path,
) -> None:
    with own_pair() as pair:  # asynchronous: the primary does not wait for the standby
        c = Cluster(pair.url, tmp_path)  # the store asks for the primary by default
        try:
            tasks, recovered, ids = _run_failover(c, pair, kill_one=True)
            effects = Counter(x["key"] for x in c.effects())
            holders = _holders_by_term(c, ids)
            why = c.why(f"effects {effects}\nholders by term {holders}")
            print(f"asynchronous failover: a task finished {recovered:.2f} s after the promotion")
            assert recovered <= RECOVERS_WITHIN, why
            # Every task finishes (its submit sent again where the failover lost it)...
            assert all(t.process_state == PROCESSED for t in tasks), why
            # ...and the service applied each step's effect once, even a step that ran again
            # because its recorded outcome was lost: its idempotency key did not change.
            assert len(effects) == 3 * len(ids) and set(effects.values()) == {1}, why
            # The killed worker's tasks were recovered by a leader on the new primary, and
            # every term recorded there was held by one leader.
            assert holders and all(len(h) == 1 for h in holders.values()), why
        finally:
            c.close()
