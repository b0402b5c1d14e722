"""Who may call the application API: a client's token from the tokens file (401 without a
known one), whose scopes include the route's (403), decided before the body is read; the
dashboard's token and a client's are each good for their own routes only; wrong tokens from
one address are throttled (429), each API apart, and a right token is always taken; a server
without a tokens file refuses every request."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from .conftest import DASHBOARD_TOKEN, Tokens, serving, status, submit, waiting_for_approval

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


async def test_a_request_without_a_known_token_is_refused(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    task_id = await submit(client, tokens, "echo", 1)
    routes = [
        ("POST", "/api/v1/tasks", {"workflow": "echo"}),
        ("GET", f"/api/v1/tasks/{task_id}", None),
        ("GET", f"/api/v1/results/{task_id}?timeout=0", None),
        ("GET", f"/api/v1/messages/{task_id}", None),
        ("POST", f"/api/v1/events/{task_id}", {"name": "approve"}),
        ("POST", f"/api/v1/cancel/{task_id}", {}),
        ("GET", "/api/v1/nothing-here", None),
    ]
    none = "send a client's token: Authorization: Bearer TOKEN"
    wrong = "the client's token is wrong"
    for headers, expected, tried in [
        ({}, none, routes),
        ({"Authorization": "Basic YTpi"}, none, routes),
        ({"Authorization": "Bearer"}, none, routes),
        # A wrong token counts against the address (10 a minute): a few routes each.
        ({"Authorization": "Bearer sw_not-a-token"}, wrong, routes[:4]),
        # The dashboard's token is the operators', not a client's.
        ({"Authorization": f"Bearer {DASHBOARD_TOKEN}"}, wrong, routes[3:]),
    ]:
        for method, path, body in tried:
            answer = await client.request(method, path, json=body, headers=headers)
            assert answer.status_code == 401, (headers, path, answer.text)
            assert answer.json() == {"error": expected}
            assert answer.headers["www-authenticate"] == "Bearer"
    # Nothing was cancelled; a client's token does not open the dashboard's actions either.
    assert (await status(client, tokens, task_id))["state"] != "cancelled"
    refused = await client.post(
        "/api/actions",
        json={"action": "cancel", "task_ids": [task_id]},
        headers=tokens.auth("billing"),
    )
    assert refused.status_code == 401, refused.text
    # The application API's document is open, as the dashboard's is.
    document = await client.get("/api/v1/openapi.json")
    assert document.status_code == 200
    assert document.json()["components"]["securitySchemes"]["client"]["scheme"] == "bearer"


async def test_each_route_needs_its_scope(client: httpx.AsyncClient, tokens: Tokens) -> None:
    task_id = await submit(client, tokens, "approval", {"id": 1})
    await waiting_for_approval(client, tokens, task_id)
    reader, submitter = tokens.auth("reader"), tokens.auth("submitter")
    refused = [
        (reader, "POST", "/api/v1/tasks", {"workflow": "echo"}, "submit"),
        (submitter, "GET", f"/api/v1/tasks/{task_id}", None, "read"),
        (submitter, "GET", f"/api/v1/results/{task_id}", None, "read"),
        (submitter, "GET", f"/api/v1/messages/{task_id}", None, "read"),
        (reader, "POST", f"/api/v1/events/{task_id}", {"name": "approve"}, "events"),
        (reader, "POST", f"/api/v1/cancel/{task_id}", {}, "cancel"),
        (submitter, "POST", f"/api/v1/cancel/{task_id}", {}, "cancel"),
    ]
    for headers, method, path, body, scope in refused:
        answer = await client.request(method, path, json=body, headers=headers)
        assert answer.status_code == 403, (path, answer.text)
        assert f"it needs the scope {scope!r}" in answer.json()["error"], answer.text
    # Refused before the body is read: a body that is not JSON is not looked at.
    answer = await client.post(
        "/api/v1/tasks", content=b"{", headers={**reader, "Content-Type": "application/json"}
    )
    assert answer.status_code == 403, answer.text
    # Nothing happened to the task: no event taken, not cancelled.
    task = await status(client, tokens, task_id)
    assert (task["state"], task["waiting_for"]) == ("waiting", "event:approve")
    # Within its scopes, each client is served.
    assert (await client.get(f"/api/v1/tasks/{task_id}", headers=reader)).status_code == 200
    made = await client.post("/api/v1/tasks", json={"workflow": "echo"}, headers=submitter)
    assert made.status_code == 201, made.text


async def test_wrong_tokens_refuse_no_right_one_and_each_api_counts_its_own(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    """A burst of wrong tokens from an address (any local process, or a page of another
    site, can send one) has its next wrong ones answered 429, and nothing more: the clients
    of that address that have their token are served, and the application API, the agent
    protocol and the dashboard's own token and sign-in each count their wrong tokens apart."""
    wrong = {"Authorization": "Bearer sw_guess"}
    dry_run = {"action": "cancel", "task_ids": ["x"], "dry_run": True}
    for _ in range(10):
        assert (await client.get("/api/v1/tasks/x", headers=wrong)).status_code == 401
    answer = await client.get("/api/v1/tasks/x", headers=wrong)
    assert answer.status_code == 429, answer.text
    assert 0 < int(answer.headers["retry-after"]) <= 60
    assert "too many wrong tokens" in answer.json()["error"]
    # Every right token is taken, on every door; the other doors' counts are untouched.
    answer = await client.get("/api/v1/tasks/x", headers=tokens.auth("reader"))
    assert answer.status_code == 404, answer.text  # served: no such task
    whoami = await client.get("/api/v1/agents/whoami", headers=tokens.auth("billing"))
    assert (whoami.json()["client"], whoami.json()["agents"]) == ("billing", ["desk"])
    assert (await client.get("/api/v1/agents/whoami", headers=wrong)).status_code == 401
    operator = {"Authorization": f"Bearer {DASHBOARD_TOKEN}"}
    answer = await client.post("/api/actions", json=dry_run, headers=operator)
    assert answer.status_code == 200, answer.text
    answer = await client.post("/api/actions", json=dry_run, headers=wrong)
    assert answer.status_code == 401, answer.text
    signed_in = await client.post("/login", data={"token": DASHBOARD_TOKEN})
    assert signed_in.status_code == 303, signed_in.text
    # The agent protocol's own burst (ten with the one above) leaves the application API's
    # clients as they were.
    for _ in range(9):
        assert (await client.get("/api/v1/agents/whoami", headers=wrong)).status_code == 401
    assert (await client.get("/api/v1/agents/whoami", headers=wrong)).status_code == 429
    whoami = await client.get("/api/v1/agents/whoami", headers=tokens.auth("billing"))
    assert whoami.status_code == 200, whoami.text
    answer = await client.get("/api/v1/tasks/x", headers=tokens.auth("reader"))
    assert answer.status_code == 404, answer.text


