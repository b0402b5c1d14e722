"""Waiting for a condition, read again until it holds."""

from __future__ import annotations

import asyncio
from typing import Any

import stepwarden as sw


async def until(check: Any, timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if await check():
                return
            await asyncio.sleep(0.02)


async def in_state(
    app: sw.App, task_id: str, state: sw.TaskState, timeout: float = 20
) -> sw.TaskRecord:
    """The task once it exists and is in `state` (read from the store until then)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                task = await app.status_async(task_id)
            except sw.TaskNotFound:  # a child not started yet
                task = None
            if task is not None and task.process_state == state:
                return task
            await asyncio.sleep(0.02)
