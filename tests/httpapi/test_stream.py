"""A task's status messages as server-sent events, over a real server: in order, as they are
published, each with the message's id, ending with the task's end; a client that reconnects
with Last-Event-ID gets those after it (204 when none will come); a server that stops ends
its streams and answers its long polls instead of waiting for their clients."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

import stepwarden as sw

from .conftest import (
    Event,
    Served,
    Tokens,
    events,
    serving,
    submit,
    until,
    waiting_for_approval,
)


async def _outbox(store_url: str, task_id: str) -> list[sw.OutboxMessage]:
    app = sw.App("reader", store=store_url)
    try:
        return await (await app.store()).outbox(task_id=task_id, limit=1000)
    finally:
        await app.aclose()


async def _read(
    client: httpx.AsyncClient, tokens: Tokens, task_id: str, **headers: str
) -> tuple[int, list[Event]]:
    async with client.stream(
        "GET", f"/api/v1/messages/{task_id}", headers={**tokens.auth("reader"), **headers}
    ) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, []
        return 200, [e async for e in events(response)]


async def test_the_status_messages_stream_as_they_are_published_and_resume(
    served: Served, client: httpx.AsyncClient, tokens: Tokens
) -> None:
    task_id = await submit(client, tokens, "approval", {"id": 1}, reply_to="orders")
    seen: list[Event] = []
    async with client.stream(
        "GET", f"/api/v1/messages/{task_id}", headers=tokens.auth("reader")
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-store"
        stream = events(response)
        async for event in stream:  # live: the task waits for its approval meanwhile
            seen.append(event)
            if event.event == "waiting":
                break
        sent = await client.post(
            f"/api/v1/events/{task_id}",
            json={"name": "approve", "payload": "ann"},
            headers=tokens.auth("billing"),
        )
        assert sent.status_code == 200, sent.text
        seen.extend([e async for e in stream])  # until the stream ends, with the task
    kinds = [e.event for e in seen]
    assert kinds[0] == "received" and "waiting" in kinds and kinds[-1] == "processed", kinds
    assert "step_completed" in kinds[kinds.index("waiting") :]
    kept = await _outbox(served.store_url, task_id)
    assert [(e.id, e.event) for e in seen] == [(m.id, m.kind) for m in kept]  # all, in order
    for event, message in zip(seen, kept, strict=True):
        assert event.data["id"] == event.id and event.data["kind"] == event.event
        assert event.data["task_id"] == task_id
        assert event.data["detail"] == message.detail
    assert seen[-1].data["detail"]["result"] == {
        "order": {"stamped": {"id": 1}},
        "approved_by": "ann",
    }

    # A client that reconnects with the last id it handled gets those after it, then the end.
    code, rest = await _read(client, tokens, task_id, **{"Last-Event-ID": str(seen[1].id)})
    assert code == 200 and rest == seen[2:]
    code, every = await _read(client, tokens, task_id)
    assert every == seen
    # After the last one, nothing will come: 204, and an EventSource stops reconnecting.
    code, none = await _read(client, tokens, task_id, **{"Last-Event-ID": str(seen[-1].id)})
    assert (code, none) == (204, [])
    for bad in ("abc", "-1", str(2**63)):
        code, _ = await _read(client, tokens, task_id, **{"Last-Event-ID": bad})
        assert code == 422, bad


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_stream_resumed_while_the_task_runs_goes_on_live(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    task_id = await submit(client, tokens, "approval", {"id": 2}, reply_to="orders")
    await waiting_for_approval(client, tokens, task_id)
    async with client.stream(
        "GET",
        f"/api/v1/messages/{task_id}",
        headers={**tokens.auth("reader"), "Last-Event-ID": "0"},
    ) as response:
        stream = events(response)
        received = await anext(stream)
        assert received.event == "received"
    async with client.stream(
        "GET",
        f"/api/v1/messages/{task_id}",
        headers={**tokens.auth("reader"), "Last-Event-ID": str(received.id)},
    ) as response:
        stream = events(response)
        after: list[Event] = []
        async for event in stream:
            after.append(event)
            if event.event == "waiting":
                break
        assert after[0].id > received.id and after[0].event != "received"
        await client.post(
            f"/api/v1/events/{task_id}", json={"name": "approve"}, headers=tokens.auth("billing")
        )
        after.extend([e async for e in stream])
    assert after[-1].event == "processed"
    assert [e.id for e in after] == sorted(e.id for e in after)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_task_without_reply_to_has_no_stream(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    task_id = await submit(client, tokens, "echo", 1)
    answer = await client.get(f"/api/v1/messages/{task_id}", headers=tokens.auth("reader"))
    assert answer.status_code == 409
    assert answer.json() == {
        "error": f"task {task_id!r} was submitted without reply_to: it has no status messages"
    }
    missing = await client.get("/api/v1/messages/nope", headers=tokens.auth("reader"))
    assert (missing.status_code, missing.json()) == (404, {"error": "no task 'nope'"})


async def test_a_server_that_stops_ends_its_streams_and_long_polls(
    sqlite_url: str, tokens: Tokens
) -> None:
    with serving(sqlite_url, tokens.path) as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
            task_id = await submit(client, tokens, "approval", {"id": 3}, reply_to="orders")
            await waiting_for_approval(client, tokens, task_id)
            async with client.stream(
                "GET", f"/api/v1/messages/{task_id}", headers=tokens.auth("reader")
            ) as response:
                stream = events(response)
                assert (await anext(stream)).event == "received"
                poll = asyncio.create_task(
                    client.get(
                        f"/api/v1/results/{task_id}",
                        params={"timeout": 60},
                        headers=tokens.auth("reader"),
                    )
                )

                async def polling() -> bool:
                    """The server holds the poll's request and has not answered it yet."""
                    assert served.uvicorn_server is not None
                    for connection in served.uvicorn_server.server_state.connections:
                        cycle = getattr(connection, "cycle", None)
                        if (
                            cycle is not None
                            and cycle.scope["path"] == f"/api/v1/results/{task_id}"
                            and not cycle.response_complete
                        ):
                            return True
                    return False

                # Stopped before the poll's request arrived (its connection idle, kept alive
                # from an earlier request), the server would close that connection
                # unanswered, as any server does: the poll's request is in the server first.
                await until("the long poll to be under way", polling)
                started = time.monotonic()
                stopping = asyncio.create_task(asyncio.to_thread(served.stop))
                rest = [e async for e in stream]  # ends when the server stops
                answer = await poll
                await stopping
            assert time.monotonic() - started < 10  # not the long poll's 60 s, nor forever
            assert rest and rest[-1].event == "waiting"  # the task did not end: it waits on
            assert answer.status_code == 202 and answer.json()["state"] == "waiting"
