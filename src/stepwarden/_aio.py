"""Small asyncio helpers shared by the roles."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def first(*aws: Awaitable[Any]) -> None:
    """Wait until the first of `aws` finishes, then cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


async def to_the_end(aw: Awaitable[T]) -> T:
    """Await `aw` to its end even when this task is cancelled meanwhile, then pass the
    cancellation on: for a cleanup (closing a client's connections) that a cancellation
    cut short would leave half done, its sockets open and nobody to close them."""
    inner = asyncio.ensure_future(aw)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(inner)
            break
        except asyncio.CancelledError:
            if inner.done():  # the cleanup itself was cancelled (the loop shutting down)
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


async def stop_tasks(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel each task and wait until they have ended, their cleanups included; the first
    error one raised is raised. A cancellation of the caller while it waits is its own: it
    ends the wait (and is raised) without cancelling a task a second time, which would cut
    its cleanup short."""
    stopping = [t for t in tasks if t is not None]
    for task in stopping:
        task.cancel()
    if stopping:
        await asyncio.wait(stopping)
    for task in stopping:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def cancel_until_ended(
    *tasks: asyncio.Task[Any], again_after: float = 1.0
) -> list[asyncio.Task[Any]]:
    """Cancel each task and wait until each has ended, whatever each raised. A task still
    running `again_after` seconds after its cancel is cancelled again, and so on: a
    cancellation that a loop's cleanup or a library took for its own, and went on, would
    otherwise keep the caller waiting for ever. The tasks that needed another cancel."""
    again: list[asyncio.Task[Any]] = []
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=again_after)
        again += [t for t in pending if t not in again]
    return again


async def sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `stop` is set meanwhile."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass


async def in_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking `fn(*args)` in a thread of its own that does not hold the process open.

    `asyncio.to_thread` uses the loop's default executor, whose threads are joined when the
    loop shuts down and again when the interpreter exits: a blocking call that outlives a
    worker's drain timeout would keep the process alive until the call returns. A daemon
    thread is abandoned instead; cancelling the awaiting task stops waiting for it, and its
    late outcome is dropped.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def run() -> None:
        try:
            value = context.run(fn, *args)
        except BaseException as exc:  # handed to the awaiting task, whatever it is
            outcome: tuple[bool, Any] = (False, exc)
        else:
            outcome = (True, value)
        # When the loop has closed nobody waits for this outcome any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(
        target=run, name=f"stepwarden-call-{getattr(fn, '__name__', 'fn')}", daemon=True
    ).start()
    return await future


FALLBACK_POLL = 30.0
"""Seconds between two polls of a poller whose store's wake-ups all reach it
(`Store.wakeups_live`: PostgreSQL listening), once it has been idle for `HOT_FOR`: the poll
is then only the fallback, should a wake-up be lost."""
HOT_FOR = 30.0
"""Seconds a poller keeps its poll interval after its last work or wake-up: work that
becomes due with no wake-up of its own (a task released after a backoff, up to the
default backoff's 30 s; a request past a rate limit's window) is found as soon as before."""


class Pace:
    """How long a poller waits for a wake-up before it looks anyway: its poll interval while
    its wake-ups may be missed (none across processes, or the listener down) and for
    `HOT_FOR` seconds after work or a wake-up; else `FALLBACK_POLL` (or the poll interval,
    if longer)."""

    def __init__(self, poll: float, live: Callable[[], bool]) -> None:
        self.poll = poll
        self._live = live
        self._hot_until = -float("inf")

    def busy(self) -> None:
        """Work was found, or a wake-up came: poll at the poll interval for a while."""
        self._hot_until = time.monotonic() + HOT_FOR

    def wait(self) -> float:
        if not self._live() or time.monotonic() < self._hot_until:
            return self.poll
        return max(self.poll, FALLBACK_POLL)


def until_beat(period: float) -> float:
    """Seconds until the next multiple of `period` on the event loop's clock: the
    heartbeats of one process's instances, of one period, come due together (and their
    registry beats are written in one transaction, `Store.beat`)."""
    now = asyncio.get_running_loop().time()
    return (math.floor(now / period) + 1) * period - now


_RANDOM = random.Random()
"""This module's own generator: the process-wide one (`random`'s) is left to the
application, its seeds and its tests."""

SPREAD = 0.2
"""Seconds over which the first calls of a process's roles (and their looks after a beat)
are spread at random: made at the same instant, each would take a connection of its own, and
the pool would keep them open for a while."""


def spread() -> float:
    """A random delay of up to SPREAD seconds."""
    return _RANDOM.uniform(0.0, SPREAD)
