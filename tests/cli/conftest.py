"""Fixtures of the command-line tests: a clean environment, migrated and empty stores, and a
store holding tasks in each finished state and one pending."""

from __future__ import annotations

import asyncio

import pytest

import stepwarden as sw

from . import cli_app
from .helpers import assert_ok, cli_envvars, invoke

FAST = sw.WorkerOptions(
    poll_interval=0.01,
    supervisor_interval=0.05,
    lease_ttl=1.0,
    backoff=sw.Backoff(initial=0.01, maximum=0.05),
    drain_timeout=5,
)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No STEPWARDEN_* setting of the developer's shell leaks into a test, and the shared
    application's store is restored after a test that pointed it elsewhere (`--store` sets
    the loaded application's store_url)."""
    for name in cli_envvars() | {cli_app.APP_STORE_ENV}:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cli_app.app, "store_url", cli_app.app.store_url)


@pytest.fixture
def migrated_url(store_url: str) -> str:
    """`store_url` after `stepwarden migrate` (PostgreSQL's is migrated already; SQLite's
    is a new file)."""
    assert_ok(invoke("--store", store_url, "migrate"))
    return store_url


async def _populate(url: str) -> None:
    app = cli_app.build(url)
    worker = sw.Worker(app, FAST)
    running = asyncio.create_task(worker.run())
    try:
        await app.submit_async("process", {"n": 1}, task_id="ok-1")
        await app.submit_async("process", {"refuse": "no stamp"}, task_id="bad-1")
        assert await app.result_async("ok-1", timeout=20) == {
            "stamped": {"n": 1},
            "key": "ok-1/1",
        }
        with pytest.raises(sw.TaskFailed, match="no stamp"):
            await app.result_async("bad-1", timeout=20)
    finally:
        worker.stop.set()
        await asyncio.wait_for(running, 30)
    try:
        await app.submit_async("process", {"n": 2}, task_id="later-1", priority=5)
    finally:
        await app.aclose()


@pytest.fixture
def populated(migrated_url: str) -> str:
    """A store holding `ok-1` (processed), `bad-1` (error: its step failed permanently) and
    `later-1` (pending, submitted after the worker stopped), in that order."""
    asyncio.run(_populate(migrated_url))
    return migrated_url
