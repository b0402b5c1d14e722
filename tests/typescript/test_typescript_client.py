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

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "typescript"
NODE_MAJOR = 20


def _tool(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed: the TypeScript library needs Node {NODE_MAJOR}+"
    return found


def _run(args: list[str], *, cwd: Path, timeout: float, **env: str) -> str:
    done = subprocess.run(
        args,
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = f"$ {' '.join(args)}\n{done.stdout[-20000:]}\n{done.stderr[-20000:]}"
    assert done.returncode == 0, output
    return done.stdout


def _installed() -> bool:
    """Whether node_modules holds every package of package-lock.json, at its version."""
    lock = json.loads((PACKAGE / "package-lock.json").read_text())
    for path, entry in lock["packages"].items():
        if not path:
            continue
        manifest = PACKAGE / path / "package.json"
        if not manifest.exists():
            return False
        if json.loads(manifest.read_text()).get("version") != entry.get("version"):
            return False
    return True


def installed_dependencies(npm: str | None = None) -> None:
    """The package's dependencies installed with `npm ci` when node_modules lacks them (one
    install at a time: the orders demo's test may install them too)."""
    npm = npm or _tool("npm")
    with (PACKAGE / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _installed():
            install = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"]
            _run(install, cwd=PACKAGE, timeout=300)


def compiled_library(out: Path) -> Path:
    """The library and its tests compiled with its pinned TypeScript into `out` (never into
    the source tree), its dependencies installed first when node_modules lacks them; `out`
    (an ES module package: `out/src/index.js` is the library)."""
    node = _tool("node")
    npm = _tool("npm")
    version = _run([node, "--version"], cwd=PACKAGE, timeout=30).strip()
    major = re.match(r"v(\d+)\.", version)
    assert major and int(major[1]) >= NODE_MAJOR, f"Node {NODE_MAJOR}+ is needed, not {version}"
    installed_dependencies(npm)
    tsc = str(PACKAGE / "node_modules" / ".bin" / "tsc")
    _run([tsc, "-p", str(PACKAGE), "--outDir", str(out)], cwd=ROOT, timeout=120)
    (out / "package.json").write_text('{"type": "module"}\n')  # as the package's own
    return out


def test_the_typescript_library_compiles_and_its_tests_pass(tmp_path: Path) -> None:
    node = _tool("node")
    out = compiled_library(tmp_path / "dist")
    tests = sorted(str(p) for p in (out / "test").glob("*.test.js"))
    assert len(tests) >= 2, tests
    _run(
        [node, "--test", "--test-reporter=spec", *tests],
        cwd=PACKAGE,
        timeout=240,
        STEPWARDEN_PYTHON=sys.executable,
        STEPWARDEN_REPOSITORY=str(ROOT),
        NO_COLOR="1",
    )
