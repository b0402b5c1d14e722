"""Deadline: the seconds a store gives, counted down on this process's monotonic clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from stepwarden.deadline import Deadline


def test_seconds_left_become_a_moment_that_counts_down() -> None:
    d = Deadline.after(60.0)
    assert 59.0 < d.remaining() <= 60.0
    assert not d.expired()
    assert not d.passes_within(30.0) and d.passes_within(61.0)
    assert abs((d.complete_by - datetime.now(UTC)) - timedelta(seconds=60)) < timedelta(seconds=1)


def test_a_passed_deadline_has_nothing_left() -> None:
    d = Deadline.after(-1.0)
    assert d.expired() and d.remaining() == 0.0 and d.passes_within(0.0)


def test_the_store_s_wall_time_is_kept_for_display() -> None:
    shown = datetime(2030, 1, 1, tzinfo=UTC)
    assert Deadline.after(5.0, complete_by=shown).complete_by == shown


def test_the_earlier_of_two_is_their_min() -> None:
    soon, later = Deadline.after(1.0), Deadline.after(100.0)
    assert min(later, soon) is soon


async def test_it_is_on_the_event_loop_s_clock() -> None:
    d = Deadline.after(0.05)
    loop = asyncio.get_running_loop()
    assert abs((d.at - loop.time()) - 0.05) < 0.01
    async with asyncio.timeout_at(d.at):
        await asyncio.sleep(0)
