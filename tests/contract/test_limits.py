"""What a hostile or runaway value cannot do to the store: an error text is stored cut to
8 KiB wherever it is kept, and a long history is read newest first, a page at a time, saying
when older events exist. On both stores."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest

import stepwarden as sw
from stepwarden.rules import MAX_ERROR
from tests.contract.test_engine import running
from tests.rawsql import is_sqlite, sql, sqlite_path

HUGE = 20_000_000


def _file_size(path: str) -> int:
    return os.path.getsize(path)


def _app(store_url: str) -> sw.App:
    app = sw.App("limits", store=store_url)
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

    return app


async def test_a_20_mb_error_is_stored_cut_everywhere(store_url: str) -> None:
    """A 20 MB PermanentError of a step, and a 20 MB exception of a workflow: the task's
    error, the step's, their events and the alerts each hold at most MAX_ERROR characters,
    ending with a marker that says how long the error was; the SQLite file stays small."""
    app = _app(store_url)
    try:
        async with running(app):
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
        store = await app.store()
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
