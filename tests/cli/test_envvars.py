"""Every option also reads an environment variable, `--help` names it, and setting it has the
option's effect (docs/howto/operating.md: "`stepwarden COMMAND --help` names each one")."""

from __future__ import annotations

from pathlib import Path

import click
import orjson
import pytest

from . import cli_app
from .helpers import (
    APP,
    assert_ok,
    assert_refused,
    commands,
    error_line,
    invoke,
    json_lines,
    run,
    snapshot,
)

# They print something and exit: there is nothing for an environment variable to configure.
NOT_SETTINGS = {"help", "version"}
# The arguments a command needs to get as far as reading its options.
REQUIRED_ARGS = {
    "submit": ["process"],
    "show": ["t-1"],
    "why": ["t-1"],
    "skip": ["t-1"],
    "send": ["t-1", "go"],
    "check-upgrade": [APP],
    "export-tasks": ["tasks.json"],
    "fork": ["t-1", "--from", "1"],
    "bulk": ["retry"],
}


def _options() -> list[tuple[list[str], click.Option]]:
    return [
        (words, param)
        for words, command in commands()
        for param in command.params
        if isinstance(param, click.Option) and param.name not in NOT_SETTINGS
    ]


def test_every_option_has_an_environment_variable_named_in_its_help() -> None:
    helps = {
        tuple(words): " ".join(assert_ok(invoke(*words, "--help")).split())
        for words, _ in commands()
    }
    seen: dict[str, list[str]] = {}
    for words, option in _options():
        name = option.opts[0]
        assert isinstance(option.envvar, str) and option.envvar.startswith("STEPWARDEN_"), name
        assert option.show_envvar, name
        text = helps[tuple(words)]
        assert name in text and f"env var: {option.envvar}" in text, (words, name)
        seen.setdefault(option.envvar, []).append(name)
    # The walk did find the options (the docs name these two), and one variable is never
    # shared by two different options.
    assert {"STEPWARDEN_STORE", "STEPWARDEN_ROLES"} <= set(seen)
    assert all(len(set(names)) == 1 for names in seen.values()), seen
    # Every command's own help is reachable from the group's.
    for words, _ in commands():
        if words:
            assert words[0] in helps[()]


@pytest.mark.parametrize(
    ("words", "option"),
    [
        pytest.param(words, option, id=" ".join([*words, option.opts[0]]))
        for words, option in _options()
        if option.type is not click.STRING
    ],
)
def test_a_typed_option_reads_its_environment_variable(
    words: list[str], option: click.Option
) -> None:
    """A value the option's type refuses, given only through the environment variable, is
    refused in the option's name: so the variable is what the option reads."""
    assert isinstance(option.envvar, str)
    command = words or ["tasks"]
    args = [*command, *REQUIRED_ARGS.get(command[0], [])]
    line = assert_refused(
        invoke(*args, env={option.envvar: "not-a-valid-value"}),
        f"Invalid value for '{option.opts[0]}' (env var: '{option.envvar}')",
        exit_code=2,
    )
    assert "not-a-valid-value" in line


def test_the_store_comes_from_stepwarden_store_unless_store_is_given(
    populated: str, tmp_path: Path
) -> None:
    env = {"STEPWARDEN_STORE": populated}
    assert [t["task_id"] for t in json_lines(assert_ok(invoke("tasks", "--json", env=env)))] == [
        "ok-1",
        "bad-1",
        "later-1",
    ]
    assert "process_state  error" in assert_ok(invoke("show", "bad-1", env=env))
    # --store wins over the variable: an empty store is listed instead.
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert_ok(invoke("--store", other, "migrate"))
    assert assert_ok(invoke("--store", other, "tasks", "--json", env=env)) == ""
    # A bad URL in the variable is reported like one given as --store.
    assert_refused(
        invoke("tasks", env={"STEPWARDEN_STORE": "mysql://x"}), "invalid store URL 'mysql://x'"
    )
    # The same in a real process.
    done = run("tasks", "--state", "error", env=env)
    assert done.returncode == 0 and "bad-1" in done.stdout and "ok-1" not in done.stdout


