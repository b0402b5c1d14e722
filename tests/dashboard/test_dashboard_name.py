"""A dashboard started with `--store` alone has no App of its own: it names itself, on its first
line and on every page, by the store it serves, without the URL's user, password or options."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from stepwarden.store import open_store
from tests.cli.helpers import REPO, STEPWARDEN, process_env

from .conftest import TOKEN


def _migrated(url: str) -> None:
    async def migrate() -> None:
        store = open_store(url)
        await store.open(migrate=True)
        await store.close()

    asyncio.run(migrate())


def _named(url: str) -> tuple[str, str]:
    """The first line of `stepwarden --store URL dashboard`, and its overview page."""
    proc = subprocess.Popen(
        [STEPWARDEN, "--store", url, "dashboard", "--port", "0", "--token", TOKEN],
        cwd=REPO,
        env=process_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().rstrip()
        port = line.rstrip("/").rsplit(":", 1)[-1]
        assert port.isdigit(), (line, proc.stderr and proc.stderr.read())
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=20).text
        return line, page
    finally:
        proc.terminate()
        proc.communicate(timeout=15)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_dashboard_of_a_store_alone_is_named_by_its_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        path = tmp_path / "shop.db"
        url = f"sqlite:///{path}?synchronous=normal"
        shown = f"sqlite:///{path}"
    else:
        base = str(request.getfixturevalue("pg_url"))
        parts = urlsplit(base)
        where = f"{parts.hostname}:{parts.port}{parts.path}"
        url = f"postgresql://{parts.username}:not-shown@{where}?application_name=hidden"
        shown = f"postgresql://{where}"
    _migrated(url)
    line, page = _named(url)
    assert line.startswith(f"stepwarden dashboard of {shown}: http://127.0.0.1:"), line
    assert f'<span class="app">{shown}</span>' in page
    for hidden in ("stepwarden-dashboard", "not-shown", "postgres@", "hidden", "synchronous"):
        assert hidden not in line and hidden not in page.split("</header>")[0], hidden
