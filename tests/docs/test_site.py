"""The documentation site builds strictly and offline: `mkdocs build --strict` fails on a
broken internal link or anchor, a page left out of the navigation, a Python name the API
reference cannot find, or a snippet whose file is missing; the theme loads no web fonts and
no inventory is fetched. The generated pages (the CLI, the environment variables, the HTTP
API) are checked for what they are generated from."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click

from stepwarden.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def _envvars(command: click.Command) -> set[str]:
    found = {p.envvar for p in command.params if isinstance(p, click.Option) and p.envvar}
    names = {n for n in found if isinstance(n, str)}
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            names |= _envvars(sub)
    return names


def test_the_site_builds_strictly_offline(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    # No proxy reachable: a fetch from outside would fail the build rather than pass unseen.
    env.update({"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"})
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert "WARNING" not in done.stderr, done.stderr[-5000:]
    html = {p: p.read_text() for p in site.rglob("*.html")}
    # The pages load nothing from outside: no web fonts, no script or style from a CDN.
    for page, text in html.items():
        assert "fonts.googleapis.com" not in text, page
        assert not re.search(r'<(script|img)[^>]* src="(https?:)?//', text), page
        assert not re.search(r'<link[^>]* href="(https?:)?//', text), page
    configuration = (site / "reference" / "configuration" / "index.html").read_text()
    for name in _envvars(cli):
        assert name in configuration, name
    # Every variable the package reads is on the page, options' or not.
    package = "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.py"))
    for name in set(re.findall(r"\bSTEPWARDEN_[A-Z_]*[A-Z]\b", package)):
        assert name in configuration, name
    api = (site / "reference" / "http-api" / "index.html").read_text()
    for path in (
        "/api/overview",
        "/api/tasks/{task_id}",
        "/api/schedules",
        "/api/v1/tasks",
        "/api/v1/messages/{task_id}",
    ):
        assert path in api, path
    reference = (site / "reference" / "api" / "index.html").read_text()
    import stepwarden

    for name in stepwarden.__all__:
        if not name.startswith("_"):
            assert f'id="stepwarden.{name}"' in reference, name
    commands = (site / "reference" / "cli" / "index.html").read_text()
    assert isinstance(cli, click.Group)
    for command in cli.commands:
        assert f"stepwarden {command}" in commands, command
    # An option without a default shows none (click's sentinel is not written out).
    assert "UNSET" not in commands and "Sentinel" not in commands
    assert "<code>--app</code>" in commands
    # The old paths of the docs still lead to their pages.
    for old in ("RELIABILITY", "PERFORMANCE", "OPERATIONS"):
        assert (site / old / "index.html").exists(), old


def test_the_readme_stays_short_and_leads_to_the_docs() -> None:
    """What it is, the two commands first, a first workflow, where the docs are: the rest is
    in the site's pages."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    assert readme.index("make demo") < readme.index("make test") < readme.index("## ")
    assert "## A workflow in plain Python" in readme
    assert "make docs" in readme and "(docs/index.md)" in readme
