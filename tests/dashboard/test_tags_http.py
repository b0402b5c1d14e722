"""Tags over HTTP: a client's submit carries them (`POST /api/v1/tasks`, refused with 422
beyond their bounds, nothing written; refused to a client without the submit scope), the
dashboard's task list finds tasks by them (`GET /api/tasks?tag=KEY=VALUE`, and the tasks
page's filter), and the task's answer and page show them. The dashboard's reads take its
own token, never an application client's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import stepwarden as sw
from stepwarden import _tokens
from stepwarden.dashboard import create_app

TOKEN = "a-dashboard-token-of-24c"


async def job(ctx: sw.Context, n: int) -> int:
    return n


@pytest.fixture
async def served(
    sqlite_url: str, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, dict[str, str]]]]:
    made = {
        name: _tokens.new_client(name, scopes)
        for name, scopes in (("billing", ["submit", "read"]), ("reader", ["read"]))
    }
    path = tmp_path / "api-tokens"
    path.write_text("".join(client.line() + "\n" for _, client in made.values()))
    path.chmod(0o600)
    auth = {name: {"Authorization": f"Bearer {token}"} for name, (token, _) in made.items()}
    auth["dashboard"] = {"Authorization": f"Bearer {TOKEN}"}
    app = sw.App("tags-http", store=sqlite_url)
    app.workflow(job)
    web = create_app(app, token=TOKEN, auth_reads=True, api_tokens=path)
    async with app:
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            yield c, auth


async def test_a_client_submits_tags_and_the_dashboard_finds_the_task_by_them(
    served: tuple[httpx.AsyncClient, dict[str, dict[str, str]]],
) -> None:
    client, auth = served
    for i, customer in enumerate(["c-42", "c-7", "c-42"]):
        body = {"workflow": "job", "input": i, "task_id": f"t-{i}"}
        body["tags"] = {"customer": customer, "region": "eu" if i < 2 else "us"}
        answer = await client.post("/api/v1/tasks", json=body, headers=auth["billing"])
        assert answer.status_code == 201, answer.text

    async def listed(query: str) -> list[str]:
        answer = await client.get(f"/api/tasks?{query}", headers=auth["dashboard"])
        assert answer.status_code == 200, answer.text
        return [t["task_id"] for t in answer.json()["tasks"]]

    assert await listed("tag=customer=c-42") == ["t-2", "t-0"]
    assert await listed("tag=customer=c-42&tag=region=eu") == ["t-0"]
    assert await listed("tag=customer=c-42&search=0") == ["t-0"]
    assert await listed("tag=customer=nobody") == []
    assert await listed("tag=customer=c-42&tag=customer=c-7") == []  # no task has both
    assert await listed("tag=customer=c-42&tag=customer=c-42") == ["t-2", "t-0"]
    for bad in ("tag=customer", "tag==x", "tag=a%0Ab=c"):
        refused = await client.get(f"/api/tasks?{bad}", headers=auth["dashboard"])
        assert refused.status_code == 400, (bad, refused.text)
    task = await client.get("/api/tasks/t-1", headers=auth["dashboard"])
    assert task.json()["task"]["tags"] == {"customer": "c-7", "region": "eu"}
    # The pages: the list filtered by tag, the task's tags linking to that filter.
    page = (await client.get("/tasks?tag=customer%3Dc-42&tag=", headers=auth["dashboard"])).text
    assert 'data-task="t-0"' in page and 'data-task="t-2"' in page
    assert 'data-task="t-1"' not in page
    assert 'name="tag" value="customer=c-42"' in page
    page = (await client.get("/tasks/t-1", headers=auth["dashboard"])).text
    assert 'href="/tasks?tag=customer%3Dc-7">customer=c-7</a>' in page
    # An application client's token reads nothing of the dashboard's.
    for name in ("billing", "reader"):
        stranger = await client.get("/api/tasks?tag=customer=c-42", headers=auth[name])
        assert stranger.status_code == 401, stranger.text


@pytest.mark.parametrize(
    ("tags", "refused"),
    [
        ({f"k{i}": "v" for i in range(17)}, "tags"),
        ({"a=b": "v"}, "tags"),
        ({"k" * 65: "v"}, "tags"),
        ({"customer": "v" * 257}, "tags"),
        ({"customer": ""}, "tags"),
        ({"customer": 42}, "tags"),
        ({"customer": "a\u0007b"}, "tags"),
        (["customer"], "tags"),
        (None, "tags"),
    ],
)
async def test_tags_beyond_their_bounds_are_refused_with_422(
    served: tuple[httpx.AsyncClient, dict[str, dict[str, str]]], tags: object, refused: str
) -> None:
    client, auth = served
    body = {"workflow": "job", "input": 1, "task_id": "t-1", "tags": tags}
    answer = await client.post("/api/v1/tasks", json=body, headers=auth["billing"])
    assert answer.status_code == 422, answer.text
    assert refused in answer.text
    listed = await client.get("/api/tasks", headers=auth["dashboard"])
    assert listed.json()["tasks"] == []


async def test_a_client_without_the_submit_scope_tags_nothing(
    served: tuple[httpx.AsyncClient, dict[str, dict[str, str]]],
) -> None:
    client, auth = served
    body = {"workflow": "job", "input": 1, "task_id": "t-1", "tags": {"customer": "c-42"}}
    answer = await client.post("/api/v1/tasks", json=body, headers=auth["reader"])
    assert answer.status_code == 403, answer.text
    listed = await client.get("/api/tasks?tag=customer=c-42", headers=auth["dashboard"])
    assert listed.json()["tasks"] == []
