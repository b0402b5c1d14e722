"""A TypeScript agent process (the library of clients/typescript) serving an agent over the
agent protocol of a real `stepwarden dashboard`, the workflows in a Python worker: SIGKILLed
mid-call, its steps are called again by another agent process under the same idempotency
keys and every task finishes; frozen (SIGSTOP) past its step's complete_by, its step is
dispatched again and done by another, and the frozen one, thawed (SIGCONT), changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import stepwarden as sw
from stepwarden import _tokens

from ..support.typescript import compiled_library
from . import ts_scenario_app
from .harness import ROOT

APP = "tests.scenarios.ts_scenario_app:app"
TIMEOUT = 60.0
DASHBOARD_TOKEN = "scenario-dashboard-token-0123"

#: The agent: `hold(gate)` notes its start, waits for the gate file (or its signal), notes
#: its end, and answers with its process id.
AGENT_JS = """
import { appendFileSync, existsSync } from "node:fs";
import { Agent } from "%(library)s";

const note = (what, call) => appendFileSync(process.env.TS_CALLS, JSON.stringify({
  what, pid: process.pid, key: call.idempotencyKey, task: call.taskId, attempt: call.attempt,
}) + "\\n");

async function hold(call, gate) {
  note("start", call);
  while (!existsSync(gate)) {
    if (call.signal.aborted) { note("aborted", call); throw call.signal.reason; }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  note("end", call);
  return { pid: process.pid, key: call.idempotencyKey };
}

const agent = new Agent({
  url: process.env.STEPWARDEN_URL, token: process.env.STEPWARDEN_AGENT_TOKEN,
  agent: "shipping", operations: { hold }, concurrency: 10,
  heartbeatMs: 300, goneAfterMs: 1500, pollMs: 500,
  onRegistered: (instance) => console.log(`serving shipping as ${instance}`),
});
const stop = new AbortController();
process.once("SIGTERM", () => stop.abort());
await agent.run(stop.signal);
"""


@dataclass
class Stage:
    """The server, the Python worker and the TypeScript agents of one scenario."""

    workdir: Path
    library: Path
    store_url: str = ""
    url: str = ""
    token: str = ""
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)
    """The processes the test ends itself."""
    app: sw.App | None = None

    def start(self, name: str, cmd: list[str], **env: str) -> subprocess.Popen[bytes]:
        with open(self.workdir / f"{name}.log", "ab") as log:  # the process keeps its own
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env={**os.environ, "STEPWARDEN_STORE": self.store_url, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"==== {n}\n{self.log(n)[-3000:]}" for n in self.procs)

    def agent(self, name: str) -> subprocess.Popen[bytes]:
        script = self.workdir / "agent.mjs"
        if not script.exists():
            index = (self.library / "src" / "index.js").as_uri()
            script.write_text(AGENT_JS % {"library": index})
        proc = self.start(
            name,
            ["node", str(script)],
            STEPWARDEN_URL=self.url,
            STEPWARDEN_AGENT_TOKEN=self.token,
            TS_CALLS=str(self.workdir / "calls.jsonl"),
        )
        self.until(lambda: "serving shipping as" in self.log(name), f"{name} to serve")
        return proc

    def calls(self) -> list[dict[str, Any]]:
        path = self.workdir / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def until(self, check: Any, what: str, timeout: float = TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            dead = [
                n for n, p in self.procs.items() if p.poll() is not None and n not in self.killed
            ]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} died" if dead else f"timed out after {timeout}s"
                raise AssertionError(f"{why} waiting for {what}\n{self.logs()}")
            time.sleep(0.02)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with_signal(proc, signal.SIGCONT)
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self.app is not None:
            self.app.close()


def with_signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TypeScript library, compiled once for the module."""
    return compiled_library(tmp_path_factory.mktemp("ts-library"))


@pytest.fixture
def stage(tmp_path: Path, library: Path) -> Iterator[Stage]:
    s = Stage(tmp_path, library, store_url=f"sqlite:///{tmp_path}/store.db")
    token, client = _tokens.new_client("shipper", ["agent:shipping"])
    tokens = tmp_path / "api-tokens"
    tokens.write_text(client.line() + "\n")
    tokens.chmod(0o600)
    s.token = token
    from stepwarden.dashboard import bind

    with bind("127.0.0.1", 0) as probe:
        port = probe.getsockname()[1]
    s.url = f"http://127.0.0.1:{port}"
    stepwarden = [str(Path(sys.executable).parent / "stepwarden"), "--store", s.store_url]
    try:
        s.start(
            "server",
            [*stepwarden, "dashboard", APP, "--port", str(port), "--api-tokens", str(tokens)],
            STEPWARDEN_DASHBOARD_TOKEN=DASHBOARD_TOKEN,
        )
        s.start(
            "worker",
            [*stepwarden, "worker", APP, "--roles", "scheduler,supervisor",
             "--poll-interval", "0.05", "--supervisor-interval", "0.2", "--lease-ttl", "1"],
        )  # fmt: skip
        s.until(lambda: "running" in s.log("worker"), "the worker to run")
        s.until(lambda: "Uvicorn running" in s.log("server") or "listening" in s.log("server")
                or _answers(s.url), "the server to answer")  # fmt: skip
        s.app = ts_scenario_app.app  # the client: the App the workers run, on this store
        s.app.store_url = s.store_url
        yield s
    finally:
        s.close()


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/api/v1/openapi.json", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_killed_typescript_agents_calls_are_made_again_by_another_under_their_keys(
    stage: Stage,
) -> None:
    gate = stage.workdir / "gate"
    app = stage.app
    assert app is not None
    doomed = stage.agent("agent-a")
    ids = [app.submit("haul", str(gate), task_id=f"k-{i}") for i in range(4)]
    stage.until(lambda: len({c["task"] for c in stage.calls() if c["what"] == "start"}) == 4,
                "the first agent to call every step")  # fmt: skip
    stage.killed.add("agent-a")
    doomed.kill()  # SIGKILL, mid-call
    doomed.wait(10)
    survivor = stage.agent("agent-b")
    gate.touch()
    results = [app.result(t, timeout=TIMEOUT) for t in ids]
    calls = stage.calls()
    why = f"results {results}\ncalls {calls}\n{stage.logs()}"
    assert all(r["pid"] == survivor.pid for r in results), why
    for task_id, result in zip(ids, results, strict=True):
        keys = {c["key"] for c in calls if c["task"] == task_id}
        assert keys == {result["key"]}, why  # one idempotency key, however many calls
        ended = [c for c in calls if c["task"] == task_id and c["what"] == "end"]
        assert [c["pid"] for c in ended] == [survivor.pid], why
        assert app.status(task_id).process_state == sw.TaskState.PROCESSED, why


