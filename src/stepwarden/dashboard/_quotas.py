"""What each client of the application API and the agent protocol may ask, as its settings
in the tokens file say (`_tokens.SETTINGS`: each has a built-in default), applied by this
server. Each refusal names the bound, and the setting that sets it:

- submits a second (`submit_rate`) and bytes of task input a second (`submit_bytes`): a
  token bucket per client, in this server's memory, that holds one second's worth (the
  bytes' at least one input's bound) and fills at that rate; past it, 429 with Retry-After
  (the seconds until it holds enough);
- one task's input, as stored (`input_bytes`): past it, 413;
- the priority a submit asks for (`priority`, LOW..HIGH): outside it, 422;
- a submit's `reply_to` and the status messages a client reads: a plain channel must be one
  of its `channels`, a broker destination one that an entry of its `destinations` allows
  (`destinations.py`); otherwise 422 at submit (nothing stored), 403 for the messages;
- its tasks not finished (`unfinished`): at the bound, 429. The store's count of the
  client's tasks (`submitted_by`) is read at most once a second, and this server adds the
  submits it has admitted since: one server never admits past the bound, however many
  submits come at once; with several servers, each may also admit what the others admitted
  within the last second;
- its long polls (`polls`: a result's wait, an agent's claim that waits) and its streams
  (`streams`: status messages, wake-ups) at once, on this server: past either, 429;
- for an agent client, its alive registrations in the agent registry (`instances`, counted
  by the store at each new registration, one at a time per client on this server): past it,
  429; an instance's capacity (`capacity`) and time to live (`ttl`): past either, 422.

The buckets and the counts of polls and streams are this process's: they start afresh when
it starts, and each of several servers keeps its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from starlette.exceptions import HTTPException
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .. import _tokens
from ..destinations import Destinations, is_destination
from ..errors import ConfigurationError

FRESH = 1.0
"""Seconds a count of a client's unfinished tasks read from the store is used."""
RETRY_COUNTED = 1
"""The Retry-After of a refusal by a count (unfinished tasks, instances, polls, streams)."""


def refused(status: int, reason: str, retry_after: float | None = None) -> HTTPException:
    headers = None if retry_after is None else {"Retry-After": str(max(1, math.ceil(retry_after)))}
    return HTTPException(status, reason, headers)


@dataclass
class Bucket:
    """A token bucket: holds up to `size`, fills at `rate` a second."""

    rate: float
    size: float
    level: float = math.inf
    at: float = 0.0

    def take(self, amount: float, now: float) -> float:
        """Take `amount`: 0 when taken, else the seconds until the bucket holds it."""
        self.level = min(self.size, self.level + (now - self.at) * self.rate)
        self.at = now
        if amount <= self.level:
            self.level -= amount
            return 0.0
        return (min(amount, self.size) - self.level) / self.rate


@dataclass
class _Unfinished:
    counted: int = 0
    """The store's count, when last read."""
    read_at: float = -math.inf
    added: int = 0
    """Tasks created by this server's submits since the count was read."""
    admitted: int = 0
    """Submits admitted, not yet answered by the store."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class Admission:
    """A submit admitted under its client's `unfinished` bound: say whether it created a
    task once the store has answered (or failed)."""

    state: _Unfinished
    done: bool = False

    def created(self, created: bool) -> None:
        if not self.done:
            self.done = True
            self.state.admitted -= 1
            self.state.added += int(created)


@dataclass
class Held:
    """One long poll or stream of a client, counted until it is released."""

    counts: dict[str, int]
    key: str
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.counts[self.key] -= 1
            if not self.counts[self.key]:
                del self.counts[self.key]


class HeldStream(StreamingResponse):
    """A stream counted as one of its client's (`held`) until it ends, however it ends."""

    def __init__(
        self,
        content: AsyncIterable[str],
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
        *,
        held: Held,
    ) -> None:
        super().__init__(content, status_code, headers, media_type)
        self.held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.held.release()


