"""Alerts for the operator: delivered at least once from the store's outbox to sinks.

An alert is recorded (as an `alert` event and an outbox message) in the transaction that
makes the change it reports: a task in error, a compensation that failed, max_failures
reached. The supervisor leader delivers the outbox to every sink of the App, in order, beside
its sweep (a slow sink never holds the sweep up), and records which sinks have it; a sink
that fails is tried again later with a growing backoff, while the others are not sent the
alert again. A crash between a delivery and its record
sends it once more: every alert carries its outbox `id`, the same each time, for the sink to
drop duplicates.

    app.add_alert_sink(stepwarden.WebhookSink("https://ops.example.com/hooks/stepwarden"))
    app.add_alert_sink(stepwarden.CallableSink(page_the_on_call))
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from . import _check
from ._aio import Pace, first
from .errors import ConfigurationError, TransientStoreError
from .records import OutboxMessage
from .retry import Backoff
from .secret import public_name, public_url, stored_name, stored_url
from .store import CHANNEL_OUTBOX, Subscription
from .store.ports import AlertPort

logger = logging.getLogger("stepwarden.alerts")

DEFAULT_DEADLINE = 10.0
"""Seconds one delivery of one alert to one sink may take, all told."""
ANSWER_READ = 4096
"""Bytes of a webhook's answer after which reading stops (its status is what counts; one
read from the network brings 64 KiB at most)."""


def alert_body(alert: OutboxMessage) -> dict[str, Any]:
    """What a sink is given: the outbox id (stable across deliveries), the task and why."""
    return {
        "id": alert.id,
        "task_id": alert.task_id,
        "at": alert.at.isoformat(),
        **(alert.detail if isinstance(alert.detail, dict) else {"detail": alert.detail}),
    }


class AlertSink(Protocol):
    name: str
    """Unique among an App's sinks: the outbox records delivery per sink name."""

    async def send(self, alert: dict[str, Any]) -> None:
        """Deliver one alert or raise."""


class LogSink:
    """Logs each alert at ERROR level on the `stepwarden.alerts` logger."""

    def __init__(self, name: str = "log") -> None:
        self.name = name

    async def send(self, alert: dict[str, Any]) -> None:
        logger.error(
            "ALERT %s task %s: %s (%s)",
            alert["id"],
            alert.get("task_id"),
            alert.get("reason"),
            alert.get("error"),
            extra={"task_id": alert.get("task_id")},
        )


class WebhookSink:
    """POSTs each alert as JSON to `url`; any answer other than 2xx is a failed delivery.
    The alert's id is also sent as the `Idempotency-Key` header. A delivery that has not
    ended within `timeout` seconds (connecting, sending and the answer together) fails and
    is tried again later.

    Only the answer's status counts: it is asked for unencoded (`Accept-Encoding:
    identity`), and its body is read, raw and never decoded, only until `ANSWER_READ` bytes
    have come, so that no answer (a compressed body that decodes to gigabytes, an endless
    one) costs the process more than kilobytes, or its event loop more than a moment.

    The URL is a secret (it may carry a user, a password or a token, in its path too): the
    sink is named `webhook:` and the URL's scheme, host, port and path, or `name`, and the
    outbox records delivery by that name; the dashboard and the log show it as `webhook:` and
    the URL's scheme, host and port only. Give a `name` to keep the path out of the store
    too."""

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        timeout: float = DEFAULT_DEADLINE,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = url
        self.name = stored_name(name) if name else f"webhook:{stored_url(url)}"
        self.shown = public_name(self.name)
        self.timeout = timeout
        self.headers = headers or {}
        self._tls_context: ssl.SSLContext | None = None
        _HIDDEN.update((url, str(httpx.URL(url))))

    @classmethod
    def parse(cls, spec: str) -> WebhookSink:
        """A sink from the command line's form: `URL`, or `NAME=URL` (NAME without `:`,
        `/`, `?`, `#` or `@`, so that a URL is never taken for a name)."""
        name, sep, url = spec.partition("=")
        if not sep or not name or any(c in name for c in ":/?#@"):
            name, url = "", spec
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"an alert webhook must be an http:// or https:// URL (or NAME=URL), "
                f"not {public_url(url)!r}"
            )
        if name:
            _check.name("the webhook's name", name)
        return cls(url, name=name or None)

    async def send(self, alert: dict[str, Any]) -> None:
        headers = {
            **self.headers,
            "Idempotency-Key": f"stepwarden-alert-{alert['id']}",
            "Accept-Encoding": "identity",
        }
        try:
            async with asyncio.timeout(self.timeout):
                client = httpx.AsyncClient(timeout=self.timeout, verify=await self._tls())
                async with (
                    client,
                    client.stream("POST", self.url, json=alert, headers=headers) as answer,
                ):
                    await _skim(answer)
        except TimeoutError:
            raise TimeoutError(f"{self.shown}: no answer within {self.timeout} s") from None
        except httpx.HTTPError as exc:  # its text may hold the URL
            raise ConnectionError(f"{self.shown}: {type(exc).__name__}") from None
        if not answer.is_success:
            raise RuntimeError(f"{self.shown} answered {answer.status_code}")

    async def _tls(self) -> ssl.SSLContext:
        # Loading the CA certificates costs tens of milliseconds of CPU: done once per sink
        # (not once per delivery, as a new client's default would), and off the event loop.
        if self._tls_context is None:
            self._tls_context = await asyncio.to_thread(httpx.create_ssl_context)
        return self._tls_context


