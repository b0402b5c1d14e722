"""`tasks` and `show`: what an operator reads, as text and as JSON a script can parse."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import orjson

from stepwarden.records import AgentBeat
from stepwarden.store import open_one

from .helpers import APP, assert_ok, assert_refused, invoke, json_lines

TASK_FIELDS = {
    "task_id",
    "workflow",
    "version",
    "input",
    "process_state",
    "locked_by",
    "complete_by",
    "failure_count",
    "max_failures",
    "attempt",
    "priority",
    "result",
    "error",
    "created_at",
    "updated_at",
    "finished_at",
}
STEP_FIELDS = {
    "seq",
    "name",
    "agent",
    "operation",
    "state",
    "attempt",
    "complete_by",
    "idempotency_key",
    "input",
    "result",
    "error",
    "locked_by",
    "tries",
    "created_at",
    "claimed_at",
    "finished_at",
}


def _time(value: Any) -> datetime:
    assert isinstance(value, str), value
    return datetime.fromisoformat(value)


def _tasks(url: str, *args: str) -> list[dict[str, Any]]:
    return json_lines(assert_ok(invoke("--store", url, "tasks", "--json", *args)))


def _show(url: str, task_id: str) -> dict[str, Any]:
    data = orjson.loads(assert_ok(invoke("--store", url, "show", task_id, "--json")))
    assert isinstance(data, dict)
    return data


def test_tasks_json_is_one_object_a_line_with_every_field(populated: str) -> None:
    rows = _tasks(populated)
    assert [r["task_id"] for r in rows] == ["ok-1", "bad-1", "later-1"]  # oldest first
    for row in rows:
        assert set(row) >= TASK_FIELDS, TASK_FIELDS - set(row)
        assert row["workflow"] == "process" and row["max_failures"] == 2
        assert _time(row["created_at"]) <= _time(row["updated_at"])
    ok, bad, later = rows
    assert ok["process_state"] == "processed" and ok["attempt"] == 1
    assert ok["result"] == {"stamped": {"n": 1}, "key": "ok-1/1"} and ok["error"] is None
    assert bad["process_state"] == "error" and bad["result"] is None
    assert "refused: no stamp" in bad["error"]
    for finished in (ok, bad):
        assert finished["failure_count"] == 0
        # A finished task is no longer held by anyone.
        assert finished["locked_by"] is None and finished["complete_by"] is None
        assert _time(finished["finished_at"]) >= _time(finished["created_at"])
    assert later["process_state"] == "pending" and later["attempt"] == 0
    assert later["input"] == {"n": 2} and later["priority"] == 5
    assert later["locked_by"] is None and later["complete_by"] is None
    assert later["finished_at"] is None and later["failure_count"] == 0


def test_tasks_filters_by_state_workflow_and_limit(populated: str) -> None:
    assert [r["task_id"] for r in _tasks(populated, "--state", "error")] == ["bad-1"]
    assert [r["task_id"] for r in _tasks(populated, "--state", "pending")] == ["later-1"]
    assert [r["task_id"] for r in _tasks(populated, "--limit", "2")] == ["ok-1", "bad-1"]
    assert _tasks(populated, "--workflow", "other") == []
    assert len(_tasks(populated, "--workflow", "process")) == 3


def test_tasks_as_text_counts_each_state_and_lists_the_chosen_ones(populated: str) -> None:
    out = assert_ok(invoke("--store", populated, "tasks", "--state", "error"))
    counts, header, *rows = out.splitlines()
    for expected in ("pending: 1", "processing: 0", "processed: 1", "error: 1"):
        assert expected in counts, counts
    assert header.split()[:4] == ["TASK", "WORKFLOW", "VER", "STATE"]
    assert len(rows) == 1 and rows[0].split()[:4] == ["bad-1", "process", "1", "error"]


def test_show_json_has_the_task_its_steps_and_its_history(populated: str) -> None:
    bad = _show(populated, "bad-1")
    assert set(bad) >= TASK_FIELDS, TASK_FIELDS - set(bad)
    assert bad["process_state"] == "error" and bad["failure_count"] == 0
    assert bad["locked_by"] is None and bad["complete_by"] is None
    [step] = bad["steps"]
    assert set(step) >= STEP_FIELDS, STEP_FIELDS - set(step)
    assert (step["seq"], step["name"], step["agent"], step["operation"]) == (
        1,
        "desk.stamp",
        "desk",
        "stamp",
    )
    assert step["state"] == "failed" and step["attempt"] == 1 and step["tries"] == 1
    assert step["idempotency_key"] == "bad-1/1"
    assert step["input"] == [{"refuse": "no stamp"}] and step["result"] is None
    assert "PermanentError: refused: no stamp" in step["error"]
    assert _time(step["created_at"]) <= _time(step["claimed_at"]) <= _time(step["finished_at"])
    _time(step["complete_by"])
    kinds = [e["kind"] for e in bad["events"]]
    assert "alert" in kinds, kinds
    for event in bad["events"]:
        assert set(event) == {"id", "at", "kind", "detail"}
        _time(event["at"])

    ok = _show(populated, "ok-1")
    [step] = ok["steps"]
    assert step["state"] == "completed" and step["error"] is None
    assert step["result"] == {"stamped": {"n": 1}, "key": "ok-1/1"}
    assert ok["result"] == step["result"]

    later = _show(populated, "later-1")
    assert later["process_state"] == "pending" and later["steps"] == []


def test_show_as_text_names_the_state_each_step_and_the_alert(populated: str) -> None:
    out = assert_ok(invoke("--store", populated, "show", "bad-1"))
    assert "process_state  error" in out
    assert "failure_count  0 of max 2" in out
    assert "desk.stamp" in out and "key bad-1/1" in out and "attempt 1" in out
    assert "PermanentError: refused: no stamp" in out
    assert "history (newest first):" in out and "alert" in out


def test_show_of_an_unknown_task_fails_clearly(migrated_url: str) -> None:
    for extra in ([], ["--json"]):
        assert_refused(
            invoke("--store", migrated_url, "show", "no-such-task", *extra),
            "no task 'no-such-task'",
            exit_code=1,
        )


def test_tasks_as_text_keeps_its_columns_aligned_for_a_long_task_id(migrated_url: str) -> None:
    long_id = "signup-" + "4" * 25  # 32 characters, as an id made of a name and a uuid
    for task_id in (long_id, "s-1"):
        assert_ok(
            invoke("--app", APP, "--store", migrated_url, "submit", "process", "{}",
                   "--task-id", task_id)
        )  # fmt: skip
    _, header, *rows = assert_ok(invoke("--store", migrated_url, "tasks")).splitlines()
    assert len(rows) == 2 and {r.split()[0] for r in rows} == {long_id, "s-1"}
    for column in ("WORKFLOW", "STATE", "UPDATED"):
        at = header.index(column)
        for row in rows:
            assert row[at - 1] == " " and row[at] != " ", (column, header, row)


def test_agents_as_text_shows_no_calls_for_a_gone_instance(migrated_url: str) -> None:
    """A gone instance's calls are given back: its last heartbeat's count is not shown as
    calls in flight. A long instance name (a client's, over HTTP) keeps the columns."""
    alive = "billing-service/agent-0123456789abcdef"

    async def registry() -> None:
        store = open_one(migrated_url)
        await store.open(migrate=False)
        try:
            beats = [_beat(alive, inflight=3), _beat("agent-gone", inflight=2)]
            await store.beat(beats, ttl=30)
            await store.leave("agent-gone", ["desk"])
        finally:
            await store.close()

    asyncio.run(registry())
    _, *rows = assert_ok(invoke("--store", migrated_url, "agents")).splitlines()
    fields = {r.split()[1]: r.split() for r in rows}
    assert fields[alive][2:4] == ["alive", "3"]
    assert fields["agent-gone"][2:4] == ["gone", "-"]
    at = {r.index(" alive ") if " alive " in r else r.index(" gone ") for r in rows}
    assert len(at) == 1, rows


def _beat(instance: str, *, inflight: int) -> AgentBeat:
    return AgentBeat(
        instance=instance,
        agent="desk",
        operations=("stamp",),
        capacity=10,
        inflight=inflight,
        breaker="closed",
        breaker_detail={},
    )
