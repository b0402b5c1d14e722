"""Workflow versions on the command line, on both stores: `submit --version`, the version in
`tasks` and `show`, `tasks --version` (alone or with --workflow and --state), the versions each
scheduler runs in `schedulers`, and bad values refused in one line with nothing written."""

from __future__ import annotations

import asyncio

import orjson
import pytest

import stepwarden as sw

from ..support.worker import running
from . import versions_app
from .helpers import assert_ok, assert_refused, invoke, json_lines, snapshot

APP = versions_app.APP


@pytest.fixture(autouse=True)
def _restore_store_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--store` points the loaded application at the test's store: put it back after."""
    monkeypatch.setattr(versions_app.app, "store_url", versions_app.app.store_url)


def _submit(url: str, task_id: str, *options: str) -> str:
    out = assert_ok(
        invoke("--app", APP, "--store", url, "submit", "route", "{}", "--task-id", task_id,
               *options)
    )  # fmt: skip
    return out.strip()


def _listed(url: str, *options: str) -> list[tuple[str, int]]:
    rows = json_lines(assert_ok(invoke("--store", url, "tasks", "--json", *options)))
    return [(r["task_id"], r["version"]) for r in rows]


def test_submit_records_the_newest_version_or_the_one_named_and_tasks_filters_by_it(
    migrated_url: str,
) -> None:
    url = migrated_url
    assert _submit(url, "new-1") == "new-1"
    _submit(url, "old-1", "--version", "1")
    _submit(url, "new-2", "--version", "2")
    _submit(url, "old-2", "--version", "1")
    assert _listed(url) == [("new-1", 2), ("old-1", 1), ("new-2", 2), ("old-2", 1)]
    assert _listed(url, "--workflow", "route", "--version", "1") == [("old-1", 1), ("old-2", 1)]
    assert _listed(url, "--version", "2", "--state", "pending") == [("new-1", 2), ("new-2", 2)]
    assert _listed(url, "--version", "2", "--state", "processed") == []
    assert _listed(url, "--workflow", "other", "--version", "1") == []
    # The variable reads as the option does.
    env = {"STEPWARDEN_WORKFLOW_VERSION": "1"}
    by_variable = invoke("--store", url, "tasks", "--json", env=env)
    rows = json_lines(assert_ok(by_variable))
    assert [r["task_id"] for r in rows] == ["old-1", "old-2"]

    text = assert_ok(invoke("--store", url, "tasks", "--version", "1"))
    _, header, *lines = text.splitlines()
    assert header.split()[:4] == ["TASK", "WORKFLOW", "VER", "STATE"]
    assert [line.split()[:4] for line in lines] == [
        ["old-1", "route", "1", "pending"],
        ["old-2", "route", "1", "pending"],
    ]
    shown = assert_ok(invoke("--store", url, "show", "new-1"))
    assert shown.splitlines()[0].startswith("task new-1  workflow route  version 2  priority 0")
    shown_json = orjson.loads(assert_ok(invoke("--store", url, "show", "old-1", "--json")))
    assert shown_json["version"] == 1


def test_bad_versions_are_refused_in_one_line_and_write_nothing(migrated_url: str) -> None:
    url = migrated_url
    before = snapshot(url)
    not_in_range = "is not in the range 1<=x<=2147483647"
    for value in ("0", "-1", str(2**31)):
        assert_refused(
            invoke("--app", APP, "--store", url, "submit", "route", "{}", "--version", value),
            "--version", not_in_range, exit_code=2,
        )  # fmt: skip
        assert_refused(
            invoke("--store", url, "tasks", "--version", value), "--version", not_in_range,
            exit_code=2,
        )  # fmt: skip
    for value in ("two", "1.5", ""):
        assert_refused(
            invoke("--app", APP, "--store", url, "submit", "route", "{}", "--version", value),
            "--version", "is not a valid integer", exit_code=2,
        )  # fmt: skip
        assert_refused(
            invoke("--store", url, "tasks", "--version", value), "--version",
            "is not a valid integer", exit_code=2,
        )  # fmt: skip
    assert_refused(
        invoke("--app", APP, "--store", url, "submit", "route", "{}", "--version", "3"),
        "workflow 'route' has no version 3 in this App (declared: 1, 2)", exit_code=1,
    )  # fmt: skip
    assert_refused(
        invoke("--app", APP, "--store", url, "submit", "route", "{}",
               env={"STEPWARDEN_WORKFLOW_VERSION": "0"}),
        "--version", not_in_range, exit_code=2,
    )  # fmt: skip
    assert snapshot(url) == before


def test_schedulers_lists_the_versions_each_runs(migrated_url: str) -> None:
    async def scenario() -> None:
        app = sw.App("both", store=migrated_url)

        @app.workflow(name="route", version=1)
        async def one(ctx: sw.Context, value: object) -> str:
            return "v1"

        @app.workflow(name="route", version=2)
        async def two(ctx: sw.Context, value: object) -> str:
            return "v2"

        @app.workflow
        async def audit(ctx: sw.Context, value: object) -> str:
            return "audited"

        try:
            async with running(app):
                task_id = await app.submit_async("route", None)
                assert await app.result_async(task_id, timeout=30) == "v2"
                out = await asyncio.to_thread(invoke, "--store", migrated_url, "schedulers")
                header, line = assert_ok(out).splitlines()
                assert header.split()[-1] == "RUNS"
                assert line.split()[1] == "alive"
                assert line.endswith("  audit@1 route@1,2"), line
                rows = json_lines(
                    assert_ok(
                        await asyncio.to_thread(
                            invoke, "--store", migrated_url, "schedulers", "--json"
                        )
                    )
                )
                [row] = rows
                assert row["workflows"] == ["audit", "route"]
                assert row["versions"] == [["audit", 1], ["route", 1], ["route", 2]]
        finally:
            await app.aclose()

    asyncio.run(scenario())
