"""The `cluster` fixture: real worker processes on the store under test, always reaped."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from .harness import Cluster
from .own_postgres import OwnPostgres, own_postgres


@pytest.fixture
def cluster(store_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(store_url, tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failure that did not already carry the logs (an unexpected exception) gets them."""
    report = yield
    c = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(c, Cluster) and "==== log of" not in report.longreprtext:
        report.sections.append(("scenario logs", c.logs()))
    return report


@pytest.fixture
def pg_cluster(pg_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster on PostgreSQL only, for what only holds with the database's clock."""
    c = Cluster(pg_url, tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def own_pg_cluster(tmp_path: Path) -> Iterator[tuple[Cluster, OwnPostgres]]:
    """A cluster on a PostgreSQL server of the test's own, which the test may stop and start."""
    with own_postgres() as server:
        c = Cluster(server.url, tmp_path)
        try:
            yield c, server
        finally:
            c.close()
