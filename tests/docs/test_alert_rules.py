"""The alerting rules shipped in docs/prometheus/ are valid for Prometheus's own checker, and
each behaves as its cases say (`promtool test rules`): it fires on what it is about and stays
silent otherwise."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make packages` installs Debian's prometheus"
    return subprocess.run(
        [promtool, *args], cwd=RULES, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_rules_pass_promtools_check() -> None:
    done = _promtool("check", "rules", "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout, done.stdout


def test_each_rule_fires_in_one_case_and_stays_silent_in_another() -> None:
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    cases = yaml.safe_load((RULES / "alerts_test.yml").read_text())
    fired: set[str] = set()
    silent: set[str] = set()
    for test in cases["tests"]:
        for case in test["alert_rule_test"]:
            (fired if case["exp_alerts"] else silent).add(case["alertname"])
    assert fired == names and silent == names, (names, fired, silent)

    done = _promtool("test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout, done.stdout
