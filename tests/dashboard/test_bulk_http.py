"""Bulk actions by filter over the dashboard's API (`POST /api/bulk`), on both stores: with
plan, the plan `stepwarden bulk --plan` prints (the same `App.bulk_plan`), changing nothing;
otherwise at most `batch` tasks a request, the same request again going on with the rest until
done, each task's history naming the operator. It is an operator's action: without the
dashboard's token, with an application client's token (every scope of it), with a wrong one,
or sent by a page of another origin with the right one, it is refused and changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

import stepwarden as sw
from stepwarden import _tokens
from stepwarden.dashboard import create_app
from stepwarden.states import TaskState
from tests.support.worker import running

TOKEN = "a-dashboard-token-of-bulk-31"
DASH = {"Authorization": f"Bearer {TOKEN}"}
DECLINED = {"states": ["error"], "workflow": "order", "error": "declined"}


@dataclass
class Served:
    client: httpx.AsyncClient
    app: sw.App
    application_client: dict[str, str]

    async def states(self) -> dict[str, TaskState]:
        return {t.task_id: t.process_state for t in await self.app.tasks_async(limit=100)}


@pytest.fixture
async def served(store_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    """o-1, o-2, o-4 declined and o-3 timed out (error), o-5 processed; o-1 and o-2 of the
    customer c-42."""
    token, client = _tokens.new_client("billing", sorted(_tokens.SCOPES))
    path = tmp_path / "api-tokens"
    path.write_text(client.line() + "\n")
    path.chmod(0o600)
    app = sw.App("bulk-http", store=store_url)
    pay = app.agent("pay", retry=sw.Retry(max_attempts=1))

    @pay.operation
    async def charge(call: sw.Call, why: str) -> str:
        if why:
            raise sw.PermanentError(why)
        return "charged"

    @app.workflow(complete_within=timedelta(seconds=30))
    async def order(ctx: sw.Context, why: str) -> str:
        return await ctx.step(charge, why)

    web = create_app(app, token=TOKEN, api_tokens=path)
    async with app:
        whys = {"o-1": "card declined", "o-2": "card declined", "o-3": "bank timed out"}
        whys |= {"o-4": "card declined", "o-5": ""}
        for task_id, why in whys.items():
            tags = {"customer": "c-42"} if task_id in ("o-1", "o-2") else None
            await app.submit_async(order, why, task_id=task_id, tags=tags)
        async with running(app):
            for task_id in ("o-1", "o-2", "o-3", "o-4"):
                with pytest.raises(sw.TaskFailed):
                    await app.result_async(task_id, timeout=20)
            assert await app.result_async("o-5", timeout=20) == "charged"
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            yield Served(c, app, {"Authorization": f"Bearer {token}"})


async def _bulk(served: Served, body: dict[str, Any], **headers: str) -> httpx.Response:
    return await served.client.post("/api/bulk", json=body, headers={**DASH, **headers})


async def test_the_plan_is_the_command_line_s_and_changes_nothing(served: Served) -> None:
    before = await served.states()
    answer = await _bulk(served, {"action": "retry", "filter": DECLINED, "plan": True})
    assert answer.status_code == 200, answer.text
    plan = sw.TaskFilter(states=frozenset({TaskState.ERROR}), workflow="order", error="declined")
    expected = await served.app.bulk_plan_async(plan, "retry")
    assert answer.json() == {
        "action": "retry",
        "plan": {
            "matched": expected.matched,
            "by_workflow": [{"workflow": "order", "version": 1, "tasks": 3}],
            "moves": {"error -> pending": 3},
            "steps": {"same_key": 3},
            "sample": ["o-1", "o-2", "o-4"],
            "skipped": 0,
            "last": "o-4",
            "done": True,
        },
        "progress": None,
    }
    assert expected.matched == 3 and expected.sample == ("o-1", "o-2", "o-4")
    assert await served.states() == before
    # Tags and the tenant narrow it as they narrow `stepwarden tasks`.
    tagged = {**DECLINED, "tags": {"customer": "c-42"}}
    answer = await _bulk(served, {"action": "retry", "filter": tagged, "plan": True})
    assert answer.json()["plan"]["sample"] == ["o-1", "o-2"]
    answer = await _bulk(served, {"action": "retry", "filter": {"tenant": "acme"}, "plan": True})
    assert answer.json()["plan"]["matched"] == 0


async def test_a_bulk_acts_a_batch_a_request_and_the_same_request_goes_on(
    served: Served,
) -> None:
    body = {"action": "cancel", "filter": DECLINED, "batch": 2, "by": "ann", "reason": "fraud"}
    first = await _bulk(served, body)
    assert first.status_code == 200, first.text
    assert first.json() == {
        "action": "cancel",
        "plan": None,
        "progress": {"acted": 2, "refused": 0, "skipped": 0, "last": "o-2", "done": False},
    }
    states = await served.states()
    assert (states["o-1"], states["o-2"], states["o-4"]) == (
        TaskState.CANCELLED,
        TaskState.CANCELLED,
        TaskState.ERROR,
    )
    second = (await _bulk(served, body)).json()["progress"]
    assert (second["acted"], second["last"], second["done"]) == (1, "o-4", True)
    third = (await _bulk(served, body)).json()["progress"]
    assert (third["acted"], third["done"]) == (0, True)
    states = await served.states()
    assert states["o-3"] == TaskState.ERROR and states["o-5"] == TaskState.PROCESSED
    assert states["o-4"] == TaskState.CANCELLED
    view = await served.app.show_async("o-4")
    assert view is not None
    [detail] = [e.detail for e in view.events if e.kind == "operator"]
    assert (detail["action"], detail["by"], detail["reason"]) == ("cancel", "ann", "fraud")
    assert detail["authenticated"] == "api-token"


async def test_bad_requests_are_refused_and_change_nothing(served: Served) -> None:
    before = await served.states()
    for body, said in (
        ({"action": "retry", "filter": {"states": ["stuck"]}}, "states"),
        ({"action": "retry", "filter": {"created_after": "2026-01-01T00:00:00"}}, "created_after"),
        ({"action": "retry", "filter": {"tags": {"customer": ""}}}, "tags"),
        ({"action": "retry", "filter": {"tenant": "no such tenant!"}}, "tenant"),
        ({"action": "retry", "batch": 1001}, "batch"),
        ({"action": "retry", "batch": 0}, "batch"),
        ({"action": "fork", "filter": DECLINED}, "fork"),
        ({"action": "retry", "fork": {"from": "1", "as": "again"}}, "fork"),
        ({"action": "skip"}, "action"),
        ({"action": "retry", "states": ["error"]}, "states"),  # the filter's, not the body's
    ):
        refused = await _bulk(served, body)
        assert refused.status_code == 400, (body, refused.text)
        assert said in refused.json()["error"], (body, refused.text)
    assert await served.states() == before


async def test_a_weaker_token_or_another_origin_is_refused_and_changes_nothing(
    served: Served,
) -> None:
    before = await served.states()
    body = {"action": "cancel", "filter": {}, "batch": 1000}
    for headers in (
        {},
        served.application_client,
        {"Authorization": "Bearer not-the-dashboard-token"},
    ):
        refused = await served.client.post("/api/bulk", json=body, headers=headers)
        assert refused.status_code == 401, refused.text
        plan = {**body, "plan": True}
        planned = await served.client.post("/api/bulk", json=plan, headers=headers)
        assert planned.status_code == 401, planned.text
    # A page of another origin makes the browser send the right token (or the session's
    # cookie): refused before the token is looked at.
    for cross in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "https://elsewhere.example"},
        {"Origin": "null"},
    ):
        refused = await _bulk(served, body, **cross)
        assert refused.status_code == 403, refused.text
    assert await served.states() == before
    # A signed-in session's cookie without its CSRF token (what a forged form would send).
    signed_in = await served.client.post("/login", data={"token": TOKEN})
    assert signed_in.status_code == 303, signed_in.text
    forged = await served.client.post("/api/bulk", json=body)
    assert forged.status_code == 403, forged.text
    assert await served.states() == before
    # The same request from the dashboard's own origin does act.
    same = await _bulk(served, body, **{"Sec-Fetch-Site": "same-origin"})
    assert same.status_code == 200 and same.json()["progress"]["acted"] == 4, same.text


async def test_the_route_is_typed_in_the_dashboard_s_openapi_document(served: Served) -> None:
    document = (await served.client.get("/openapi.json")).json()
    route = document["paths"]["/api/bulk"]["post"]
    assert route["operationId"] == "bulkByFilter"
    assert route["security"] == [{"bearer": []}, {"session": [], "csrf": []}]
    request = route["requestBody"]["content"]["application/json"]["schema"]
    assert request == {"$ref": "#/components/schemas/BulkFilterRequest"}
    schemas = document["components"]["schemas"]
    assert set(schemas["TaskFilter"]["properties"]) == {
        "states",
        "workflow",
        "version",
        "error",
        "created_after",
        "created_before",
        "finished_after",
        "finished_before",
        "tenant",
        "tags",
    }
    assert schemas["BulkFilterRequest"]["properties"]["batch"]["maximum"] == 1000
    answer = route["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer == {"$ref": "#/components/schemas/BulkFilterAnswer"}
