"""Webhook receivers for the alert tests: real HTTP servers on 127.0.0.1, one that trickles
its answer (a byte every few seconds, never done) and one that answers at once."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

TRICKLE = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"


@dataclass
class Receiver:
    """What a receiver has seen: each request's first line and headers, and how many
    connections are open now."""

    port: int = 0
    requests: list[bytes] = field(default_factory=list)
    open_connections: int = 0
    got_request: asyncio.Event | None = None

    def url(self, secret: bool = False) -> str:
        if secret:
            return f"http://ana:pa55word@127.0.0.1:{self.port}/hook?token=T0KEN-SECRET"
        return f"http://127.0.0.1:{self.port}/hook"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            await reader.readexactly(int(value))
    return head


@contextlib.asynccontextmanager
async def trickling(every: float = 2.0) -> AsyncIterator[Receiver]:
    """A receiver that reads each request, then sends its answer one byte every `every`
    seconds, never finishing it, until the client goes away."""
    seen = Receiver(got_request=asyncio.Event())
    serving: set[asyncio.Task[object]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        serving.add(me)
        seen.open_connections += 1
        try:
            seen.requests.append(await _read_request(reader))
            assert seen.got_request is not None
            seen.got_request.set()
            for byte in TRICKLE * 100:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(every)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # the test is over: the loop ends the connection
            return
        finally:
            seen.open_connections -= 1
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    seen.port = server.sockets[0].getsockname()[1]
    try:
        yield seen
    finally:
        server.close()
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)


@contextlib.contextmanager
def trickling_in_thread(every: float = 2.0) -> Iterator[Receiver]:
    """`trickling`, served by a loop of its own in a thread: for a test that drives real
    processes from synchronous code."""
    ready = threading.Event()
    done: asyncio.Event | None = None
    loop = asyncio.new_event_loop()
    box: list[Receiver] = []

    async def main() -> None:
        nonlocal done
        done = asyncio.Event()
        async with trickling(every) as seen:
            box.append(seen)
            ready.set()
            await done.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the receiver did not start"
    try:
        yield box[0]
    finally:
        assert done is not None
        loop.call_soon_threadsafe(done.set)
        thread.join(10)
        loop.close()


@contextlib.asynccontextmanager
async def answering() -> AsyncIterator[Receiver]:
    """A receiver that answers 204 to each request at once."""
    seen = Receiver(got_request=asyncio.Event())

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                seen.requests.append(await _read_request(reader))
                assert seen.got_request is not None
                seen.got_request.set()
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    seen.port = server.sockets[0].getsockname()[1]
    try:
        yield seen
    finally:
        server.close()
