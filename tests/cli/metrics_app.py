"""The application of the metrics and JSON log tests (`tests.cli.metrics_app:app`, its store
from STEPWARDEN_STORE / --store): a known workload whose every count is known.

- `order`: reserve, then charge. The charge of `{"n": 1}` fails once (a transient error) and
  succeeds when its agent tries again; the others succeed at once.
- `doomed`: reserve (undone by release), then refuse, which fails for good: the task fails
  and is compensated (release).
- `patient`: a durable timer, then a wait for the event `go`, then reserve.

Every call logs a line of its own (logger `metrics_app`), which the JSON log test reads.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import stepwarden as sw

log = logging.getLogger("metrics_app")
TIMER = timedelta(seconds=0.2)


def build(store: str) -> sw.App:
    app = sw.App("metrics-test", store=store)
    shop = app.agent("shop", retry=sw.Retry(max_attempts=3, initial=0.001, maximum=0.01))
    failed_once: set[str] = set()

    @shop.operation
    async def reserve(call: sw.Call, item: Any) -> str:
        log.info("reserving")
        return f"reserved {call.idempotency_key}"

    @shop.operation
    async def release(call: sw.Call, item: Any) -> str:
        log.info("releasing")
        return "released"

    @shop.operation
    async def charge(call: sw.Call, item: Any) -> str:
        log.info("charging, try %d", call.try_number)
        if item == {"n": 1} and call.idempotency_key not in failed_once:
            failed_once.add(call.idempotency_key)
            raise ConnectionError("the payment service hung up")
        return "charged"

    @shop.operation
    async def refuse(call: sw.Call, item: Any) -> str:
        log.info("refusing")
        raise sw.PermanentError("declined")

    @app.workflow(complete_within=timedelta(seconds=60))
    async def order(ctx: sw.Context, item: Any) -> str:
        await ctx.step(shop.reserve, item)
        return str(await ctx.step(shop.charge, item))

    @app.workflow(complete_within=timedelta(seconds=60))
    async def doomed(ctx: sw.Context, item: Any) -> str:
        await ctx.step(shop.reserve, item, compensate=shop.release)
        return str(await ctx.step(shop.refuse, item))

    @app.workflow(complete_within=timedelta(seconds=60))
    async def patient(ctx: sw.Context, item: Any) -> str:
        await ctx.sleep(TIMER)
        await ctx.wait_for_event("go", timeout=timedelta(seconds=120))
        return str(await ctx.step(shop.reserve, item))

    return app


app = build("sqlite:///:memory:")
