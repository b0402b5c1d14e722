"""Small asyncio helpers shared by the roles."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def first(*aws: Awaitable[Any]) -> None:
    """Wait until the first of `aws` finishes, then cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


async def sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `stop` is set meanwhile."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass
