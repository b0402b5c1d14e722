"""A database whose schema is newer than the installed stepwarden: every command refuses it
with SchemaVersionError's message, and changes nothing."""

from __future__ import annotations

import threading

import pytest

import stepwarden as sw
from stepwarden.store import open_store
from stepwarden.store._sql import latest_version

from . import cli_app
from .helpers import APP, assert_refused, error_line, invoke, is_sqlite, run, snapshot, sql


def _from_the_future(url: str) -> tuple[int, int]:
    """Record the newest migration as one this code does not know, as a newer stepwarden
    would have; returns (the version this code knows, the version now recorded)."""
    known = latest_version("sqlite" if is_sqlite(url) else "postgres")
    sql(url, f"UPDATE stepwarden_schema SET version = {known + 1} WHERE version = {known}")
    return known, known + 1


def test_every_command_refuses_a_newer_schema_and_changes_nothing(migrated_url: str) -> None:
    known, found = _from_the_future(migrated_url)
    before = snapshot(migrated_url)
    assert before.schema[-1][0] == found and before.tasks == 0
    expected = (
        f"Error: the database schema is at version {found}, newer than this stepwarden "
        f"understands ({known}); upgrade stepwarden"
    )
    store = ("--store", migrated_url)
    for args in (
        (*store, "tasks"),
        (*store, "tasks", "--json"),
        (*store, "show", "t-1"),
        (*store, "migrate"),
        ("--app", APP, *store, "submit", "process", "{}", "--task-id", "t-1"),
    ):
        assert assert_refused(invoke(*args), exit_code=1) == expected, args
    # A worker (a real process: were it to start, it would run until stopped) exits at once.
    done = run("--app", APP, *store, "worker", timeout=30)
    assert done.returncode == 1 and error_line(done.stderr) == expected
    # The Python API refuses it with the documented class.
    app = cli_app.build(migrated_url)
    try:
        with pytest.raises(sw.SchemaVersionError, match="newer than this stepwarden"):
            app.submit("process", {}, task_id="t-1")
    finally:
        app.close()
    assert snapshot(migrated_url) == before


async def test_a_refused_sqlite_store_is_closed_again(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    await store.open()
    await store.close()
    _from_the_future(sqlite_url)

    def sqlite_threads() -> int:
        return sum(t.name.startswith("stepwarden-sqlite") for t in threading.enumerate())

    before = sqlite_threads()
    with pytest.raises(sw.SchemaVersionError):
        await store.open()
    assert sqlite_threads() == before
