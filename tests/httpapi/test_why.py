"""`GET /api/why/{task_id:path}`, the task's page and the overview on both stores: why a task
waits, as the reason and facts `App.why` answers, guarded as the dashboard's other reads
(`/api/tasks/{task_id:path}`): with reads closed, only the dashboard's token or a session
reads it, and an application client's token, whatever its scopes, is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

import stepwarden as sw
from stepwarden.dashboard import create_app

from .conftest import DASHBOARD_TOKEN, Tokens

BEARER = {"Authorization": f"Bearer {DASHBOARD_TOKEN}"}


@pytest.fixture
async def app(store_url: str) -> AsyncIterator[sw.App]:
    app = sw.App("why-api", store=store_url)

    @app.workflow
    async def quick(ctx: sw.Context, n: int) -> int:
        return n

    await app.submit_async("quick", 1, task_id="orders/42")
    await app.operate_async("pause", ["orders/42"], by="ann", reason="a look")
    await app.submit_async("quick", 2, task_id="idle")
    try:
        yield app
    finally:
        await app.aclose()


def client(web: object) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=web)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")


async def test_why_answers_the_reason_and_its_facts(app: sw.App) -> None:
    async with client(create_app(app, token=DASHBOARD_TOKEN, auth_reads=False)) as c:
        answer = await c.get("/api/why/orders/42")
        assert answer.status_code == 200, answer.text
        data = answer.json()
        assert data["task_id"] == "orders/42" and data["state"] == "paused"
        assert data["gate"]["reason"] == "paused"
        assert (data["gate"]["by"], data["gate"]["note"]) == ("ann", "a look")
        assert data["holding"] == data["gate"] and data["steps"] == []
        idle = (await c.get("/api/why/idle")).json()
        assert idle["gate"]["reason"] == "no_scheduler" and idle["gate"]["workflow"] == "quick"
        missing = await c.get("/api/why/no-such-task")
        assert missing.status_code == 404 and "no-such-task" in missing.json()["error"]
        for bad in ("bad%0Aid", "bad%1B[2Jid"):  # refused as a task's own read refuses it
            refused = await c.get(f"/api/why/{bad}")
            assert refused.status_code == (await c.get(f"/api/tasks/{bad}")).status_code
            assert refused.status_code in (400, 404) and "error" in refused.json()

        page = (await c.get("/tasks/orders%2F42")).text
        assert 'id="why"' in page and 'data-reason="paused"' in page and "ann" in page
        overview = (await c.get("/api/overview")).json()["waiting"]
        reasons = {(w["reason"], w["workflow"]): w["tasks"] for w in overview["reasons"]}
        assert reasons == {("paused", "quick"): 1, ("no_scheduler", "quick"): 1}
        assert overview["looked_at"] == 2
        shown = (await c.get("/")).text
        assert 'id="waiting"' in shown and 'data-reason="no_scheduler"' in shown


async def test_why_is_read_as_the_task_is_read(app: sw.App, tokens: Tokens) -> None:
    web = create_app(app, token=DASHBOARD_TOKEN, auth_reads=True, api_tokens=tokens.path)
    async with client(web) as c:
        for path in ("/api/tasks/orders/42", "/api/why/orders/42"):
            assert (await c.get(path)).status_code == 401, path
            assert (await c.get(path, headers={"Authorization": "Bearer wrong"})).status_code == 401
            # An application client's token is not the dashboard's, with read or without.
            for name in ("reader", "submitter", "billing"):
                refused = await c.get(path, headers=tokens.auth(name))
                assert refused.status_code == 401, (path, name)
            assert (await c.get(path, headers=BEARER)).status_code == 200, path
        assert (
            await c.get("/api/v1/tasks/orders/42", headers=tokens.auth("reader"))
        ).status_code != 401


async def test_the_route_and_its_reasons_are_in_the_openapi_document(app: sw.App) -> None:
    async with client(create_app(app, token=DASHBOARD_TOKEN)) as c:
        document = (await c.get("/openapi.json")).json()
    route = document["paths"]["/api/why/{task_id}"]["get"]
    assert route["operationId"] == "whyTask"
    schemas = document["components"]["schemas"]
    assert set(schemas["WaitReason"]["enum"]) == {r.value for r in sw.WaitReason}
    assert "no_agent" in schemas["WaitReason"]["description"]
    assert schemas["WhyAnswer"]["properties"]["gate"]["$ref"].endswith("/Gate")
