"""Tags from the command line, on both stores: `submit --tag KEY=VALUE` (checked before
anything is written), `tasks --tag` (every tag given), `show` and `show --json`."""

from __future__ import annotations

import orjson

from .helpers import APP, assert_ok, assert_refused, invoke, json_lines


def test_tasks_are_submitted_with_tags_and_listed_by_them(migrated_url: str) -> None:
    for task_id, customer, region in (("a", "c-42", "eu"), ("b", "c-7", "eu"), ("c", "c-42", "us")):
        assert_ok(
            invoke("--app", APP, "--store", migrated_url, "submit", "process", "{}",
                   "--task-id", task_id, "--tag", f"customer={customer}",
                   "--tag", f"region={region}")
        )  # fmt: skip

    def listed(*tags: str) -> list[str]:
        args = [a for t in tags for a in ("--tag", t)]
        out = assert_ok(invoke("--store", migrated_url, "tasks", "--json", *args))
        return [t["task_id"] for t in json_lines(out)]

    assert listed("customer=c-42") == ["a", "c"]
    assert listed("customer=c-42", "region=us") == ["c"]
    assert listed("region=eu") == ["a", "b"]
    assert listed("customer=c-0") == []
    # The variable holds them separated by spaces.
    out = assert_ok(
        invoke("--store", migrated_url, "tasks", "--json",
               env={"STEPWARDEN_TAG": "customer=c-42 region=eu"})
    )  # fmt: skip
    assert [t["task_id"] for t in json_lines(out)] == ["a"]
    shown = assert_ok(invoke("--store", migrated_url, "show", "c"))
    assert "tags           customer=c-42 region=us" in shown
    data = orjson.loads(assert_ok(invoke("--store", migrated_url, "show", "c", "--json")))
    assert data["tags"] == {"customer": "c-42", "region": "us"}


def test_tags_beyond_their_bounds_are_refused_before_anything_is_written(
    migrated_url: str,
) -> None:
    submit = ["--app", APP, "--store", migrated_url, "submit", "process", "{}", "--task-id", "x"]
    for tags, said in (
        (["customer"], "is written KEY=VALUE"),
        (["a=1", "a=2"], "given twice"),
        ([f"k{i}=v" for i in range(17)], "at most 16 tags"),
        (["k" * 65 + "=v"], "a tag key must be 1 to 64 characters"),
        (["customer=" + "v" * 257], "1 to 256 characters"),
        (["customer="], "1 to 256 characters"),
    ):
        args = [a for t in tags for a in ("--tag", t)]
        assert_refused(invoke(*submit, *args), "--tag", said, exit_code=2)
        assert_refused(invoke("--store", migrated_url, "tasks", *args), "--tag", said, exit_code=2)
    assert json_lines(assert_ok(invoke("--store", migrated_url, "tasks", "--json"))) == []
