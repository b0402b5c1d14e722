"""The group's options (`--app`, `--store`, `--log-level`, `--log-format`) are taken before
the command or after it, as a new user writes them."""

from __future__ import annotations

from pathlib import Path

from .helpers import APP, assert_ok, assert_refused, invoke, json_lines


def _ids(url: str) -> list[str]:
    return [t["task_id"] for t in json_lines(assert_ok(invoke("tasks", "--json", "--store", url)))]


def test_the_application_and_the_store_are_taken_after_the_command(migrated_url: str) -> None:
    assert_ok(
        invoke(
            "submit", "process", "{}", "--task-id", "after-1", "--app", APP, "--store", migrated_url
        )
    )
    assert_ok(
        invoke(
            "submit",
            "--app=" + APP,
            "process",
            "{}",
            "--task-id=after-2",
            f"--store={migrated_url}",
        )
    )
    assert sorted(_ids(migrated_url)) == ["after-1", "after-2"]


def test_given_before_and_after_the_command_the_one_after_wins(
    migrated_url: str, tmp_path: Path
) -> None:
    refused = f"sqlite:///{tmp_path / 'no-such-folder' / 'store.db'}"
    assert_ok(
        invoke(
            "--app",
            APP,
            "--store",
            refused,
            "submit",
            "process",
            "{}",
            "--task-id",
            "w-1",
            "--store",
            migrated_url,
        )
    )
    assert _ids(migrated_url) == ["w-1"]


def test_a_command_option_whose_value_reads_like_a_group_option_keeps_it(
    migrated_url: str,
) -> None:
    """`--task-id --app` names the task `--app`: the group is given no application."""
    assert_ok(
        invoke(
            "--app", APP, "--store", migrated_url, "submit", "process", "{}", "--task-id", "--app"
        )
    )
    assert _ids(migrated_url) == ["--app"]


def test_the_error_without_an_application_names_a_form_that_works(migrated_url: str) -> None:
    line = assert_refused(invoke("submit", "process", "{}", "--store", migrated_url), exit_code=2)
    assert "--app MODULE:ATTRIBUTE" in line
    assert_ok(invoke("submit", "process", "{}", "--store", migrated_url, "--app", APP))


def test_a_group_option_after_the_command_without_its_value_is_a_usage_error() -> None:
    assert_refused(invoke("tasks", "--store"), "Option '--store' requires an argument", exit_code=2)