def test_tasks_options_read_their_environment_variables(populated: str) -> None:
    def listed(**env: str) -> list[str]:
        settings = {"STEPWARDEN_STORE": populated, **{f"STEPWARDEN_{k}": v for k, v in env.items()}}
        return [t["task_id"] for t in json_lines(assert_ok(invoke("tasks", env=settings)))]

    assert listed(JSON="1") == ["ok-1", "bad-1", "later-1"]
    assert listed(JSON="1", STATE="error") == ["bad-1"]
    assert listed(JSON="1", LIMIT="1") == ["ok-1"]
    assert listed(JSON="1", WORKFLOW="other") == []
    show = invoke("show", "bad-1", env={"STEPWARDEN_STORE": populated, "STEPWARDEN_JSON": "yes"})
    assert orjson.loads(assert_ok(show))["task_id"] == "bad-1"


def test_submit_options_read_their_environment_variables(migrated_url: str) -> None:
    env = {
        "STEPWARDEN_APP": APP,
        "STEPWARDEN_STORE": migrated_url,
        "STEPWARDEN_TASK_ID": "from-env",
        "STEPWARDEN_PRIORITY": "7",
    }
    assert assert_ok(invoke("submit", "process", '{"a": 1}', env=env)) == "from-env\n"
    [task] = json_lines(assert_ok(invoke("--store", migrated_url, "tasks", "--json")))
    assert (task["task_id"], task["priority"], task["input"]) == ("from-env", 7, {"a": 1})
    # Options given on the command line win over the variables.
    assert assert_ok(invoke("submit", "process", "--task-id", "flag", env=env)) == "flag\n"
    assert snapshot(migrated_url).tasks == 2


def test_worker_roles_and_agents_read_their_environment_variables() -> None:
    """A worker refuses roles and agents it does not know, named through the variables (in a
    real process: a worker that started instead would run until stopped)."""
    env = {"STEPWARDEN_APP": APP}
    done = run("worker", env={**env, "STEPWARDEN_ROLES": "scheduler,bogus"}, timeout=30)
    assert done.returncode == 1
    assert error_line(done.stderr) == (
        "Error: unknown role(s) bogus; choose from scheduler, agents, supervisor"
    )
    done = run("worker", env={**env, "STEPWARDEN_AGENTS": "desk,ghost"}, timeout=30)
    assert done.returncode == 1
    assert error_line(done.stderr) == "Error: unknown agent(s): ghost (declared: desk)"


def test_the_application_store_is_used_unless_a_store_is_named(
    store_url: str, tmp_path: Path
) -> None:
    """`--app` alone uses the application's own store; `--store` or STEPWARDEN_STORE
    overrides it (its help: "The store URL, overriding the application's")."""
    own = f"sqlite:///{tmp_path / 'own.db'}"
    env = {cli_app.APP_STORE_ENV: own, "STEPWARDEN_APP": APP}
    assert_ok(invoke("--store", store_url, "migrate"))

    def submit(task_id: str, *args: str, **extra: str) -> None:
        done = run(*args, "submit", "process", "{}", "--task-id", task_id, env={**env, **extra})
        assert (done.returncode, done.stdout) == (0, f"{task_id}\n"), done.stderr

    submit("to-own")
    submit("to-option", "--store", store_url)
    submit("to-variable", STEPWARDEN_STORE=store_url)
    submit("option-wins", "--store", store_url, STEPWARDEN_STORE=own)

    def listed(*args: str) -> list[str]:
        done = run(*args, "tasks", "--json", env=env)
        assert done.returncode == 0, done.stderr
        return [t["task_id"] for t in json_lines(done.stdout)]

    assert listed() == ["to-own"]
    assert listed("--store", store_url) == ["to-option", "to-variable", "option-wins"]
