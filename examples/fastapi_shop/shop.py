"""The shop's workflow and the App that runs it: imported by the web service
(`service.py`) to submit and follow orders, and by the worker that processes them.

    SHOP_STORE=postgresql://postgres@127.0.0.1:5432/shop \\
        stepwarden worker examples.fastapi_shop.shop:app
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import stepwarden

STORE = os.environ.get("SHOP_STORE", "postgresql://postgres@127.0.0.1:5432/shop")

app = stepwarden.App("fastapi_shop", store=STORE)
inventory = app.agent("inventory")
payments = app.agent("payments")
shipping = app.agent("shipping")


# The remote services are stand-ins that answer at once: see examples/orders for real ones.
@inventory.operation
async def reserve(call: stepwarden.Call, order: dict[str, Any]) -> list[str]:
    return [item["sku"] for item in order["items"]]


@payments.operation
async def charge(call: stepwarden.Call, order: dict[str, Any]) -> dict[str, Any]:
    # A real payment service is given call.idempotency_key, so that a retry charges once.
    return {"charged": order["total"], "key": call.idempotency_key}


@shipping.operation
async def ship(call: stepwarden.Call, order: dict[str, Any]) -> str:
    return f"track-{order['order_id']}"


@app.workflow(complete_within=timedelta(seconds=30))
async def process_order(ctx: stepwarden.Context, order: dict[str, Any]) -> dict[str, Any]:
    await ctx.step(inventory.reserve, order)
    receipt = await ctx.step(payments.charge, order)
    tracking = await ctx.step(shipping.ship, order)
    return {"receipt": receipt, "tracking": tracking}
