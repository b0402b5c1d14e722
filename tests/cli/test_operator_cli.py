"""The operator's commands: the same actions as the Python API, by task or in bulk."""

from __future__ import annotations

import json

from .helpers import assert_refused, invoke


def state_of(url: str, task_id: str) -> str:
    shown = invoke("--store", url, "show", task_id, "--json")
    assert shown.exit_code == 0, shown.output
    return str(json.loads(shown.stdout)["process_state"])


def history(url: str, task_id: str) -> list[dict[str, object]]:
    shown = json.loads(invoke("--store", url, "show", task_id, "--json").stdout)
    return [e["detail"] for e in shown["events"] if e["kind"] == "operator"]


def test_retry_records_who_and_why(populated: str) -> None:
    done = invoke("--store", populated, "retry", "bad-1", "--reason", "fixed", "--by", "ana")
    assert done.exit_code == 0, done.output
    assert done.stdout == "bad-1: error -> pending\n"
    assert state_of(populated, "bad-1") == "pending"
    [entry] = history(populated, "bad-1")
    assert entry == {
        "action": "retry",
        "by": "ana",
        "reason": "fixed",
        "from": "error",
        "to": "pending",
    }


def test_an_action_that_does_not_apply_is_refused_and_changes_nothing(populated: str) -> None:
    result = invoke("--store", populated, "retry", "ok-1")
    assert "cannot retry a task that is processed" in result.stderr
    assert_refused(result, "1 of 1 task(s) refused", exit_code=1)
    assert state_of(populated, "ok-1") == "processed"
    assert history(populated, "ok-1") == []
    missing = invoke("--store", populated, "pause", "nope")
    assert "no task 'nope'" in missing.stderr and missing.exit_code == 1


def test_bulk_by_filter_with_a_dry_run(populated: str) -> None:
    preview = invoke("--store", populated, "pause", "--state", "pending", "--dry-run")
    assert preview.exit_code == 0, preview.output
    assert preview.stdout == "later-1: would pause: pending -> paused\n"
    assert state_of(populated, "later-1") == "pending"
    done = invoke("--store", populated, "pause", "--state", "pending", "--workflow", "process")
    assert done.stdout == "later-1: pending -> paused\n"
    resumed = invoke("--store", populated, "resume", "later-1")
    assert resumed.stdout == "later-1: paused -> pending\n"
    both = invoke("--store", populated, "retry", "bad-1", "--state", "error")
    assert_refused(both, "not both", exit_code=2)
    neither = invoke("--store", populated, "retry")
    assert_refused(neither, "name the task(s)", exit_code=2)


def test_cancel_and_skip(populated: str) -> None:
    skipped = invoke(
        "--store", populated, "skip", "bad-1", "--step", "1", "--result", '{"stamped": "by hand"}'
    )
    assert skipped.exit_code == 0, skipped.output
    shown = json.loads(invoke("--store", populated, "show", "bad-1", "--json").stdout)
    assert shown["steps"][0]["state"] == "completed"
    assert shown["steps"][0]["result"] == {"stamped": "by hand"}
    bad_json = invoke("--store", populated, "skip", "bad-1", "--step", "1", "--result", "{nope")
    assert_refused(bad_json, "not JSON", exit_code=2)
    cancelled = invoke("--store", populated, "cancel", "later-1", "--reason", "duplicate")
    assert cancelled.stdout == "later-1: pending -> cancelled\n"
    assert state_of(populated, "later-1") == "cancelled"


def test_purge_keeps_what_is_recent_or_waits_for_an_operator(populated: str) -> None:
    assert invoke("--store", populated, "purge").stdout == "purged 0 task(s)\n"
    done = invoke("--store", populated, "purge", "--older-than", "0")
    assert done.stdout == "purged 1 task(s)\n"  # ok-1; bad-1 waits in error, later-1 pending
    gone = invoke("--store", populated, "show", "ok-1")
    assert_refused(gone, "no task 'ok-1'", exit_code=1)
    assert state_of(populated, "bad-1") == "error"
