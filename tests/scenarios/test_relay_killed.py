"""The relay of status messages to a broker in a worker process SIGKILLed mid-delivery: the
worker that takes over delivers what it had not recorded, none lost, each task's in order."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stepwarden.records import OutboxMessage

from ..brokers.own import OwnRedis
from ..conftest import unique
from ..support.relay import assert_delivered
from .harness import PROCESSED, Cluster

TASKS = 40


def test_a_worker_killed_mid_delivery_loses_nothing(cluster: Cluster, tmp_path: Path) -> None:
    redis = OwnRedis(tmp_path / "redis")
    redis.start()
    try:
        name = unique("killed")
        listed = tmp_path / "destinations"
        listed.write_text(f"own redis://127.0.0.1:{redis.port} *\n")
        cluster.app.destinations = redis.listed()
        first = cluster.start("w1", "--destinations", str(listed))
        # The last step waits for the gate, opened after the kill: however fast the relay,
        # no task's last messages can have been delivered before it.
        gate = tmp_path / "gate"
        last = {"async": True, "block_until": str(gate), "within": 30}
        steps = [{"async": True, "work": 0.05}] * 2 + [last]
        task_ids = [
            cluster.app.submit("steps", {"steps": steps}, task_id=f"k{i}", reply_to=redis.url(name))
            for i in range(TASKS)
        ]

        def received() -> list[dict[str, Any]]:
            return asyncio.run(redis.received(name))

        cluster.wait_until(lambda: len(received()) >= 20, "the first messages on the stream")
        cluster.kill(first)
        before = received()
        assert not [m for m in before if m["kind"] == "processed"]

        gate.touch()
        cluster.start("w2", "--destinations", str(listed))
        for task_id in task_ids:
            assert cluster.wait_finished(task_id, timeout=60).process_state == PROCESSED

        def all_processed() -> list[dict[str, Any]] | None:
            found = received()
            done = {m["task_id"] for m in found if m["kind"] == "processed"}
            return found if done >= set(task_ids) else None

        after = cluster.wait_until(all_processed, "every task's processed message", timeout=60)
        outbox = asyncio.run(_outbox(cluster, task_ids))
        assert after[: len(before)] == before
        assert_delivered(after, outbox)
    finally:
        redis.close()


async def _outbox(cluster: Cluster, task_ids: Sequence[str]) -> dict[str, list[OutboxMessage]]:
    async with cluster.app:
        store = await cluster.app.store()
        return {t: await store.outbox(task_id=t) for t in task_ids}
