"""Real processes of the examples' services for their tests: a web service on a socket this
process bound (so its address is known before it starts, and requests wait in the socket's
queue until it serves), and `stepwarden worker`."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tests.cli.helpers import STEPWARDEN, process_env

LEFT_PENDING = "Task was destroyed but it is pending"


@contextlib.contextmanager
def process(
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log: Path,
    pass_fds: Sequence[int] = (),
    exits: Sequence[int] = (0,),
) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose output goes to `log`; SIGTERM at the end, after which it must exit
    cleanly (a status of `exits`, no traceback, nothing left pending): its shutdown is part
    of what is tested."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(args),
            cwd=cwd,
            env=process_env(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=pass_fds,
        )
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    proc.wait()
    text = log.read_text()
    assert proc.returncode in exits, f"{args[0]} exited {proc.returncode}:\n{text}"
    assert LEFT_PENDING not in text, text
    assert "Traceback" not in text, text


@contextlib.contextmanager
def asgi_server(target: str, *, cwd: Path, env: Mapping[str, str], log: Path) -> Iterator[str]:
    """`uvicorn TARGET` on a free port of 127.0.0.1; its base URL. At SIGTERM uvicorn runs
    the application's shutdown, then ends by that signal."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        port = sock.getsockname()[1]
        args = ["uvicorn", target, "--fd", str(sock.fileno()), "--no-access-log"]
        with process(
            [sys.executable, "-m", *args],
            cwd=cwd,
            env=env,
            log=log,
            pass_fds=[sock.fileno()],
            exits=(0, -signal.SIGTERM),
        ):
            yield f"http://127.0.0.1:{port}"
    assert "Application shutdown complete." in log.read_text()


@contextlib.contextmanager
def worker(app: str, *, cwd: Path, env: Mapping[str, str], log: Path) -> Iterator[None]:
    """`stepwarden worker APP`: scheduler, agents and supervisor."""
    with process([STEPWARDEN, "worker", app], cwd=cwd, env=env, log=log):
        yield
