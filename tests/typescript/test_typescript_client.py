"""The TypeScript library (clients/typescript) compiles with its pinned TypeScript, and its
tests pass (`node --test`): they start a real `stepwarden dashboard` and `stepwarden worker`
of `tests.typescript.ts_app:app` with this Python, and serve its `shipping` agent with the
library's agent runner.

The package's dependencies are installed with `npm ci` when node_modules does not hold the
versions package-lock.json names (from the registry, or npm's cache offline); the library
and its tests are compiled into this test's own folder, never into the source tree. Node 20
or later and npm are needed, as PostgreSQL is: the test fails without them, it is not
skipped."""

from __future__ import annotations

import sys
from pathlib import Path

from ..support import ROOT
from ..support.typescript import (
    PACKAGE,
    compiled_library,
    run_command,
    tool,
)


def test_the_typescript_library_compiles_and_its_tests_pass(tmp_path: Path) -> None:
    node = tool("node")
    out = compiled_library(tmp_path / "dist")
    tests = sorted(str(p) for p in (out / "test").glob("*.test.js"))
    assert len(tests) >= 2, tests
    run_command(
        [node, "--test", "--test-reporter=spec", *tests],
        cwd=PACKAGE,
        timeout=240,
        STEPWARDEN_PYTHON=sys.executable,
        STEPWARDEN_REPOSITORY=str(ROOT),
        NO_COLOR="1",
    )
