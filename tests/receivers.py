"""Webhook receivers for the alert tests: real HTTP servers on 127.0.0.1, one that trickles
its answer (a byte every few seconds, never done), one that answers at once, and hostile
ones: a compressed body that decodes to far more than it is (sent whatever the request's
Accept-Encoding says), a large body, a body dripped a byte at a time."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import threading
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
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
    with in_thread(lambda: trickling(every)) as seen:
        yield seen


@contextlib.contextmanager
def in_thread(
    receiver: Callable[[], contextlib.AbstractAsyncContextManager[Receiver]],
) -> Iterator[Receiver]:
    """A receiver served by a loop of its own in a thread."""
    ready = threading.Event()
    done: asyncio.Event | None = None
    loop = asyncio.new_event_loop()
    box: list[Receiver] = []

    async def main() -> None:
        nonlocal done
        done = asyncio.Event()
        async with receiver() as seen:
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


@functools.cache
def gzip_bomb(decoded: int, layers: int = 1) -> bytes:
    """`decoded` zero bytes, gzipped `layers` times: a body whose `Content-Encoding` (gzip,
    once per layer) makes it `decoded` bytes, from 1/1000 of that (one layer) to a few
    hundred bytes (two)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    whole, rest = divmod(decoded, len(zeros))
    body = b"".join(packer.compress(zeros) for _ in range(whole))
    body += packer.compress(zeros[:rest]) + packer.flush()
    for _ in range(layers - 1):
        body = gzip.compress(body, 9)
    return body


@contextlib.asynccontextmanager
async def hostile(
    body: bytes,
    *,
    status: int = 200,
    encoding: str | None = None,
    drip: float | None = None,
) -> AsyncIterator[Receiver]:
    """A receiver that answers each request with `status` and `body`, labelled with the
    Content-Encoding `encoding` whatever the request asked for; the body at once, or one
    byte every `drip` seconds."""
    seen = Receiver(got_request=asyncio.Event())
    head = f"HTTP/1.1 {status} Whatever\r\nContent-Length: {len(body)}\r\n"
    if encoding:
        head += f"Content-Encoding: {encoding}\r\n"
    answer = head.encode() + b"\r\n"
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
            writer.write(answer)
            step = 1 if drip else 1 << 16  # in pieces: the receiver holds little of it
            for start in range(0, len(body), step):
                writer.write(memoryview(body)[start : start + step])
                await writer.drain()
                if drip:
                    await asyncio.sleep(drip)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # the test is over: the loop ends the connection
            return
        finally:
            seen.open_connections -= 1
            serving.discard(me)
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    seen.port = server.sockets[0].getsockname()[1]
    try:
        yield seen
    finally:
        server.close()
        for task in list(serving):
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)
