"""The FastAPI example (`examples/fastapi_shop`) as its README runs it, on PostgreSQL: the
service under uvicorn and `stepwarden worker`, each a real process. An order and its task
commit together, and an insert that fails leaves neither; the order's status messages stream
as server-sent events while its task runs, and its result comes back; the dashboard's API,
mounted in the service, answers the service's staff only and records who acted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.rawsql import sql

from .services import asgi_server, worker

REPO = Path(__file__).resolve().parents[2]
SERVICE = "examples.fastapi_shop.service:service"
APP = "examples.fastapi_shop.shop:app"
STAFF_TOKEN = "alice-staff-token-2f9c"
ORDER = {"customer_id": "ann", "items": [{"sku": "book", "quantity": 2, "price_cents": 1250}]}


def env(store_url: str) -> dict[str, str]:
    return {"SHOP_STORE": store_url, "SHOP_STAFF": f"alice:{STAFF_TOKEN} bob:bob-token-77e1a0c4"}


def events(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """The server-sent events of a stream's lines (comments, the keep-alive pings, left out)."""
    event: dict[str, str] = {}
    for line in lines:
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")


def tasks(url: str) -> list[tuple[Any, ...]]:
    return sql(url, "SELECT task_id, process_state, input FROM stepwarden_tasks ORDER BY 1")


def test_an_order_commits_with_its_task_streams_its_messages_and_gets_its_result(
    pg_url: str, tmp_path: Path
) -> None:
    with (
        asgi_server(SERVICE, cwd=REPO, env=env(pg_url), log=tmp_path / "service.log") as base,
        httpx.Client(base_url=base, timeout=60) as shop,
    ):
        placed = shop.post("/orders", json=ORDER)
        assert placed.status_code == 201, placed.text
        order_id = placed.json()["order_id"]
        task_id = f"order-{order_id}"
        # Both committed: the service's row names the task, the task holds the order.
        [row] = sql(pg_url, "SELECT order_id, customer_id, total_cents, task_id FROM orders")
        assert row == (order_id, "ann", 2500, task_id)
        [(found_id, state, task_input)] = tasks(pg_url)
        assert (found_id, state) == (task_id, "pending")
        assert task_input["order_id"] == order_id and task_input["total"] == 2500

        # An unknown customer: the insert fails after the submit, and the task goes with it.
        refused = shop.post("/orders", json={**ORDER, "customer_id": "nobody"})
        assert refused.status_code == 422, refused.text
        assert sql(pg_url, "SELECT count(*) FROM orders") == [(1,)]
        assert [t[0] for t in tasks(pg_url)] == [task_id]

        with shop.stream("GET", f"/orders/{order_id}/events") as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            seen = events(stream.iter_lines())
            # No worker runs yet: the first message streams while the task waits for one.
            first = next(seen)
            assert first["event"] == "received"
            assert orjson.loads(first["data"])["task_id"] == task_id
            with worker(APP, cwd=REPO, env=env(pg_url), log=tmp_path / "worker.log"):
                rest = list(seen)  # the stream ends with the task's end
        kinds = [e["event"] for e in rest]
        assert kinds == ["step_completed"] * 3 + ["processed"], rest
        assert [orjson.loads(e["data"])["name"] for e in rest[:3]] == [
            "inventory.reserve",
            "payments.charge",
            "shipping.ship",
        ]
        ids = [int(e["id"]) for e in [first, *rest]]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        result = {
            "receipt": {"charged": 2500, "key": f"{task_id}/2"},
            "tracking": f"track-{order_id}",
        }
        assert orjson.loads(rest[-1]["data"])["result"] == result

        status = shop.get(f"/orders/{order_id}")
        assert status.json() == {
            "order_id": order_id,
            "state": "processed",
            "result": result,
            "error": None,
        }
        # Reconnecting after the last message seen: nothing again (the stream has ended).
        again = shop.get(f"/orders/{order_id}/events", headers={"Last-Event-ID": str(ids[-1])})
        assert list(events(iter(again.text.splitlines()))) == []
        assert shop.get("/orders/" + "0" * 32).status_code == 404


def test_the_mounted_dashboard_api_answers_the_staff_only(pg_url: str, tmp_path: Path) -> None:
    staff = {"Authorization": f"Bearer {STAFF_TOKEN}"}
    with (
        asgi_server(SERVICE, cwd=REPO, env=env(pg_url), log=tmp_path / "service.log") as base,
        httpx.Client(base_url=base, timeout=60) as shop,
    ):
        order_id = shop.post("/orders", json=ORDER).json()["order_id"]
        task_id = f"order-{order_id}"
        pause = f"/ops/api/tasks/{task_id}/pause"

        for refused in ({}, {"Authorization": "Bearer not-a-staff-token"}):
            for path in ("/ops/api/tasks", f"/ops/api/tasks/{task_id}", "/ops/metrics"):
                answer = shop.get(path, headers=refused)
                assert answer.status_code == 401, (path, answer.text)
            answer = shop.post(pause, json={"reason": "hold it"}, headers=refused)
            assert answer.status_code == 401, answer.text
        assert [t[:2] for t in tasks(pg_url)] == [(task_id, "pending")]

        listed = shop.get("/ops/api/tasks", headers=staff)
        assert listed.status_code == 200, listed.text
        assert [t["task_id"] for t in listed.json()["tasks"]] == [task_id]
        assert "stepwarden_tasks" in shop.get("/ops/metrics", headers=staff).text

        paused = shop.post(pause, json={"reason": "hold it", "by": "alice"}, headers=staff)
        assert paused.status_code == 200, paused.text
        assert paused.json()["outcome"]["after"] == "paused"
        assert [t[:2] for t in tasks(pg_url)] == [(task_id, "paused")]
        history = shop.get(f"/ops/api/tasks/{task_id}", headers=staff).json()["events"]
        [action] = [e["detail"] for e in history if (e["detail"] or {}).get("action") == "pause"]
        assert (action["by"], action["authenticated"]) == ("alice", "staff:alice")

        # A request the API's models refuse is answered as the dashboard answers it.
        bad = shop.get("/ops/api/tasks?limit=0", headers=staff)
        assert bad.status_code == 400 and "limit" in bad.json()["error"]
