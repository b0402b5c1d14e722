"""The App of the TypeScript agent's scenarios (`test_ts_agent.py`): one workflow, `haul`,
whose one step `shipping.hold` a TypeScript agent process serves over the agent protocol;
no Python worker serves `shipping` (its body here is never called)."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import stepwarden as sw

app = sw.App("ts-scenarios", store=os.environ.get("STEPWARDEN_STORE", "sqlite:///unused.db"))
shipping = app.agent("shipping")

#: A step's deadline: short, so that a frozen agent's step is dispatched again in seconds.
HOLD_WITHIN = timedelta(seconds=float(os.environ.get("TS_HOLD_WITHIN", "3")))


@shipping.operation
async def hold(call: sw.Call, gate: str) -> dict[str, Any]:
    raise RuntimeError("shipping.hold is served by the TypeScript agent")


@app.workflow(complete_within=timedelta(seconds=60), max_failures=10)
async def haul(ctx: sw.Context, gate: str) -> dict[str, Any]:
    held: dict[str, Any] = await ctx.step(hold, gate, complete_within=HOLD_WITHIN)
    return held
