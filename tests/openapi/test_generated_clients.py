"""The application API's OpenAPI document, as a real `stepwarden dashboard` serves it
(/api/v1/openapi.json), through generators nobody here wrote: openapi-python-client makes a
Python package and openapi-typescript (with openapi-fetch for the calls) TypeScript types.
Each generates without a warning, type-checks (mypy --strict, tsc --strict: a misspelt
workflow is refused), and a program written against it submits a task to that server,
long-polls its result (202 while it waits for its event), sends the event and long-polls
again until the task has finished (a `stepwarden worker` process runs it).

The TypeScript packages are those of tests/openapi/typescript/package-lock.json, installed
with `npm ci` when node_modules lacks them (from the registry, or npm's cache offline); all
that is generated or compiled goes in the test's own folder. Node 20+ and npm are needed, as
for the TypeScript library: the test fails without them, it is not skipped."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from stepwarden import _tokens

from ..cli.helpers import REPO, STEPWARDEN, process_env
from ..httpapi.api_app import STORE_ENV

APP = "tests.httpapi.api_app:app"
TYPESCRIPT = Path(__file__).resolve().parent / "typescript"
BIN = Path(sys.executable).parent
DASHBOARD_TOKEN = "openapi-dashboard-token-8d41"

PYTHON_PROGRAM = '''
"""Written against the generated package: the same calls as typescript/use-client.ts."""
import json
import os
import time
from http import HTTPStatus

import httpx

from stepwarden_api import AuthenticatedClient
from stepwarden_api.api.default import send_task_event, submit_task, task_result
from stepwarden_api.models import (
    SendAnswer,
    SendRequest,
    SubmitAnswer,
    SubmitRequest,
    SubmitRequestWorkflow,
    TaskResult,
    TaskStatus,
)


def main() -> None:
    task_id = os.environ["TASK_ID"]
    with AuthenticatedClient(
        base_url=os.environ["STEPWARDEN_URL"],
        token=os.environ["STEPWARDEN_TOKEN"],
        timeout=httpx.Timeout(70.0),
    ) as client:
        body = SubmitRequest(workflow=SubmitRequestWorkflow.APPROVAL, input_=7, task_id=task_id)
        made = submit_task.sync_detailed(client=client, body=body)
        assert isinstance(made.parsed, SubmitAnswer), made
        early = task_result.sync_detailed(task_id, client=client, timeout=1.0)
        assert isinstance(early.parsed, TaskStatus), early
        event = SendRequest(name="approve", payload="ana", event_id=f"{task_id}-approve")
        sent = send_task_event.sync_detailed(task_id, client=client, body=event)
        assert isinstance(sent.parsed, SendAnswer), sent
        deadline = time.monotonic() + 60
        while True:
            polled = task_result.sync_detailed(task_id, client=client, timeout=20.0)
            if polled.status_code == HTTPStatus.OK:
                break
            assert time.monotonic() < deadline, "the task did not finish within 60 s"
        result = polled.parsed
        assert isinstance(result, TaskResult), polled
        seen = {
            "submitted": {"status": int(made.status_code), "task_id": made.parsed.task_id},
            "early": {
                "status": int(early.status_code),
                "state": str(early.parsed.state),
                "finished": early.parsed.finished,
            },
            "sent": {"sent": sent.parsed.sent, "woke": sent.parsed.woke},
            "result": {"state": str(result.state), "result": result.result, "error": result.error},
        }
        print(json.dumps(seen))


if __name__ == "__main__":
    main()
'''

MISSPELT_PYTHON = """
from stepwarden_api.models import SubmitRequest, SubmitRequestWorkflow

SubmitRequest(workflow=SubmitRequestWorkflow.APPROVALL)
"""

MISSPELT_TYPESCRIPT = """
import createClient from "openapi-fetch";
import type { paths } from "./schema.js";

const client = createClient<paths>({ baseUrl: "http://127.0.0.1:1" });
await client.POST("/api/v1/tasks", { body: { workflow: "approvall", input: 7 } });
"""

MYPY_CONFIG = """
[mypy]
strict = True
cache_dir = .mypy_cache

