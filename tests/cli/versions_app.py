"""An application with two versions of one workflow, for the command line's version tests:
`--app tests.cli.versions_app:app` (its own store is never opened: the tests give --store).

`route` version 1 returns "v1", version 2 returns "v2"; neither takes a step.
"""

from __future__ import annotations

from typing import Any

import stepwarden as sw

APP = "tests.cli.versions_app:app"

app = sw.App("cli-versions", store="sqlite:///:memory:")


@app.workflow(name="route", version=1)
async def route_v1(ctx: sw.Context, value: Any) -> str:
    return "v1"


@app.workflow(name="route", version=2)
async def route_v2(ctx: sw.Context, value: Any) -> str:
    return "v2"
