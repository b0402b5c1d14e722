"""Running the command line (in this process, or as a real `stepwarden` process) and looking at
the database behind a store URL without going through stepwarden."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import orjson
from click.testing import CliRunner, Result

from stepwarden.cli import cli

from ..rawsql import is_sqlite as is_sqlite
from ..rawsql import sql as sql
from ..rawsql import sqlite_path as sqlite_path
from .cli_app import APP_STORE_ENV

REPO = Path(__file__).resolve().parents[2]
APP = "tests.cli.cli_app:app"


def _console_script() -> str:
    beside = Path(sys.executable).with_name("stepwarden")
    found = str(beside) if beside.exists() else shutil.which("stepwarden")
    assert found, "the stepwarden console script is not installed"
    return found


STEPWARDEN = _console_script()


def commands() -> Iterator[tuple[list[str], click.Command]]:
    """The group and each of its commands, with the words that name it."""
    yield [], cli
    assert isinstance(cli, click.Group)
    for name, command in sorted(cli.commands.items()):
        yield [name], command


def cli_envvars() -> set[str]:
    """Every environment variable the command line reads."""
    found: set[str] = set()
    for _, command in commands():
        for param in command.params:
            if isinstance(param.envvar, str):
                found.add(param.envvar)
            elif param.envvar:
                found.update(param.envvar)
    return found


def invoke(*args: str, env: Mapping[str, str] | None = None, input: str | None = None) -> Result:
    """Run the command line in this process, as `stepwarden ARGS` (`input`: its stdin)."""
    return CliRunner().invoke(
        cli, list(args), env=dict(env or {}), input=input, prog_name="stepwarden"
    )


def run(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `stepwarden ARGS` as a real process, from the repository root, with none of the
    command line's environment variables but those in `env`."""
    return subprocess.run(
        [STEPWARDEN, *args],
        cwd=REPO,
        env=process_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def process_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    unset = cli_envvars() | {APP_STORE_ENV}
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(extra or {})
    return env


def error_line(stderr: str) -> str:
    """The one `Error: ...` line of a failed command; fails unless there is exactly one, it is
    the last line, and no traceback was printed."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, stderr
    assert stderr.rstrip("\n").splitlines()[-1] == errors[0], stderr
    return errors[0]


def assert_refused(result: Result, *fragments: str, exit_code: int | None = None) -> str:
    """The command failed cleanly: a non-zero exit through click (no exception escaped, so no
    traceback), and one error line naming the problem. Returns that line."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), result.exc_info
    if exit_code is not None:
        assert result.exit_code == exit_code, result.output
    assert result.stdout == "", result.stdout
    line = error_line(result.stderr)
    for fragment in fragments:
        assert fragment in line, line
    return line


def assert_ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.exc_info)
    return result.stdout


def json_lines(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


# -- the database behind a store URL, read and changed without stepwarden ----------------


@dataclass(frozen=True)
class Snapshot:
    """What a store holds: the migrations recorded, and how many rows of each kind."""

    schema: list[tuple[Any, ...]]
    tasks: int
    steps: int
    events: int


def snapshot(url: str) -> Snapshot:
    if is_sqlite(url) and not Path(sqlite_path(url)).exists():
        return Snapshot([], 0, 0, 0)

    def count(table: str) -> int:
        return int(sql(url, f"SELECT count(*) FROM {table}")[0][0])

    return Snapshot(
        schema=sql(url, "SELECT version, name FROM stepwarden_schema ORDER BY version"),
        tasks=count("stepwarden_tasks"),
        steps=count("stepwarden_steps"),
        events=count("stepwarden_events"),
    )
