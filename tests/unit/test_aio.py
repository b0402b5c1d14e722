"""The asyncio helpers the roles stop their tasks with: a cleanup runs to its end whatever
cancellation arrives meanwhile, and the cancellation is still passed on."""

from __future__ import annotations

import asyncio

import pytest

from stepwarden._aio import cancel_until_ended, stop_tasks, to_the_end


class Cleanup:
    def __init__(self) -> None:
        self.started, self.gate, self.done = asyncio.Event(), asyncio.Event(), False

    async def run(self) -> None:
        self.started.set()
        await self.gate.wait()
        self.done = True


async def test_a_cleanup_cancelled_midway_runs_to_its_end_then_the_cancellation_is_raised() -> None:
    cleanup = Cleanup()
    task = asyncio.create_task(to_the_end(cleanup.run()))
    await cleanup.started.wait()
    task.cancel()
    task.cancel()  # twice: still one cleanup, run to its end
    cleanup.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleanup.done


async def test_stopping_a_task_waits_for_its_cleanup_and_a_cancelled_caller_cuts_none() -> None:
    cleanup = Cleanup()

    under_way = asyncio.Event()

    async def role() -> None:
        try:
            under_way.set()
            await asyncio.Event().wait()
        finally:
            await cleanup.run()

    task = asyncio.create_task(role())
    await under_way.wait()
    stopping = asyncio.create_task(stop_tasks(task))
    await cleanup.started.wait()
    stopping.cancel()  # the caller's own cancellation: the role is not cancelled again
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert not task.done()
    cleanup.gate.set()
    await asyncio.wait([task])
    assert cleanup.done and task.cancelled()


async def test_stopping_a_task_that_failed_raises_its_error() -> None:
    under_way = asyncio.Event()

    async def role() -> None:
        try:
            under_way.set()
            await asyncio.Event().wait()
        finally:
            raise OSError("closing failed")

    task = asyncio.create_task(role())
    await under_way.wait()
    with pytest.raises(OSError, match="closing failed"):
        await stop_tasks(task)


async def test_a_loop_that_takes_its_cancellation_for_its_own_is_cancelled_until_it_ends() -> None:
    """A loop whose first cancellation is caught and gone on from (as a call that answers
    an error of its own for it would) still ends: it is cancelled again; one that ends at
    once is cancelled once."""
    cancels = 0
    started = asyncio.Event(), asyncio.Event()

    async def stubborn() -> None:
        nonlocal cancels
        started[0].set()
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancels += 1
                if cancels == 2:
                    raise
                # taken for its own: the loop goes on

    async def plain() -> None:
        started[1].set()
        await asyncio.Event().wait()

    loop, other = asyncio.create_task(stubborn()), asyncio.create_task(plain())
    await asyncio.gather(started[0].wait(), started[1].wait())
    again = await cancel_until_ended(loop, other, again_after=0.05)
    assert again == [loop] and cancels == 2
    assert loop.cancelled() and other.cancelled()
