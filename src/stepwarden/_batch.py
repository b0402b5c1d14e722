"""Group commit: callers hand in one item each; items that arrive while a flush is under way
are written together by the next flush, in one transaction."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class Batcher(Generic[In, Out]):
    def __init__(
        self,
        flush: Callable[[Sequence[In]], Awaitable[Sequence[Out]]],
        *,
        max_size: int = 500,
        yields: int = 1,
        gather: float = 0.0,
    ) -> None:
        self._flush = flush
        self._max_size = max_size
        self._yields = yields
        self._gather = gather
        """Seconds a flush waits besides, for items of callers woken at about the same time
        (timers due together, whose callbacks may run a turn or two apart)."""
        """Turns of the event loop a flush waits before it takes the items: the coroutines
        woken together (and those they wake) add theirs."""
        self._queue: list[tuple[In, asyncio.Future[Out]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, item: In) -> Out:
        future: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._flusher is None:
            # A flush serves every submitter: it runs in a context of its own, not in that of
            # the first (whose log fields and span would be wrongly carried by its lines).
            self._flusher = asyncio.create_task(self._run(), context=contextvars.Context())
        return await future

    async def _run(self) -> None:
        try:
            for _ in range(self._yields):  # let the coroutines woken together add theirs
                await asyncio.sleep(0)
            if self._gather > 0:
                await asyncio.sleep(self._gather)
            while self._queue:
                batch = self._queue[: self._max_size]
                del self._queue[: self._max_size]
                try:
                    results = await self._flush([item for item, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException:
                    for _, future in batch:
                        future.cancel()
                    raise
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._flusher = None
            if self._queue:  # cancelled mid-way: nobody will write these
                for _, future in self._queue:
                    future.cancel()
                self._queue.clear()

    async def drain(self) -> None:
        """Wait until every item handed in so far is written."""
        while self._flusher is not None:
            await asyncio.shield(self._flusher)