async def test_a_server_without_a_tokens_file_refuses_every_client(store_url: str) -> None:
    with serving(store_url, None, worker=False) as served:
        async with httpx.AsyncClient(base_url=served.url) as c:
            answer = await c.post(
                "/api/v1/tasks", json={"workflow": "echo"}, headers={"Authorization": "Bearer x"}
            )
            assert answer.status_code == 401
            assert "--api-tokens FILE" in answer.json()["error"]
            # The dashboard is served as before.
            assert (await c.get("/api/overview")).status_code == 200


def test_every_route_of_the_application_api_has_a_scope(store_url: str) -> None:
    import asyncio

    from stepwarden import App, _tokens
    from stepwarden.dashboard import _app_api

    routes = _app_api.router(App("x", store=store_url), asyncio.Event()).routes
    assert len(routes) == 6
    for route in routes:
        assert _app_api.route_scope(route) in _tokens.SCOPES, route


def test_a_tokens_file_is_read_when_the_application_is_made(store_url: str, tmp_path: Path) -> None:
    from stepwarden import App, ConfigurationError
    from stepwarden.dashboard import create_app

    app = App("x", store=store_url)
    bad = tmp_path / "tokens"
    bad.write_text("billing submit,ship " + "0" * 64 + "\n")
    with pytest.raises(ConfigurationError, match=r"line 1: unknown scope 'ship'"):
        create_app(app, token=DASHBOARD_TOKEN, api_tokens=bad)
    with pytest.raises(ConfigurationError, match="cannot read the API tokens file"):
        create_app(app, token=DASHBOARD_TOKEN, api_tokens=tmp_path / "missing")
    with pytest.raises(ConfigurationError, match="served with the token, not auth"):
        create_app(app, auth=lambda: "x", api_tokens=bad)
