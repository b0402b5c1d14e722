"""A store of two shards, each a PostgreSQL server of the test's own: when one server stops,
the other shard's tasks go on (and new ones placed there are served); the stopped shard's
tasks resume when it is back, none lost, none applied twice, none counted as a failure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepwarden.placement import ShardMap

from .harness import PROCESSED, Cluster
from .own_postgres import OwnPostgres, own_postgres

QUICK = ("--scheduler-heartbeat", "0.2", "--scheduler-gone-after", "1")


@pytest.fixture
def two_shards(tmp_path: Path) -> Iterator[tuple[Cluster, OwnPostgres, OwnPostgres]]:
    with own_postgres() as a, own_postgres() as b:
        c = Cluster(f"{a.url} {b.url}", tmp_path)
        try:
            yield c, a, b
        finally:
            c.close()


def test_a_stopped_shard_stops_only_its_own_tasks_and_they_resume_when_it_is_back(
    two_shards: tuple[Cluster, OwnPostgres, OwnPostgres], tmp_path: Path
) -> None:
    c, _, b = two_shards
    placement = ShardMap.first(["s1", "s2"])  # the map a store of two new shards writes
    for n in (1, 2):
        c.start(f"worker-{n}", *QUICK)
    gate = tmp_path / "gate"
    ids = [f"sh-{i:02d}" for i in range(40)]
    for task_id in ids:
        c.submit(task_id, [{"block_until": str(gate), "idempotent": True}, {"work": 0.05}])
    on_a = [t for t in ids if placement.home(t) == "s1"]
    on_b = [t for t in ids if placement.home(t) == "s2"]
    assert on_a and on_b
    c.wait_until(
        lambda: len({r["task_id"] for r in c.calls()}) >= len(ids), "every first step to run"
    )
    b.stop()
    gate.touch()  # the calls return: shard s2's outcomes wait for their server
    for task_id in on_a:
        c.wait_finished(task_id)
    # New tasks placed on the shard that runs are served meanwhile.
    more = [t for t in (f"more-{i}" for i in range(40)) if placement.home(t) == "s1"][:5]
    for task_id in more:
        c.submit(task_id, [{"work": 0.01, "idempotent": True}])
    for task_id in more:
        c.wait_finished(task_id)
    assert not b.accepts(), "shard s2's server was to be down while s1's tasks finished"
    b.start()
    for task_id in on_b:
        c.wait_finished(task_id, timeout=60)
    effects = Counter(x["key"] for x in c.effects())
    why = c.why(f"effects {effects}")
    every = [*ids, *more]
    assert all(c.status(t).process_state == PROCESSED for t in every), why  # nothing lost
    assert set(effects.values()) == {1}, why  # nothing applied twice
    assert len(effects) == 2 * len(ids) + len(more), why
    assert all(c.status(t).failure_count == 0 for t in every), why
