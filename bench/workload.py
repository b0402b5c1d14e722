"""The benchmark's workload on stepwarden: the "order" workflow (reserve, charge, ship), each
step a trivial operation returning a small dict, each result recorded by the engine.

Workers run it with `stepwarden worker bench.workload:app --store URL`; the URL given here is
only a default for imports (every process of the benchmark names its store).

`fan_out` is the fan-out measurement's workflow: one task whose N steps (`inventory.pick`, as
trivial as the order's) run side by side under `ctx.gather`.

`hold_order` and `gate_order` are the recovery measurements' workflows: their one step blocks
until a marker file exists, so that the benchmark can SIGKILL the agent process running it, or
the scheduler holding the tasks.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import stepwarden as sw

from .tracing import configure_from_env

configure_from_env()  # BENCH_TRACING: the tracing cost's workers (bench/tracing.py)
app = sw.App("bench", store=os.environ.get("STEPWARDEN_STORE", "sqlite:///stepwarden-bench.db"))
inventory = app.agent("inventory")
payments = app.agent("payments")
shipping = app.agent("shipping")
holder = app.agent("holder")

HOLD_STEP_WITHIN = float(os.environ.get("BENCH_HOLD_STEP_WITHIN", "2.0"))
"""Seconds the held step may take (its complete_within): the recovery waits for it to pass."""


@inventory.operation
async def reserve(call: sw.Call, order: dict[str, Any]) -> dict[str, Any]:
    return {"reserved": order["items"], "order": order["id"]}


@payments.operation
async def charge(call: sw.Call, order: dict[str, Any]) -> dict[str, Any]:
    return {"receipt": call.idempotency_key, "amount": order["amount"]}


@shipping.operation
async def ship(call: sw.Call, order: dict[str, Any]) -> dict[str, Any]:
    return {"tracking": f"t-{order['id']}"}


@app.workflow(complete_within=timedelta(seconds=60))
async def order(ctx: sw.Context, order: dict[str, Any]) -> dict[str, Any]:
    reserved = await ctx.step(inventory.reserve, order)
    receipt = await ctx.step(payments.charge, order)
    shipped = await ctx.step(shipping.ship, order)
    return {"reserved": reserved, "receipt": receipt, "shipped": shipped}


@inventory.operation
async def pick(call: sw.Call, item: dict[str, Any]) -> dict[str, Any]:
    return {"picked": item["sku"], "n": item["n"]}


FANOUT_WITHIN = timedelta(minutes=15)
"""The fan-out task's complete_within (and so each of its steps'): long enough for the
measurement to time out (bench.fanout.TIMEOUT) before the engine gives up on the task."""


@app.workflow(complete_within=FANOUT_WITHIN)
async def fan_out(ctx: sw.Context, spec: dict[str, Any]) -> dict[str, Any]:
    """spec["n"] steps side by side; the result says how many came back, and whether each
    came back in its branch's place (the list is in the order the steps were started)."""
    picked = await ctx.gather(
        *(ctx.step(inventory.pick, {"n": i, "sku": f"s{i}"}) for i in range(spec["n"]))
    )
    return {
        "steps": len(picked),
        "in_order": all(p["n"] == i for i, p in enumerate(picked)),
        "last": picked[-1] if picked else None,
    }


@holder.operation
async def hold(call: sw.Call, spec: dict[str, Any]) -> dict[str, Any]:
    """Write this process's pid for the attempt, then wait for the release marker."""
    workdir = Path(spec["dir"])
    (workdir / f"pid-{call.attempt}").write_text(str(os.getpid()))
    release = workdir / "release"
    while not release.exists():  # noqa: ASYNC110 - the marker comes from another process
        await asyncio.sleep(0.01)
    return {"pid": os.getpid(), "attempt": call.attempt}


@app.workflow(complete_within=timedelta(seconds=60), max_failures=5)
async def hold_order(ctx: sw.Context, spec: dict[str, Any]) -> dict[str, Any]:
    return await ctx.step(  # type: ignore[no-any-return]
        holder.hold, spec, complete_within=timedelta(seconds=HOLD_STEP_WITHIN)
    )


@holder.operation
async def gate(call: sw.Call, spec: dict[str, Any]) -> dict[str, Any]:
    """Wait until the gate marker exists: the tasks stay held by their scheduler until then."""
    opened = Path(spec["dir"]) / "open"
    while not opened.exists():  # noqa: ASYNC110 - the marker comes from another process
        await asyncio.sleep(0.05)
    return {"pid": os.getpid(), "attempt": call.attempt}


@app.workflow(complete_within=timedelta(seconds=120))
async def gate_order(ctx: sw.Context, spec: dict[str, Any]) -> dict[str, Any]:
    """The recovery of a killed scheduler: a long deadline, so that nothing but the
    scheduler's absence from the registry gives its tasks to another in time."""
    return await ctx.step(  # type: ignore[no-any-return]
        holder.gate, spec, complete_within=timedelta(seconds=120)
    )


def order_input(i: int) -> dict[str, Any]:
    """The input of order number i (the same for every system)."""
    return {"id": i, "items": ["book", "lamp"], "amount": 19.5}
