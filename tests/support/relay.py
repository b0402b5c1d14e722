"""Status messages relayed to brokers: the App, the outbox as the relay sees it, what a broker
received; a listener of a port."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import stepwarden as sw
from stepwarden.destinations import Destinations
from stepwarden.errors import TransientStoreError
from stepwarden.records import OutboxMessage
from stepwarden.store.base import Subscription

from ..brokers.own import OwnBroker

T = TypeVar("T")


KINDS = ["received", "step_completed", "step_completed", "step_completed", "processed"]


BROKER = "redis://127.0.0.1:6390"


class Listener:
    """A plain TCP listener on a free port of 127.0.0.1: counts the connections made to it
    (and closes each at once)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def url(self, scheme: str, name: str) -> str:
        return f"{scheme}://127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def build(store_url: str, destinations: Destinations | None = None) -> sw.App:
    """Tasks of three steps: one, then two side by side (their completions may commit in
    either order, from two transactions); their status messages may go to `destinations`."""
    app = sw.App("relayed", store=store_url, destinations=destinations or Destinations())
    svc = app.agent("svc")

    @svc.operation
    async def act(call: sw.Call, n: int) -> int:
        return n

    @app.workflow(complete_within=timedelta(seconds=30))
    async def three(ctx: sw.Context, x: int) -> list[int]:
        first = await ctx.step(act, x)
        return [first, *await ctx.gather(ctx.step(act, x + 1), ctx.step(act, x + 2))]

    return app


async def until(check: Callable[[], Awaitable[T | None]], what: str, timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def all_processed(
    broker: OwnBroker, name: str, task_ids: Sequence[str]
) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        found = await broker.received(name)
        done = {m["task_id"] for m in found if m["kind"] == "processed"}
        return found if done >= set(task_ids) else None

    return await until(check, f"the processed message of {len(task_ids)} task(s) on {name}")


async def outbox_of(app: sw.App, task_ids: Sequence[str]) -> dict[str, list[OutboxMessage]]:
    store = await app.store()
    return {t: await store.outbox(task_id=t) for t in task_ids}


def assert_delivered(
    received: list[dict[str, Any]],
    outbox: dict[str, list[OutboxMessage]],
    kinds: list[str] | None = KINDS,
) -> int:
    """Every outbox message arrived; each task's in outbox order (a duplicate only under the
    same id, with the same body); the number of duplicates."""
    first: dict[str, dict[str, Any]] = {}
    order: dict[str, list[int]] = {}
    duplicates = 0
    for body in received:
        if body["id"] in first:
            assert body == first[body["id"]]
            duplicates += 1
            continue
        first[body["id"]] = body
        order.setdefault(body["task_id"], []).append(body["outbox_id"])
    for task_id, messages in outbox.items():
        if kinds is not None:
            assert [m.kind for m in messages] == kinds
        assert order.get(task_id) == [m.id for m in messages], task_id
        for m in messages:
            body = first[f"{task_id}:{m.id}"]
            assert (body["kind"], body["task_id"]) == (m.kind, task_id)
            assert body["detail"]["task_id"] == task_id
    return duplicates


class Outbox:
    """The store calls of a round: each task's messages, due at once; what was recorded."""

    def __init__(self, tasks: dict[str, int], channel: str = f"{BROKER}/s") -> None:
        self.due = [
            OutboxMessage(
                id=n * 100 + i,
                channel=channel,
                task_id=task,
                kind="step_completed",
                detail={},
                at=datetime.now(UTC),
            )
            for n, (task, count) in enumerate(tasks.items())
            for i in range(count)
        ]
        self.delivered: list[int] = []
        self.failed: list[tuple[int, str]] = []
        self.refuse_failed = False
        self.recorded = asyncio.Event()
        """Set once a delivery is recorded."""

    async def relay_fence(self, safe: int) -> tuple[int, int | None]:
        return safe, None

    async def relay_due(self, upto: int, tasks: int, limit: int) -> list[OutboxMessage]:
        return [m for m in self.due if m.id not in self.delivered]

    async def relay_delivered(self, ids: list[int]) -> None:
        self.delivered += ids
        if ids:
            self.recorded.set()

    async def relay_refused(self, refused: list[tuple[int, str]]) -> None:
        assert not refused, f"refused: {refused}"

    async def relay_failed(self, message_id: int, error: str, delay: float) -> None:
        await asyncio.sleep(0)
        if self.refuse_failed:
            raise TransientStoreError("the store is out of reach")
        self.failed.append((message_id, error))

    def subscribe(self, channel: str) -> Subscription:
        return Subscription()

    def unsubscribe(self, channel: str, sub: Subscription) -> None:
        pass
