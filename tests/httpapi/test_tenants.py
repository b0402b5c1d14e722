"""What a client of the application API may see, on each store: the tasks of its own tenant
(by default, its own name), of the tenants its tokens entry grants (`tenants=`), and of the
workflows it grants (`workflows=`). Any other task is answered 404, word for word as a task
that does not exist, by every route: its status, its result's long poll, its status
messages' stream, an event, a cancel; and nothing is done to it. A submit names only a
tenant it is granted (403 otherwise), and one under an id another tenant holds is 409."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import Served, Tokens, events, new_client, serving, until

CLIENTS = {
    "acme": ("submit", "read", "events", "cancel"),
    "globex": ("submit", "read", "events", "cancel", "channels=acme,globex"),
    "ops": ("read", "events", "cancel", "tenants=acme", "channels=acme"),
    "auditor": ("read", "workflows=approval"),
    "hub": ("submit", "read", "tenants=*"),
}


@pytest.fixture
def tenant_tokens(tmp_path: Path) -> Tokens:
    made = {name: new_client(name, spec) for name, spec in CLIENTS.items()}
    path = tmp_path / "api-tokens"
    path.write_text("\n".join(client.line() for _, client in made.values()) + "\n")
    path.chmod(0o600)
    return Tokens(path, {name: token for name, (token, _) in made.items()})


@pytest.fixture
def tenant_server(store_url: str, tenant_tokens: Tokens) -> Iterator[Served]:
    with serving(store_url, tenant_tokens.path) as s:
        yield s


async def _submit(
    client: httpx.AsyncClient, tokens: Tokens, who: str, workflow: str, **body: Any
) -> httpx.Response:
    return await client.post(
        "/api/v1/tasks", json={"workflow": workflow, **body}, headers=tokens.auth(who)
    )


async def _status(client: httpx.AsyncClient, tokens: Tokens, who: str, task_id: str) -> Any:
    answer = await client.get(f"/api/v1/tasks/{task_id}", headers=tokens.auth(who))
    return answer.status_code, answer.json()


def _requests(task_id: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("GET", f"/api/v1/tasks/{task_id}", None),
        ("GET", f"/api/v1/results/{task_id}?timeout=1", None),
        ("GET", f"/api/v1/messages/{task_id}", None),
        ("POST", f"/api/v1/events/{task_id}", {"name": "approve", "payload": "globex"}),
        ("POST", f"/api/v1/cancel/{task_id}", {"reason": "not mine"}),
    ]


async def test_another_tenant_s_task_is_answered_as_one_that_does_not_exist(
    tenant_server: Served, tenant_tokens: Tokens
) -> None:
    tokens = tenant_tokens
    async with httpx.AsyncClient(base_url=tenant_server.url, timeout=20) as client:
        made = await _submit(client, tokens, "acme", "approval", input={"id": 1}, reply_to="acme")
        assert made.status_code == 201, made.text
        task_id = made.json()["task_id"]
        code, found = await _status(client, tokens, "acme", task_id)
        assert (code, found["tenant"]) == (200, "acme")
        await until(
            "the task waiting for its approval",
            lambda: _waits(client, tokens, task_id),
        )
        # globex may read, send events and cancel: but not acme's task, which it is told
        # does not exist, in the very words it is told of a task that does not.
        for method, path, body in _requests(task_id):
            answer = await client.request(method, path, json=body, headers=tokens.auth("globex"))
            missing = path.replace(task_id, "no-such-task")
            none = await client.request(method, missing, json=body, headers=tokens.auth("globex"))
            assert answer.status_code == none.status_code == 404, (path, answer.text)
            assert answer.json()["error"] == none.json()["error"].replace("no-such-task", task_id)
        # The auditor sees approvals of every tenant, not acme's other workflows.
        assert (await _status(client, tokens, "auditor", task_id))[0] == 200
        echo = await _submit(client, tokens, "acme", "echo", input=1)
        assert (await _status(client, tokens, "auditor", echo.json()["task_id"]))[0] == 404
        # Nothing was done to it: still waiting, its event not sent, not cancelled.
        code, found = await _status(client, tokens, "acme", task_id)
        assert (code, found["state"], found["waiting_for"]) == (200, "waiting", "event:approve")
        # ops is granted acme: it follows the task, approves it, and reads its end.
        sent = await client.post(
            f"/api/v1/events/{task_id}",
            json={"name": "approve", "payload": "ops"},
            headers=tokens.auth("ops"),
        )
        assert sent.status_code == 200, sent.text
        result = await client.get(
            f"/api/v1/results/{task_id}?timeout=20", headers=tokens.auth("ops")
        )
        assert result.status_code == 200, result.text
        assert result.json()["result"]["approved_by"] == "ops"
        async with client.stream(
            "GET", f"/api/v1/messages/{task_id}", headers=tokens.auth("ops")
        ) as response:
            assert response.status_code == 200
            kinds = [e.event async for e in events(response)]
        assert kinds[0] == "received" and kinds[-1] == "processed"
        # A granted cancel reaches the task (it has finished: refused for its state, 409).
        refused = await client.post(f"/api/v1/cancel/{task_id}", headers=tokens.auth("ops"))
        assert refused.status_code == 409, refused.text


async def test_a_granted_cancel_applies_and_a_submit_names_only_a_granted_tenant(
    tenant_server: Served, tenant_tokens: Tokens
) -> None:
    tokens = tenant_tokens
    async with httpx.AsyncClient(base_url=tenant_server.url, timeout=20) as client:
        made = await _submit(client, tokens, "acme", "approval", input={"id": 2}, task_id="a-2")
        assert made.status_code == 201, made.text
        cancelled = await client.post("/api/v1/cancel/a-2", headers=tokens.auth("ops"))
        assert cancelled.status_code == 200, cancelled.text
        assert (await _status(client, tokens, "acme", "a-2"))[1]["state"] == "cancelled"
        # globex may not submit as acme; hub, granted every tenant, may, and acme sees it.
        refused = await _submit(client, tokens, "globex", "echo", input=1, tenant="acme")
        assert refused.status_code == 403, refused.text
        assert "may not submit tasks of the tenant 'acme'" in refused.json()["error"]
        assert (await _submit(client, tokens, "acme", "echo", tenant="acme")).status_code == 201
        given = await _submit(client, tokens, "hub", "echo", input=3, tenant="acme", task_id="h")
        assert given.status_code == 201, given.text
        code, found = await _status(client, tokens, "acme", "h")
        assert (code, found["tenant"]) == (200, "acme")
        assert (await _status(client, tokens, "globex", "h"))[0] == 404
        # An id another tenant's task holds: refused 409, telling only that it is taken.
        taken = await _submit(client, tokens, "globex", "approval", input={"id": 2}, task_id="a-2")
        assert taken.status_code == 409, taken.text
        assert "another client" in taken.json()["error"]
        bad = await _submit(client, tokens, "hub", "echo", tenant="not a name")
        assert bad.status_code == 422, bad.text


async def _waits(client: httpx.AsyncClient, tokens: Tokens, task_id: str) -> bool:
    code, found = await _status(client, tokens, "acme", task_id)
    return bool(code == 200 and found["waiting_for"] == "event:approve")
