"""Bulk actions from the command line, on both stores: `bulk ACTION --plan` prints the count
per workflow and move, the steps of a retry and the first task ids, and changes nothing;
`bulk ACTION --yes` acts on the matching tasks only, a line per batch; stopped at a limit, it
says where, and the same command again finishes the rest, as it does after a process
SIGKILLed mid-run; without --yes it asks first."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

import stepwarden as sw
from stepwarden.states import TaskState
from tests.support.worker import running

from . import cli_app
from .helpers import APP, REPO, STEPWARDEN, assert_ok, assert_refused, invoke, process_env


def _failed(url: str, refusals: dict[str, str]) -> None:
    """Tasks of `process` whose step is refused with each reason, run to their error."""

    async def go() -> None:
        app = cli_app.build(url)
        try:
            for task_id, why in refusals.items():
                await app.submit_async("process", {"refuse": why}, task_id=task_id)
            async with running(app):
                for task_id in refusals:
                    with pytest.raises(sw.TaskFailed):
                        await app.result_async(task_id, timeout=20)
        finally:
            await app.aclose()

    asyncio.run(go())


def _states(url: str) -> dict[str, TaskState]:
    async def go() -> dict[str, TaskState]:
        app = cli_app.build(url)
        try:
            return {t.task_id: t.process_state for t in await app.tasks_async()}
        finally:
            await app.aclose()

    return asyncio.run(go())


def test_bulk_retry_plans_then_acts_in_batches_and_resumes(migrated_url: str) -> None:
    url = migrated_url
    _failed(url, {"b-1": "card", "b-2": "card", "b-3": "bank", "b-4": "card"})
    assert_ok(invoke("--app", APP, "--store", url, "submit", "process", "{}", "--task-id", "p-1"))
    declined = ("--state", "error", "--workflow", "process", "--error", "refused: card")
    planned = assert_ok(invoke("--store", url, "bulk", "retry", *declined, "--plan"))
    assert planned.splitlines() == [
        "retry: 3 task(s) match",
        "  process v1: 3",
        "  error -> pending: 3",
        "  steps: 3 run again, same key",
        "  first: b-1 b-2 b-4",
    ]
    assert set(_states(url).values()) == {TaskState.ERROR, TaskState.PENDING}  # as they were
    assert _states(url)["b-1"] == TaskState.ERROR

    stopped = assert_ok(
        invoke("--store", url, "bulk", "retry", *declined, "--yes", "--batch", "1",
               "--limit", "2", "--by", "ann")
    )  # fmt: skip
    assert stopped.splitlines() == [
        "retry: 1 acted, 0 refused, through b-1",
        "retry: 2 acted, 0 refused, through b-2",
        "retry: stopped at the limit: 2 acted, 0 refused; go on with --after b-2",
    ]
    rest = assert_ok(invoke("--store", url, "bulk", "retry", *declined, "--plan"))
    assert rest.splitlines()[0] == "retry: 1 task(s) match"
    again = assert_ok(invoke("--store", url, "bulk", "retry", *declined, "--yes"))
    assert again.splitlines() == [
        "retry: 1 acted, 0 refused, through b-4",
        "retry: done: 1 acted, 0 refused",
    ]
    states = _states(url)
    assert [states[t] for t in ("b-1", "b-2", "b-3", "b-4", "p-1")] == [
        TaskState.PENDING,
        TaskState.PENDING,
        TaskState.ERROR,
        TaskState.PENDING,
        TaskState.PENDING,
    ]
    history = assert_ok(invoke("--store", url, "show", "b-1"))
    assert history.count("operator") == 1 and "ann" in history


def test_bulk_asks_before_acting_unless_told_yes(migrated_url: str) -> None:
    url = migrated_url
    for task_id in ("w-1", "w-2"):
        assert_ok(
            invoke("--app", APP, "--store", url, "submit", "process", "{}", "--task-id", task_id)
        )
    asked = invoke("--store", url, "bulk", "pause", "--workflow", "process", input="n\n")
    assert asked.exit_code == 1 and "pause 2 task(s)? [y/N]" in asked.stderr
    assert "Aborted" in asked.stderr
    assert set(_states(url).values()) == {TaskState.PENDING}
    said_yes = invoke("--store", url, "bulk", "pause", "--workflow", "process", input="y\n")
    assert said_yes.exit_code == 0, said_yes.output
    assert "pause: done: 2 acted, 0 refused" in said_yes.stdout
    assert set(_states(url).values()) == {TaskState.PAUSED}
    none = assert_ok(invoke("--store", url, "bulk", "pause", "--workflow", "process"))
    assert none == "pause: 0 task(s) match\n"  # nothing to ask about
    assert_refused(invoke("--store", url, "bulk", "skip"), "'skip' is not one of", exit_code=2)
    assert_refused(
        invoke("--store", url, "bulk", "cancel", "--created-after", "yesterday"),
        "--created-after",
        exit_code=2,
    )


def test_a_bulk_killed_mid_run_is_finished_by_the_same_command(pg_url: str, tmp_path: Path) -> None:
    """A real `stepwarden bulk` process, its second batch held up by a row lock (PostgreSQL:
    the lock makes "mid-run" a place, not a moment), SIGKILLed there: its first batch stands,
    the second is rolled back, and the same command again acts on the rest, once each."""
    url = pg_url
    for task_id in ("k-1", "k-2", "k-3"):
        assert_ok(
            invoke("--app", APP, "--store", url, "submit", "process", "{}", "--task-id", task_id)
        )
    out = tmp_path / "bulk.out"
    with psycopg.connect(url) as hold, out.open("w") as sink:
        hold.execute("SELECT 1 FROM stepwarden_tasks WHERE task_id = 'k-2' FOR UPDATE")
        proc = subprocess.Popen(
            [STEPWARDEN, "--store", url, "bulk", "pause", "--workflow", "process", "--yes",
             "--batch", "1", "--by", "ops"],
            cwd=REPO, env=process_env(), stdout=sink, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while "through k-1" not in out.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
                time.sleep(0.05)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        hold.rollback()
    assert out.read_text() == "pause: 1 acted, 0 refused, through k-1\n"
    states = _states(url)
    assert [states[t] for t in ("k-1", "k-2", "k-3")] == [
        TaskState.PAUSED,
        TaskState.PENDING,
        TaskState.PENDING,
    ]
    again = assert_ok(
        invoke("--store", url, "bulk", "pause", "--workflow", "process", "--yes", "--by", "ops")
    )
    assert again.splitlines() == [
        "pause: 2 acted, 0 refused, through k-3",
        "pause: done: 2 acted, 0 refused",
    ]
    assert set(_states(url).values()) == {TaskState.PAUSED}
    for task_id in ("k-1", "k-2", "k-3"):
        assert assert_ok(invoke("--store", url, "show", task_id)).count("operator") == 1


def test_bulk_fork_forks_each_task_once_under_its_name(migrated_url: str) -> None:
    url = migrated_url
    _failed(url, {"f-1": "card", "f-2": "card"})
    fork = ("bulk", "fork", "--state", "error", "--from", "1", "--as", "again")
    planned = assert_ok(invoke("--store", url, *fork, "--plan"))
    assert planned.splitlines() == [
        "fork: 2 task(s) match",
        "  process v1: 2",
        "  error -> fork: 2",
        "  steps: 2 run again, same key",
        "  first: f-1 f-2",
    ]
    done = assert_ok(invoke("--store", url, *fork, "--yes", "--limit", "1"))
    assert done.splitlines()[-1] == (
        "fork: stopped at the limit: 1 acted, 0 refused, 0 forked before; go on with --after f-1"
    )
    rest = assert_ok(invoke("--store", url, *fork, "--yes"))
    assert rest.splitlines()[-1] == "fork: done: 1 acted, 0 refused, 1 forked before"
    assert set(_states(url)) == {"f-1", "f-2", "f-1~again", "f-2~again"}
    assert_refused(invoke("--store", url, "bulk", "fork", "--yes"), "--from POSITION and --as")
    assert_refused(invoke("--store", url, "bulk", "retry", "--as", "x"), "a bulk fork's")
