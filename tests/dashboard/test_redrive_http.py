"""Redrives over the dashboard's API: `POST /api/tasks/{id}/fork` (its plan, or the fork,
recorded with the operator who asked) and `GET /api/retry-plan/{id}`. A fork is an action:
without the dashboard's token (or with an application client's) it is refused and writes
nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

import stepwarden as sw
from stepwarden import _tokens
from stepwarden.dashboard import create_app
from tests.support.worker import running

TOKEN = "a-dashboard-token-of-24c"
DASH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def served(
    sqlite_url: str, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, sw.App, dict[str, str]]]:
    token, client = _tokens.new_client("billing", ["submit", "read", "cancel"])
    path = tmp_path / "api-tokens"
    path.write_text(client.line() + "\n")
    path.chmod(0o600)
    app = sw.App("redrive-http", store=sqlite_url)
    desk = app.agent("desk")

    @desk.operation
    async def stamp(call: sw.Call, n: int) -> str:
        return call.idempotency_key

    @app.workflow(complete_within=timedelta(seconds=30))
    async def job(ctx: sw.Context, n: int) -> list[str]:
        return [await ctx.step(stamp, n), await ctx.step(stamp, n)]

    web = create_app(app, token=TOKEN, api_tokens=path)
    async with app:
        await app.submit_async(job, 1, task_id="t-1")
        async with running(app):
            await app.result_async("t-1", timeout=20)
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            yield c, app, {"Authorization": f"Bearer {token}"}


async def test_a_fork_is_planned_then_made_over_the_api(
    served: tuple[httpx.AsyncClient, sw.App, dict[str, str]],
) -> None:
    client, app, _ = served
    body = {"from": "2", "task_id": "t-2", "new_keys_from": 2, "plan": True}
    planned = await client.post("/api/tasks/t-1/fork", json=body, headers=DASH)
    assert planned.status_code == 200, planned.text
    answer = planned.json()
    assert (answer["applied"], answer["runs_as"]) == (False, "t-2")
    assert [(s["seq"], s["plan"], s["key"]) for s in answer["steps"]] == [
        (1, "kept", "t-1/1"),
        (2, "new_key", "t-2/2"),
    ]
    assert await app.status_async("t-1") and await app.tasks_async(state="pending") == []
    made = await client.post(
        "/api/tasks/t-1/fork", json={**body, "plan": False, "by": "ann"}, headers=DASH
    )
    assert made.status_code == 200, made.text
    assert made.json()["applied"] and made.json()["message"] == "forked as t-2"
    events = (await client.get("/api/tasks/t-2", headers=DASH)).json()["events"]
    [detail] = [e["detail"] for e in events if (e["detail"] or {}).get("action") == "fork"]
    assert (detail["by"], detail["forked_from"]) == ("ann", "t-1")
    again = await client.post("/api/tasks/t-1/fork", json={**body, "plan": False}, headers=DASH)
    assert again.status_code == 409 and "exists" in again.json()["error"]
    missing = await client.post("/api/tasks/nope/fork", json=body, headers=DASH)
    assert missing.status_code == 404
    plan = await client.get("/api/retry-plan/t-1", headers=DASH)
    assert plan.status_code == 200 and plan.json()["message"].startswith("cannot retry")


async def test_a_fork_without_the_dashboard_s_token_is_refused(
    served: tuple[httpx.AsyncClient, sw.App, dict[str, str]],
) -> None:
    client, app, application_client = served
    body = {"from": "1", "task_id": "t-2"}
    for headers in ({}, application_client, {"Authorization": "Bearer not-the-token-at-all"}):
        refused = await client.post("/api/tasks/t-1/fork", json=body, headers=headers)
        assert refused.status_code in (401, 403), refused.text
    assert [t.task_id for t in await app.tasks_async()] == ["t-1"]
