"""The JSON API and /metrics, against the real dashboard process: the metrics say what the
store holds, and the API answers as its OpenAPI document (/openapi.json) says."""

from __future__ import annotations

import signal
import socket
import stat
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from prometheus_client.parser import text_string_to_metric_families
from schemathesis.core.result import Err

import stepwarden as sw
from tests.cli.helpers import error_line, run, sql

from ..support.dashboard import AGENTS
from .conftest import TOKEN, Served, run_async, submit_orders, wait_for
from .dash_app import build, order

Operation = schemathesis.APIOperation[Any, Any, Any, Any]
"""An operation of the OpenAPI document (the library leaves its type parameters open)."""


EXAMPLES = 4
"""Generated requests per operation and mode: few, so that the test stays fast."""


def test_the_metrics_say_what_the_store_holds(served: Served) -> None:
    served.flag.touch()
    submit_orders(served.store_url, {"order-3": 3})
    wait_for("order-3 processed", lambda: served.state("order-3") == "processed")
    wait_for("the agent registered", lambda: sql(served.store_url, AGENTS))

    response = served.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    in_db = dict(
        sql(
            served.store_url,
            "SELECT process_state, count(*) FROM stepwarden_tasks GROUP BY process_state",
        )
    )
    assert in_db == {"error": 2, "processed": 1}
    for state in sw.TaskState:
        assert value("stepwarden_tasks", state=str(state)) == in_db.get(str(state), 0)
    assert value("stepwarden_oldest_pending_age_seconds") == 0  # none pending

    # What happens is counted by the workers (their own /metrics): counts read from the rows
    # kept would drop when retention deletes rows, so the dashboard serves none.
    names = {name for name, _ in samples}
    for gone in (
        "stepwarden_steps_started",
        "stepwarden_steps_completed",
        "stepwarden_steps_failed",
        "stepwarden_steps_retried",
        "stepwarden_step_reassignments",
        "stepwarden_step_duration_seconds_count",
        "stepwarden_deadlines_missed",
    ):
        assert gone not in names

    # The worker's agent instance, as the registry has it.
    [(instance, capacity)] = sql(served.store_url, AGENTS)
    agent = {"agent": "desk", "stepwarden_instance": instance}
    assert value("stepwarden_agent_breaker_state", **agent, state="closed") == 1
    assert value("stepwarden_agent_breaker_state", **agent, state="open") == 0
    assert value("stepwarden_agent_capacity", **agent) == capacity
    assert value("stepwarden_agent_alive", **agent) == 1
    assert value("stepwarden_supervisor_lease_remaining_seconds") > 0


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_an_operator_skips_a_failed_step_and_retries_the_task(served: Served) -> None:
    auth = bearer(TOKEN)
    path = "/api/tasks/order-2"
    refused = served.post(f"{path}/pause", headers=auth, json={"reason": "hold it"})
    assert refused.status_code == 409  # not when the task is in error
    assert refused.json()["outcome"] == {
        "task_id": "order-2",
        "applied": False,
        "before": "error",
        "after": "error",
        "message": "cannot pause a task that is error (only when pending, processing, waiting)",
    }
    skip = {"seq": 1, "result": {"stamped": "by hand", "card": {"$secret": "x"}}, "by": "bob"}
    done = served.post(f"{path}/skip", headers=auth, json=skip)
    assert done.status_code == 200, done.text
    assert done.json()["outcome"]["after"] == "error"
    retried = served.post(f"{path}/retry", headers=auth, json={"reason": "skipped by hand"})
    assert retried.json()["outcome"] == {
        "task_id": "order-2",
        "applied": True,
        "before": "error",
        "after": "pending",
        "message": "done",
    }
    wait_for("order-2 processed", lambda: served.state("order-2") == "processed")
    task = served.get(path).json()
    assert task["task"]["result"] == {"stamped": "by hand", "card": "***"}
    actions = [
        (e["detail"]["action"], e["detail"]["by"], e["detail"]["reason"])
        for e in task["events"]
        if e["kind"] == "operator"
    ]  # newest first
    assert actions == [("retry", "dashboard", "skipped by hand"), ("skip", "bob", None)]
    # `by` is what the caller says; how it proved it is recorded beside it.
    assert {e["detail"]["authenticated"] for e in task["events"] if e["kind"] == "operator"} == {
        "api-token"
    }
    assert served.post(f"{path}/retry", headers=auth).status_code == 409
    assert served.post("/api/tasks/no-such-task/retry", headers=auth).status_code == 404


