"""The shop's workflow, and the stepwarden App that runs it, configured from Django's
settings (`STEPWARDEN["store"]`). The views submit orders to it; a worker processes them:

    DJANGO_SETTINGS_MODULE=django_shop.settings stepwarden worker django_shop.tasks:app
"""

from __future__ import annotations

import atexit
from datetime import timedelta
from typing import Any

from django.conf import settings

import stepwarden

app = stepwarden.App("django_shop", store=settings.STEPWARDEN["store"])
atexit.register(app.close)  # a web process closes the App's connections as it exits

warehouse = app.agent("warehouse")
shipping = app.agent("shipping")


# The remote services are stand-ins that answer at once: see examples/orders for real ones.
@warehouse.operation
def reserve(call: stepwarden.Call, order: dict[str, Any]) -> dict[str, int]:
    return {line["sku"]: line["quantity"] for line in order["lines"]}


@shipping.operation
def ship(call: stepwarden.Call, order: dict[str, Any]) -> str:
    # A real carrier is given call.idempotency_key, so that a retry ships once.
    return f"track-{order['order_id']}"


@app.workflow(complete_within=timedelta(seconds=30))
async def process_order(ctx: stepwarden.Context, order: dict[str, Any]) -> dict[str, Any]:
    reserved = await ctx.step(warehouse.reserve, order)
    tracking = await ctx.step(shipping.ship, order)
    return {"reserved": reserved, "tracking": tracking}
