"""Alerts for the operator: delivered at least once from the store's outbox to sinks.

An alert is recorded (as an `alert` event and an outbox message) in the transaction that
makes the change it reports: a task in error, a compensation that failed, max_failures
reached. The supervisor leader delivers the outbox to every sink of the App, in order, and
records which sinks have it; a sink that fails is tried again later with a growing backoff,
while the others are not sent the alert again. A crash between a delivery and its record
sends it once more: every alert carries its outbox `id`, the same each time, for the sink to
drop duplicates.

    app.add_alert_sink(stepwarden.WebhookSink("https://ops.example.com/hooks/stepwarden"))
    app.add_alert_sink(stepwarden.CallableSink(page_the_on_call))
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import httpx

from .records import OutboxMessage
from .retry import Backoff
from .store import Store

logger = logging.getLogger("stepwarden.alerts")


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
        )


class WebhookSink:
    """POSTs each alert as JSON to `url`; any answer other than 2xx is a failed delivery.
    The alert's id is also sent as the `Idempotency-Key` header."""

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        timeout: float = 10.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = url
        self.name = name or f"webhook:{url}"
        self.timeout = timeout
        self.headers = headers or {}

    async def send(self, alert: dict[str, Any]) -> None:
        headers = {**self.headers, "Idempotency-Key": f"stepwarden-alert-{alert['id']}"}
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            answer = await client.post(self.url, json=alert, headers=headers)
        if not answer.is_success:
            raise RuntimeError(f"{self.url} answered {answer.status_code}")


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
    """Delivers due alerts from the outbox to every sink, recording who has each one."""

    def __init__(
        self,
        store: Store,
        sinks: Sequence[AlertSink],
        *,
        batch: int = 100,
        backoff: Backoff | None = None,
    ) -> None:
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"alert sink names must be unique: {names}")
        self.store = store
        self.sinks = list(sinks)
        self.batch = batch
        self.backoff = backoff or Backoff(initial=1.0, maximum=300.0)

    async def deliver_due(self) -> int:
        """One round over the due alerts; the number delivered to every sink."""
        done = 0
        for alert in await self.store.due_alerts(self.batch):
            reached = list(alert.delivered_to)
            body = alert_body(alert)
            for sink in self.sinks:
                if sink.name in reached:
                    continue
                try:
                    await sink.send(body)
                except Exception as exc:
                    logger.warning(
                        "alert %d: sink %s failed (try %d): %s",
                        alert.id,
                        sink.name,
                        alert.attempts + 1,
                        exc,
                    )
                else:
                    reached.append(sink.name)
            complete = all(s.name in reached for s in self.sinks)
            await self.store.record_delivery(
                alert.id,
                reached,
                done=complete,
                retry_in=self.backoff.delay(alert.attempts + 1),
            )
            done += complete
        return done
