"""`stepwarden tasks` by filter, on both stores: it takes every filter `stepwarden bulk` takes
(one definition of them: the same options, the same help), lists the tasks that match oldest
first, a page at a time (--limit, then --after the last task of the page, as the line after a
full page says), and refuses bad input in one clear line before reading anything."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import click
import pytest

import stepwarden as sw
from stepwarden.cli import cli
from tests.support.worker import running

from . import cli_app
from .helpers import assert_ok, assert_refused, invoke, json_lines


def _orders(url: str) -> None:
    """e-1 (refused: card), e-2 (refused: bank), e-3 (refused: card) in error, then p-1
    pending, of the tenant acme; e-1, e-2 and p-1 of the customer c-42, e-3 of c-7."""

    async def go() -> None:
        app = cli_app.build(url)
        try:
            for task_id, why, customer in (
                ("e-1", "card", "c-42"),
                ("e-2", "bank", "c-42"),
                ("e-3", "card", "c-7"),
            ):
                await app.submit_async(
                    "process", {"refuse": why}, task_id=task_id, tags={"customer": customer}
                )
            async with running(app):
                for task_id in ("e-1", "e-2", "e-3"):
                    with pytest.raises(sw.TaskFailed):
                        await app.result_async(task_id, timeout=20)
            await app.submit_async(
                "process", {}, task_id="p-1", tags={"customer": "c-42"}, tenant="acme"
            )
        finally:
            await app.aclose()

    asyncio.run(go())


def _listed(url: str, *args: str) -> list[str]:
    out = assert_ok(invoke("--store", url, "tasks", "--json", *args))
    return [t["task_id"] for t in json_lines(out)]


def test_tasks_takes_every_filter_bulk_takes(migrated_url: str) -> None:
    url = migrated_url
    _orders(url)
    assert _listed(url) == ["e-1", "e-2", "e-3", "p-1"]  # oldest first
    declined = ("--state", "error", "--error", "refused: card")
    assert _listed(url, *declined) == ["e-1", "e-3"]
    # The same filter, the same tasks: those bulk's plan counts.
    planned = assert_ok(invoke("--store", url, "bulk", "retry", *declined, "--plan"))
    assert "retry: 2 task(s) match" in planned and "first: e-1 e-3" in planned
    assert _listed(url, "--state", "error", "--state", "pending") == ["e-1", "e-2", "e-3", "p-1"]
    assert _listed(url, "--state", "pending") == ["p-1"]
    assert _listed(url, "--workflow", "process", "--version", "1") == ["e-1", "e-2", "e-3", "p-1"]
    assert _listed(url, "--version", "2") == []
    assert _listed(url, "--workflow", "other") == []
    assert _listed(url, "--tenant", "acme") == ["p-1"]
    assert _listed(url, "--tenant", "") == ["e-1", "e-2", "e-3"]
    assert _listed(url, "--tag", "customer=c-42") == ["e-1", "e-2", "p-1"]
    assert _listed(url, "--tag", "customer=c-42", "--state", "error") == ["e-1", "e-2"]
    assert _listed(url, "--tag", "customer=c-42", "--error", "bank") == ["e-2"]
    # Times: p-1 was created last, and is the one task not finished.
    every = json_lines(assert_ok(invoke("--store", url, "tasks", "--json")))
    tasks = {t["task_id"]: t for t in every}
    # (A millisecond before each time: SQLite keeps times as floats, which the microseconds
    # shown may round up.)
    ms = timedelta(milliseconds=1)
    created = (datetime.fromisoformat(tasks["p-1"]["created_at"]) - ms).isoformat()
    assert _listed(url, "--created-after", created) == ["p-1"]
    assert _listed(url, "--created-before", created) == ["e-1", "e-2", "e-3"]
    later = (datetime.fromisoformat(created) + timedelta(days=1)).isoformat()
    assert _listed(url, "--finished-before", later) == ["e-1", "e-2", "e-3"]
    assert _listed(url, "--finished-after", later) == []
    ended = {t: datetime.fromisoformat(tasks[t]["finished_at"]) for t in ("e-1", "e-2", "e-3")}
    cut = max(ended.values()) - ms
    assert _listed(url, "--finished-after", cut.isoformat()) == [
        t for t, at in ended.items() if at >= cut
    ]
    assert _listed(url, "--finished-before", cut.isoformat()) == [
        t for t, at in ended.items() if at < cut
    ]
    # The text form lists them too, under the counts of every task.
    text = assert_ok(invoke("--store", url, "tasks", *declined)).splitlines()
    assert text[0].startswith("pending: 1") and "error: 3" in text[0]
    assert [line.split()[0] for line in text[2:]] == ["e-1", "e-3"]


def test_tasks_are_listed_a_page_at_a_time(migrated_url: str) -> None:
    url = migrated_url
    _orders(url)
    first = invoke("--store", url, "tasks", "--json", "--limit", "2")
    assert [t["task_id"] for t in json_lines(assert_ok(first))] == ["e-1", "e-2"]
    assert first.stderr.strip() == "more: --after e-2"
    second = invoke("--store", url, "tasks", "--json", "--limit", "2", "--after", "e-2")
    assert [t["task_id"] for t in json_lines(assert_ok(second))] == ["e-3", "p-1"]
    last = invoke("--store", url, "tasks", "--json", "--limit", "2", "--after", "p-1")
    assert (assert_ok(last), last.stderr) == ("", "")
    # The page after a task, by a filter, through the tags' index too.
    assert _listed(url, "--tag", "customer=c-42", "--after", "e-1") == ["e-2", "p-1"]
    assert _listed(url, "--state", "error", "--after", "e-1", "--limit", "1") == ["e-2"]
    # A page that is not full says nothing more; the text form says it after the list.
    text = invoke("--store", url, "tasks", "--limit", "3")
    assert assert_ok(text).splitlines()[-1].startswith("e-3")
    assert text.stderr.strip() == "more: --after e-3"
    assert invoke("--store", url, "tasks", "--limit", "5").stderr == ""
    # --after names a task: one that is not there is said so.
    assert_refused(
        invoke("--store", url, "tasks", "--after", "gone"), "no task 'gone'", exit_code=1
    )


def test_bad_filters_are_refused_in_one_line(migrated_url: str) -> None:
    url = migrated_url
    for args, said in (
        (["--tag", "customer"], "is written KEY=VALUE"),
        (["--tag", "a=1", "--tag", "a=2"], "given twice"),
        (["--state", "stuck"], "'stuck' is not one of"),
        (["--version", "0"], "--version"),
        (["--created-after", "yesterday"], "not an ISO 8601 time"),
        (["--finished-before", "2026-01-01T00:00:00"], "with its time zone"),
        (["--limit", "0"], "--limit"),
    ):
        assert_refused(invoke("--store", url, "tasks", *args), said, exit_code=2)
        if args[0] != "--limit":  # bulk's --limit is its own
            assert_refused(invoke("--store", url, "bulk", "retry", *args), said, exit_code=2)
    for args, said in (
        (["--workflow", "a\x07b"], "workflow must not contain control characters"),
        (["--tenant", "no such tenant!"], "tenant must be"),
    ):
        assert_refused(invoke("--store", url, "tasks", *args), said, exit_code=1)


def test_tasks_and_bulk_share_one_definition_of_the_filter() -> None:
    assert isinstance(cli, click.Group)
    listing, bulk = cli.commands["tasks"], cli.commands["bulk"]

    def options(command: click.Command) -> dict[str, tuple[object, ...]]:
        return {
            p.opts[0]: (p.envvar, p.multiple, repr(p.type), p.metavar, p.help)
            for p in command.params
            if isinstance(p, click.Option)
        }

    filters = [
        "--state",
        "--workflow",
        "--version",
        "--error",
        "--created-after",
        "--created-before",
        "--finished-after",
        "--finished-before",
        "--tenant",
        "--tag",
    ]
    mine, theirs = options(listing), options(bulk)
    for name in filters:
        if name == "--state":  # bulk says which states its actions move
            assert str(theirs[name][-1]).startswith(str(mine[name][-1])), name
            assert mine[name][:-1] == theirs[name][:-1], name
        else:
            assert mine[name] == theirs[name], name
    helped = " ".join(assert_ok(invoke("tasks", "--help")).split())
    for name in (*filters, "--limit", "--after", "--json"):
        assert name in helped, name
