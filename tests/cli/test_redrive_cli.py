"""Redrives from the command line, on both stores: `retry --plan` and `fork --plan` print
each step's plan and change nothing; `fork` acts, says what it did, and the worker then runs
the fork under the keys printed; a refused fork exits 1."""

from __future__ import annotations

import asyncio

import pytest

import stepwarden as sw
from tests.support.worker import running

from . import cli_app
from .helpers import APP, assert_ok, assert_refused, invoke


def _run_to_end(url: str, task_id: str, *, fails: bool = False) -> None:
    async def go() -> None:
        app = cli_app.build(url)
        try:
            async with running(app):
                if fails:
                    with pytest.raises(sw.TaskFailed):
                        await app.result_async(task_id, timeout=20)
                else:
                    await app.result_async(task_id, timeout=20)
        finally:
            await app.aclose()

    asyncio.run(go())


def test_retry_and_fork_print_their_plan_then_act(migrated_url: str) -> None:
    url = migrated_url
    assert_ok(invoke("--app", APP, "--store", url, "submit", "process",
                     '{"refuse": "no"}', "--task-id", "bad"))  # fmt: skip
    _run_to_end(url, "bad", fails=True)
    planned = assert_ok(invoke("--store", url, "retry", "bad", "--plan"))
    assert "bad: would retry: error -> pending" in planned
    assert "desk.stamp" in planned and "run again, same key  bad/1" in planned
    assert "error" in assert_ok(invoke("--store", url, "show", "bad"))  # nothing changed
    assert_refused(invoke("--store", url, "retry", "--state", "error", "--plan"), "--plan")

    assert_ok(invoke("--app", APP, "--store", url, "submit", "process", '{"n": 1}',
                     "--task-id", "ok"))  # fmt: skip
    _run_to_end(url, "ok")
    plan = assert_ok(
        invoke("--store", url, "fork", "ok", "--from", "1", "--task-id", "ok-2", "--plan")
    )
    assert "ok: would fork as ok-2" in plan and "run again, same key  ok/1" in plan
    assert_refused(invoke("--store", url, "show", "ok-2"), "ok-2")
    fresh = assert_ok(
        invoke("--store", url, "fork", "ok", "--from", "1", "--task-id", "ok-2",
               "--new-keys-from", "1", "--by", "ann")
    )  # fmt: skip
    assert "ok: forked as ok-2" in fresh and "run again, new key   ok-2/1" in fresh
    _run_to_end(url, "ok-2")
    shown = assert_ok(invoke("--store", url, "show", "ok-2"))
    assert "key ok-2/1" in shown and "processed" in shown
    assert_refused(invoke("--store", url, "fork", "ok", "--from", "7"), "no step at 7")
