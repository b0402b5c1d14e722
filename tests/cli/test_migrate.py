"""`stepwarden migrate`: creates the schema on an empty store, and running it again (even at
the same moment from two processes) changes nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

from stepwarden.store._sql import migrations

from .helpers import (
    APP,
    REPO,
    STEPWARDEN,
    assert_ok,
    assert_refused,
    invoke,
    is_sqlite,
    json_lines,
    process_env,
    run,
    snapshot,
    sql,
)


def _expected(url: str) -> list[tuple[int, str]]:
    return [(m.version, m.name) for m in migrations("sqlite" if is_sqlite(url) else "postgres")]


def _recorded(url: str) -> list[tuple[object, ...]]:
    return sql(url, "SELECT version, name, applied_at FROM stepwarden_schema ORDER BY version")


def test_migrate_creates_the_schema_and_a_second_run_changes_nothing(empty_store_url: str) -> None:
    url = empty_store_url
    latest = _expected(url)[-1][0]
    # Before: a command that needs the schema says what is missing and what to run.
    missing = (
        ("there is no database at", "create it with `stepwarden migrate`")
        if url.startswith("sqlite")  # a new file: nothing is there yet
        else (
            "the database schema is at version 0, older than this stepwarden needs",
            "run `stepwarden migrate`",
        )
    )
    assert_refused(invoke("--store", url, "tasks"), *missing, exit_code=1)
    assert assert_ok(invoke("--store", url, "migrate")) == f"schema version {latest}\n"
    assert snapshot(url).schema == _expected(url)
    recorded = _recorded(url)
    counts = assert_ok(invoke("--store", url, "tasks"))
    for state in ("pending", "processing", "processed", "error"):
        assert f"{state}: 0" in counts, counts
    assert_ok(invoke("--app", APP, "--store", url, "submit", "process", "{}", "--task-id", "t"))

    done = run("--store", url, "migrate")  # again, as a real process
    assert (done.returncode, done.stdout) == (0, f"schema version {latest}\n"), done.stderr
    assert _recorded(url) == recorded  # nothing re-applied, nothing re-recorded
    [task] = json_lines(assert_ok(invoke("--store", url, "tasks", "--json")))
    assert task["task_id"] == "t" and task["process_state"] == "pending"


def test_two_processes_migrating_at_once_both_succeed(empty_store_url: str) -> None:
    url = empty_store_url
    procs = [
        subprocess.Popen(
            [STEPWARDEN, "--store", url, "migrate"],
            cwd=REPO,
            env=process_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    latest = _expected(url)[-1][0]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert out == f"schema version {latest}\n"
    assert snapshot(url).schema == _expected(url)


def test_a_read_only_command_on_a_missing_sqlite_file_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    assert_refused(invoke("--store", f"sqlite:///{typo}", "tasks"), exit_code=1)
    assert list(tmp_path.iterdir()) == []
