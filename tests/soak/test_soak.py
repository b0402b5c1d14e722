"""The crash soak, short: a few hundred orders, a process SIGKILLed every two seconds, payment
faults on, and on PostgreSQL every database connection cut mid-run. The long soak is run by
hand (docs/RELIABILITY.md has its figures): `python -m tests.soak.soak --help`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .soak import check_holds

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_short_soak_loses_nothing_and_repeats_nothing(store_url: str, tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "tests.soak.soak",
        "--store", store_url,
        "--workdir", str(tmp_path),
        "--orders", "300",
        "--rate", "40",  # placed over 7.5 s: the run meets several kills, however fast it is
        "--kill-every", "2",
        "--timeout", "240",
        "--json",
    ]  # fmt: skip
    if store_url.startswith("postgresql"):
        cmd += ["--cut-connections", "--duration-hint", "10"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.stdout, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0, json.dumps(summary, indent=2)
    assert summary["ids_in_equal_ids_out"] and summary["lost"] == 0
    assert summary["duplicate_effects_applied"] == 0 and summary["charged_not_processed"] == 0
    assert summary["hold_violations"] == 0 and summary["store_intact"]
    assert summary["kills_total"] >= 3  # the run did meet crashes
    assert summary["processed"] + summary["compensated"] == 300


def test_the_hold_check_finds_overlaps_and_stale_writes() -> None:
    fine = [
        ("t", "claim", 1, None),
        ("t", "dispatch", 1, 1),
        ("t", "release", 1, None),
        ("t", "claim", 2, None),
        ("t", "dispatch", 2, 1),
    ]
    assert check_holds(fine) == []
    overlap = [("t", "claim", 1, None), ("t", "claim", 2, None)]
    assert check_holds(overlap) == ["t: claimed as attempt 2 while 1 held it"]
    stale = [*fine, ("t", "dispatch", 1, 2)]
    assert check_holds(stale) == ["t: step 2 dispatched under attempt 1 while 2 held it"]
    # The supervisor queues a gone agent's step again: under its holder's attempt, or held
    # by none; never under an attempt that no longer holds it.
    requeued = [*fine, ("t", "requeue", 2, 1), ("t", "release", 2, None), ("t", "requeue", 2, 1)]
    assert check_holds(requeued) == []
    late = [*fine, ("t", "requeue", 1, 1)]
    assert check_holds(late) == ["t: step 1 queued again under attempt 1 while 2 held it"]
