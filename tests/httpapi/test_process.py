"""`stepwarden dashboard APP --api-tokens FILE` as a real process: it says how many clients it
knows, serves the application API to them, refuses a wrong tokens file before serving, and
stops on SIGTERM while a client follows a task's status messages."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.cli.helpers import REPO, STEPWARDEN, error_line, process_env, run

from .api_app import STORE_ENV
from .conftest import DASHBOARD_TOKEN, Tokens

APP = "tests.httpapi.api_app:app"


def test_the_dashboard_serves_the_application_api_and_stops_with_a_stream_open(
    sqlite_url: str, tokens: Tokens
) -> None:
    env = process_env({STORE_ENV: sqlite_url, "STEPWARDEN_DASHBOARD_TOKEN": DASHBOARD_TOKEN})
    env["STEPWARDEN_API_TOKENS"] = str(tokens.path)
    proc = subprocess.Popen(
        [STEPWARDEN, "dashboard", APP, "--port", "0"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().rsplit(" ", 1)[-1].strip().rstrip("/")
        said = proc.stdout.readline().strip()
        assert said == f"application API (/api/v1): 3 client(s) of {tokens.path}"
        with httpx.Client(base_url=url, timeout=20) as client:
            deadline = time.monotonic() + 20
            while True:  # until it answers (the first line is printed before it serves)
                try:
                    client.get("/api/v1/openapi.json").raise_for_status()
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the dashboard did not answer"
                    time.sleep(0.05)
            made = client.post(
                "/api/v1/tasks",
                json={"workflow": "echo", "input": 1, "task_id": "t-1", "reply_to": "r"},
                headers=tokens.auth("billing"),
            )
            assert made.status_code == 201, made.text
            # No worker runs: the task stays pending, its stream open after "received".
            with client.stream(
                "GET", "/api/v1/messages/t-1", headers=tokens.auth("reader")
            ) as stream:
                lines = stream.iter_lines()
                assert next(lines) == "retry: 2000"
                assert next(lines) == ""
                assert next(lines).startswith("id: ")
                assert next(lines) == "event: received"
                proc.send_signal(signal.SIGTERM)
                started = time.monotonic()
                rest = list(lines)  # the stream ends as the server stops
            assert rest[0].startswith("data: ") and '"kind":"received"' in rest[0]
        proc.wait(15)
        assert time.monotonic() - started < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert proc.returncode == -signal.SIGTERM  # it ends by the signal, as a server does


def test_a_wrong_tokens_file_ends_the_command_before_it_serves(
    sqlite_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "api-tokens"
    path.write_text("billing submit,ship " + "0" * 64 + "\n")
    done = run(
        "dashboard", APP, "--port", "0", "--token", DASHBOARD_TOKEN, "--api-tokens", str(path),
        env={STORE_ENV: sqlite_url},
    )  # fmt: skip
    assert done.returncode == 2
    line = error_line(done.stderr)
    assert "--api-tokens" in line and "line 1: unknown scope 'ship'" in line
    assert "http://" not in done.stdout  # it did not start serving
