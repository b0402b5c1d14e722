"""The application the dashboard tests serve and run: `tests.dashboard.dash_app:app`.

Its store is STEPWARDEN_TEST_DASH_STORE. Its one operation, `desk.stamp`, fails permanently
until the file named by STEPWARDEN_TEST_DASH_FLAG exists (the fault an operator fixes before
retrying); its workflow then stops in error for the operator (on_failure="stop").
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import stepwarden as sw

STORE_ENV = "STEPWARDEN_TEST_DASH_STORE"
FLAG_ENV = "STEPWARDEN_TEST_DASH_FLAG"
CARD = "4111-1111-1111-1111"
"""The secret in every order: never to appear on a page."""


def build(store: str, flag: Path | None) -> sw.App:
    app = sw.App("dash-test", store=store)
    desk = app.agent("desk", retry=sw.Retry(max_attempts=2, initial=0.001, maximum=0.01))

    @desk.operation
    def stamp(call: sw.Call, order: dict[str, Any]) -> dict[str, Any]:  # runs in a thread
        if flag is None or not flag.exists():
            raise sw.PermanentError("the stamp pad is dry")
        return {"stamped": order["id"], "key": call.idempotency_key}

    @app.workflow(complete_within=timedelta(seconds=30), max_failures=2, on_failure="stop")
    async def process(ctx: sw.Context, order: dict[str, Any]) -> Any:
        return await ctx.step(desk.stamp, order)

    return app


def order(n: int) -> dict[str, Any]:
    return {"id": n, "card": sw.Secret(CARD)}


_flag = os.environ.get(FLAG_ENV)
app = build(os.environ.get(STORE_ENV, "sqlite:///:memory:"), Path(_flag) if _flag else None)