def test_without_a_token_one_is_made_and_written_to_a_file_only_its_owner_reads(
    served: Served, tmp_path: Path
) -> None:
    """`stepwarden --store URL dashboard`: no application, no token. The token made is
    written to a new file of mode 0600 under $XDG_STATE_HOME/stepwarden, whose path is
    printed (never the token), and removed when the dashboard stops."""
    other = Served(store_url=served.store_url, flag=served.flag)
    state = tmp_path / "state"
    proc = other.start(
        "--store", served.store_url, "dashboard", "--port", "0",
        read=True, env={"XDG_STATE_HOME": str(state)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().rsplit(" ", 1)[-1].strip().rstrip("/")
        line = proc.stdout.readline()
        assert line.startswith("API token (for operator actions) written to "), line
        written = Path(line.rsplit(" ", 1)[-1].strip())
        assert written.parent == state / "stepwarden"
        assert stat.S_IMODE(written.stat().st_mode) == 0o600
        assert stat.S_IMODE(written.parent.stat().st_mode) == 0o700
        token = written.read_text().strip()
        assert len(token) >= 24 and token != TOKEN and token not in line
        other.url = url
        wait_for("the second dashboard", other.answers)
        dry_run = {"action": "cancel", "task_ids": ["order-1"], "dry_run": True}
        wrong = other.post(
            "/api/actions", json=dry_run, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert wrong.status_code == 401
        right = other.post(
            "/api/actions", json=dry_run, headers={"Authorization": f"Bearer {token}"}
        )
        assert right.status_code == 200, right.text
        assert right.json()["outcomes"][0]["message"] == "would cancel: error -> cancelled"
    finally:
        other.stop()
    assert proc.returncode == -signal.SIGTERM  # it ends by the signal, as a server does
    assert not written.exists()  # the token died with the process, and so did its file


def test_other_hosts_and_other_sites_are_not_served(served: Served) -> None:
    # A page of another site whose name resolves to this machine (DNS rebinding).
    assert served.get("/api/tasks", headers={"Host": "evil.example"}).status_code == 421
    assert served.get("/api/tasks", headers={"Host": "localhost"}).status_code == 200
    # Signing in sends the operator back to a page of the dashboard, never elsewhere.
    for target, expected in [
        ("/tasks/order-1", "/tasks/order-1"),
        ("//evil.example/", "/"),
        ("/\t/evil.example/", "/"),
        ("/\\evil.example", "/"),
        ("https://evil.example/", "/"),
    ]:
        response = served.post("/login", data={"token": TOKEN, "next": target})
        assert response.status_code == 303, target
        assert response.headers["location"] == expected, target
        assert "stepwarden_session" in response.cookies
    refused = served.post("/login", data={"token": "wrong", "next": "/"})
    assert refused.status_code == 401 and "stepwarden_session" not in refused.cookies
    # Pages may not be framed by another site, and run no inline script.
    headers = served.get("/").headers
    assert headers["x-frame-options"] == "DENY"
    assert "script-src 'self'" in headers["content-security-policy"]


def test_the_api_matches_its_openapi_document(served: Served) -> None:
    schema = schemathesis.openapi.from_url(served.url + "/openapi.json")
    operations: list[Operation] = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        operations.append(result.ok())
    assert {op.label for op in operations} >= {
        "GET /api/overview",
        "GET /api/tasks",
        "GET /api/tasks/{task_id}",
        "GET /api/why/{task_id}",
        "POST /api/tasks/{task_id}/{action}",
        "POST /api/tasks/{task_id}/skip",
        "POST /api/actions",
        "POST /api/bulk",
        "GET /api/alerts",
        "GET /api/agents",
        "GET /metrics",
    }
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for operation in operations:
        modes = [schemathesis.GenerationMode.POSITIVE]
        if list(operation.iter_parameters()) or operation.get_request_payload_content_types():
            modes.append(schemathesis.GenerationMode.NEGATIVE)  # something to get wrong
        for mode in modes:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,  # the same requests each run: no flaky CI
                suppress_health_check=list(HealthCheck),
            )
            def check(case: schemathesis.Case[Operation]) -> None:
                case.call_and_validate(headers=headers)

            check()


def test_a_store_that_cannot_be_served_ends_the_command_with_one_error_line(
    tmp_path: Path,
) -> None:
    missing = run("--store", f"sqlite:///{tmp_path / 'none.db'}", "dashboard", "--port", "0")
    assert missing.returncode == 1
    assert "there is no database at" in error_line(missing.stderr)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        busy = run("--store", f"sqlite:///{tmp_path / 'x.db'}", "dashboard", "--port", port)
    assert busy.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in error_line(busy.stderr)


def test_the_api_shows_each_task_s_version_and_the_versions_no_scheduler_runs(
    served: Served,
) -> None:
    """A deploy that declares version 2 of `process` submits an order; the worker serving the
    store runs version 1 only: the order waits, and the overview (page and API) says which
    (workflow, version) no alive scheduler runs, until it is cancelled."""

    async def submit_version_2() -> None:
        app = build(served.store_url, None)

        @app.workflow(name="process", version=2)
        async def process_v2(ctx: sw.Context, order: dict[str, Any]) -> Any:
            raise AssertionError("no scheduler runs version 2")

        try:
            await app.submit_async("process", order(7), task_id="order-v2")
        finally:
            await app.aclose()

    run_async(submit_version_2())
    assert served.get("/api/tasks/order-v2").json()["task"]["version"] == 2
    assert served.get("/api/tasks/order-1").json()["task"]["version"] == 1
    listed = {t["task_id"]: t["version"] for t in served.get("/api/tasks").json()["tasks"]}
    assert listed["order-v2"] == 2 and listed["order-1"] == 1
    twos = served.get("/api/tasks", params={"workflow": "process", "version": 2}).json()
    assert [t["task_id"] for t in twos["tasks"]] == ["order-v2"]
    for bad in ("0", "two", str(2**31)):
        refused = served.get("/api/tasks", params={"version": bad})
        assert refused.status_code == 400 and "version" in refused.json()["error"], refused.text

    def stranded() -> list[dict[str, Any]]:
        return list(served.get("/api/overview").json()["unrunnable"])

    [entry] = wait_for("order-v2 listed as unrunnable", stranded)
    assert {k: entry[k] for k in ("workflow", "version", "pending", "compensating")} == {
        "workflow": "process",
        "version": 2,
        "pending": 1,
        "compensating": 0,
    }
    assert (
        entry["oldest_created_at"] == served.get("/api/tasks/order-v2").json()["task"]["created_at"]
    )
    page = served.get("/").text
    assert "Workflow versions no scheduler runs" in page
    table = page.split('<table id="unrunnable">', 1)[1].split("</table>", 1)[0]
    assert ">process</a></td>" in table and "<td>2</td>" in table, table
    task_page = served.get("/tasks/order-v2").text
    assert '<span id="task-version">2</span>' in task_page

    document = served.get("/openapi.json").json()["components"]["schemas"]
    assert "unrunnable" in document["Overview"]["required"]
    assert document["TaskSummary"]["properties"]["version"]["minimum"] == 1
    assert set(document["UnrunnableVersion"]["properties"]) == {
        "workflow",
        "version",
        "pending",
        "compensating",
        "oldest_created_at",
    }

    cancelled = served.post("/api/tasks/order-v2/cancel", headers=bearer(TOKEN), json={})
    assert cancelled.status_code == 200, cancelled.text
    assert stranded() == []
