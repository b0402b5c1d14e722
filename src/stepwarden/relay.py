"""Status messages on the application's own broker: the relay from the outbox.

A task submitted with `reply_to="amqp://host[:port]/queue"` (RabbitMQ), `"nats://host[:port]/
subject"` (NATS JetStream) or `"redis://host[:port]/stream"` (a Redis stream) records only
that destination. Its status messages are written to the outbox, as for any `reply_to`, in
the transactions that make the changes they report, and are due at once there (`next_at`).
The relay, run by the supervisor leader beside its sweep, delivers them:

- at least once, each under a stable id, `TASK_ID:OUTBOX_ID` (the AMQP `message_id`, the
  NATS `Nats-Msg-Id` header that JetStream de-duplicates by, a Redis stream entry's `id`
  field), for the consumer to drop a duplicate;
- in order per task: a task's messages go one after another, in outbox id order, each once
  the broker acknowledged the one before it (a publisher confirm on RabbitMQ, JetStream's ack
  on NATS, XADD's reply on Redis); a delivery that fails is tried again after a growing
  backoff (`retry.Backoff`), and the task's later messages wait for it;
- recorded only after the broker's acknowledgement: a relay killed between the two sends the
  message again, under the same id; a broker down or restarting is an error tried again;
- only to the destinations the operator lists (`destinations.py`, given by the worker's
  App): a message for another one (stored before the list existed, or since taken off it)
  is refused, recorded done with its error and never tried again, before anything connects.

A destination that keeps failing, or whose messages are refused, is warned of at most once a
minute (`WARN_EVERY`), with the number of messages since the last warning.

Why the supervisor leader: there is one at a time (its lease), so that no two relays send a
task's messages side by side, out of order, and the leader already delivers the outbox's
alerts; a leader's successor takes up where the store says it stopped.

On PostgreSQL, outbox ids are given when a row is written, not when its transaction commits:
two transactions of one task (two parallel steps completing) may commit out of id order. The
relay sends a message only once every transaction of the database that began before it took
a fence has ended (`Store.relay_fence`, `relay_passed`), so that no message of a lower id can
still appear. SQLite writes one transaction at a time: its ids come in commit order.

Credentials are never part of a destination (a `reply_to` with a user or password is
refused): each worker reads them from the JSON file that `STEPWARDEN_BROKERS` names, one entry
per broker, `"amqp://host:5672": {"username": ..., "password": ..., "vhost": "/"}` (NATS:
`username`, `password` or `token`; Redis: `username`, `password`, `db`; any: `"tls": true`).
They are never stored, shown or logged: an error text has them masked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import _json
from ._aio import Pace, sleep_unless, to_the_end
from ._files import PRIVATE, read_guarded
from .destinations import BROKERS_ENV, Destination, Destinations, broker
from .errors import ConfigurationError, TransientStoreError
from .records import OutboxMessage
from .retry import Backoff
from .secret import MASK, Secret
from .store._flow import CHANNEL_OUTBOX
from .store.ports import RelayPort

logger = logging.getLogger("stepwarden.relay")

ENV = BROKERS_ENV
"""The environment variable that names the workers' file of broker credentials."""
DEADLINE = 10.0
"""Seconds one delivery may take, connecting included."""
WARN_EVERY = 60.0
"""Seconds between two warnings of the relay about one destination's messages."""
MAX_QUIET = 1000
REFUSED_FOR = 1.0
"""Seconds a broker that refused a connection is taken for unreachable without another try
(the tasks a round serves side by side do not each try)."""
MAX_ERROR = 1000
"""Characters of a failed delivery's error that are stored."""
_ACCESS_FIELDS = {"username", "password", "token", "vhost", "db", "tls"}


# -- credentials ---------------------------------------------------------------------------
@dataclass(frozen=True)
class BrokerAccess:
    """How a worker connects to one broker. Secrets print as `***`."""

    username: str | None = None
    password: Secret[str] | None = None
    token: Secret[str] | None = None
    vhost: str = "/"
    db: int = 0
    tls: bool = False


