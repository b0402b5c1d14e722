"""The suite's net for the PostgreSQL server's warnings holds: a deliberate warning fails the
test that caused it, whether a store of the test's process received it or only the server's
log shows it (a worker process's connection), on the suite's server and on a test's own.

The deliberate warnings go to a cluster of these tests' own, found by its port as the suite
finds its server's log: the log of the server the suite runs on stays free of warnings."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ..scenarios.own_postgres import OwnPostgres, own_postgres
from ..server_warnings import LOG_ENV

ROOT = Path(__file__).resolve().parents[2]

INNER = """
import subprocess
import sys

from stepwarden.store import open_store


async def test_a_store_warned(pg_url):
    store = open_store(pg_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            await tx.execute("BEGIN")  # WARNING: there is already a transaction in progress
    finally:
        await store.close()


def test_another_process_warned(pg_url):
    # As a worker process would: a connection of its own, named as the store names it.
    script = (
        "import psycopg, sys; "
        "psycopg.connect(sys.argv[1], application_name='stepwarden', autocommit=True)"
        ".execute('COMMIT')"
    )
    subprocess.run([sys.executable, "-c", script, pg_url], check=True)


async def test_a_notice_is_not_a_warning(pg_url):
    store = open_store(pg_url)
    await store.open()
    try:
        async with store.transaction() as tx:  # NOTICE: relation already exists, skipping
            await tx.execute("CREATE TABLE IF NOT EXISTS stepwarden_tasks (x int)")
    finally:
        await store.close()
"""


@pytest.fixture(scope="module")
def warned_server() -> Iterator[OwnPostgres]:
    """A cluster these tests warn on purpose."""
    with own_postgres(warnings_fail=False) as server:
        yield server


@pytest.fixture
def inner(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, warned_server: OwnPostgres
) -> pytest.Pytester:
    """A test session of its own, with the suite's fixtures, in a process of its own, on
    `warned_server`."""
    monkeypatch.setenv("STEPWARDEN_TEST_POSTGRES_URL", warned_server.url)
    monkeypatch.delenv(LOG_ENV, raising=False)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    pytester.makeconftest(
        "from tests.conftest import _no_store_warnings, pg_template, pg_url  # noqa: F401\n"
    )
    pytester.makepyfile(test_inner=INNER)
    return pytester


def run(inner: pytest.Pytester, *args: str) -> pytest.RunResult:
    return inner.runpytest_subprocess(
        "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
        "-o", "asyncio_default_fixture_loop_scope=function", "-W", "error", *args,
    )  # fmt: skip


def test_a_warning_to_a_store_of_the_tests_process_fails_the_test(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOG_ENV, "off")  # the store's own report alone
    result = run(inner, "-k", "store_warned or notice")
    # The test ran to its end and fails at its teardown; a notice is not a warning.
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_a_store_warned*",
            "*warned a store of this test:*",
            "*PostgreSQL WARNING (25001): there is already a transaction in progress*",
        ]
    )


def test_a_warning_in_the_servers_log_fails_the_test(inner: pytest.Pytester) -> None:
    result = run(inner)
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_a_store_warned*",
            "*ERROR at teardown of test_another_process_warned*",
            "*warned a connection to sw_t_*",
            "*WARNING:  there is no transaction in progress*",
        ]
    )


def warn(url: str, application: str) -> None:
    with psycopg.connect(url, application_name=application, autocommit=True) as conn:
        conn.execute("COMMIT")  # WARNING: there is no transaction in progress


def test_a_warning_on_a_tests_own_server_fails_it(warned_server: OwnPostgres) -> None:
    with (
        pytest.raises(AssertionError, match="warned a stepwarden connection"),
        own_postgres() as server,
    ):
        warn(server.url, "stepwarden")
    # Only the engine's connections count: another application's warning is not its own.
    log = warned_server.log()
    since = log.end()
    warn(warned_server.url, "psql")
    assert log.stepwarden_warnings(since) == []
    warn(warned_server.url, "stepwarden")
    assert len(log.stepwarden_warnings(since)) == 1
