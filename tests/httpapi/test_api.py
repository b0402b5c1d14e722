"""The application API against a real server and worker, on each store: a submit is
idempotent by its task id, a result is waited for (long poll) and answered once a worker has
finished the task, or 202 when the timeout comes first; an event reaches the workflow that
waits for it; a cancel reaches the task and records the client's name; invalid requests are
answered 422 with what is wrong."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

import stepwarden as sw

from .conftest import Served, Tokens, status, submit, waiting_for_approval

SQLITE_ONLY = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


async def test_a_submit_is_idempotent_by_task_id(client: httpx.AsyncClient, tokens: Tokens) -> None:
    order = {"id": 7, "items": ["pen", "ink"], "price": 1.5}
    body = {"workflow": "approval", "input": order, "task_id": "order/7"}
    first = await client.post("/api/v1/tasks", json=body, headers=tokens.auth("submitter"))
    assert first.status_code == 201, first.text
    assert first.json() == {"task_id": "order/7", "created": True}
    assert first.headers["location"] == "/api/v1/tasks/order%2F7"
    # The same submit again (a retry whose answer was lost): nothing new, said so.
    again = await client.post("/api/v1/tasks", json=body, headers=tokens.auth("submitter"))
    assert again.status_code == 200, again.text
    assert again.json() == {"task_id": "order/7", "created": False}
    # The same input, its keys in another order (a store may keep them in its own order).
    reordered = {**body, "input": {"price": 1.5, "items": ["pen", "ink"], "id": 7}}
    same = await client.post("/api/v1/tasks", json=reordered, headers=tokens.auth("submitter"))
    assert (same.status_code, same.json()["created"]) == (200, False)
    # The same submit with other options: they are ignored, the task is the first's.
    options = {**body, "priority": 7, "start_after": 3600}
    ignored = await client.post("/api/v1/tasks", json=options, headers=tokens.auth("submitter"))
    assert (ignored.status_code, ignored.json()["created"]) == (200, False)
    # Another submit under a taken id is refused, naming the task and what differs.
    for other, told in (
        ({**body, "input": {**order, "id": 8}}, "another input"),
        ({**body, "workflow": "echo"}, "workflow 'approval' (this submit: 'echo')"),
    ):
        refused = await client.post("/api/v1/tasks", json=other, headers=tokens.auth("submitter"))
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == (
            f"task 'order/7' was submitted before with {told}: a task id names one submit"
        )
    # Submits racing on one new id: one creates the task.
    racing = {"workflow": "approval", "input": order, "task_id": "order/8"}
    answers = await asyncio.gather(
        *(
            client.post("/api/v1/tasks", json=racing, headers=tokens.auth("submitter"))
            for _ in range(5)
        )
    )
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 200, 201]
    task = await status(client, tokens, "order/7")
    assert (task["task_id"], task["workflow"], task["version"]) == ("order/7", "approval", 1)
    assert task["state"] in ("pending", "processing", "waiting") and not task["finished"]
    assert task["priority"] == 0 and task["waiting_for"] != "start"


async def test_a_submit_s_options_are_the_task_s(client: httpx.AsyncClient, tokens: Tokens) -> None:
    start_at = datetime.now(UTC) + timedelta(hours=2)
    task_id = await submit(
        client,
        tokens,
        "echo",
        {"n": 1},
        priority=5,
        reply_to="orders",
        start_at=start_at.isoformat(),
    )
    assert len(task_id) == 32  # a new id when none is given
    task = await status(client, tokens, task_id)
    assert (task["priority"], task["reply_to"], task["state"]) == (5, "orders", "waiting")
    assert task["waiting_for"] == "start"
    assert datetime.fromisoformat(task["wake_at"]) == start_at
    later = await submit(client, tokens, "echo", 2, task_id="later", start_after=3600)
    assert (await status(client, tokens, later))["waiting_for"] == "start"


async def test_the_result_is_answered_once_a_worker_has_finished_the_task(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    task_id = await submit(client, tokens, "approval", {"id": 1}, task_id="order-1")
    await waiting_for_approval(client, tokens, task_id)
    read = tokens.auth("reader")
    not_yet = await client.get(f"/api/v1/results/{task_id}", params={"timeout": 0}, headers=read)
    assert not_yet.status_code == 202, not_yet.text
    assert not_yet.json()["state"] == "waiting" and not_yet.json()["finished"] is False

    started = time.monotonic()
    poll = asyncio.create_task(
        client.get(f"/api/v1/results/{task_id}", params={"timeout": 15}, headers=read)
    )
    sent = await client.post(
        f"/api/v1/events/{task_id}",
        json={"name": "approve", "payload": "ann", "event_id": "approval-1"},
        headers=tokens.auth("billing"),
    )
    assert sent.status_code == 200, sent.text
    assert sent.json() == {"sent": True, "woke": True}
    answer = await poll
    assert answer.status_code == 200, answer.text
    assert time.monotonic() - started < 15  # answered when the task finished, not at the timeout
    result = answer.json()
    assert result["task_id"] == task_id and result["state"] == "processed"
    assert result["result"] == {"order": {"stamped": {"id": 1}}, "approved_by": "ann"}
    assert result["error"] is None and result["finished_at"] is not None
    # A finished task's result is answered at once, however long the caller would wait.
    again = await client.get(f"/api/v1/results/{task_id}", params={"timeout": 60}, headers=read)
    assert again.json() == result
    # The same event again (its event_id; the first answer lost, say) is answered as sent
    # before, though the task has finished; a finished task takes no other event.
    twice = await client.post(
        f"/api/v1/events/{task_id}",
        json={"name": "approve", "payload": "ann", "event_id": "approval-1"},
        headers=tokens.auth("billing"),
    )
    assert twice.status_code == 200, twice.text
    assert twice.json() == {"sent": False, "woke": False}
    other = await client.post(
        f"/api/v1/events/{task_id}",
        json={"name": "approve", "payload": "bob", "event_id": "approval-2"},
        headers=tokens.auth("billing"),
    )
    assert other.status_code == 409, other.text
    assert "processed" in other.json()["error"]


async def test_a_task_that_failed_is_answered_with_its_state_and_error(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    task_id = await submit(client, tokens, "failing", "x")
    answer = await client.get(
        f"/api/v1/results/{task_id}", params={"timeout": 15}, headers=tokens.auth("reader")
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "error"
    assert "the desk is jammed" in answer.json()["error"]
    assert answer.json()["result"] is None


@SQLITE_ONLY
async def test_a_result_not_ready_in_time_is_answered_202_with_the_status(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    task_id = await submit(client, tokens, "approval", {"id": 2})
    await waiting_for_approval(client, tokens, task_id)
    started = time.monotonic()
    answer = await client.get(
        f"/api/v1/results/{task_id}", params={"timeout": 0.3}, headers=tokens.auth("reader")
    )
    assert time.monotonic() - started >= 0.3
    assert answer.status_code == 202, answer.text
    assert answer.headers["retry-after"] == "0"
    assert answer.json()["waiting_for"] == "event:approve"
    assert answer.json()["state"] == "waiting"
    for bad in ({"timeout": "61"}, {"timeout": "-1"}, {"timeout": "soon"}):
        refused = await client.get(
            f"/api/v1/results/{task_id}", params=bad, headers=tokens.auth("reader")
        )
        assert refused.status_code == 422, refused.text
        assert "timeout" in refused.json()["error"]
    twice = await client.get(
        f"/api/v1/results/{task_id}?timeout=1&timeout=2", headers=tokens.auth("reader")
    )
    assert twice.status_code == 422 and "more than once" in twice.json()["error"]
    missing = await client.get("/api/v1/results/nope", headers=tokens.auth("reader"))
    assert missing.status_code == 404 and missing.json() == {"error": "no task 'nope'"}


async def test_a_cancel_reaches_the_task_and_records_the_client(
    served: Served, client: httpx.AsyncClient, tokens: Tokens
) -> None:
    task_id = await submit(client, tokens, "approval", {"id": 3})
    await waiting_for_approval(client, tokens, task_id)
    billing = tokens.auth("billing")
    cancelled = await client.post(
        f"/api/v1/cancel/{task_id}", json={"reason": "the customer left"}, headers=billing
    )
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["outcome"] == {
        "task_id": task_id,
        "applied": True,
        "before": "waiting",
        "after": "cancelled",
        "message": "done",
    }
    result = await client.get(f"/api/v1/results/{task_id}", headers=tokens.auth("reader"))
    assert (result.status_code, result.json()["state"]) == (200, "cancelled")
    again = await client.post(f"/api/v1/cancel/{task_id}", headers=billing)
    assert again.status_code == 409, again.text
    assert again.json()["outcome"]["before"] == "cancelled"
    missing = await client.post("/api/v1/cancel/nope", headers=billing)
    assert missing.status_code == 404
    # Who acted is the client whose token it was, recorded in the task's history.
    view = await _show(served.store_url, task_id)
    [detail] = [e.detail for e in view.events if e.kind == "operator"]
    assert (detail["action"], detail["by"], detail["reason"]) == (
        "cancel",
        "billing",
        "the customer left",
    )
    assert detail["authenticated"] == "client-token"


async def test_a_cancel_with_compensation_undoes_the_task(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    task_id = await submit(client, tokens, "approval", {"id": 4})
    await waiting_for_approval(client, tokens, task_id)
    answer = await client.post(
        f"/api/v1/cancel/{task_id}", json={"compensate": True}, headers=tokens.auth("billing")
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"]["after"] == "compensating"
    result = await client.get(
        f"/api/v1/results/{task_id}", params={"timeout": 15}, headers=tokens.auth("reader")
    )
    assert (result.status_code, result.json()["state"]) == (200, "compensated")


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


async def _show(store_url: str, task_id: str) -> sw.TaskView:
    app = sw.App("reader", store=store_url)
    try:
        return await app.show_async(task_id)
    finally:
        await app.aclose()


@SQLITE_ONLY
async def test_an_event_to_a_task_that_is_not_there_is_refused(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    billing = tokens.auth("billing")
    missing = await client.post("/api/v1/events/nope", json={"name": "approve"}, headers=billing)
    assert missing.status_code == 404 and missing.json() == {"error": "no task 'nope'"}
    task_id = await submit(client, tokens, "approval", {"id": 5})
    for bad, where in [
        ({}, "name"),
        ({"name": "approve", "colour": "red"}, "colour"),
        ({"name": "a\nb"}, "name"),
        ({"name": "approve", "payload": _deep(300)}, "nested deeper than 254 levels"),
    ]:
        refused = await client.post(f"/api/v1/events/{task_id}", json=bad, headers=billing)
        assert refused.status_code == 422, (bad, refused.text)
        assert where in refused.json()["error"], refused.text
    kept = await client.post(
        f"/api/v1/events/{task_id}", json={"name": "approve", "payload": 1}, headers=billing
    )
    assert kept.status_code == 200 and kept.json()["sent"] is True


@SQLITE_ONLY
async def test_an_invalid_submit_is_answered_422_with_what_is_wrong(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    cases: list[tuple[Any, str]] = [
        ({"workflow": "ship"}, "'approval', 'echo' or 'failing'"),
        ({"input": 1}, "workflow: Field required"),
        ({"workflow": "echo", "colour": "red"}, "colour: Extra inputs are not permitted"),
        ({"workflow": "echo", "task_id": ".."}, "task_id must not be '..'"),
        ({"workflow": "echo", "task_id": "a\u202eb"}, "task_id"),
        ({"workflow": "echo", "version": 2}, "version 2"),
        ({"workflow": "echo", "priority": 2**31}, "priority"),
        ({"workflow": "echo", "priority": 1.5}, "priority"),
        ({"workflow": "echo", "reply_to": " "}, "reply_to"),
        ({"workflow": "echo", "start_at": "2030-01-01T00:00:00"}, "start_at"),
        ({"workflow": "echo", "start_at": None}, "start_at may be left out, not null"),
        (
            {"workflow": "echo", "start_at": "2030-01-01T00:00:00Z", "start_after": 1},
            "not both",
        ),
        ({"workflow": "echo", "input": _deep(300)}, "nested deeper than 254 levels"),
        ([{"workflow": "echo"}], "the body"),
    ]
    for body, fragment in cases:
        answer = await client.post("/api/v1/tasks", json=body, headers=tokens.auth("billing"))
        assert answer.status_code == 422, (body, answer.text)
        assert fragment in answer.json()["error"], (body, answer.text)
    for raw, fragment in [
        (b'{"workflow": "echo", "input": NaN}', "NaN"),
        (b'{"workflow": ', "the body is not JSON"),
    ]:
        answer = await client.post(
            "/api/v1/tasks",
            content=raw,
            headers={**tokens.auth("billing"), "Content-Type": "application/json"},
        )
        assert answer.status_code == 422, (raw, answer.text)
        assert fragment in answer.json()["error"], (raw, answer.text)
    tasks = await client.get(
        "/api/tasks", headers={"Authorization": "Bearer dashboard-token-51f0c2"}
    )
    assert tasks.json()["tasks"] == []  # nothing was written


@SQLITE_ONLY
async def test_a_body_over_the_limit_is_refused_before_it_is_read(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    big = {"workflow": "echo", "input": "x" * (3 * 1024 * 1024)}
    answer = await client.post("/api/v1/tasks", json=big, headers=tokens.auth("billing"))
    assert answer.status_code == 413, answer.text
    assert answer.json() == {"error": "the request body is over the limit of 2097152 bytes"}

    async def chunks() -> Any:  # no Content-Length: counted as it arrives
        for _ in range(40):
            yield b" " * (64 * 1024)

    answer = await client.post(
        "/api/v1/events/x",
        content=chunks(),
        headers={**tokens.auth("billing"), "Content-Type": "application/json"},
    )
    assert answer.status_code == 413, answer.text
    # An input within the body's limit but over a payload's (1 MiB) is the engine's to refuse.
    over = {"workflow": "echo", "input": "x" * (1024 * 1024 + 1)}
    answer = await client.post("/api/v1/tasks", json=over, headers=tokens.auth("billing"))
    assert answer.status_code == 422 and "over the limit" in answer.json()["error"]


async def test_a_re_submit_by_another_client_is_refused_without_comparing_anything(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    """A stored secret cannot be guessed through re-submits: another client's re-submit under
    a taken id is 409 whatever its input, with the same answer for a right and a wrong
    guess; the submitting client's own is compared by the input's digest."""
    order = {"id": 9, "pin": {"$secret": "7391"}}
    body = {"workflow": "approval", "input": order, "task_id": "order/9"}
    first = await client.post("/api/v1/tasks", json=body, headers=tokens.auth("billing"))
    assert first.status_code == 201, first.text
    answers = []
    for guess in ("7391", "0000"):
        guessed = {**body, "input": {"id": 9, "pin": {"$secret": guess}}}
        answer = await client.post("/api/v1/tasks", json=guessed, headers=tokens.auth("submitter"))
        answers.append((answer.status_code, answer.json()))
    assert answers[0] == answers[1]
    assert answers[0][0] == 409 and "another client" in answers[0][1]["error"]
    wrong = {**body, "input": {"id": 9, "pin": {"$secret": "0000"}}}
    mine = await client.post("/api/v1/tasks", json=wrong, headers=tokens.auth("billing"))
    assert mine.status_code == 409, mine.text
    again = await client.post("/api/v1/tasks", json=body, headers=tokens.auth("billing"))
    assert (again.status_code, again.json()["created"]) == (200, False)


async def test_an_object_with_a_secret_and_other_keys_is_refused(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    """`{"$secret": ..., "extra": 1}` would be kept as a plain object, its value shown
    everywhere: refused (422), as is a client's `{"$sealed": ...}`; nothing is stored."""
    for value in ({"$secret": "PIN-7391", "extra": 1}, {"$sealed": "k1:AAAA"}):
        body = {"workflow": "approval", "input": {"id": 1, "pin": value}, "task_id": "mixed"}
        refused = await client.post("/api/v1/tasks", json=body, headers=tokens.auth("submitter"))
        assert refused.status_code == 422, refused.text
        assert "reserved key" in refused.json()["error"]
        assert "PIN-7391" not in refused.text
    missing = await client.get("/api/v1/tasks/mixed", headers=tokens.auth("reader"))
    assert missing.status_code == 404