@dataclass(frozen=True)
class Brokers:
    """The workers' credentials, per broker (`scheme://host:port`)."""

    access: Mapping[str, BrokerAccess] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Brokers:
        """From the file `STEPWARDEN_BROKERS` names; none when it is unset."""
        path = (os.environ if environ is None else environ).get(ENV)
        return cls.from_file(path) if path else cls()

    @classmethod
    def from_file(cls, path: str) -> Brokers:
        """From a JSON object of `"scheme://host[:port]": {fields}`. A file its group or
        others may read or write is refused (`chmod 600`), as is an unknown field (named,
        never its value)."""
        text = read_guarded(path, f"{ENV}: the brokers' file", PRIVATE)
        raw = _json.loads(text, what=f"{ENV} file {path}")
        if not isinstance(raw, dict):
            raise ConfigurationError(f"{ENV}: {path} must hold a JSON object")
        access = {}
        for key, entry in raw.items():
            broker = _broker_key(key)
            if not isinstance(entry, dict) or set(entry) - _ACCESS_FIELDS:
                unknown = sorted(set(entry) - _ACCESS_FIELDS) if isinstance(entry, dict) else []
                raise ConfigurationError(
                    f"{ENV}: the entry of {broker} must be an object of "
                    f"{sorted(_ACCESS_FIELDS)}" + (f" (unknown: {unknown})" if unknown else "")
                )
            try:
                access[broker] = BrokerAccess(
                    username=_text_or_none(entry.get("username")),
                    password=_secret(entry.get("password")),
                    token=_secret(entry.get("token")),
                    vhost=str(entry.get("vhost", "/")),
                    db=int(entry.get("db", 0)),
                    tls=bool(entry.get("tls", False)),
                )
            except (TypeError, ValueError):
                raise ConfigurationError(f"{ENV}: a bad field in the entry of {broker}") from None
        return cls(access)

    def __post_init__(self) -> None:
        for access in self.access.values():
            _SHOWN_NEVER.update(
                s
                for s in (
                    access.username,
                    *(x.reveal() for x in (access.password, access.token) if x),
                )
                if s
            )

    def of(self, dest: Destination) -> BrokerAccess:
        return self.access.get(dest.broker, BrokerAccess())

    def secrets(self) -> list[str]:
        """Every password and token: masked in any error text."""
        found = []
        for a in self.access.values():
            found += [s.reveal() for s in (a.password, a.token) if s is not None and s.reveal()]
        return found


def _broker_key(key: str) -> str:
    try:
        return broker(key).broker
    except ConfigurationError as exc:
        raise ConfigurationError(f"{ENV}: {exc}") from None


