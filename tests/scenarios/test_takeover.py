"""A worker whose steps outlive the gone-after and fill the agents' capacity dies (SIGKILL), is
frozen (SIGSTOP) or is cut off from PostgreSQL by a partition of the network (its process left
running): each of its steps runs again on another instance within max(`--lease-ttl`,
`--scheduler-gone-after`, `--agent-gone-after`) + 2 s of the fault, whoever the worker was
(the supervisor leader's own included), long before the steps' complete_by; what a zombie
says late, once it runs or reaches the database again, is refused.

When a step runs again is read from the remote service's record of each call (`calls`: its
start, and the process that made it), against the time of the fault, on the same machine's
clock. The bound asserted is the engine's promise (docs/RELIABILITY.md, promises 17 and 24),
not an interleaving a quiet machine produces: it holds on a loaded one too."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import stepwarden as sw

from .harness import COMPLETED, PROCESSED, Cluster, Proc
from .netns import namespace
from .own_postgres import own_postgres

pytestmark = pytest.mark.slow

CAPACITY = 10
"""Calls each worker's agent makes at once: the doomed worker's steps fill its capacity."""
#: Heartbeats every 0.5 s, an instance gone after 3 s of silence, a lease of 3 s.
QUICK = (
    "--lease-ttl", "3",
    "--scheduler-heartbeat", "0.5", "--scheduler-gone-after", "3",
    "--agent-heartbeat", "0.5", "--agent-gone-after", "3",
)  # fmt: skip
#: The defaults (5 s each): a zombie may hold a transaction open at the moment of the fault,
#: and its locks last until the server ends it (5 s: `store.postgres.STALLED`); the bound
#: is then that of the defaults.
DEFAULTS = (
    "--lease-ttl", "5",
    "--scheduler-heartbeat", "1", "--scheduler-gone-after", "5",
    "--agent-heartbeat", "1", "--agent-gone-after", "5",
)  # fmt: skip
WITHIN = {QUICK: 3.0 + 2.0, DEFAULTS: 5.0 + 2.0}
"""max(lease, gone-afters) + 2 s: when each step of the worker runs again, at the latest."""
GRACE = {QUICK: 3.0, DEFAULTS: 5.0}
"""How long a standby must have reached the store before it may find anyone gone."""
#: A step outlives the gone-after by far: its complete_within is its task's, 30 s.
STEP_DEADLINE = 30.0


def _started(c: Cluster, proc: Proc, keys: list[str]) -> dict[str, float] | None:
    """When each key's first call in `proc` started, once every key has one."""
    first: dict[str, float] = {}
    for call in c.calls(pid=proc.pid):
        first.setdefault(call["key"], call["started_at"])
    return first if all(k in first for k in keys) else None


def _workers_options(timing: tuple[str, ...]) -> tuple[str, ...]:
    return (*timing, "--agents", "svc", "--agent-concurrency", str(CAPACITY))


def _fill(c: Cluster, doomed: Proc, gate: Path, prefix: str) -> tuple[list[str], list[str]]:
    """As many tasks as the doomed worker's agent has room for, each blocking in its first
    step until the gate opens; once all of them are called by it, their ids and keys."""
    ids = [f"{prefix}-{i:02d}" for i in range(CAPACITY)]
    for task_id in ids:
        c.submit(task_id, [{"block_until": str(gate), "idempotent": True}, {"idempotent": True}])
    keys = [f"{t}/1" for t in ids]
    c.wait_until(lambda: _started(c, doomed, keys), "the doomed worker to call every step")
    return ids, keys


def _standby(c: Cluster, proc: Proc, grace: float) -> None:
    """Wait until `proc` (every role) has reached the store for longer than the grace."""
    name = f"scheduler-{proc.instance()}"

    def reached() -> bool:
        rows = [s for s in c.app.scheduler_instances() if s.instance == name]
        return bool(rows) and (rows[0].heartbeat_at - rows[0].started_at).total_seconds() > (
            grace + 0.5
        )

    c.wait_until(reached, f"{proc.name} to have reached the store for its grace")


def _leads(c: Cluster, proc: Proc) -> bool:
    lease = c.lease()
    return lease is not None and lease[0] == f"supervisor-{proc.instance()}"


def _took_over(
    c: Cluster, survivor: Proc, keys: list[str], fault: float, within: float
) -> dict[str, float]:
    """Seconds from the fault to each step's first call in the survivor, asserted within
    the bound; waited for much longer (a failure says how long it took)."""
    started = c.wait_until(
        lambda: _started(c, survivor, keys),
        f"{survivor.name} to call every step again",
        timeout=STEP_DEADLINE + 30,
    )
    taken = {k: round(at - fault, 2) for k, at in started.items()}
    assert max(taken.values()) <= within, c.why(f"steps called again after the fault (s) {taken}")
    assert max(taken.values()) < STEP_DEADLINE - 10, taken
    return taken


def _finished(c: Cluster, ids: list[str], survivor: Proc) -> dict[str, sw.TaskView]:
    """Every task processed, each step's effect applied once, no failure counted, no
    deadline waited for; the first steps completed by the survivor. Their views."""
    for task_id in ids:
        c.wait_finished(task_id, timeout=60)
    views = {t: c.app.show(t) for t in ids}
    effects = Counter(x["key"] for x in c.effects())
    why = c.why(f"effects {effects}", *ids)
    for view in views.values():
        assert view.task.process_state == PROCESSED, why
        assert view.task.failure_count == 0, why
        assert all(e.kind != "expired" for e in view.events), why
        first = view.steps[0]
        assert first.state == COMPLETED and first.result["pid"] == survivor.pid, why
        assert first.attempt >= 2 and first.reassignments >= 1, why
    assert len(effects) == 2 * len(ids) and set(effects.values()) == {1}, why
    return views


