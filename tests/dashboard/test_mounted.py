"""The dashboard's API mounted in the application's own FastAPI service, behind that
service's auth instead of the dashboard's token (`create_app(app, auth=...)`): every route
goes through the service's dependency, reads and actions alike, and an action records the
name it returns; the paths under the mount are the API's (bodies up to the API's limit, its
errors as JSON); the pages are not served; a token and an auth at once are refused. The
example service (`tests/examples/test_fastapi_shop.py`) runs it behind bearer tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
import pytest
from fastapi import FastAPI, Header, HTTPException

import stepwarden as sw
from stepwarden.dashboard import create_app


def operator(x_operator: Annotated[str | None, Header()] = None) -> str:
    """The service's own auth, as simple as it gets: a header naming a known operator."""
    if x_operator != "ann":
        raise HTTPException(401, "who is this?")
    return "service:ann"


async def job(ctx: sw.Context, n: int) -> int:
    return n


@pytest.fixture
async def client(sqlite_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = sw.App("svc", store=sqlite_url)
    app.workflow(job)
    service = FastAPI()
    service.mount("/ops", create_app(app, auth=operator))
    async with app:  # the service's lifespan would open and close it
        await app.submit_async(job, 1, task_id="t-1")
        transport = httpx.ASGITransport(app=service)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as c:
            yield c


ANN = {"X-Operator": "ann"}


async def test_every_route_goes_through_the_service_auth(client: httpx.AsyncClient) -> None:
    for headers in ({}, {"X-Operator": "bob"}):
        paths = ("/ops/api/overview", "/ops/api/tasks", "/ops/api/tasks/t-1", "/ops/api/why/t-1")
        for path in (*paths, "/ops/metrics"):
            answer = await client.get(path, headers=headers)
            assert answer.status_code == 401, (path, answer.text)
            assert answer.json() == {"error": "who is this?"}
        refused = await client.post("/ops/api/tasks/t-1/pause", json={}, headers=headers)
        assert refused.status_code == 401
    task = await client.get("/ops/api/tasks/t-1", headers=ANN)
    assert task.json()["task"]["process_state"] == "pending"
    assert (await client.get("/ops/metrics", headers=ANN)).status_code == 200
    why = (await client.get("/ops/api/why/t-1", headers=ANN)).json()
    assert why["gate"]["reason"] == "no_scheduler"


async def test_an_action_records_the_name_the_service_gives(client: httpx.AsyncClient) -> None:
    paused = await client.post("/ops/api/tasks/t-1/pause", json={"by": "ann"}, headers=ANN)
    assert paused.status_code == 200, paused.text
    events = (await client.get("/ops/api/tasks/t-1", headers=ANN)).json()["events"]
    [detail] = [e["detail"] for e in events if (e["detail"] or {}).get("action") == "pause"]
    assert (detail["by"], detail["authenticated"]) == ("ann", "service:ann")


async def test_the_mount_serves_the_api_as_the_dashboard_does(client: httpx.AsyncClient) -> None:
    # Errors are the API's JSON, found by the path under the mount.
    bad = await client.get("/ops/api/tasks?limit=0", headers=ANN)
    assert bad.status_code == 400 and "limit" in bad.json()["error"]
    # A body over the forms' 64 KiB but within the API's 2 MiB is the API's to read.
    big: dict[str, Any] = {"by": "ann", "reason": "x" * 100_000}
    answer = await client.post("/ops/api/tasks/t-1/pause", json=big, headers=ANN)
    assert answer.status_code == 400 and "reason" in answer.json()["error"], answer.text
    too_big = {"by": "ann", "reason": "x" * (3 * 1024 * 1024)}
    answer = await client.post("/ops/api/tasks/t-1/pause", json=too_big, headers=ANN)
    assert answer.status_code == 413
    # The pages (signed in with the dashboard's token) are not served; the document is.
    assert (await client.get("/ops/", headers=ANN)).status_code == 404
    assert (await client.get("/ops/login")).status_code == 404
    document = (await client.get("/ops/openapi.json")).json()
    assert "/api/tasks" in document["paths"]
    assert "securitySchemes" not in document["components"]


def test_a_token_and_an_auth_at_once_are_refused(sqlite_url: str) -> None:
    app = sw.App("svc", store=sqlite_url)
    with pytest.raises(sw.ConfigurationError, match="one"):
        create_app(app, token="t" * 24, auth=operator)
    with pytest.raises(sw.ConfigurationError, match="one"):
        create_app(app)
    with pytest.raises(sw.ConfigurationError, match="auth_reads"):
        create_app(app, auth=operator, auth_reads=True)


async def test_the_token_api_under_a_prefix_knows_its_paths(sqlite_url: str) -> None:
    """Mounted with its own token, the API's paths are found under the prefix as well: an
    action is refused before its body is read, and the API's body limit is its own."""
    app = sw.App("svc", store=sqlite_url)
    app.workflow(job)
    service = FastAPI()
    service.mount("/ops", create_app(app, token="t" * 24))
    async with app:
        await app.submit_async(job, 1, task_id="t-1")
        transport = httpx.ASGITransport(app=service)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as c:
            big = {"by": "ann", "reason": "x" * 100_000}
            refused = await c.post("/ops/api/tasks/t-1/pause", json=big)
            assert refused.status_code == 401
            assert refused.json()["error"].startswith("an API token")
            token = {"Authorization": "Bearer " + "t" * 24}
            answer = await c.post("/ops/api/tasks/t-1/pause", json=big, headers=token)
            assert answer.status_code == 400 and "reason" in answer.json()["error"]


async def test_an_action_a_page_of_another_site_sends_is_refused(
    client: httpx.AsyncClient,
) -> None:
    """The service's auth may be a cookie the browser sends by itself: a form on another
    site that posts to an action is refused by what the browser says of it."""
    for cross in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://elsewhere.example"}):
        refused = await client.post("/ops/api/tasks/t-1/pause", json={}, headers=ANN | cross)
        assert refused.status_code == 403, refused.text
        assert (await client.get("/ops/api/tasks/t-1", headers=ANN | cross)).status_code == 200
    task = (await client.get("/ops/api/tasks/t-1", headers=ANN)).json()["task"]
    assert task["process_state"] == "pending"  # nothing was paused
    same = {"Sec-Fetch-Site": "same-origin", "Origin": "http://svc"}
    paused = await client.post("/ops/api/tasks/t-1/pause", json={}, headers=ANN | same)
    assert paused.status_code == 200, paused.text
