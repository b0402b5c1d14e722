"""The application the command-line tests load: `--app tests.cli.cli_app:app` (and
`tests.cli.cli_app:bounded`, the same keeping 2 events of 64 bytes at most per task).

Its own store is read from STEPWARDEN_TEST_CLI_APP_STORE (default: an in-memory SQLite
database nothing else sees), so that a test can tell the application's store from the one
`--store` names.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import stepwarden as sw

APP_STORE_ENV = "STEPWARDEN_TEST_CLI_APP_STORE"


def build(store: str, **options: Any) -> sw.App:
    """The application on `store`: one agent `desk` with `stamp`, one workflow `process`.

    `process` stamps its input in one step; an input `{"refuse": REASON}` makes `stamp` raise
    a PermanentError, which sends the task to Error.
    """
    app = sw.App("cli-test", store=store, **options)
    desk = app.agent("desk", retry=sw.Retry(max_attempts=2, initial=0.001, maximum=0.01))

    @desk.operation
    async def stamp(call: sw.Call, form: Any) -> dict[str, Any]:
        if isinstance(form, dict) and form.get("refuse"):
            raise sw.PermanentError(f"refused: {form['refuse']}")
        return {"stamped": form, "key": call.idempotency_key}

    @app.workflow(complete_within=timedelta(seconds=60), max_failures=2)
    async def process(ctx: sw.Context, form: Any) -> Any:
        return await ctx.step(desk.stamp, form)

    return app


app = build(os.environ.get(APP_STORE_ENV, "sqlite:///:memory:"))
bounded = build(
    os.environ.get(APP_STORE_ENV, "sqlite:///:memory:"), max_events_per_task=2, max_event_payload=64
)
