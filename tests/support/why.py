"""What the tests of why a task waits share: worker options by role, and a value polled
until it is true."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .worker import FAST

T = TypeVar("T")


async def until(what: str, check: Callable[[], Awaitable[T | None]], timeout: float = 30.0) -> T:
    """`check()`'s value once it is true; fails after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


ROLES = {
    "all": FAST,
    "no_agents": dataclasses.replace(FAST, roles=frozenset({"scheduler", "supervisor"})),
}
