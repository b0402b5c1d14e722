"""The relay's rounds and its publishers, on an outbox and brokers of the test's own: a
publisher is closed only once no send uses it (a client closed under a send may connect
again, in a publisher nobody closes), and every one is closed when the relay stops."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from stepwarden import relay as relay_module
from stepwarden.destinations import Destination, Destinations
from stepwarden.errors import TransientStoreError
from stepwarden.records import OutboxMessage
from stepwarden.relay import BrokerAccess, Relay

from ..support.relay import BROKER, Outbox

LISTED = Destinations.parse(f"a {BROKER} *\nb redis://127.0.0.1:6391 *")


class FakePublisher:
    """Each send as the test planned it, once (a later try answers at once): `hang` never
    answers (the relay's deadline ends it), `late` answers after a while, `timeout` raises
    TimeoutError as the deadline would."""

    made: list[FakePublisher] = []
    both_sending: asyncio.Event | None = None
    """Set once two sends are under way on one publisher."""

    def __init__(self, dest: Destination, access: BrokerAccess) -> None:
        self.sending = 0
        self.closed = False
        self.sent_while_closed: list[str] = []
        self.closed_while_sending = False
        self.fail_close = False
        self.closed_fully = False
        self.made.append(self)

    async def publish(self, dest: Destination, message_id: str, kind: str, body: bytes) -> None:
        self.sending += 1
        if self.sending >= 2 and self.both_sending is not None:
            self.both_sending.set()
        try:
            how = PLAN.pop(message_id, "")
            if how == "hang":
                await asyncio.Event().wait()
            elif how == "late":
                await asyncio.sleep(0.2)
            elif how == "timeout":
                await asyncio.sleep(0)
                raise TimeoutError
            if self.closed:
                self.sent_while_closed.append(message_id)
        finally:
            self.sending -= 1

    closing: asyncio.Event | None = None
    """Set once a close is under way, when the test holds closes at `close_gate`."""
    close_gate: asyncio.Event | None = None

    async def close(self) -> None:
        self.closed_while_sending |= self.sending > 0
        self.closed = True
        if self.fail_close:
            raise OSError("the socket is gone")
        if self.close_gate is not None and self.closing is not None:
            self.closing.set()
            await self.close_gate.wait()  # a client's close awaiting its sockets' end
        self.closed_fully = True


PLAN: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _fake_publishers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(relay_module._PUBLISHERS, "redis", FakePublisher)
    FakePublisher.made = []
    FakePublisher.both_sending = None
    FakePublisher.closing = FakePublisher.close_gate = None
    PLAN.clear()
    yield
    PLAN.clear()


def _relay(outbox: Outbox, deadline: float = 1.0) -> Relay:
    store: Any = outbox
    return Relay(store, destinations=LISTED, deadline=deadline)


async def test_a_publisher_given_up_after_the_deadline_is_closed_once_no_send_uses_it() -> None:
    outbox = Outbox({"a": 1, "b": 1})
    PLAN.update({"a:0": "timeout", "b:100": "late"})
    relay = _relay(outbox)
    assert await relay.deliver_due() == 1
    [dropped] = FakePublisher.made
    assert outbox.delivered == [100]
    assert [(i, e) for i, e in outbox.failed] == [(0, "no acknowledgement within 1.0 s")]
    assert dropped.closed and not dropped.closed_while_sending
    assert dropped.sent_while_closed == []
    # The next send opens another publisher; closing the relay closes it.
    assert await relay.deliver_due() == 1
    [_, second] = FakePublisher.made
    assert not second.closed
    await relay.close()
    assert second.closed


async def test_the_deadline_ends_a_send_and_its_publisher_is_closed_after_the_round() -> None:
    outbox = Outbox({"a": 1, "b": 2})
    PLAN.update({"a:0": "hang", "b:100": "late", "b:101": "late"})
    relay = _relay(outbox, deadline=0.3)
    assert await relay.deliver_due() == 2
    [publisher] = FakePublisher.made
    assert publisher.closed and not publisher.closed_while_sending
    assert publisher.sent_while_closed == []


async def test_a_round_whose_store_write_fails_ends_after_its_other_sends() -> None:
    outbox = Outbox({"a": 1, "b": 1})
    outbox.refuse_failed = True
    PLAN.update({"a:0": "timeout", "b:100": "late"})
    relay = _relay(outbox)
    with pytest.raises(TransientStoreError):
        await relay.deliver_due()
    [publisher] = FakePublisher.made
    assert publisher.sending == 0  # b's send ended with the round
    assert outbox.delivered == [100]
    assert publisher.closed and not publisher.closed_while_sending


async def test_a_relay_stopped_in_a_round_closes_its_publishers_after_the_sends() -> None:
    outbox = Outbox({"a": 1, "b": 1})
    PLAN.update({"a:0": "hang", "b:100": "hang"})
    relay = _relay(outbox, deadline=30)
    FakePublisher.both_sending = both_sending = asyncio.Event()
    running = asyncio.create_task(relay.run(asyncio.Event(), lambda: True, 0.01))
    await asyncio.wait_for(both_sending.wait(), 10)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    [publisher] = FakePublisher.made
    assert publisher.closed and not publisher.closed_while_sending


async def test_closing_the_relay_closes_each_publisher_whatever_another_raised() -> None:
    outbox = Outbox({"a": 1})
    relay = _relay(outbox)
    await relay.deliver_due()
    other = Outbox({"c": 1})
    other.due = [
        OutboxMessage(
            id=7,
            channel="redis://127.0.0.1:6391/s",
            task_id="c",
            kind="received",
            detail={},
            at=datetime.now(UTC),
        )
    ]
    relay.store = other  # type: ignore[assignment]
    await relay.deliver_due()
    first, second = FakePublisher.made
    first.fail_close = True
    await relay.close()
    assert first.closed and second.closed


async def test_a_relay_cancelled_while_it_closes_still_closes_every_publisher() -> None:
    """The relay ends its loop when told to stop, and the supervisor then cancels it: a
    cancellation landing in the close lets the close run to its end (a client's close cut
    short leaves its sockets open, with nobody left to close them)."""
    outbox = Outbox({"a": 1})
    relay = _relay(outbox)
    stop = asyncio.Event()
    closing, gate = asyncio.Event(), asyncio.Event()
    FakePublisher.closing, FakePublisher.close_gate = closing, gate
    running = asyncio.create_task(relay.run(stop, lambda: True, 0.01))
    await asyncio.wait_for(outbox.recorded.wait(), 10)
    assert outbox.delivered == [0]
    stop.set()
    await asyncio.wait_for(closing.wait(), 10)
    running.cancel()  # it reaches the close, waiting at the gate
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await running
    [publisher] = FakePublisher.made
    assert publisher.closed_fully
