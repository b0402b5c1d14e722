"""Typed results under mypy --strict, as a user's type checker sees them: the typed shop
(`typed_shop.py`) passes with no error, and every misuse of `misuse.py` is reported on its
line (`# E: <code>`), with no error elsewhere; so is every role's call outside its port of
the store (`misuse_ports.py`). One mypy run (the project's venv and its pyproject settings,
strict) checks the three files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TYPED = HERE / "typed_shop.py"
MISUSE = HERE / "misuse.py"
MISUSE_PORTS = HERE / "misuse_ports.py"
MARK = re.compile(r"#\s*E:\s*([a-z-]+)\s*$")
ERROR = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*)  \[(?P<code>[a-z-]+)\]$"
)

Errors = dict[str, list[tuple[int, str, str]]]


@pytest.fixture(scope="module")
def errors(request: pytest.FixtureRequest) -> Errors:
    """mypy's errors in the three files, by file name: (line, code, message)."""
    # A cache of its own, kept between runs (the package's modules are analysed once); none
    # where pytest keeps no cache (`-p no:cacheprovider`: the config then has no `cache`).
    kept = getattr(request.config, "cache", None)
    cache = kept.mkdir("mypy-typed") if kept is not None else None
    env = {**os.environ, "MYPYPATH": str(ROOT / "src")}  # this tree's package, not another
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--no-color-output",
        "--no-error-summary",
        "--show-error-codes",
        "--hide-error-context",
        "--no-pretty",
        *(["--cache-dir", str(cache)] if cache else []),
        str(TYPED.relative_to(ROOT)),
        str(MISUSE.relative_to(ROOT)),
        str(MISUSE_PORTS.relative_to(ROOT)),
    ]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    # 0: no error; 1: errors found (misuse.py must have some); anything else: mypy failed.
    assert run.returncode == 1, f"mypy exited {run.returncode}\n{run.stdout}\n{run.stderr}"
    found: Errors = {}
    for line in run.stdout.splitlines():
        m = ERROR.match(line)
        if m is None:
            assert ": note: " in line, f"an unexpected line from mypy: {line}"
            continue
        name = Path(m["path"]).name
        found.setdefault(name, []).append((int(m["line"]), m["code"], m["message"]))
    return found


def test_the_typed_shop_passes_mypy_strict(errors: Errors) -> None:
    assert errors.get(TYPED.name, []) == [], errors.get(TYPED.name)
    assert set(errors) <= {TYPED.name, MISUSE.name, MISUSE_PORTS.name}, errors


def _marked(path: Path) -> set[tuple[int, str]]:
    """The lines of a misuse file marked `# E: <code>`, each with its code."""
    lines = path.read_text().splitlines()
    return {(n, m[1]) for n, text in enumerate(lines, 1) if (m := MARK.search(text))}


def _reported(errors: Errors, path: Path) -> tuple[list[tuple[int, str]], str]:
    found = errors.get(path.name, [])
    shown = "\n".join(f"{line}: [{code}] {message}" for line, code, message in found)
    return [(line, code) for line, code, _ in found], shown


def test_each_misuse_is_an_error_on_its_line(errors: Errors) -> None:
    expected = _marked(MISUSE)
    assert len(expected) >= 15
    reported, shown = _reported(errors, MISUSE)
    # One error per marked line, of the marked code, and none on a line not marked.
    assert sorted(reported) == sorted(expected), shown


PORTS = ("ApplicationPort", "ReadPort", "SchedulerPort", "SupervisorPort", "AgentPort")
"""The roles' ports, each of which asks, in `misuse_ports.py`, a method of every other one."""


def test_a_role_asking_the_store_outside_its_port_is_an_error_on_its_line(
    errors: Errors,
) -> None:
    expected = _marked(MISUSE_PORTS)
    reported, shown = _reported(errors, MISUSE_PORTS)
    # Each role's own calls, every store serving every port, each actor given its own: no
    # error; each marked line one error of its code.
    assert sorted(reported) == sorted(expected), shown
    # From each role's port, a method of each of the four other ports is missing.
    missing = [
        message
        for _, code, message in errors[MISUSE_PORTS.name]
        if code == "attr-defined" and "has no attribute" in message
    ]
    for port in PORTS:
        asked = [m for m in missing if m.startswith(f'"{port}" has no attribute')]
        # The application's port also lacks a transaction: only one database serves it.
        extra = (
            ['"ApplicationPort" has no attribute "transaction"']
            if port == "ApplicationPort"
            else []
        )
        assert len(asked) == len(PORTS) - 1 + len(extra), (port, asked)
        assert all(e in asked for e in extra), (port, asked)
    # A channel's messages from an id on (no task named) are one database's.
    needs_task = [m for _, code, m in errors[MISUSE_PORTS.name] if code == "call-arg"]
    assert needs_task == [
        'Missing named argument "task_id" for "outbox" of "ApplicationPort"',
        'Missing named argument "task_id" for "outbox" of "ShardedStore"',
    ], needs_task
    # What `App.store()` gives refuses the actors' calls: the scheduler's, the
    # supervisor's, the agents'.
    assert sum(m.startswith('"ApplicationStore" has no attribute') for m in missing) == 3
    # An actor given another role's port, or a store of shards (which serves none).
    assert sum(code == "arg-type" for _, code, _ in errors[MISUSE_PORTS.name]) == 8
    # Three actors refuse a store of shards; it has no transaction and reads no channel.
    assert sum('"ShardedStore"' in m for _, _, m in errors[MISUSE_PORTS.name]) == 5


def test_the_misuse_file_is_outside_the_projects_own_mypy_run() -> None:
    # Its errors are wanted: pyproject's mypy `files` would take it in without the exclude.
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "tests" in config["files"]
    for misuse in ("tests/typed/misuse.py", "tests/typed/misuse_ports.py"):
        assert any(re.search(pattern, misuse) for pattern in config["exclude"]), misuse
    assert not any(re.search(pattern, "tests/typed/typed_shop.py") for pattern in config["exclude"])
