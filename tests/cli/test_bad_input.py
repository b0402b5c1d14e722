"""Bad input on the command line: a clear one-line error, a non-zero exit, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepwarden._json import MAX_PAYLOAD_BYTES

from . import cli_app
from .helpers import (
    APP,
    assert_ok,
    assert_refused,
    error_line,
    invoke,
    json_lines,
    run,
    snapshot,
)


def _no_tasks(url: str) -> None:
    assert snapshot(url).tasks == 0
    assert assert_ok(invoke("--store", url, "tasks", "--json")) == ""


def _submit(url: str, *args: str) -> tuple[str, ...]:
    return ("--app", APP, "--store", url, "submit", *args)


def test_submitting_an_unknown_workflow_names_it_and_the_declared_ones(migrated_url: str) -> None:
    line = assert_refused(invoke(*_submit(migrated_url, "nope", "{}")), exit_code=1)
    assert line == "Error: unknown workflow 'nope' (declared: process)"
    _no_tasks(migrated_url)


def test_an_input_that_is_not_json_is_refused(migrated_url: str) -> None:
    for text in ["{not json", "", "NaN", "{'a': 1}", "[1,]", "process"]:
        assert_refused(
            invoke(*_submit(migrated_url, "process", text)),
            "Invalid value for INPUT_JSON",
            "not JSON",
            exit_code=2,
        )
    _no_tasks(migrated_url)


def test_an_input_over_the_size_limit_is_refused(migrated_url: str) -> None:
    too_big = '"' + "x" * MAX_PAYLOAD_BYTES + '"'
    assert_refused(
        invoke(*_submit(migrated_url, "process", too_big)),
        "the task input is",
        f"over the limit of {MAX_PAYLOAD_BYTES}",
        exit_code=1,
    )
    _no_tasks(migrated_url)


def test_an_invalid_task_id_is_refused(migrated_url: str) -> None:
    for task_id, problem in [
        ("", "task_id must be a string of 1 to 200 characters"),
        ("x" * 201, "task_id must be a string of 1 to 200 characters"),
        ("line\nbreak", "task_id must not contain control characters"),
    ]:
        result = invoke(*_submit(migrated_url, "process", "{}", "--task-id", task_id))
        assert_refused(result, problem, exit_code=1)
    _no_tasks(migrated_url)


def test_a_priority_that_is_not_an_integer_is_refused(migrated_url: str) -> None:
    result = invoke(*_submit(migrated_url, "process", "{}", "--priority", "high"))
    assert_refused(result, "Invalid value for '--priority'", "'high'", exit_code=2)
    _no_tasks(migrated_url)


BAD_URLS = [
    ("mysql://x", "invalid store URL 'mysql://x'"),
    ("sqlite://", "invalid SQLite store URL 'sqlite://': no database path"),
    ("nonsense", "invalid store URL 'nonsense'"),
    ("sqlite://host/x.db", "invalid SQLite store URL 'sqlite://host/x.db'"),
    ("sqlite:///x.db?sync=off", "unknown SQLite store option(s): sync"),
    ("sqlite:///x.db?wake=no", "wake must be one of on, off, not 'no'"),
]


@pytest.mark.parametrize(("url", "problem"), BAD_URLS)
def test_an_invalid_store_url_is_refused_by_every_command(
    migrated_url: str, url: str, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The application's own store is a real one: a refused --store must not fall back to it.
    monkeypatch.setattr(cli_app.app, "store_url", migrated_url)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for command in (["tasks"], ["show", "t-1"], ["migrate"]):
        assert_refused(invoke("--store", url, *command), problem, exit_code=1)
    for command in (
        ["submit", "process", "{}", "--task-id", "t-1"],
        ["worker", "--roles", "nothing-to-run"],
    ):
        assert_refused(
            invoke("--app", APP, "--store", url, *command),
            "Invalid value for --store",
            problem,
            exit_code=2,
        )
    assert list(cwd.iterdir()) == []  # no database file was created anywhere
    _no_tasks(migrated_url)


def test_a_sqlite_database_in_a_missing_folder_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing' / 'store.db'}"
    for command in (["tasks"], ["migrate"]):
        assert_refused(invoke("--store", url, *command), "does not exist", exit_code=1)
    assert not (tmp_path / "missing").exists()


def test_an_unreachable_postgresql_is_one_clear_line_without_the_password() -> None:
    url = "postgresql://postgres:s3cret@127.0.0.1:1/nowhere?connect_timeout=5"
    line = assert_refused(invoke("--store", url, "tasks"), exit_code=1)
    assert line.startswith("Error: cannot connect to PostgreSQL at 127.0.0.1:1/nowhere"), line
    assert "s3cret" not in line


def test_naming_no_store_and_no_application_is_a_usage_error() -> None:
    for command in (["tasks"], ["show", "t-1"], ["migrate"]):
        assert_refused(invoke(*command), "name the store", exit_code=2)
    assert_refused(invoke("submit", "process"), "name the application", exit_code=2)


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        ("cli_app", "invalid application 'cli_app': expected MODULE:ATTRIBUTE"),
        ("tests.cli.no_such_module:app", "cannot import module 'tests.cli.no_such_module'"),
        ("tests.cli.cli_app:nothing", "module 'tests.cli.cli_app' has no attribute 'nothing'"),
        (
            "tests.cli.cli_app:build",
            "'tests.cli.cli_app:build' is not a stepwarden.App (it is function)",
        ),
        (
            "tests.cli.broken_app:app",
            "cannot load application 'tests.cli.broken_app:app': invalid store URL",
        ),
    ],
)
def test_an_application_that_cannot_be_loaded_is_a_usage_error(
    sqlite_url: str, ref: str, problem: str
) -> None:
    assert_refused(
        invoke("--app", ref, "--store", sqlite_url, "submit", "process", "{}"),
        problem,
        exit_code=2,
    )
    assert_refused(invoke("--app", ref, "tasks"), problem, exit_code=2)


def test_submitting_a_task_id_twice_creates_one_task_and_says_so(migrated_url: str) -> None:
    first = run(*_submit(migrated_url, "process", '{"v": 1}', "--task-id", "dup"))
    assert (first.returncode, first.stdout, first.stderr) == (0, "dup\n", "")
    # The same submit again (its priority ignored): the id, and a word that nothing was made.
    same = run(*_submit(migrated_url, "process", '{"v": 1}', "--task-id", "dup", "--priority", "5"))
    assert same.returncode == 0 and same.stdout == "dup\n"
    assert same.stderr == (
        "task 'dup' was submitted before with the same workflow, version and input: nothing "
        "submitted\n"
    )
    # Another input under the same id: an error naming the task and what differs.
    other = run(*_submit(migrated_url, "process", '{"v": 2}', "--task-id", "dup"))
    assert (other.returncode, other.stdout) == (1, "")
    assert other.stderr == (
        "Error: task 'dup' was submitted before with another input: a task id names one submit\n"
    )
    [task] = json_lines(assert_ok(invoke("--store", migrated_url, "tasks", "--json")))
    assert task["task_id"] == "dup" and task["input"] == {"v": 1} and task["priority"] == 0
    assert snapshot(migrated_url).tasks == 1


def test_a_real_process_exits_with_the_documented_codes(migrated_url: str) -> None:
    """Exit status 0 on success, 1 for an error of stepwarden, 2 for a usage error, and never
    a traceback, in a process started like a user starts it."""
    store = ("--store", migrated_url)
    cases: list[tuple[tuple[str, ...], int, str]] = [
        (("--store", "mysql://x", "tasks"), 1, "invalid store URL"),
        (_submit(migrated_url, "nope", "{}"), 1, "unknown workflow 'nope'"),
        (_submit(migrated_url, "process", "{not json"), 2, "not JSON"),
        ((*store, "show", "no-such-task"), 1, "no task 'no-such-task'"),
        (("tasks",), 2, "name the store"),
    ]
    for args, code, problem in cases:
        done = run(*args)
        assert done.returncode == code, (args, done.stderr)
        assert problem in error_line(done.stderr)
        assert done.stdout == ""
    for args in ((*store, "migrate"), (*store, "tasks")):
        done = run(*args)
        assert done.returncode == 0, done.stderr
    _no_tasks(migrated_url)


@pytest.mark.parametrize("role", ["agent", "scheduler"])
def test_a_gone_after_no_longer_than_its_heartbeat_is_refused(migrated_url: str, role: str) -> None:
    for beat, gone in (("1", "1"), ("2", "1.5")):
        assert_refused(
            invoke(
                "--app", APP, "--store", migrated_url, "worker",
                f"--{role}-heartbeat", beat, f"--{role}-gone-after", gone,
            ),
            f"--{role}-gone-after",
            f"must be longer than --{role}-heartbeat",
            exit_code=1,
        )  # fmt: skip
    for option in (f"--{role}-heartbeat", f"--{role}-gone-after"):
        assert_refused(
            invoke("--app", APP, "--store", migrated_url, "worker", option, "0"),
            f"Invalid value for '{option}'",
            exit_code=2,
        )
    command = f"{role}s"
    assert assert_ok(invoke("--store", migrated_url, command)) == (
        f"no {role} instance has registered\n"
    )
    assert assert_ok(invoke("--store", migrated_url, command, "--json")) == ""
