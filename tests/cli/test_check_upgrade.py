"""`stepwarden check-upgrade`: the new code of the demo's shop replayed against its tasks in
flight, read-only, on both stores; `stepwarden export-tasks` and `--from-file`.

The tasks are made by the demo's own workflow (a copy of `examples/orders/shop.py`, run by a
worker whose payments agent does not run: each order has its reservation recorded and waits
for its charge). The new code is a copy of the same file, unchanged or with a change planted.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import psycopg
import pytest

import stepwarden as sw
from stepwarden.errors import StoreError
from stepwarden.records import Submission
from stepwarden.sealing import new_keyring
from stepwarden.store import open_one

from .helpers import REPO, assert_ok, error_line, invoke, sql

SHOP = (REPO / "examples" / "orders" / "shop.py").read_text()
FIRST_STEP = "await ctx.step(inventory.reserve, order, compensate=inventory.release)"
DECLARED = "@app.workflow(complete_within=timedelta(seconds=10), max_failures=5)"
TABLES = ("tasks", "steps", "waits", "events", "outbox", "inbox", "keys", "awaited")
FAST = sw.WorkerOptions(
    roles=frozenset({"scheduler", "agents"}),
    agents=frozenset({"inventory"}),  # no payments agent: each order waits for its charge
    poll_interval=0.01,
    drain_timeout=5,
)


def _copy(tmp_path: Path, change: Callable[[str], str] = lambda text: text) -> str:
    """A copy of the demo's shop (changed by `change`) as a module of its own: its
    `MODULE:app`."""
    name = f"shop_copy_{uuid.uuid4().hex[:10]}"
    text = change(SHOP)
    (tmp_path / f"{name}.py").write_text(text)
    return f"{name}:app"


def _planted(text: str) -> str:
    """The first step changed: the new code ships where the old one reserved."""
    assert FIRST_STEP in text
    return text.replace(FIRST_STEP, "await ctx.step(shipping.ship, order)")


def _version_two(text: str) -> str:
    """The workflow declared as version 2 alone: version 1 no longer declared."""
    assert DECLARED in text
    return text.replace(DECLARED, DECLARED[:-1] + ", version=2)")


def _dump(url: str) -> dict[str, list[str]]:
    """Every row of the store's tables that hold tasks and what they did."""
    return {t: sorted(repr(r) for r in sql(url, f"SELECT * FROM stepwarden_{t}")) for t in TABLES}


async def _in_flight(url: str, old: str, orders: list[dict[str, Any]]) -> None:
    """The orders submitted with the old code and driven until each waits for its charge
    (reserved, charge recorded, not taken by any agent)."""
    module, _, attr = old.partition(":")
    app: sw.App = getattr(importlib.import_module(module), attr)
    app.store_url = url
    worker = sw.Worker(app, FAST)
    running = asyncio.create_task(worker.run())
    try:
        for order in orders:
            await app.submit_async("process_order", order, task_id=f"order-{order['id']}")
        store = open_one(url)
        await store.open(migrate=False)
        try:
            for _ in range(1500):  # until each order's charge is recorded
                steps = [await store.get_steps(f"order-{o['id']}") for o in orders]
                if all(len(s) == 2 for s in steps):
                    break
                await asyncio.sleep(0.02)
            else:
                pytest.fail(f"the orders did not reach their charge: {steps}")
        finally:
            await store.close()
    finally:
        worker.stop.set()
        await asyncio.wait_for(running, 30)
        await app.aclose()


