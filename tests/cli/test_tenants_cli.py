"""Tenants on the command line, on both stores: `submit --tenant`, the tenant in `tasks` and
`show`, `tasks --tenant` (and "" for the tasks of none), `purge --tenant` deleting that
tenant's finished tasks only, and a bad name refused in one line with nothing written."""

from __future__ import annotations

import orjson
import pytest

from tests.rawsql import sql

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


def _listed(url: str, *options: str) -> list[tuple[str, str | None]]:
    rows = json_lines(assert_ok(invoke("--store", url, "tasks", "--json", *options)))
    return [(r["task_id"], r["tenant"]) for r in rows]


def test_tasks_are_listed_shown_and_purged_by_tenant(migrated_url: str) -> None:
    url = migrated_url
    _submit(url, "a-1", "--tenant", "acme")
    _submit(url, "g-1", "--tenant", "globex")
    _submit(url, "n-1")
    _submit(url, "a-2", "--tenant", "acme")
    assert _listed(url, "--tenant", "acme") == [("a-1", "acme"), ("a-2", "acme")]
    assert _listed(url, "--tenant", "") == [("n-1", None)]
    assert len(_listed(url)) == 4
    text = assert_ok(invoke("--store", url, "tasks", "--tenant", "globex"))
    _, header, line = text.splitlines()
    assert header.split()[6] == "TENANT" and line.split()[6] == "globex"
    shown = assert_ok(invoke("--store", url, "show", "a-1"))
    assert shown.splitlines()[1].split() == ["tenant", "acme"]
    assert orjson.loads(assert_ok(invoke("--store", url, "show", "a-1", "--json")))["tenant"] == (
        "acme"
    )
    # Finished long ago: purge deletes acme's only.
    sql(url, "UPDATE stepwarden_tasks SET process_state = 'processed', finished_at = created_at")
    out = assert_ok(invoke("--store", url, "purge", "--older-than", "0", "--tenant", "acme"))
    assert out.strip() == "purged 2 task(s)"
    assert sorted(_listed(url)) == [("g-1", "globex"), ("n-1", None)]


def test_a_bad_tenant_is_refused_with_nothing_written(migrated_url: str) -> None:
    url = migrated_url
    before = snapshot(url)
    for args in (
        ("--app", APP, "--store", url, "submit", "route", "{}", "--tenant", "a b"),
        ("--store", url, "tasks", "--tenant", "a\nb"),
        ("--store", url, "purge", "--tenant", "-x"),
    ):
        assert_refused(invoke(*args), "tenant must be")
    assert snapshot(url) == before


def test_a_tenant_s_weight_is_set_and_listed(migrated_url: str) -> None:
    url = migrated_url
    out = assert_ok(invoke("--store", url, "tenants", "weight", "acme", "3"))
    assert out.strip() == "tenant acme: weight 3"
    assert_ok(invoke("--store", url, "tenants", "weight", "globex", "0.5"))
    rows = json_lines(assert_ok(invoke("--store", url, "tenants", "--json")))
    assert [(r["tenant"], r["weight"]) for r in rows] == [("acme", 3.0), ("globex", 0.5)]
    text = assert_ok(invoke("--store", url, "tenants"))
    assert text.splitlines()[1].split()[:2] == ["acme", "3"]
    assert_refused(invoke("--store", url, "tenants", "weight", "acme", "0"), "0")
    assert_refused(invoke("--store", url, "tenants", "weight", "a b", "1"), "tenant must be")
