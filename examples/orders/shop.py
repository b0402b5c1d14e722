"""The pattern's worked example: an online shop processes each order in three steps.

    reserve the items (inventory) -> charge the card (payments, a remote HTTP service) -> ship

The payment service (`payment_service.py`) is remote and unreliable: it answers 503s, answers
too late, drops answers after applying the charge, is down for a while, and crashes. The
payments agent passes each step's idempotency key, so a charge retried or re-dispatched after
any of these is applied once. A declined card is a permanent error: the order cannot succeed,
an operator is alerted, and what was done is undone (the saga's compensations): the charge is
refunded (if it may have been applied) and the reservation released, newest first.

Submitting an order inserts it into the shop's own `orders` table and creates its task in the
same transaction: both are recorded, or neither.

    STEPWARDEN_STORE=sqlite:///shop.db PAYMENTS_URL=http://127.0.0.1:8081 \\
        stepwarden worker examples.orders.shop:app
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

import httpx

import stepwarden

app = stepwarden.App("shop", store=os.environ.get("STEPWARDEN_STORE", "sqlite:///shop.db"))

inventory = app.agent("inventory")
payments = app.agent("payments", retry=stepwarden.Retry(max_attempts=8, initial=0.1, maximum=1))
shipping = app.agent("shipping")

#: Deadline of one charge: shorter than the payment service's slow answers, on purpose.
CHARGE_WITHIN = timedelta(seconds=float(os.environ.get("SHOP_CHARGE_WITHIN", "2")))


class PaymentUnavailable(Exception):
    """The payment service did not answer, or answered 5xx: worth trying again."""


def payments_url() -> str:
    return os.environ.get("PAYMENTS_URL", "http://127.0.0.1:8081")


_clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}


def _client() -> httpx.AsyncClient:
    """One pooled HTTP client per event loop (a worker process runs one loop)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = httpx.AsyncClient(base_url=payments_url())
    return client


@inventory.operation
def reserve(call: stepwarden.Call, order: dict[str, Any]) -> dict[str, Any]:
    return {"reserved": order["items"], "reservation": f"R-{call.idempotency_key}"}


@payments.operation
async def charge(call: stepwarden.Call, order: dict[str, Any]) -> dict[str, Any]:
    body = {
        "order_id": order["id"],
        "amount": order["amount"],
        "card": order.get("card", "ok"),
        "idempotency_key": call.idempotency_key,
    }
    try:
        answer = await _client().post("/charge", json=body, timeout=max(0.05, call.remaining()))
    except httpx.TransportError as exc:  # refused, reset, timed out: the charge may be applied
        raise PaymentUnavailable(f"{type(exc).__name__}: {exc}") from exc
    if answer.status_code == 402:
        raise stepwarden.PermanentError(f"card declined for order {order['id']}")
    if answer.status_code >= 500:
        raise PaymentUnavailable(f"payment service answered {answer.status_code}")
    answer.raise_for_status()
    return {"receipt": answer.json()["charge"]}


@inventory.operation
def release(call: stepwarden.Call, order: dict[str, Any]) -> dict[str, Any]:
    """Undo `reserve` (call.compensates_key names the reservation's step)."""
    return {"released": order["items"], "reservation": f"R-{call.compensates_key}"}


@payments.operation
async def refund(call: stepwarden.Call, order: dict[str, Any]) -> dict[str, Any]:
    """Undo `charge`: the payment service refunds the order once, whatever the retries."""
    body = {"order_id": order["id"], "idempotency_key": call.idempotency_key}
    try:
        answer = await _client().post("/refund", json=body, timeout=max(0.05, call.remaining()))
    except httpx.TransportError as exc:
        raise PaymentUnavailable(f"{type(exc).__name__}: {exc}") from exc
    if answer.status_code >= 500:
        raise PaymentUnavailable(f"payment service answered {answer.status_code}")
    answer.raise_for_status()
    return {"refund": answer.json()["refund"]}


@shipping.operation
def ship(call: stepwarden.Call, order: dict[str, Any]) -> dict[str, Any]:
    if order.get("address") == "nowhere":
        raise stepwarden.PermanentError(f"no courier delivers order {order['id']}")
    return {"tracking": f"T-{call.idempotency_key}", "items": order["items"]}


APPROVAL_ABOVE = 150.0
"""Orders above this amount ship only once a person approves them (an `approved` event)."""
APPROVAL_WITHIN = timedelta(seconds=float(os.environ.get("SHOP_APPROVAL_WITHIN", "3600")))
"""How long an order waits for its approval before it is undone."""


@app.workflow(complete_within=timedelta(seconds=10), max_failures=5)
async def process_order(ctx: stepwarden.Context, order: dict[str, Any]) -> dict[str, Any]:
    reservation = await ctx.step(inventory.reserve, order, compensate=inventory.release)
    payment = await ctx.step(
        payments.charge, order, complete_within=CHARGE_WITHIN, compensate=payments.refund
    )
    approval: dict[str, Any] = {}
    if order["amount"] > APPROVAL_ABOVE:
        # The task is released while it waits: no scheduler holds it, no deadline runs.
        try:
            approval = await ctx.wait_for_event("approved", timeout=APPROVAL_WITHIN)
        except stepwarden.EventTimeout:
            raise stepwarden.PermanentError(
                f"order {order['id']} was not approved in time"
            ) from None
    shipment = await ctx.step(shipping.ship, order)
    return {**reservation, **payment, **shipment, "approval": approval}


# -- the shop's side: orders and their tasks, committed together ---------------------------
def _placeholder() -> str:
    return "%s" if app.store_url.startswith("postgres") else "?"


async def create_orders_table() -> None:
    async with app.transaction() as tx:
        await tx.execute(
            "CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, amount REAL NOT NULL,"
            " card TEXT NOT NULL, items TEXT NOT NULL)"
        )


async def place_order(order: dict[str, Any]) -> str:
    """Insert the order and create its task in one transaction."""
    p = _placeholder()
    async with app.transaction() as tx:
        await tx.execute(
            f"INSERT INTO orders (order_id, amount, card, items) VALUES ({p}, {p}, {p}, {p})",
            (order["id"], order["amount"], order.get("card", "ok"), ",".join(order["items"])),
        )
        return await tx.submit(process_order, order, task_id=f"order-{order['id']}")
