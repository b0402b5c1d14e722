"""The application the application API's tests serve and run: `tests.httpapi.api_app:app`.

Its store is STEPWARDEN_TEST_API_STORE. `echo` stamps its input in one step; `approval` waits
for the event "approve" (an hour at most), then stamps the order; `failing` fails for good and
stops in error.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import stepwarden as sw

STORE_ENV = "STEPWARDEN_TEST_API_STORE"


def build(store: str, *, waits: bool = True) -> sw.App:
    """The App; without `waits`, only the workflows that end by themselves (echo)."""
    app = sw.App("api-test", store=store)
    desk = app.agent("desk")

    @desk.operation
    async def stamp(call: sw.Call, value: Any) -> dict[str, Any]:
        return {"stamped": value}

    @desk.operation
    async def jam(call: sw.Call, value: Any) -> None:
        raise sw.PermanentError("the desk is jammed")

    @app.workflow(complete_within=timedelta(seconds=30))
    async def echo(ctx: sw.Context, value: Any) -> dict[str, Any]:
        return await ctx.step(stamp, value)

    if not waits:
        return app

    @app.workflow(complete_within=timedelta(seconds=30))
    async def approval(ctx: sw.Context, order: Any) -> dict[str, Any]:
        decision = await ctx.wait_for_event("approve", timeout=timedelta(hours=1))
        return {"order": await ctx.step(stamp, order), "approved_by": decision}

    @app.workflow(complete_within=timedelta(seconds=30), on_failure="stop")
    async def failing(ctx: sw.Context, value: Any) -> None:
        await ctx.step(jam, value)

    return app


app = build(os.environ.get(STORE_ENV, "sqlite:///:memory:"))
