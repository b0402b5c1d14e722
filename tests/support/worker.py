"""A worker of an App for the length of a block, with fast options."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import stepwarden as sw

FAST = sw.WorkerOptions(
    poll_interval=0.01,
    supervisor_interval=0.05,
    lease_ttl=1.0,
    backoff=sw.Backoff(initial=0.01, maximum=0.05),
    drain_timeout=5,
)


RESUME = dataclasses.replace(
    FAST,
    agent_heartbeat=0.2,
    agent_gone_after=1.0,
    scheduler_heartbeat=0.2,
    scheduler_gone_after=1.0,
)


@contextlib.asynccontextmanager
async def running(app: sw.App, options: sw.WorkerOptions = FAST) -> AsyncIterator[sw.Worker]:
    worker = sw.Worker(app, options)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop.set()
        await asyncio.wait_for(task, 30)
