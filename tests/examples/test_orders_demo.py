"""The orders demo, as `make demo` runs it but smaller: faults on, a worker killed mid-run,
some orders undone by their compensations."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rawsql import sql

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_loses_nothing_and_applies_nothing_twice(store_url: str, tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "examples.orders.demo",
        "--orders", "60",
        "--workers", "2",
        "--kill-at", "0.2",
        "--declined", "0.1",
        "--undeliverable", "0.1",
        "--unapproved", "0.3",
        "--store", store_url,
        "--workdir", str(tmp_path),
        "--timeout", "120",
        "--json",
    ]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    logs = "\n".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("*.log")))
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{logs}"
    summary = json.loads(run.stdout)  # stdout is the JSON summary and nothing else
    assert summary["submitted"] == 60
    assert summary["lost"] == 0
    assert summary["processed"] + summary["compensated"] + summary["error"] == 60
    assert summary["duplicate_effects_applied"] == 0
    assert summary["workers_killed"] == 1
    # The saga holds: an order is charged (and not refunded) if and only if it was processed;
    # declined and undeliverable orders were undone (a refund where a charge was applied).
    assert summary["charged_not_processed"] == 0
    assert summary["compensated"] >= 1 and summary["refunds_applied"] >= 1
    # Orders above the threshold waited for a person's approval: most came, the others timed
    # out and were undone, and every order that waited is one or the other.
    assert summary["awaiting_approval"] >= 1 and summary["approved"] >= 1
    assert summary["approval_timeouts"] <= summary["compensated"]
    assert summary["approved"] + summary["approval_timeouts"] >= summary["awaiting_approval"]


@pytest.mark.slow
def test_demo_with_the_typescript_shipping_agent(sqlite_url: str, tmp_path: Path) -> None:
    """The shipping agent served by the TypeScript agent runner over the agent protocol,
    killed with SIGKILL beside a worker and replaced: nothing lost, nothing applied twice,
    every shipment made by a TypeScript instance."""
    cmd = [
        sys.executable,
        "-m",
        "examples.orders.demo",
        "--orders", "40",
        "--workers", "2",
        "--kill-at", "0.3",
        "--undeliverable", "0.1",
        "--ts-shipping",
        "--store", sqlite_url,
        "--workdir", str(tmp_path),
        "--timeout", "120",
        "--json",
    ]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    logs = "\n".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("*.log")))
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{logs}"
    summary = json.loads(run.stdout)
    assert summary["lost"] == 0 and summary["duplicate_effects_applied"] == 0
    assert summary["processed"] + summary["compensated"] + summary["error"] == 40
    assert summary["charged_not_processed"] == 0
    assert summary["shipping_agent"] == "typescript"
    assert summary["shipping_agents_killed"] == 1
    shipped = sql(
        sqlite_url,
        "SELECT locked_by FROM stepwarden_steps WHERE agent = 'shipping' AND state = 'completed'",
    )
    served = [row[0] for row in shipped]
    assert served and all(by.startswith("shipper/") for by in served), served


def _noted_lines(text: str) -> dict[str, str]:
    """The summary's lines that have an explanation: name -> explanation."""
    found = re.findall(r"^  ([a-z][a-z ]*?)\s{2,}\S+\s+(\(.*\))$", text, re.M)
    return {name: note for name, note in found}


def test_demo_explains_its_lines_as_the_home_page_shows_and_removes_its_work_folder(
    tmp_path: Path,
) -> None:
    """The home page's summary is the real one: each line explained there is explained so
    by the demo; after a good run its temporary work folder is gone, and kept with --keep."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    cmd = [
        sys.executable, "-m", "examples.orders.demo",
        "--orders", "10", "--workers", "1", "--no-kill", "--no-faults", "--timeout", "60",
    ]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    page = (ROOT / "docs" / "index.md").read_text()
    [shown] = re.findall(r"```\n(  submitted.*?)```", page, re.S)
    assert _noted_lines(shown) == _noted_lines(run.stdout), run.stdout
    assert "OK: nothing lost, nothing applied twice" in run.stdout
    assert list(tmp_path.glob("stepwarden-demo-*")) == [], run.stdout
    assert "workdir" not in run.stdout

    kept = subprocess.run(
        [*cmd, "--keep"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert kept.returncode == 0, f"{kept.stdout}\n{kept.stderr}"
    [folder] = tmp_path.glob("stepwarden-demo-*")
    assert (folder / "shop.db").exists()
    assert re.search(rf"^  workdir\s+{re.escape(str(folder))}$", kept.stdout, re.M), kept.stdout