# The generator's own template of the client class (the same whatever the document):
# its __exit__ passes *args: object on to httpx's.
[mypy-stepwarden_api.client]
disable_error_code = arg-type
"""


@dataclass(frozen=True)
class Server:
    url: str
    token: str
    document: Path


def _run(args: list[str], *, cwd: Path, timeout: float = 180, **env: str) -> str:
    done = subprocess.run(
        args,
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = f"$ {' '.join(args)}\n{done.stdout[-20000:]}\n{done.stderr[-20000:]}"
    assert done.returncode == 0, output
    return done.stdout + done.stderr


def _refused(args: list[str], *, cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode != 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A `stepwarden dashboard` serving the application API to one client (submit, read,
    events), and a `stepwarden worker`, of `tests.httpapi.api_app:app` on one SQLite store."""
    here = tmp_path_factory.mktemp("openapi-server")
    token, client = _tokens.new_client("generated", ["submit", "read", "events"], [])
    tokens = here / "api-tokens"
    tokens.write_text(client.line() + "\n")
    tokens.chmod(0o600)
    env = process_env(
        {
            STORE_ENV: f"sqlite:///{here / 'store.db'}",
            "STEPWARDEN_DASHBOARD_TOKEN": DASHBOARD_TOKEN,
            "STEPWARDEN_API_TOKENS": str(tokens),
        }
    )
    logs = {name: (here / f"{name}.log").open("w") for name in ("dashboard", "worker")}
    dashboard = subprocess.Popen(
        [STEPWARDEN, "dashboard", APP, "--port", "0"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=logs["dashboard"],
        text=True,
    )
    worker = subprocess.Popen(
        [STEPWARDEN, "worker", APP, "--poll-interval", "0.05"],
        cwd=REPO,
        env=env,
        stdout=logs["worker"],
        stderr=subprocess.STDOUT,
    )
    try:
        assert dashboard.stdout is not None
        url = dashboard.stdout.readline().rsplit(" ", 1)[-1].strip().rstrip("/")
        assert url.startswith("http://127.0.0.1:"), (here / "dashboard.log").read_text()
        document = here / "openapi.json"
        deadline = time.monotonic() + 30
        while True:  # until it answers (the first line is printed before it serves)
            try:
                answer = httpx.get(f"{url}/api/v1/openapi.json", timeout=10)
                answer.raise_for_status()
                document.write_bytes(answer.content)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the dashboard did not answer"
                assert dashboard.poll() is None, (here / "dashboard.log").read_text()
                time.sleep(0.05)
        yield Server(url, token, document)
        assert worker.poll() is None, (here / "worker.log").read_text()
    finally:
        for proc in (dashboard, worker):
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        assert dashboard.stdout is not None
        dashboard.stdout.close()
        for log in logs.values():
            log.close()


def _check_seen(seen: dict[str, Any], task_id: str) -> None:
    assert seen["submitted"] == {"status": 201, "task_id": task_id}, seen
    # Waiting for its event, the task has not finished within the first long poll.
    assert seen["early"]["status"] == 202 and seen["early"]["finished"] is False, seen
    assert seen["early"]["state"] in ("pending", "processing", "waiting"), seen
    assert seen["sent"]["sent"] is True, seen
    assert seen["result"] == {
        "state": "processed",
        "result": {"order": {"stamped": 7}, "approved_by": "ana"},
        "error": None,
    }, seen


def test_the_python_client_openapi_python_client_generates_works(
    served: Server, tmp_path: Path
) -> None:
    generator = BIN / "openapi-python-client"
    assert generator.exists(), "openapi-python-client is a dev extra: pip install -e '.[dev]'"
    said = _run(
        [str(generator), "generate", "--path", str(served.document), "--meta", "none",
         "--output-path", str(tmp_path / "stepwarden_api")],
        cwd=tmp_path,
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # its ruff, to tidy the code
    )  # fmt: skip
    # Every schema and response of the document was understood: none left out.
    assert "Warning" not in said and "Error" not in said, said
    assert (tmp_path / "stepwarden_api" / "api" / "default" / "submit_task.py").exists()

    (tmp_path / "use_client.py").write_text(PYTHON_PROGRAM)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    mypy = [sys.executable, "-m", "mypy", "--config-file", "mypy.ini"]
    _run([*mypy, "stepwarden_api", "use_client.py"], cwd=tmp_path)
    (tmp_path / "misspelt.py").write_text(MISSPELT_PYTHON)
    refused = _refused([*mypy, "misspelt.py"], cwd=tmp_path)
    assert '"type[SubmitRequestWorkflow]" has no attribute "APPROVALL"' in refused, refused

    task_id = "python-client-1"
    out = _run(
        [sys.executable, "use_client.py"],
        cwd=tmp_path,
        STEPWARDEN_URL=served.url,
        STEPWARDEN_TOKEN=served.token,
        TASK_ID=task_id,
        PYTHONPATH=str(tmp_path),
    )
    _check_seen(json.loads(out.strip().splitlines()[-1]), task_id)


def _typescript_installed() -> bool:
    """Whether node_modules holds every package of package-lock.json, at its version."""
    lock = json.loads((TYPESCRIPT / "package-lock.json").read_text())
    for path, entry in lock["packages"].items():
        manifest = TYPESCRIPT / path / "package.json"
        if path and not (
            manifest.exists()
            and json.loads(manifest.read_text()).get("version") == entry.get("version")
        ):
            return False
    return True


def test_the_typescript_types_openapi_typescript_generates_work_with_openapi_fetch(
    served: Server, tmp_path: Path
) -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "Node 20+ and npm are needed (as for clients/typescript)"
    with (TYPESCRIPT / "package.json").open() as lock:  # one install at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _typescript_installed():
            _run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=TYPESCRIPT)
    modules = TYPESCRIPT / "node_modules"
    work = tmp_path / "ts"
    work.mkdir()
    (work / "node_modules").symlink_to(modules)  # resolved from here, compiled and run
    (work / "package.json").write_text('{"type": "module"}\n')
    said = _run(
        [str(modules / ".bin" / "openapi-typescript"), str(served.document),
         "--output", str(work / "schema.d.ts"),
         # A property with a default is one a request may leave out (its default, true,
         # makes it required in requests too: a submit would have to name its priority).
         "--default-non-nullable", "false"],
        cwd=work,
    )  # fmt: skip
    assert "openapi-typescript 7." in said, said
    assert "⚠" not in said and "warn" not in said.lower(), said

    config = json.loads((TYPESCRIPT / "tsconfig.json").read_text())
    shutil.copy(TYPESCRIPT / "use-client.ts", work / "use-client.ts")
    tsc = str(modules / ".bin" / "tsc")
    compiled = {**config, "files": ["use-client.ts", "schema.d.ts"]}
    compiled["compilerOptions"] = {**config["compilerOptions"], "outDir": "out"}
    (work / "tsconfig.json").write_text(json.dumps(compiled))
    _run([tsc, "-p", "tsconfig.json"], cwd=work)

    (work / "misspelt.ts").write_text(MISSPELT_TYPESCRIPT)
    misspelt = {**config, "files": ["misspelt.ts", "schema.d.ts"]}
    misspelt["compilerOptions"] = {**config["compilerOptions"], "noEmit": True}
    (work / "tsconfig.misspelt.json").write_text(json.dumps(misspelt))
    refused = _refused([tsc, "-p", "tsconfig.misspelt.json"], cwd=work)
    assert "misspelt.ts" in refused and '"approvall"' in refused, refused

    task_id = "typescript-client-1"
    out = _run(
        [node, str(work / "out" / "use-client.js")],
        cwd=work,
        STEPWARDEN_URL=served.url,
        STEPWARDEN_TOKEN=served.token,
        TASK_ID=task_id,
    )
    _check_seen(json.loads(out.strip().splitlines()[-1]), task_id)
