"""The "order" workload on procrastinate: three chained jobs (reserve -> charge -> ship), each
deferring the next, on PostgreSQL; the order is done when its ship job has succeeded.

procrastinate keeps no return values: each step's result travels, recorded in the database,
as the arguments of the next job (the last step's result is not kept anywhere).

    BENCH_PROCRASTINATE_URL=postgresql://... \
        procrastinate --app bench.peers.procrastinate_app.app worker --concurrency 20
"""

from __future__ import annotations

import os
from typing import Any

from procrastinate import App, PsycopgConnector

RESERVE = "bench.reserve"
CHARGE = "bench.charge"
SHIP = "bench.ship"
CONCURRENCY = int(os.environ.get("BENCH_PROCRASTINATE_CONCURRENCY", "20"))
"""Jobs one worker process runs at once (procrastinate's default is 1)."""


def make_app(url: str) -> App:
    app = App(connector=PsycopgConnector(conninfo=url))

    @app.task(name=RESERVE)
    async def reserve(order: dict[str, Any]) -> None:
        reserved = {"reserved": order["items"], "order": order["id"]}
        await charge.defer_async(order=order, reserved=reserved)

    @app.task(name=CHARGE, pass_context=True)
    async def charge(context: Any, order: dict[str, Any], reserved: dict[str, Any]) -> None:
        receipt = {"receipt": f"{context.job.id}", "amount": order["amount"]}
        await ship.defer_async(order=order, reserved=reserved, receipt=receipt)

    @app.task(name=SHIP)
    async def ship(
        order: dict[str, Any], reserved: dict[str, Any], receipt: dict[str, Any]
    ) -> dict[str, Any]:
        return {"tracking": f"t-{order['id']}"}

    return app


app = make_app(os.environ.get("BENCH_PROCRASTINATE_URL", "postgresql:///procrastinate-bench"))
