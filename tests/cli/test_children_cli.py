"""A parent and its child on the command line and the dashboard: `show` prints a child's
parent and a parent's children; the task page links them both ways; the API's task answer
carries `parent_id` and `children`; on both stores."""

from __future__ import annotations

import asyncio

import httpx
import orjson

import stepwarden as sw
from stepwarden.dashboard import create_app

from ..support.apps import Family
from ..support.poll import in_state
from ..support.worker import running
from .helpers import assert_ok, invoke

TOKEN = "a-token-of-24-characters"


def test_show_the_dashboard_and_the_api_link_a_parent_and_its_child(migrated_url: str) -> None:
    async def scenario() -> None:
        family = Family(migrated_url)
        app = family.app
        hold = family.gate("a")
        try:
            async with running(app):
                await app.submit_async("single", ["a"], task_id="p")
                await in_state(app, "p", sw.TaskState.WAITING)
                await family.started_call("a")

                parent = await asyncio.to_thread(invoke, "--store", migrated_url, "show", "p")
                shown = assert_ok(parent)
                assert "waiting_for    child:p:2  until -" in shown
                assert "children:\n  p:2 " in shown and "processing" in shown
                assert "position 2" in shown and "parent " not in shown
                child = assert_ok(
                    await asyncio.to_thread(invoke, "--store", migrated_url, "show", "p:2")
                )
                assert "  parent         p  (started at its position 2)" in child
                data = orjson.loads(
                    assert_ok(
                        await asyncio.to_thread(
                            invoke, "--store", migrated_url, "show", "p", "--json"
                        )
                    )
                )
                assert data["parent_id"] is None
                assert data["children"] == [
                    {"task_id": "p:2", "workflow": "kid", "process_state": "processing",
                     "position": "2"}
                ]  # fmt: skip

                web = create_app(app, token=TOKEN)
                transport = httpx.ASGITransport(app=web)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://127.0.0.1"
                ) as client:
                    page = (await client.get("/tasks/p")).text
                    assert '<a href="/tasks/p%3A2">p:2</a>' in page
                    assert 'id="children"' in page and 'id="parent"' not in page
                    kid_page = (await client.get("/tasks/p%3A2")).text
                    assert '<dd id="parent"><a href="/tasks/p">p</a>' in kid_page
                    answer = (await client.get("/api/tasks/p")).json()
                    assert answer["task"]["parent_id"] is None
                    [kid] = answer["children"]
                    assert (kid["task_id"], kid["process_state"], kid["position"]) == (
                        "p:2", "processing", "2",
                    )  # fmt: skip
                    kid_answer = (await client.get("/api/tasks/p%3A2")).json()
                    assert kid_answer["task"]["parent_id"] == "p"
                    assert kid_answer["task"]["parent_position"] == "2"
                    assert kid_answer["children"] == []
                hold.set()
                assert await app.result_async("p", timeout=30) == ["done p-first", ["done a"]]
        finally:
            await app.aclose()

    asyncio.run(scenario())
    done = assert_ok(invoke("--store", migrated_url, "show", "p"))
    assert "  p:2 " in done and "processed" in done