class Quotas:
    """The bounds of every client, on this server. `unfinished(client)` and
    `registrations(client, instance, agent)` ask the store (`Store.client_unfinished`,
    `Store.client_agents`)."""

    def __init__(
        self,
        destinations: Destinations,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.destinations = destinations
        self.clock = clock
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._unfinished: dict[str, _Unfinished] = {}
        self._held: dict[str, int] = {}
        self._registering: dict[str, asyncio.Lock] = {}

    # -- submits --------------------------------------------------------------------------
    def _take(self, client: str, what: str, rate: float, size: float, amount: float) -> float:
        bucket = self._buckets.get((client, what))
        if bucket is None:
            bucket = self._buckets[client, what] = Bucket(rate, size, at=self.clock())
        bucket.rate, bucket.size = rate, size  # as the tokens file says now
        return bucket.take(amount, self.clock())

    def check_submit(self, client: _tokens.Client, size: int, priority: int) -> None:
        """A submit of an input of `size` bytes (as stored) at `priority`: refused past the
        client's input size (413), or outside its priorities (422)."""
        most = client.setting(_tokens.INPUT_BYTES)
        if size > most:
            raise refused(
                413,
                f"the task input is {size} bytes, over this client's bound of {most} "
                f"(setting {_tokens.INPUT_BYTES.name})",
            )
        low, high = client.setting(_tokens.PRIORITY)
        if not low <= priority <= high:
            raise refused(
                422,
                f"priority {priority} is outside this client's priorities, {low} to {high} "
                f"(setting {_tokens.PRIORITY.name})",
            )

    def take_submit(self, client: _tokens.Client, size: int) -> None:
        """A submit of an input of `size` bytes, taken from the client's buckets of submits
        and of bytes a second; 429 with Retry-After when either holds too little."""
        most = client.setting(_tokens.INPUT_BYTES)
        rate = client.setting(_tokens.SUBMIT_RATE)
        wait = self._take(client.name, "submits", rate, max(rate, 1.0), 1)
        if wait > 0:
            raise refused(
                429,
                f"this client may submit {rate:g} task(s) a second (setting "
                f"{_tokens.SUBMIT_RATE.name}): try again in {math.ceil(wait)} s",
                wait,
            )
        per_second = client.setting(_tokens.SUBMIT_BYTES)
        if per_second == 0:
            setting = _tokens.SUBMIT_BYTES.name
            raise refused(429, f"this client may submit no task input (setting {setting})")
        wait = self._take(client.name, "bytes", per_second, max(per_second, most), size)
        if wait > 0:
            raise refused(
                429,
                f"this client may submit {per_second} bytes of task input a second (setting "
                f"{_tokens.SUBMIT_BYTES.name}): try again in {math.ceil(wait)} s",
                wait,
            )

    def check_reply_to(self, client: _tokens.Client, reply_to: str, status: int = 422) -> None:
        """Refused (`status`) unless the client may name `reply_to`: a plain channel among
        its `channels`, a broker destination that one of its `destinations` entries
        allows."""
        if not is_destination(reply_to):
            if client.may_name_channel(reply_to):
                return
            given: tuple[str, ...] = client.setting(_tokens.REPLY_CHANNELS)
            raise refused(
                status,
                f"the channel {reply_to!r} is not this client's: it may name "
                f"{', '.join(given) or 'none'} ({_tokens.CLIENT_MARK} for its name; setting "
                f"{_tokens.REPLY_CHANNELS.name})",
            )
        try:
            self.destinations.check(reply_to, client.destination_entries())
        except ConfigurationError as exc:
            raise refused(status, f"{exc} (setting {_tokens.DESTINATIONS.name})") from None

    async def admit(
        self, client: _tokens.Client, unfinished: Callable[[str], Awaitable[int]]
    ) -> Admission:
        """Admit one more submit under the client's `unfinished` bound, or refuse it (429):
        the store's count of its unfinished tasks (`unfinished`, read again when older
        than FRESH seconds), with the tasks this server's submits created since, and those
        it admitted that the store has not answered yet."""
        bound = client.setting(_tokens.UNFINISHED)
        state = self._unfinished.setdefault(client.name, _Unfinished())
        async with state.lock:
            now = self.clock()
            if now - state.read_at >= FRESH:
                # Created before the count is read: in it (a submit that commits while it is
                # read may be counted twice, never not at all).
                added, state.added = state.added, 0
                try:
                    state.counted = await unfinished(client.name)
                except BaseException:
                    state.added += added
                    raise
                state.read_at = now
            if state.counted + state.added + state.admitted >= bound:
                raise refused(
                    429,
                    f"this client has {bound} task(s) not finished, its bound (setting "
                    f"{_tokens.UNFINISHED.name}): submit again once some have finished",
                    RETRY_COUNTED,
                )
            state.admitted += 1
        return Admission(state)

    # -- long polls and streams -----------------------------------------------------------
    def hold(self, client: _tokens.Client, setting: _tokens.Setting[int]) -> Held:
        """One more long poll (`_tokens.POLLS`) or stream (`_tokens.STREAMS`) of the client,
        or 429 at its bound."""
        bound = client.setting(setting)
        key = f"{client.name} {setting.name}"
        if self._held.get(key, 0) >= bound:
            raise refused(
                429,
                f"this client has {bound} {setting.name} open, its bound (setting "
                f"{setting.name}): end one first",
                RETRY_COUNTED,
            )
        self._held[key] = self._held.get(key, 0) + 1
        return Held(self._held, key)

    @contextlib.asynccontextmanager
    async def holding(
        self, client: _tokens.Client, setting: _tokens.Setting[int]
    ) -> AsyncIterator[None]:
        held = self.hold(client, setting)
        try:
            yield
        finally:
            held.release()

    # -- agents ---------------------------------------------------------------------------
    def check_beat(self, client: _tokens.Client, capacity: int, ttl: float) -> None:
        """An agent instance's beat: refused (422) past the client's capacity or ttl."""
        for setting, value, what in (
            (_tokens.CAPACITY, capacity, "capacity"),
            (_tokens.TTL, ttl, "ttl"),
        ):
            bound = client.setting(setting)
            if value > bound:
                raise refused(
                    422,
                    f"{what} {value:g} is over this client's bound of {bound} (setting "
                    f"{setting.name})",
                )

    @contextlib.asynccontextmanager
    async def registering(
        self,
        client: _tokens.Client,
        instance: str,
        agent: str,
        registrations: Callable[[str, str, str], Awaitable[tuple[int, bool]]],
    ) -> AsyncIterator[None]:
        """Within the block, the instance's beat is written: refused (429) when it would be
        a new registration past the client's `instances`. The client's new registrations
        are counted and written one at a time on this server."""
        bound = client.setting(_tokens.INSTANCES)

        def over(alive: int) -> HTTPException:
            return refused(
                429,
                f"this client has {alive} agent registration(s) alive, its bound is {bound} "
                f"(setting {_tokens.INSTANCES.name}): one must leave or expire first",
                RETRY_COUNTED,
            )

        alive, known = await registrations(client.name, instance, agent)
        if known:  # a beat of an instance alive: it adds nothing
            yield
            return
        if alive >= bound:
            raise over(alive)
        lock = self._registering.setdefault(client.name, asyncio.Lock())
        async with lock:
            alive, known = await registrations(client.name, instance, agent)
            if not known and alive >= bound:
                raise over(alive)
            yield
