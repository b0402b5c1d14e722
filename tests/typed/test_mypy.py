"""Typed results under mypy --strict, as a user's type checker sees them: the typed shop
(`typed_shop.py`) passes with no error, and every misuse of `misuse.py` is reported on its
line (`# E: <code>`), with no error elsewhere. One mypy run (the project's venv and its
pyproject settings, strict) checks both files."""

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
MARK = re.compile(r"#\s*E:\s*([a-z-]+)\s*$")
ERROR = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*)  \[(?P<code>[a-z-]+)\]$"
)

Errors = dict[str, list[tuple[int, str, str]]]


@pytest.fixture(scope="module")
def errors(request: pytest.FixtureRequest) -> Errors:
    """mypy's errors in the two files, by file name: (line, code, message)."""
    # A cache of its own, kept between runs (the package's modules are analysed once).
    cache = request.config.cache.mkdir("mypy-typed") if request.config.cache else None
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
    assert set(errors) <= {TYPED.name, MISUSE.name}, errors


def test_each_misuse_is_an_error_on_its_line(errors: Errors) -> None:
    expected = {
        (n, m[1])
        for n, text in enumerate(MISUSE.read_text().splitlines(), 1)
        if (m := MARK.search(text))
    }
    assert len(expected) >= 15
    reported = [(line, code) for line, code, _ in errors.get(MISUSE.name, [])]
    shown = "\n".join(f"{line}: [{code}] {message}" for line, code, message in errors[MISUSE.name])
    # One error per marked line, of the marked code, and none on a line not marked.
    assert sorted(reported) == sorted(expected), shown


def test_the_misuse_file_is_outside_the_projects_own_mypy_run() -> None:
    # Its errors are wanted: pyproject's mypy `files` would take it in without the exclude.
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "tests" in config["files"]
    assert any(re.search(pattern, "tests/typed/misuse.py") for pattern in config["exclude"])
    assert not any(re.search(pattern, "tests/typed/typed_shop.py") for pattern in config["exclude"])
