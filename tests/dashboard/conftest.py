"""Fixtures of the dashboard tests: a store holding orders (on SQLite and on PostgreSQL), a
real worker process and a real `stepwarden dashboard` process serving it, and a headless
Chromium (Debian's, at /usr/bin/chromium) driven by Playwright."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from stepwarden.store import open_store
from tests.cli.helpers import REPO, STEPWARDEN, process_env
from tests.conftest import STORES, pg_database, unique

from .dash_app import FLAG_ENV, STORE_ENV, build, order

T = TypeVar("T")
APP = "tests.dashboard.dash_app:app"
TOKEN = "test-token-8c1f5e"
CHROMIUM = os.environ.get("STEPWARDEN_TEST_CHROMIUM", "/usr/bin/chromium")
TIMEOUT = 20.0


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end from synchronous code, in a thread of its own: Playwright's
    synchronous API keeps an event loop in the main thread."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def wait_for(what: str, check: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    """Poll `check` until it returns something true; that value. Fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@dataclass
class Served:
    """A store of orders, and the processes serving and running them."""

    store_url: str
    flag: Path
    url: str = ""
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return process_env({STORE_ENV: self.store_url, FLAG_ENV: str(self.flag)})

    def start(
        self, *args: str, read: bool = False, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [STEPWARDEN, *args],
            cwd=REPO,
            env={**self.env(), **(env or {})},
            stdout=subprocess.PIPE if read else subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.processes.append(proc)
        return proc

    def start_worker(self) -> None:
        self.start("worker", APP, "--poll-interval", "0.02", "--supervisor-interval", "0.1")

    def start_dashboard(self) -> None:
        proc = self.start("dashboard", APP, "--port", "0", "--token", TOKEN, read=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the first line names the address (printed at once)
        assert "http://127.0.0.1:" in line, line
        self.url = line.rsplit(" ", 1)[-1].strip().rstrip("/")
        wait_for("the dashboard to answer", self.answers)

    def answers(self) -> bool:
        try:
            return httpx.get(self.url + "/api/overview", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.processes:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.url + path, timeout=10, **kwargs)

    def state(self, task_id: str) -> str:
        response = self.get(f"/api/tasks/{task_id}")
        assert response.status_code == 200, response.text
        return str(response.json()["task"]["process_state"])

    def in_state(self, task_id: str, state: str) -> Callable[[], bool]:
        """A check for `wait_for`: the task is in `state`."""
        return lambda: self.state(task_id) == state


@contextlib.contextmanager
def store_of_kind(kind: str, tmp: Path, pg_template: str) -> Iterator[str]:
    """A new, migrated store of `kind` (sqlite or postgres) for a whole test module."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp / 'store.db'}"

        async def migrate() -> None:
            store = open_store(url)
            await store.open(migrate=True)
            await store.close()

        run_async(migrate())
        yield url
        return
    with pg_database(unique("sw_dash"), pg_template) as url:
        yield url


def submit_orders(store_url: str, ids: dict[str, int]) -> None:
    async def go() -> None:
        app = build(store_url, None)
        try:
            for task_id, n in ids.items():
                await app.submit_async("process", order(n), task_id=task_id)
        finally:
            await app.aclose()

    run_async(go())


@pytest.fixture(scope="module", params=STORES)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pg_template: str
) -> Iterator[Served]:
    """Orders `order-1` and `order-2` in error (their stamp failed: the flag file is missing),
    a worker process running, and the dashboard serving the store."""
    tmp = tmp_path_factory.mktemp(f"dash-{request.param}")
    with store_of_kind(request.param, tmp, pg_template) as url:
        env = Served(store_url=url, flag=tmp / "stamp-pad-refilled")
        try:
            env.start_worker()  # it starts while the dashboard does
            env.start_dashboard()
            submit_orders(url, {"order-1": 1, "order-2": 2})
            for task_id in ("order-1", "order-2"):
                wait_for(f"{task_id} in error", env.in_state(task_id, "error"))
            yield env
        finally:
            env.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Module-scoped: Playwright's synchronous API holds an event loop in the main thread
    # while it runs, and the tests of other modules need that thread free for theirs.
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT * 1000)
    try:
        yield context.new_page()
    finally:
        context.close()
