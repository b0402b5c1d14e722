"""Processes that share an SQLite file wake each other: a commit in one reaches the others'
subscriptions through their Unix datagram sockets (`store/_wake.py`), not only at their next
poll. A lost wake-up costs a poll; a socket left by a dead process is removed. With
`?wake=off` a process uses no socket at all, and finds the work by polling."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import textwrap
from pathlib import Path

import orjson

from stepwarden.records import step_key
from stepwarden.store import CHANNEL_TASKS, open_one
from stepwarden.store._flow import Wakeups
from stepwarden.store._wake import DATAGRAM_LIMIT, SOCKET_SUFFIX, WakeChannel, datagrams, wake_dir

from ..cli import cli_app

ROOT = Path(__file__).resolve().parents[2]

SUBMIT = textwrap.dedent(
    """
    import asyncio, sys
    from stepwarden.records import Submission
    from stepwarden.store import open_one

    async def main() -> None:
        store = open_one(sys.argv[1])
        await store.open(migrate=False)
        await store.submit([Submission(task_id=sys.argv[2], workflow="wf", input="{}",
                                    priority=0, complete_within=30, max_failures=3,
                                    on_failure="stop")])
        await store.close()

    asyncio.run(main())
    """
)


async def test_a_submit_in_another_process_wakes_a_listening_store(sqlite_url: str) -> None:
    store = open_one(sqlite_url)
    await store.open()
    try:
        await store.listen()
        tasks = store.subscribe(CHANNEL_TASKS)
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SUBMIT, sqlite_url, "t1", env=env
        )
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
        # The store polls nothing itself: only a wake-up from the other process's commit
        # reaches this subscription.
        assert await tasks.wait(timeout=30) == [""]
    finally:
        await store.close()
    assert not any(wake_dir(str(_path(sqlite_url))).glob(f"*{SOCKET_SUFFIX}"))


def test_a_socket_left_by_a_dead_process_is_removed_by_the_next_sender(tmp_path: Path) -> None:
    database = tmp_path / "store.db"
    folder = wake_dir(str(database))
    folder.mkdir(mode=0o700)
    left = folder / f"dead-1{SOCKET_SUFFIX}"
    orphan = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    orphan.bind(str(left))
    orphan.close()  # bound, then its process died: the file stays, nobody reads it
    sender = WakeChannel(str(database))
    wake = Wakeups()
    wake.tasks()
    sender.send(wake)
    sender.close()
    assert not left.exists()


def test_wake_ups_are_split_into_datagrams_that_fit() -> None:
    wake = Wakeups()
    keys = [step_key(f"task-{i:06d}", i) for i in range(20000)]  # \x1f: six bytes in JSON
    wake.results(keys)
    wake.requests(["payments", "shipping"])
    sent = datagrams(wake)
    assert all(len(d) <= DATAGRAM_LIMIT for d in sent)
    got: list[str] = []
    for d in sent:
        channel, payloads = orjson.loads(d)
        if channel == "results":
            got.extend(payloads)
    assert got == keys


def test_a_long_database_path_puts_its_sockets_in_the_temporary_directory(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90) / "store.db"
    assert not str(wake_dir(str(deep))).startswith(str(tmp_path))
    assert wake_dir(str(deep)) == wake_dir(str(deep))  # every process finds the same one


def _path(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


async def test_a_folder_not_the_users_own_is_not_used_and_no_write_fails(
    sqlite_url: str,
) -> None:
    """Made by someone else first, or open to others: nobody listens through it (the stores
    poll), and the writes go on; a folder that cannot be listed fails no write either."""
    folder = wake_dir(str(_path(sqlite_url)))
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)
    store = open_one(sqlite_url)
    await store.open()
    try:
        await store.listen()  # refused, said as a warning: polling only
        assert not any(folder.iterdir())
        await store.acquire_lease("supervisor", "a", 30)
        folder.rmdir()
        folder.write_text("not a folder")
        assert await store.acquire_lease("supervisor", "a", 30) == 1
    finally:
        await store.close()


async def test_with_wake_off_no_socket_is_used_and_the_work_is_found_by_polling(
    sqlite_url: str,
) -> None:
    """`?wake=off`: a listening store binds no socket and no folder is made; a commit of
    another process reaches it only through its polls. A worker and a client on such URLs
    still see each task through: the worker's poll finds the task, the client's the result."""
    url = sqlite_url + "?wake=off"
    folder = wake_dir(str(_path(sqlite_url)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    store = open_one(url)
    await store.open()
    try:
        await store.listen()
        tasks = store.subscribe(CHANNEL_TASKS)
        # Another process, wake-ups on (the default): it finds nobody to wake.
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SUBMIT, sqlite_url, "t1", env=env
        )
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
        assert await tasks.wait(timeout=0.5) is None
        assert not folder.exists()
    finally:
        await store.close()

    app = cli_app.build(url)
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "stepwarden",
        "--app",
        "tests.cli.cli_app:app",
        "--store",
        url,
        "worker",
        cwd=ROOT,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        for i in range(3):
            await app.submit_async("process", {"n": i}, task_id=f"p-{i}")
            assert await app.result_async(f"p-{i}", timeout=30) == {
                "stamped": {"n": i},
                "key": f"p-{i}/1",
            }
        assert not folder.exists()
    finally:
        await app.aclose()
        if worker.returncode is None:
            worker.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(worker.communicate(), timeout=60)
    assert worker.returncode == 0, err.decode()
    assert not folder.exists()
