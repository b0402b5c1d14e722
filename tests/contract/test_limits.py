"""What a hostile or runaway value cannot do to the store: an error text is stored cut to
8 KiB wherever it is kept, a long history is read newest first, a page at a time, saying
when older events exist, and a task keeps so many events sent to it, each so large, and no
more, however many senders race. On both stores.

The 20 MB error of a step is also raised by an agent served over HTTP, in a second worker
(`workers`): its outcome is cut before it is sent, so the server takes it (its requests are
bounded) and the store keeps it as it keeps any. The other tests are of the store and the
App alone: no agent of theirs answers."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden.rules import MAX_ERROR
from tests.agentserver import Workers
from tests.rawsql import is_sqlite, sql, sqlite_path
from tests.stores import app_store

from ..support.worker import running

HUGE = 20_000_000


def _file_size(path: str) -> int:
    return os.path.getsize(path)


def _app(store_url: str, **options: Any) -> sw.App:
    app = sw.App("limits", store=store_url, **options)
    desk = app.agent("desk")

    @desk.operation
    async def explode(call: sw.Call, size: int) -> None:
        raise sw.PermanentError("E" * size)

    @app.workflow(complete_within=timedelta(seconds=30), on_failure="stop")
    async def runaway(ctx: sw.Context, size: int) -> Any:
        return await ctx.step(desk.explode, size)

    @app.workflow(complete_within=timedelta(seconds=30), on_failure="stop")
    async def raising(ctx: sw.Context, size: int) -> Any:
        raise ValueError("W" * size)

    @app.workflow(complete_within=timedelta(seconds=30))
    async def voting(ctx: sw.Context, votes: int) -> Any:
        return [
            await ctx.wait_for_event("vote", timeout=timedelta(seconds=60)) for _ in range(votes)
        ]

    return app


async def test_a_20_mb_error_is_stored_cut_everywhere(store_url: str, workers: Workers) -> None:
    """A 20 MB PermanentError of a step, and a 20 MB exception of a workflow: the task's
    error, the step's, their events and the alerts each hold at most MAX_ERROR characters,
    ending with a marker that says how long the error was; the SQLite file stays small."""
    app = _app(store_url)
    try:
        async with workers(app):
            await app.submit_async("runaway", HUGE, task_id="step-error")
            await app.submit_async("raising", HUGE, task_id="workflow-error")
            for task_id in ("step-error", "workflow-error"):
                with pytest.raises(sw.TaskFailed):
                    await app.result_async(task_id, timeout=60)
        view = await app.show_async("step-error")
        [step] = view.steps
        assert step.error is not None and len(step.error) <= MAX_ERROR
        assert step.error.startswith("PermanentError: EEEE")
        assert step.error.endswith(f"[cut: {HUGE + len('PermanentError: ')} characters in all]")
        for task_id in ("step-error", "workflow-error"):
            task = await app.status_async(task_id)
            assert task.error is not None and len(task.error) <= MAX_ERROR, task_id
            assert "characters in all]" in task.error
        longest = {
            table: sql(store_url, f"SELECT max(length(CAST({column} AS text))) FROM {table}")
            for table, column in [
                ("stepwarden_tasks", "error"),
                ("stepwarden_steps", "error"),
                ("stepwarden_events", "detail"),
                ("stepwarden_outbox", "detail"),
            ]
        }
        for table, [(length,)] in longest.items():
            assert length is not None and length < MAX_ERROR + 1000, (table, length)
        if is_sqlite(store_url):
            assert _file_size(sqlite_path(store_url)) < 5_000_000
    finally:
        await app.aclose()


async def test_history_is_read_newest_first_a_page_at_a_time(store_url: str) -> None:
    """A task with 2,000 events: the newest page starts with the last action, says that older
    events exist, and paging by `events_before` walks back through all of them, each once."""
    app = _app(store_url)
    try:
        await app.submit_async("runaway", 1, task_id="t")
        store = await app_store(app)
        await store.record_events([("t", "note", {"n": n}) for n in range(1997)])
        await app.pause_async("t", reason="first look")
        await app.resume_async("t", reason="looked")
        await app.pause_async("t", reason="the last word")
        view = await app.show_async("t", events=100)
        assert view.task.process_state == sw.TaskState.PAUSED
        newest = view.events[0]
        assert newest.kind == "operator", newest
        assert newest.detail["action"] == "pause" and newest.detail["reason"] == "the last word"
        assert view.more_events
        seen = [e.id for e in view.events]
        while view.more_events:
            view = await app.show_async("t", events=100, events_before=view.events[-1].id)
            seen.extend(e.id for e in view.events)
        assert seen == sorted(seen, reverse=True)
        everything = await store.events(task_id="t", limit=10_000)
        assert len(everything) >= 2000
        assert sorted(seen) == [e.id for e in everything]
        oldest_1000 = await app.show_async("t", events=1000, events_before=seen[-1001])
        assert not oldest_1000.more_events and len(oldest_1000.events) == 1000
        assert (await app.show_async("t", events=999, events_before=seen[-1001])).more_events
    finally:
        await app.aclose()


def _kept(store_url: str) -> dict[str, int]:
    """The events each task keeps, read from the database."""
    rows = sql(store_url, "SELECT task_id, count(*) FROM stepwarden_inbox GROUP BY task_id")
    return {task_id: int(n) for task_id, n in rows}


async def _taken(app: sw.App, task_id: str, events: int) -> None:
    """Until the task waits with `events` events taken by its waits."""
    store = await app_store(app)
    async with asyncio.timeout(30):
        while True:
            done = [w for w in await store.waits(task_id) if w.state == "done"]
            task = await app.status_async(task_id)
            if len(done) == events and task.process_state == sw.TaskState.WAITING:
                return
            await asyncio.sleep(0.02)


async def test_a_task_keeps_events_within_the_bounds_of_the_app(store_url: str) -> None:
    """max_events_per_task counts the events a task keeps, taken by a wait or not;
    max_event_payload the bytes of a payload's JSON text (UTF-8). Beyond either, the send
    raises EventRefused naming the bound, and nothing is kept or recorded; an event_id sent
    before is answered as sent before, not refused."""
    app = _app(store_url, max_events_per_task=3, max_event_payload=100)
    try:
        await app.submit_async("voting", 4, task_id="t")
        await app.submit_async("voting", 1, task_id="u")
        async with running(app):
            for n in (1, 2):
                assert (await app.send_event_async("t", "vote", n, event_id=f"v{n}")).sent
            await _taken(app, "t", 2)
            assert (await app.send_event_async("t", "vote", 3, event_id="v3")).woke
            await _taken(app, "t", 3)
            with pytest.raises(sw.EventRefused) as refused:
                await app.send_event_async("t", "vote", 4, event_id="v4")
            assert (refused.value.bound, refused.value.limit, refused.value.found) == (
                "max_events_per_task", 3, 3,
            )  # fmt: skip
            assert str(refused.value) == (
                "event 'vote' refused: task 't' keeps 3 events, its max_events_per_task (3)"
            )
            assert refused.value.state is None
            again = await app.send_event_async("t", "vote", 1, event_id="v1")
            assert (again.sent, again.woke) == (False, False)

            # 100 bytes of JSON are kept; 102 (50 two-byte characters, 52 in all) are not.
            with pytest.raises(sw.EventRefused) as too_big:
                await app.send_event_async("u", "vote", "é" * 50, event_id="big")
            assert (too_big.value.bound, too_big.value.limit, too_big.value.found) == (
                "max_event_payload", 100, 102,
            )  # fmt: skip
            assert str(too_big.value) == (
                "event 'vote' refused: its payload is 102 bytes, over max_event_payload (100)"
            )
            assert (await app.send_event_async("u", "vote", "é" * 49, event_id="fits")).sent
            assert await app.result_async("u", timeout=30) == ["é" * 49]
        assert _kept(store_url) == {"t": 3, "u": 1}
        received = await (await app_store(app)).events(task_id="t", kind="event_received")
        assert sorted(e.detail["event_id"] for e in received) == ["v1", "v2", "v3"]
        with pytest.raises(sw.ConfigurationError, match="max_events_per_task must be"):
            sw.App("x", store=store_url, max_events_per_task=0)
        with pytest.raises(sw.ConfigurationError, match="max_event_payload must be"):
            sw.App("x", store=store_url, max_event_payload=2 * 1024 * 1024)
    finally:
        await app.aclose()


async def test_the_default_bounds_are_1000_events_of_256_kib(store_url: str) -> None:
    """A thousand events sent in one transaction are kept (each counted with those before
    it); the next one is refused. A payload of 256 KiB is kept, one byte more is not."""
    app = _app(store_url)
    try:
        await app.submit_async("voting", 1, task_id="t")
        await app.submit_async("voting", 1, task_id="u")
        async with app.transaction() as tx:
            for n in range(1000):
                assert (await tx.send_event("t", "vote", n, event_id=f"e{n}")).sent
        with pytest.raises(sw.EventRefused, match=r"keeps 1000 events, its max_events_per_task"):
            await app.send_event_async("t", "vote", 1000, event_id="e1000")
        largest = "x" * (256 * 1024 - 2)  # and its two quotes
        assert (await app.send_event_async("u", "vote", largest, event_id="fits")).sent
        with pytest.raises(sw.EventRefused, match=r"262145 bytes, over max_event_payload"):
            await app.send_event_async("u", "vote", largest + "x", event_id="over")
        assert _kept(store_url) == {"t": 1000, "u": 1}
    finally:
        await app.aclose()


async def test_racing_senders_never_pass_the_bound(store_url: str) -> None:
    """Thirty sends at once from three Apps (each its own connections) to a task that keeps
    five events: five are kept, the others refused, since each send counts the events kept
    with the task's row locked."""
    apps = [_app(store_url, max_events_per_task=5) for _ in range(3)]
    try:
        await apps[0].submit_async("voting", 1, task_id="t")
        sends = [apps[n % 3].send_event_async("t", "vote", n, event_id=f"e{n}") for n in range(30)]
        outcomes = await asyncio.gather(*sends, return_exceptions=True)
        sent = [o for o in outcomes if isinstance(o, sw.SendOutcome)]
        refused = [o for o in outcomes if isinstance(o, sw.EventRefused)]
        assert (len(sent), len(refused)) == (5, 25), outcomes
        assert all(o.sent for o in sent)
        assert {o.bound for o in refused} == {"max_events_per_task"}
        assert _kept(store_url) == {"t": 5}
    finally:
        for app in apps:
            await app.aclose()
