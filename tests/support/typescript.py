"""The TypeScript client, its dependencies installed and the library compiled once for the tests
that drive it."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from . import ROOT

PACKAGE = ROOT / "clients" / "typescript"


NODE_MAJOR = 20


def run_command(args: list[str], *, cwd: Path, timeout: float, **env: str) -> str:
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


def installed_dependencies(npm: str | None = None) -> None:
    """The package's dependencies installed with `npm ci` when node_modules lacks them (one
    install at a time: the orders demo's test may install them too)."""
    npm = npm or tool("npm")
    with (PACKAGE / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not node_installed():
            install = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"]
            run_command(install, cwd=PACKAGE, timeout=300)


def compiled_library(out: Path) -> Path:
    """The library and its tests compiled with its pinned TypeScript into `out` (never into
    the source tree), its dependencies installed first when node_modules lacks them; `out`
    (an ES module package: `out/src/index.js` is the library)."""
    node = tool("node")
    npm = tool("npm")
    version = run_command([node, "--version"], cwd=PACKAGE, timeout=30).strip()
    major = re.match(r"v(\d+)\.", version)
    assert major and int(major[1]) >= NODE_MAJOR, f"Node {NODE_MAJOR}+ is needed, not {version}"
    installed_dependencies(npm)
    tsc = str(PACKAGE / "node_modules" / ".bin" / "tsc")
    run_command([tsc, "-p", str(PACKAGE), "--outDir", str(out)], cwd=ROOT, timeout=120)
    (out / "package.json").write_text('{"type": "module"}\n')  # as the package's own
    return out


def tool(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed: the TypeScript library needs Node {NODE_MAJOR}+"
    return found


def node_installed() -> bool:
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
