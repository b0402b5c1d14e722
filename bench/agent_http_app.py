"""The App of the agent-call measurement (`bench/agent_http.py`): one workflow of one step,
`svc.echo`, a trivial operation that its agent serves in the worker's process, or over
HTTP from a worker of its own (`stepwarden worker --agent-url`)."""

from __future__ import annotations

import os
from datetime import timedelta

import stepwarden as sw

app = sw.App("bench-agent-http", store=os.environ.get("STEPWARDEN_STORE", "sqlite:///unused.db"))
svc = app.agent("svc")


@svc.operation
async def echo(call: sw.Call, n: int) -> int:
    return n


@app.workflow(complete_within=timedelta(seconds=60))
async def one(ctx: sw.Context, n: int) -> int:
    echoed: int = await ctx.step(echo, n)
    return echoed