@pytest.mark.parametrize("roles", ["all", "agents"])
def test_a_killed_workers_long_steps_run_again_within_the_gone_after(
    cluster: Cluster, roles: str
) -> None:
    """SIGKILL of a worker whose steps (30 s) fill its agent's capacity: every role, the
    supervisor leader among them (its tasks are released as well, and the survivor's
    scheduler has no room to claim them until the steps end), or its agents alone."""
    c = cluster
    options = _workers_options(QUICK)
    gate = c.workdir / "gate"
    if roles == "all":
        doomed = c.start("doomed", *options)
        c.wait_until(lambda: _leads(c, doomed), "the doomed worker to lead")
    else:
        c.start("control", "--roles", "scheduler,supervisor", *options)
        doomed = c.start("doomed", "--roles", "agents", *options)
    ids, keys = _fill(c, doomed, gate, f"kill-{roles}")
    if roles == "all":
        survivor = c.start("survivor", *options)
        _standby(c, survivor, GRACE[QUICK])
        assert _leads(c, doomed), c.why("the doomed worker no longer leads")
    else:
        survivor = c.start("survivor", "--roles", "agents", *options)
        name = f"agent-{survivor.instance()}"
        c.wait_until(
            lambda: any(a.alive for a in c.app.agent_instances() if a.instance == name),
            "the survivor's agent to register",
        )
    killed = time.time()
    c.kill(doomed)
    taken = _took_over(c, survivor, keys, killed, WITHIN[QUICK])
    gate.touch()
    _finished(c, ids, survivor)
    print(f"kill ({roles}, {c.store_url.split(':')[0]}): steps called again after (s) {taken}")


def _zombie_refused(zombie: Proc, keys: list[str]) -> bool:
    """Whether the zombie has had every late outcome refused: the store refused it ("late
    outcome ... discarded"), or told it first that the step was no longer its own, which
    refuses its word that the call stopped too ("cancelled")."""
    log = zombie.log()
    return all(
        f"late outcome of {k} attempt 1 discarded" in log or f"for {k}: cancelled (" in log
        for k in keys
    )


def _zombie(
    c: Cluster,
    fault: Callable[[], None],
    mend: Callable[[], None],
    *,
    prefix: tuple[str, ...] = (),
    store: str | None = None,
) -> dict[str, float]:
    """A worker with every role, the leader, whose steps fill its agent's capacity, falls to
    `fault` (frozen, or cut off) beside a standby past its grace: each of its steps runs
    again on the standby within the bound. The calls then return (the gate opens) and the
    standby finishes every task while the zombie is still out; then `mend` (thawed, or the
    link up): its late outcomes are refused, and nothing it held changes."""
    options = _workers_options(DEFAULTS)
    gate = c.workdir / "gate"
    zombie = c.start("zombie", *options, prefix=prefix, store=store)
    c.wait_until(lambda: _leads(c, zombie), "the zombie-to-be to lead")
    ids, keys = _fill(c, zombie, gate, "zombie")
    survivor = c.start("survivor", *options)
    _standby(c, survivor, GRACE[DEFAULTS])
    assert _leads(c, zombie), c.why("the zombie-to-be no longer leads")
    at = time.time()
    fault()
    taken = _took_over(c, survivor, keys, at, WITHIN[DEFAULTS])
    gate.touch()  # the zombie's calls answer too, while it is still out
    before = _finished(c, ids, survivor)
    mend()
    c.wait_until(
        lambda: _zombie_refused(zombie, keys),
        "the zombie to have its late outcomes refused",
        timeout=STEP_DEADLINE + 30,
    )
    after = {t: c.app.show(t) for t in ids}
    why = c.why("the zombie changed what it no longer held", *ids)
    for task_id in ids:
        assert after[task_id].task == before[task_id].task, why
        assert after[task_id].steps == before[task_id].steps, why
    assert zombie.popen.poll() is None, why  # it carries on
    return taken


def test_a_frozen_workers_long_steps_run_again_and_its_late_outcomes_are_refused(
    cluster: Cluster,
) -> None:
    """The zombie is frozen with SIGSTOP (not in the middle of a write: on SQLite that
    would hold every other writer up, which is not what this is about) and thawed once the
    standby has finished its tasks."""
    c = cluster
    procs: list[Proc] = []

    def freeze() -> None:
        [zombie] = [p for p in c.procs if p.name == "zombie"]
        procs.append(zombie)
        c.pause(zombie)

    taken = _zombie(c, freeze, lambda: c.resume(procs[0]))
    print(f"freeze ({c.store_url.split(':')[0]}): steps called again after (s) {taken}")


def test_a_worker_cut_off_from_postgresql_is_taken_over_and_its_late_outcomes_refused(
    tmp_path: Path,
) -> None:
    """PostgreSQL: the zombie runs in a network namespace of the test's own, reaching a
    server of the test's own through a veth pair; the link is set down (no connection is
    reset: packets are lost), its process left running, then set up again once the standby
    has finished its tasks."""
    with (
        namespace() as ns,
        own_postgres(listen_on=ns.host_ip, trust=ns.inner_address) as server,
    ):
        c = Cluster(server.url, tmp_path)
        try:
            inner = f"postgresql://postgres@{ns.host_ip}:{server.port}/postgres"
            taken = _zombie(c, ns.cut, ns.heal, prefix=ns.prefix, store=inner)
        finally:
            c.close()
    print(f"partition (postgres): steps called again after (s) {taken}")