def _text_or_none(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError
    return value


def _secret(value: Any) -> Secret[str] | None:
    text = _text_or_none(value)
    return None if text is None else Secret(text)


class _HideCredentials(logging.Filter):
    """The brokers' clients log their connections (aiormq: its URL, with the user): the
    configured users, passwords and tokens are shown as `***`, whoever configured the
    logging."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _SHOWN_NEVER:
            text = record.getMessage()
            for hidden in _SHOWN_NEVER:
                text = text.replace(hidden, MASK)
            record.msg, record.args = text, ()
        return True


_SHOWN_NEVER: set[str] = set()
"""The credentials of the brokers configured in this process."""
_CLIENT_LOGGERS = ("aiormq.connection", "aio_pika.connection", "nats.aio.client", "redis")
for _name in _CLIENT_LOGGERS:
    logging.getLogger(_name).addFilter(_HideCredentials())


# -- publishers: one per broker, connected when first used ---------------------------------
class Unreachable(Exception):
    """The broker could not be reached: every message for it waits this round."""


class Publisher(Protocol):
    async def publish(self, dest: Destination, message_id: str, kind: str, body: bytes) -> None:
        """Return once the broker acknowledged the message; raise otherwise."""

    async def close(self) -> None: ...


class _Opening:
    """One connection for the tasks served side by side: opened by one of them at a time,
    and, once refused, not tried again for REFUSED_FOR seconds (each waiting task gets the
    same refusal)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._refused: tuple[float, str] | None = None

    async def run(self, open_alone: Callable[[], Awaitable[Any]]) -> Any:
        async with self._lock:
            if self._refused is not None and time.monotonic() - self._refused[0] < REFUSED_FOR:
                raise Unreachable(self._refused[1])
            try:
                return await open_alone()
            except Unreachable as exc:
                self._refused = (time.monotonic(), str(exc))
                raise


class AmqpPublisher:
    """RabbitMQ through aio-pika: to the default exchange, routed to the queue, persistent
    and mandatory (a queue that does not exist is a failed delivery), with publisher
    confirms."""

    def __init__(self, dest: Destination, access: BrokerAccess) -> None:
        self.dest = dest
        self.access = access
        self._connection: Any = None
        self._channel: Any = None
        self._opening = _Opening()

    async def _open(self) -> Any:
        return await self._opening.run(self._open_alone)

    async def _open_alone(self) -> Any:
        import aio_pika
        from aio_pika.connection import make_url

        if self._channel is not None and not self._channel.is_closed:
            return self._channel
        await self.close()
        # The connection is made here, not by `aio_pika.connect`, so that one that fails to
        # open is closed too: aio-pika closes an unclosed one when it is collected, which
        # out of its event loop leaves its close never awaited.
        self._connection = aio_pika.Connection(
            make_url(
                host=self.dest.host,
                port=self.dest.port,
                login=self.access.username or "guest",
                password=self.access.password.reveal() if self.access.password else "guest",
                virtualhost=self.access.vhost,
                ssl=self.access.tls,
            )
        )
        try:
            await self._connection.connect(timeout=DEADLINE)
            self._channel = await self._connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
        except BaseException as exc:
            await to_the_end(self.close())
            if isinstance(exc, Exception):
                raise Unreachable(_describe(exc)) from None
            raise
        return self._channel

    async def publish(self, dest: Destination, message_id: str, kind: str, body: bytes) -> None:
        import aio_pika

        channel = await self._open()
        message = aio_pika.Message(
            body,
            message_id=message_id,
            type=kind,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            await channel.default_exchange.publish(message, routing_key=dest.name, mandatory=True)
        except Exception:
            if channel.is_closed:
                await self.close()
            raise

    async def close(self) -> None:
        connection, channel = self._connection, self._channel
        self._connection = self._channel = None
        # The channel first: closed with its connection, its close callback would run in a
        # task of its own that nobody waits for.
        for closing in (channel, connection):
            if closing is not None:
                try:
                    await closing.close()
                except Exception as exc:
                    logger.debug("relay: closing %s: %s", self.dest.broker, exc)


class NatsPublisher:
    """NATS JetStream through nats-py: a JetStream publish to the subject (a stream must
    capture it), with the `Nats-Msg-Id` header, returning once JetStream acknowledged it."""

    def __init__(self, dest: Destination, access: BrokerAccess) -> None:
        self.dest = dest
        self.access = access
        self._client: Any = None
        self._opening = _Opening()

    async def _open(self) -> Any:
        return await self._opening.run(self._open_alone)

    async def _open_alone(self) -> Any:
        import nats

        if self._client is not None and self._client.is_connected:
            return self._client.jetstream(timeout=DEADLINE)
        await self.close()

        heard: list[Exception] = []

        async def quiet(*_: Any) -> None:  # errors surface where a publish fails
            return None

        async def kept(exc: Exception) -> None:  # why a connection failed to open
            heard[:] = [exc]

        scheme = "tls" if self.access.tls else "nats"
        host = f"[{self.dest.host}]" if ":" in self.dest.host else self.dest.host
        try:
            # nats-py tries its one server again and again while it may reconnect to it (0
            # attempts means no bound): one more try, then it gives up ("no servers"), and
            # the error is the last connection's (refused, say), not a timeout.
            self._client = await nats.connect(
                servers=[f"{scheme}://{host}:{self.dest.port}"],
                user=self.access.username,
                password=self.access.password.reveal() if self.access.password else None,
                token=self.access.token.reveal() if self.access.token else None,
                allow_reconnect=False,
                connect_timeout=DEADLINE,
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                error_cb=kept,
                disconnected_cb=quiet,
                closed_cb=quiet,
            )
        except Exception as exc:
            await to_the_end(self.close())
            raise Unreachable(_describe(heard[0] if heard else exc)) from None
        return self._client.jetstream(timeout=DEADLINE)

    async def publish(self, dest: Destination, message_id: str, kind: str, body: bytes) -> None:
        stream = await self._open()
        try:
            await stream.publish(
                dest.name, body, headers={"Nats-Msg-Id": message_id, "Stepwarden-Kind": kind}
            )
        except Exception:
            if not self._client.is_connected:
                await self.close()
            raise

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and not client.is_closed:
            try:
                await client.close()
            except Exception as exc:
                logger.debug("relay: closing %s: %s", self.dest.broker, exc)


class RedisPublisher:
    """A Redis stream through redis-py's asyncio client: XADD of an entry with the fields
    `id`, `kind` and `message` (the JSON body); XADD's reply is the acknowledgement.

    One client, and its pool of connections, for the publisher's life: the tasks served side
    by side each take a connection of the pool. redis-py closes a connection that failed (a
    refused AUTH's too) and checks an idle one before it is used again (one the broker closed
    by a restart is opened again). The pool is closed by `close()` alone, once no send uses
    it: redis-py would connect again for a send under way, in a pool nobody closes."""

    def __init__(self, dest: Destination, access: BrokerAccess) -> None:
        from redis import asyncio as aioredis

        self.dest = dest
        self._client = aioredis.Redis(
            host=dest.host,
            port=dest.port,
            username=access.username,
            password=access.password.reveal() if access.password else None,
            db=access.db,
            ssl=access.tls,
            socket_connect_timeout=DEADLINE,
            socket_timeout=DEADLINE,
        )

    async def publish(self, dest: Destination, message_id: str, kind: str, body: bytes) -> None:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        try:
            await self._client.xadd(dest.name, {"id": message_id, "kind": kind, "message": body})
        except (RedisConnectionError, RedisTimeoutError) as exc:
            # Its connection is closed already; the others are other tasks' sends' (closing
            # them under those sends would only have redis-py connect again and again).
            raise Unreachable(_describe(exc)) from None

    async def close(self) -> None:
        """Close every connection of the pool, idle or in use."""
        try:
            await self._client.aclose()
        except Exception as exc:  # each connection was closed, whichever raised
            logger.debug("relay: closing %s: %s", self.dest.broker, exc)


_PUBLISHERS: dict[str, Callable[[Destination, BrokerAccess], Publisher]] = {
    "amqp": AmqpPublisher,
    "nats": NatsPublisher,
    "redis": RedisPublisher,
}


def message_id(message: OutboxMessage) -> str:
    """A status message's id on every broker: its task's id and its outbox id."""
    return f"{message.task_id}:{message.id}"


def message_body(message: OutboxMessage) -> bytes:
    """What a broker is sent: JSON of the id, the outbox id, the task, the kind, the detail
    (secrets as `***`) and when it was written."""
    return _json.display(
        {
            "id": message_id(message),
            "outbox_id": message.id,
            "task_id": message.task_id,
            "kind": message.kind,
            "detail": message.detail,
            "at": message.at.isoformat(),
        }
    ).encode()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- the relay ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Refused:
    """A message the relay will never send: why."""

    error: str


class Relay:
    """Delivers the outbox's status messages for brokers, in order per task, at least once,
    to the destinations the operator lists (`destinations`: none by default).

    Each round takes up to `tasks` tasks whose first undelivered message is due (up to
    `batch` messages), and sends each task's messages one after another, at most
    `concurrency` tasks at once. A broker that cannot be reached fails every message for it
    in that round without another try. A message whose destination is not listed (stored
    before the list was, or since taken off it) is refused: recorded done with its error,
    never sent, never tried again. Its warnings, and those of a destination that keeps
    failing, come at most once every WARN_EVERY seconds per destination, with the number of
    messages since the last one."""

    def __init__(
        self,
        store: RelayPort,
        brokers: Brokers | None = None,
        *,
        destinations: Destinations | None = None,
        backoff: Backoff | None = None,
        tasks: int = 200,
        batch: int = 2000,
        concurrency: int = 16,
        deadline: float = DEADLINE,
    ) -> None:
        self.store = store
        self.brokers = brokers or Brokers()
        self.destinations = destinations or Destinations()
        self.backoff = backoff or Backoff(initial=0.5, maximum=30.0)
        self.tasks = tasks
        self.batch = batch
        self.deadline = deadline
        self._room = asyncio.Semaphore(concurrency)
        self._publishers: dict[str, Publisher] = {}
        self._dropped: list[Publisher] = []
        """Publishers given up after a deadline, closed once the round's sends have ended: a
        send of another task may still be using one, and a client closed under it connects
        again (redis-py's does), in a publisher that nobody would close."""
        self._safe = 0
        """Messages up to this id can no longer be preceded by one still to commit."""
        self._fence: tuple[int, int] | None = None
        self._found = False
        """Whether the last round found messages due."""
        self._quiet: dict[str, tuple[float, int]] = {}
        """Per destination and kind of warning, until when it is not logged again, and how
        many messages it has been about since it last was."""

    async def run(self, stop: asyncio.Event, leading: Callable[[], bool], poll: float) -> None:
        """Deliver while `leading()` says this process leads, until `stop` is set: a round at
        each outbox wake-up, else every `poll` seconds."""
        woken = self.store.subscribe(CHANNEL_OUTBOX)
        # Every message written notifies (the outbox's triggers): with those wake-ups, a
        # relay idle for a while polls only as a fallback; one that found messages, some due
        # again after a failure, polls as often as before.
        pace = Pace(poll, lambda: self.store.wakeups_live)
        try:
            while not stop.is_set():
                again = False
                if leading():
                    try:
                        again = await self.deliver_due() > 0 or self._fence is not None
                    except TransientStoreError as exc:
                        logger.warning("relay: %s", exc)
                    except Exception:
                        logger.exception("relay: the round failed")
                    if again or self._found:
                        pace.busy()
                else:
                    self._safe, self._fence = 0, None  # a later term starts afresh
                if again:
                    await sleep_unless(stop, min(poll, 0.02))
                elif await woken.wait(pace.wait()) is not None:
                    pace.busy()
        finally:
            self.store.unsubscribe(CHANNEL_OUTBOX, woken)
            # Stopped (or cancelled) while it closes, the relay still closes every publisher.
            await to_the_end(self.close())

    async def close(self) -> None:
        """Close every publisher (none is sending: a round ends when its sends have)."""
        publishers = [*self._publishers.values(), *self._dropped]
        self._publishers, self._dropped = {}, []
        await self._close_each(publishers)

    async def _close_each(self, publishers: list[Publisher]) -> None:
        for publisher in publishers:  # each one, whatever closing another raised
            try:
                await publisher.close()
            except Exception as exc:
                logger.warning("relay: closing a publisher: %s", self._scrub(_describe(exc)))

    async def deliver_due(self) -> int:
        """One round; the number of messages delivered."""
        await self._settle()
        due = await self.store.relay_due(upto=self._safe, tasks=self.tasks, limit=self.batch)
        self._found = bool(due)
        if not due:
            return 0
        by_task: dict[str | None, list[OutboxMessage]] = {}
        for message in due:
            by_task.setdefault(message.task_id, []).append(message)
        delivered: list[int] = []
        refused: list[tuple[int, str]] = []
        unreachable: dict[str, str] = {}
        failed: dict[str, list[str]] = {}
        never: dict[str, list[str]] = {}

        async def serve(messages: list[OutboxMessage]) -> None:
            async with self._room:
                for message in messages:
                    error = await self._send(message, unreachable)
                    if isinstance(error, _Refused):  # as are the task's later ones: go on
                        refused.append((message.id, error.error))
                        never.setdefault(message.channel, []).append(error.error)
                        continue
                    if error is not None:
                        failed.setdefault(message.channel, []).append(error)
                        await self.store.relay_failed(
                            message.id, error, self.backoff.delay(message.attempts + 1)
                        )
                        return
                    delivered.append(message.id)

        try:
            # Every send ends before the round does, even when one fails (the store refusing
            # a write): none runs on beside the next round, or past the publishers' close.
            ended = await asyncio.gather(
                *(serve(m) for m in by_task.values()), return_exceptions=True
            )
        finally:
            try:
                await self.store.relay_delivered(delivered)
                await self.store.relay_refused(refused)
            finally:
                dropped, self._dropped = self._dropped, []
                await to_the_end(self._close_each(dropped))
        for outcome in ended:
            if isinstance(outcome, BaseException):
                raise outcome
        for channel, errors in never.items():
            self._warn(channel, "refused, never sent", errors)
        for channel, errors in failed.items():
            self._warn(channel, "not delivered, tried again later", errors)
        return len(delivered)

    def _warn(self, channel: str, what: str, errors: list[str]) -> None:
        """A warning about `errors` of messages for `channel`, unless one of its kind was
        logged less than WARN_EVERY seconds ago (those are counted in the next one)."""
        now = time.monotonic()
        until, held = self._quiet.get(f"{what} {channel}", (0.0, 0))
        if now < until:
            self._quiet[f"{what} {channel}"] = (until, held + len(errors))
            return
        if len(self._quiet) > MAX_QUIET:
            self._quiet = {k: v for k, v in self._quiet.items() if v[0] > now}
        self._quiet[f"{what} {channel}"] = (now + WARN_EVERY, 0)
        since = f" (and {held} since the last warning)" if held else ""
        logger.warning(
            "relay: %d status message(s) for %s %s%s: %s (warned at most once every %g s)",
            len(errors),
            channel,
            what,
            since,
            errors[-1],
            WARN_EVERY,
        )

    async def _settle(self) -> None:
        """Move `_safe` on once no transaction that began before the fence runs."""
        if self._fence is not None:
            waited, settled = self._fence
            if not await self.store.relay_passed(waited):
                return
            self._safe, self._fence = max(self._safe, settled), None
        upto, fence = await self.store.relay_fence(self._safe)
        if fence is None:
            return
        if await self.store.relay_passed(fence):
            self._safe = max(self._safe, upto)
        else:
            self._fence = (fence, upto)

    async def _send(
        self, message: OutboxMessage, unreachable: dict[str, str]
    ) -> str | _Refused | None:
        """None once the broker acknowledged the message, else the error (credentials
        masked): refused when its destination is not one the relay may send to (not listed,
        or not a destination)."""
        try:
            dest = self.destinations.check(message.channel)
        except ConfigurationError as exc:
            return _Refused(self._scrub(f"refused: {exc}"))
        if dest.broker in unreachable:
            return unreachable[dest.broker]
        started = time.monotonic()
        publisher = self._publishers.get(dest.broker)
        try:
            if publisher is None:
                make = _PUBLISHERS[dest.scheme]
                publisher = self._publishers[dest.broker] = make(dest, self.brokers.of(dest))
            async with asyncio.timeout(self.deadline):
                await publisher.publish(
                    dest, message_id(message), message.kind, message_body(message)
                )
            return None
        except Unreachable as exc:
            unreachable[dest.broker] = error = self._scrub(f"{dest.broker} unreachable: {exc}")
            return error
        except TimeoutError:
            error = f"no acknowledgement within {self.deadline} s"
            if publisher is not None:
                self._drop(dest.broker, publisher)
        except Exception as exc:
            error = _describe(exc)
        logger.debug("relay: %s after %.3f s: %s", message_id(message),
                     time.monotonic() - started, self._scrub(error))  # fmt: skip
        return self._scrub(error)

    def _drop(self, broker: str, publisher: Publisher) -> None:
        """The next send to the broker opens another publisher; this one is closed at the end
        of the round (another task's send may be using it)."""
        if self._publishers.get(broker) is publisher:
            del self._publishers[broker]
        if publisher not in self._dropped:
            self._dropped.append(publisher)

    def _scrub(self, text: str) -> str:
        for secret in self.brokers.secrets():
            text = text.replace(secret, MASK)
        return text[:MAX_ERROR]
