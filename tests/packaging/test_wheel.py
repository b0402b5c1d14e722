"""The package as a user installs it: the sdist and the wheel built from it (`python -m
build`), the wheel installed into a new virtual environment with no source tree in sight, and
from there `stepwarden --help`, `stepwarden --version` and the README's first example (a
worker and the script, on SQLite: the migrations must be inside the wheel); the dashboard's
templates and static files too."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import stepwarden

from ..support.readme import PAYMENTS, first_example

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "stepwarden"


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWARDEN_", "PYTHON"))}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_the_wheel_installs_and_runs_the_first_example_without_the_source_tree(
    tmp_path: Path,
) -> None:
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], cwd=tmp_path)
    [wheel] = dist.glob("stepwarden-*.whl")
    [sdist] = dist.glob("stepwarden-*.tar.gz")
    assert wheel.name.startswith(f"stepwarden-{stepwarden.__version__}-")
    assert sdist.name == f"stepwarden-{stepwarden.__version__}.tar.gz"
    # Every file of the package that is not Python code is in the wheel: migrations,
    # queries, templates, static files, the type marker.
    data = {
        str(p.relative_to(PACKAGE.parent))
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    }
    assert data and data <= set(zipfile.ZipFile(wheel).namelist())

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    _run([str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], cwd=tmp_path)
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    command = str(venv / "bin" / "stepwarden")
    assert "worker" in _run([command, "--help"], cwd=app_dir).stdout
    assert stepwarden.__version__ in _run([command, "--version"], cwd=app_dir).stdout
    where = _run(
        [str(venv / "bin" / "python"), "-c", "import stepwarden; print(stepwarden.__file__)"],
        cwd=app_dir,
    ).stdout
    assert str(venv) in where and str(ROOT) not in where

    (app_dir / "shop.py").write_text(first_example() + PAYMENTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWARDEN_", "PYTHON"))}
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen([command, "worker", "shop:app"], cwd=app_dir, env=env,
                              stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        script = subprocess.run(
            [str(venv / "bin" / "python"), "shop.py"],
            cwd=app_dir, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
    assert script.returncode == 0, (
        f"{script.stdout}\n{script.stderr}\n{(tmp_path / 'worker.log').read_text()[-3000:]}"
    )
    shown = _run([command, "--store", "sqlite:///shop.db", "show", "order-42"], cwd=app_dir)
    assert "processed" in shown.stdout