def test_a_frozen_typescript_agent_thawed_late_changes_nothing(stage: Stage) -> None:
    gate = stage.workdir / "gate"
    app = stage.app
    assert app is not None
    zombie = stage.agent("agent-a")
    task_id = app.submit("haul", str(gate), task_id="z-1")
    stage.until(lambda: any(c["what"] == "start" for c in stage.calls()), "the call to start")
    with_signal(zombie, signal.SIGSTOP)
    survivor = stage.agent("agent-b")
    # Past the step's complete_by (3 s), the supervisor dispatches it again: the other agent
    # calls it, under the same key.
    stage.until(
        lambda: any(c["what"] == "start" and c["pid"] == survivor.pid for c in stage.calls()),
        "the step to be called again by the other agent",
    )
    gate.touch()
    result = app.result(task_id, timeout=TIMEOUT)
    assert result["pid"] == survivor.pid
    with_signal(zombie, signal.SIGCONT)
    # The thawed agent finds its call's complete_by passed, or the step no longer its own:
    # it says so, and its late word (if any) is refused by the fence.
    stage.until(
        lambda: (
            any(
                line in stage.log("agent-a")
                for line in ("complete_by passed", "no longer held", "aborting the call")
            )
            or any(
                c["what"] in ("end", "aborted") and c["pid"] == zombie.pid for c in stage.calls()
            )
        ),
        "the thawed agent to end its call",
    )
    stage.killed.add("agent-a")
    zombie.terminate()  # its drain writes whatever it still had to say before it exits
    assert zombie.wait(30) == 0, stage.logs()
    task = app.status(task_id)
    steps = app.show(task_id).steps
    why = f"steps {steps}\ncalls {stage.calls()}\n{stage.logs()}"
    assert task.process_state == sw.TaskState.PROCESSED and task.result == result, why
    assert [s.state for s in steps] == [sw.StepState.COMPLETED], why
    assert {c["key"] for c in stage.calls()} == {result["key"]}, why