@pytest.fixture
def shop(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Copies of the demo's shop made importable; the first call's copy (unchanged) has put
    two orders in flight in `store_url`."""
    monkeypatch.syspath_prepend(str(tmp_path))
    assert_ok(invoke("--store", store_url, "migrate"))
    made: list[str] = []

    def copy(change: Callable[[str], str] = lambda text: text) -> str:
        ref = _copy(tmp_path, change)
        if not made:
            orders = [
                {"id": 1, "amount": 20.0, "items": ["book"]},
                {"id": 2, "amount": 30.0, "items": ["pen"], "card": "ok"},
            ]
            asyncio.run(_in_flight(store_url, ref, orders))
        made.append(ref)
        return ref

    return copy


def _check(
    store_url: str, *args: str, env: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    done = invoke("--store", store_url, "check-upgrade", *args, "--json", env=env)
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exc_info
    return done.exit_code, orjson.loads(done.stdout)


def test_the_unchanged_demo_replays_and_a_planted_change_diverges_read_only(
    store_url: str, shop: Callable[..., str]
) -> None:
    unchanged = shop()
    before = _dump(store_url)
    code, report = _check(store_url, unchanged)
    assert code == 0, report
    assert (report["ok"], report["checked"], report["breaking"]) == (True, 2, 0)
    by_id = {t["task_id"]: t for t in report["tasks"]}
    assert set(by_id) == {"order-1", "order-2"}
    for t in by_id.values():
        # Replayed through the reservation (recorded, completed) up to the charge, open.
        assert (t["outcome"], t["breaks"], t["workflow"], t["version"]) == (
            "replays",
            False,
            "process_order",
            1,
        )
        assert (t["position"], t["message"]) == ("2", "stands at step 'payments.charge', under way")
    assert report["summary"] == [
        {
            "workflow": "process_order",
            "version": 1,
            "declared": True,
            "tasks": 2,
            "replays": 2,
            "diverges": 0,
            "raises": 0,
            "undeclared": 0,
            "not_checked": 0,
        }
    ]

    planted = shop(_planted)
    code, report = _check(store_url, planted)
    assert code == 1
    assert (report["ok"], report["checked"], report["breaking"]) == (False, 2, 2)
    for t in report["tasks"]:
        assert (t["outcome"], t["breaks"], t["position"]) == ("diverges", True, "1")
        assert t["recorded"] == "step 'inventory.reserve' (inventory.reserve)"
        assert t["asked"] == "step 'shipping.ship' (shipping.ship)"
        # Worded as a run of the new code would record it.
        assert t["message"].startswith(f"task {t['task_id']!r} position 1: the workflow asked for")
    assert report["summary"][0]["diverges"] == 2

    text = invoke("--store", store_url, "check-upgrade", planted)
    assert text.exit_code == 1
    assert "2 task(s) checked: 2 would break" in text.stdout
    assert "DIVERGES     order-1  process_order@1" in text.stdout
    assert "recorded:  step 'inventory.reserve' (inventory.reserve)" in text.stdout
    assert "new code:  step 'shipping.ship' (shipping.ship)" in text.stdout
    assert "process_order@1 (declared): 2 task(s): 2 diverges" in text.stdout

    # Nothing was written: every row as it was, no agent called, no step added.
    assert _dump(store_url) == before


def test_a_version_the_new_code_no_longer_declares_is_listed(
    store_url: str, shop: Callable[..., str]
) -> None:
    shop()
    code, report = _check(store_url, shop(_version_two))
    assert code == 1
    assert {t["outcome"] for t in report["tasks"]} == {"undeclared"}
    assert (
        "declares no version 1 of workflow 'process_order' (its versions: 2)"
        in (report["tasks"][0]["message"])
    )
    [summary] = report["summary"]
    assert (summary["declared"], summary["undeclared"]) == (False, 2)
    assert {"workflow": "process_order", "version": 2} in report["declared"]
    text = invoke("--store", store_url, "check-upgrade", shop(_version_two)).stdout
    assert "process_order@1 (NOT DECLARED by the new code): 2 task(s): 2 undeclared" in text


def test_an_export_checks_as_the_store_does(
    store_url: str, shop: Callable[..., str], tmp_path: Path
) -> None:
    unchanged = shop()
    planted = shop(_planted)
    before = _dump(store_url)
    exported = tmp_path / "tasks.json"
    line = assert_ok(invoke("--store", store_url, "export-tasks", str(exported)))
    assert line == f"exported 2 task(s) to {exported}\n"
    assert stat.S_IMODE(exported.stat().st_mode) == 0o600  # inputs are the business's data
    document = orjson.loads(exported.read_bytes())
    assert (document["format"], document["version"]) == ("stepwarden-tasks", 1)
    assert sorted(t["task"]["task_id"] for t in document["tasks"]) == ["order-1", "order-2"]
    assert all(len(t["steps"]) == 2 for t in document["tasks"])
    assert _dump(store_url) == before

    for ref, expected in ((unchanged, 0), (planted, 1)):
        from_store = _check(store_url, ref)
        from_file = _check(store_url, ref, "--from-file", str(exported))
        assert from_store[0] == from_file[0] == expected
        assert from_file[1]["tasks"] == from_store[1]["tasks"]
        assert from_file[1]["summary"] == from_store[1]["summary"]

    # The file alone is enough: no store is opened (the one named does not exist).
    nowhere = f"sqlite:///{tmp_path / 'absent' / 'none.db'}"
    code, report = _check(nowhere, planted, "--from-file", str(exported))
    assert (code, report["breaking"]) == (1, 2)
    # A file that is no export, or an export altered, is refused: exit code 1 and one line.
    bogus = tmp_path / "bogus.json"
    step = document["tasks"][0]["steps"][0]
    altered = [
        ({"tasks": []}, "not a file of `stepwarden export-tasks`"),
        ({**document, "version": 9}, "an export of format version 9"),
        ({**document, "tasks": [{"task": {}}]}, "a task of the export is not as"),
        ({**document, "masked": "many"}, "a task of the export is not as"),
    ]
    for where, value in (("position", "1.x"), ("seq", "1"), ("task_id", "another")):
        changed = {**document["tasks"][0], "steps": [{**step, where: value}]}
        altered.append(({**document, "tasks": [changed]}, "a task of the export is not as"))
    for content, said in altered:
        bogus.write_bytes(orjson.dumps(content))
        done = invoke("check-upgrade", planted, "--from-file", str(bogus))
        assert done.exit_code == 1, (content, done.output)
        assert said in error_line(done.stderr), done.stderr
    bogus.write_text("{not json")
    done = invoke("check-upgrade", planted, "--from-file", str(bogus))
    assert done.exit_code == 1 and "not a JSON document" in error_line(done.stderr)


def test_sealed_secrets_stay_sealed_and_replay_masked_without_the_key(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = ";".join(line for line in new_keyring().splitlines() if not line.startswith("#"))
    monkeypatch.setenv("STEPWARDEN_KEYS", keys)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert_ok(invoke("--store", store_url, "migrate"))
    old = _copy(tmp_path)
    card = "4111 1111 1111 1111"
    order = {"id": 7, "amount": 20.0, "items": ["book"], "card": sw.Secret(card)}
    asyncio.run(_in_flight(store_url, old, [order]))
    exported = tmp_path / "sealed.json"
    assert_ok(invoke("--store", store_url, "export-tasks", str(exported)))
    text = exported.read_text()
    assert card not in text and '"$sealed"' in text

    new = _copy(tmp_path)
    with_key = _check(store_url, new, "--from-file", str(exported), env={"STEPWARDEN_KEYS": keys})
    assert (with_key[0], with_key[1]["masked"]) == (0, 0)
    monkeypatch.delenv("STEPWARDEN_KEYS")
    without = _check(store_url, new, "--from-file", str(exported))
    assert (without[0], without[1]["masked"]) == (0, 1)
    assert without[1]["tasks"][0]["sealed"] is True
    said = invoke("check-upgrade", new, "--from-file", str(exported)).stdout
    assert "1 task(s) hold sealed secrets, replayed masked: no keyring was given" in said


def test_a_read_only_store_refuses_every_write(store_url: str) -> None:
    """What check-upgrade and export-tasks open: the database itself refuses a write of its
    connections (SQLite `query_only`, PostgreSQL read-only transactions)."""
    assert_ok(invoke("--store", store_url, "migrate"))

    async def go() -> None:
        store = open_one(store_url, read_only=True)
        with pytest.raises(sw.ConfigurationError, match="not migrated"):
            await store.open(migrate=True)
        store = open_one(store_url, read_only=True)
        await store.open(migrate=False)
        try:
            assert await store.list_tasks() == []
            new = Submission(task_id="t-1", workflow="w", input="null", complete_within=10.0,
                             max_failures=3)  # fmt: skip
            with pytest.raises(StoreError, match=r"read-only|readonly"):
                await store.submit([new])
        finally:
            await store.close()

    asyncio.run(go())
    assert sql(store_url, "SELECT count(*) FROM stepwarden_tasks") == [(0,)]
    assert os.environ.get("STEPWARDEN_KEYS") is None


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_the_check_needs_no_right_to_write(store_url: str, shop: Callable[..., str]) -> None:
    """Run as a PostgreSQL role that may only read the store's tables, check-upgrade and
    export-tasks work as they do for the owner: they write nothing, not even a session's
    bookkeeping."""
    unchanged, planted = shop(), shop(_planted)
    role = f"sw_reader_{uuid.uuid4().hex[:10]}"
    sql(store_url, f"CREATE ROLE {role} LOGIN")
    try:
        sql(store_url, f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        parts = urlsplit(store_url)
        host = parts.netloc.rpartition("@")[2]
        reader = urlunsplit(parts._replace(netloc=f"{role}@{host}"))
        assert _check(reader, unchanged)[0] == 0
        code, report = _check(reader, planted)
        assert (code, report["breaking"]) == (1, 2)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            sql(reader, "DELETE FROM stepwarden_events")  # the role may not write indeed
    finally:
        sql(store_url, f"DROP OWNED BY {role}")
        sql(store_url, f"DROP ROLE {role}")
