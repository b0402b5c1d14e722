"""The application the TypeScript library's tests serve (`tests.typescript.ts_app:app`):
`local` is served by a Python worker, `shipping` by the TypeScript agent runner over the
agent protocol. The shipping operations declared here give the workflows their steps; their
bodies are never called (no worker of the tests serves `shipping` in Python).

- `order`: doubles `n` (local), then ships the order with the doubled count (shipping);
- `haul`: one shipping step that runs until its call is stopped (the tests cancel it);
- `flaky`: one shipping step that fails `fails` times before it succeeds;
- `refused`: one shipping step that fails for good; the task stops in error;
- `approved`: waits for the event `approve`, then ships the order;
- `stalled`: one shipping step of 2 s, whose first call returns only past its complete_by.

Run as `stepwarden --store URL dashboard|worker tests.typescript.ts_app:app`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import stepwarden as sw

app = sw.App("ts-client", store="sqlite:///ts-client.db")
local = app.agent("local")
shipping = app.agent("shipping")


class ServedElsewhere(Exception):
    """A shipping operation called in Python: the TypeScript agent serves them."""


@local.operation
async def double(call: sw.Call, n: int) -> int:
    return 2 * n


@shipping.operation
async def ship(call: sw.Call, order: dict[str, Any]) -> dict[str, Any]:
    raise ServedElsewhere("shipping.ship is served by the TypeScript agent")


@shipping.operation
async def hold(call: sw.Call, parcel: str) -> dict[str, Any]:
    raise ServedElsewhere("shipping.hold is served by the TypeScript agent")


@shipping.operation
async def wobble(call: sw.Call, fails: int) -> dict[str, Any]:
    raise ServedElsewhere("shipping.wobble is served by the TypeScript agent")


@shipping.operation
async def refuse(call: sw.Call, reason: str) -> None:
    raise ServedElsewhere("shipping.refuse is served by the TypeScript agent")


@shipping.operation
async def stall(call: sw.Call, parcel: str) -> dict[str, Any]:
    raise ServedElsewhere("shipping.stall is served by the TypeScript agent")


@app.workflow(complete_within=timedelta(seconds=60))
async def order(ctx: sw.Context, order: dict[str, Any]) -> dict[str, Any]:
    doubled = await ctx.step(double, int(order["n"]))
    shipped = await ctx.step(ship, {"id": order["id"], "n": doubled})
    return {"doubled": doubled, "shipped": shipped}


@app.workflow(complete_within=timedelta(seconds=60))
async def haul(ctx: sw.Context, parcel: str) -> dict[str, Any]:
    return await ctx.step(hold, parcel, complete_within=timedelta(seconds=30))


@app.workflow(complete_within=timedelta(seconds=60))
async def flaky(ctx: sw.Context, fails: int) -> dict[str, Any]:
    return await ctx.step(wobble, fails)


@app.workflow(complete_within=timedelta(seconds=60), on_failure="stop")
async def refused(ctx: sw.Context, reason: str) -> None:
    await ctx.step(refuse, reason)


@app.workflow(complete_within=timedelta(seconds=60))
async def stalled(ctx: sw.Context, parcel: str) -> dict[str, Any]:
    return await ctx.step(stall, parcel, complete_within=timedelta(seconds=2))


@app.workflow(complete_within=timedelta(seconds=60))
async def approved(ctx: sw.Context, order: dict[str, Any]) -> dict[str, Any]:
    approver = await ctx.wait_for_event("approve", timeout=timedelta(minutes=5))
    shipped = await ctx.step(ship, {"id": order["id"], "n": int(order["n"])})
    return {"approved_by": approver, "shipped": shipped}