async def _skim(answer: httpx.Response) -> None:
    """Read an answer's body only until `ANSWER_READ` bytes have come, raw: never decoded (a
    small compressed body may decode to gigabytes)."""
    read = 0
    async for chunk in answer.aiter_raw():  # closed with the answer
        read += len(chunk)
        if read >= ANSWER_READ:
            return


class _HideWebhookURLs(logging.Filter):
    """httpx logs each request's URL (INFO, logger `httpx`): a webhook's URL is shown as its
    sink's public form, whoever configured the logging."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and _HIDDEN:
            record.args = tuple(public_url(str(a)) if str(a) in _HIDDEN else a for a in record.args)
        return True


_HIDDEN: set[str] = set()
"""The URLs of the webhooks made in this process (as given, and as httpx writes them)."""
logging.getLogger("httpx").addFilter(_HideWebhookURLs())


class CallableSink:
    """Calls `fn(alert)`, a function or a coroutine function, in the supervisor's process."""

    def __init__(
        self, fn: Callable[[dict[str, Any]], Awaitable[None] | None], *, name: str | None = None
    ) -> None:
        self.fn = fn
        self.name = name or f"callable:{getattr(fn, '__qualname__', repr(fn))}"

    async def send(self, alert: dict[str, Any]) -> None:
        if inspect.iscoroutinefunction(self.fn):
            await self.fn(alert)
        else:
            await asyncio.to_thread(self.fn, alert)


class AlertDeliverer:
    """Delivers due alerts from the outbox to every sink, recording who has each one.

    It runs beside the supervisor's sweep, never inside it: a slow sink delays only its own
    alerts. Each sink gets the due alerts it lacks in order, one at a time, each within its
    deadline (the sink's `timeout`, else `deadline`); a delivery that overruns its deadline
    ends the sink's round (its other alerts wait for their next try), so that a round lasts
    at most about one deadline however slow a sink is. At most `concurrency` sinks are sent
    to at once."""

    def __init__(
        self,
        store: AlertPort,
        sinks: Sequence[AlertSink],
        *,
        batch: int = 100,
        backoff: Backoff | None = None,
        deadline: float = DEFAULT_DEADLINE,
        concurrency: int = 4,
    ) -> None:
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"alert sink names must be unique: {[public_name(n) for n in names]}")
        self.store = store
        self.sinks = list(sinks)
        self.batch = batch
        self.backoff = backoff or Backoff(initial=1.0, maximum=300.0)
        self.deadline = deadline
        self._room = asyncio.Semaphore(concurrency)

    async def run(self, stop: asyncio.Event, leading: Callable[[], bool], interval: float) -> None:
        """Deliver a round every `interval` while `leading()` says this process leads, until
        `stop` is set (or the task is cancelled: a delivery under way is then abandoned, and
        sent again later under the same id)."""
        # Every alert written notifies (the outbox's triggers, PostgreSQL): with those
        # wake-ups, a round idle for a while waits for one, polling only as a fallback.
        woken = self.store.subscribe(CHANNEL_OUTBOX)
        pace = Pace(interval, lambda: self.store.wakeups_live)
        try:
            while not stop.is_set():
                if leading():
                    try:
                        if await self.deliver_due(found=pace.busy):
                            pace.busy()
                    except TransientStoreError as exc:
                        logger.warning("alerts: %s", exc)
                    except Exception:
                        logger.exception("alerts: the round failed")
                await first(stop.wait(), self._woken(woken, pace))
        finally:
            self.store.unsubscribe(CHANNEL_OUTBOX, woken)

    @staticmethod
    async def _woken(woken: Subscription, pace: Pace) -> None:
        if await woken.wait(pace.wait()) is not None:
            pace.busy()

    async def deliver_due(self, found: Callable[[], None] | None = None) -> int:
        """One round over the due alerts; the number delivered to every sink. `found` is
        told when there were alerts due."""
        due = await self.store.due_alerts(self.batch)
        if not due:
            return 0
        if found is not None:
            found()
        reached = {a.id: list(a.delivered_to) for a in due}
        bodies = {a.id: alert_body(a) for a in due}
        tries = {a.id: a.attempts + 1 for a in due}

        async def serve(sink: AlertSink) -> None:
            async with self._room:
                for alert in due:
                    if sink.name in reached[alert.id]:
                        continue
                    sent = await self._send(sink, bodies[alert.id], tries[alert.id])
                    if sent is None:
                        return
                    if sent:
                        reached[alert.id].append(sink.name)

        await asyncio.gather(*(serve(s) for s in self.sinks))
        done = 0
        for alert in due:
            complete = all(s.name in reached[alert.id] for s in self.sinks)
            await self.store.record_delivery(
                alert.id,
                reached[alert.id],
                done=complete,
                retry_in=self.backoff.delay(tries[alert.id]),
            )
            done += complete
        return done

    async def _send(self, sink: AlertSink, body: dict[str, Any], attempt: int) -> bool | None:
        """True when delivered, False when the sink failed, None when it overran its
        deadline."""
        deadline = getattr(sink, "timeout", None) or self.deadline
        why: BaseException
        try:
            async with asyncio.timeout(deadline):
                await sink.send(body)
            return True
        except TimeoutError as exc:
            why = exc if str(exc) else TimeoutError(f"no answer within {deadline} s")
        except Exception as exc:
            why = exc
        logger.warning(
            "alert %d: sink %s failed (try %d): %s",
            body["id"],
            public_name(sink.name),
            attempt,
            why,
        )
        return None if isinstance(why, TimeoutError) else False
