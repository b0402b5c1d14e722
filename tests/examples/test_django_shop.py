"""The Django example (`examples/django_shop`) as its README runs it, on a new PostgreSQL
database: `manage.py migrate` and `stepwarden migrate` put Django's tables and stepwarden's
side by side; a view saves an order and submits its task on commit, and a view that rolls
back submits nothing; `stepwarden worker django_shop.tasks:app` (DJANGO_SETTINGS_MODULE set)
processes the order, and its result comes back through the status view."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepwarden
from tests.cli.helpers import STEPWARDEN, process_env
from tests.conftest import pg_database, unique
from tests.rawsql import sql

from .services import worker

REPO = Path(__file__).resolve().parents[2]
PROJECT = REPO / "examples" / "django_shop"


def env(url: str) -> dict[str, str]:
    return {
        "SHOP_DATABASE": url,
        "DJANGO_SETTINGS_MODULE": "django_shop.settings",
        "PYTHONPATH": os.pathsep.join([str(PROJECT), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def run(url: str, *args: str) -> str:
    done = subprocess.run(
        list(args),
        cwd=PROJECT,
        env=process_env(env(url)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    assert done.stderr == "", done.stderr
    return done.stdout


def call(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A request through Django's test client, in a new process; its status and JSON."""
    extra = [json.dumps(body)] if body is not None else []
    out = run(url, sys.executable, "-m", "tests.examples.django_client", method, path, *extra)
    answer = json.loads(out)
    return answer["status"], answer["body"]


@pytest.fixture
def shop_db(pg_template: str) -> Iterator[str]:
    """A new, empty database, migrated as the README says: Django's tables, then the store's."""
    with pg_database(unique("sw_django")) as url:
        run(url, sys.executable, "manage.py", "migrate", "--verbosity", "0")
        run(url, STEPWARDEN, "--app", "django_shop.tasks:app", "migrate")
        yield url


def tables(url: str) -> set[str]:
    rows = sql(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {name for (name,) in rows}


def test_a_view_that_rolls_back_submits_nothing(shop_db: str) -> None:
    assert {"django_shop_order", "django_shop_line", "stepwarden_tasks"} <= tables(shop_db)
    lines = [{"sku": "book", "quantity": 1}, {"sku": "pen", "quantity": 0}]
    status, body = call(shop_db, "POST", "/orders/", {"customer": "ann", "lines": lines})
    assert status == 400, body
    assert "quantity_positive" in body["error"]
    assert sql(shop_db, "SELECT count(*) FROM django_shop_order") == [(0,)]
    assert sql(shop_db, "SELECT count(*) FROM stepwarden_tasks") == [(0,)]


def test_a_saved_order_is_submitted_on_commit_and_processed(shop_db: str, tmp_path: Path) -> None:
    lines = [{"sku": "book", "quantity": 2}]
    status, body = call(shop_db, "POST", "/orders/", {"customer": "ann", "lines": lines})
    assert status == 201, body
    order_id, task_id = body["order_id"], body["task_id"]
    assert task_id == f"order-{order_id}"
    assert sql(shop_db, "SELECT id, customer FROM django_shop_order") == [(order_id, "ann")]
    [(state, task_input)] = sql(
        shop_db, f"SELECT process_state, input FROM stepwarden_tasks WHERE task_id = '{task_id}'"
    )
    assert (state, task_input) == (
        "pending",
        {"order_id": order_id, "customer": "ann", "lines": lines},
    )

    with (
        worker("django_shop.tasks:app", cwd=PROJECT, env=env(shop_db), log=tmp_path / "w.log"),
        stepwarden.App("probe", store=shop_db) as probe,
    ):
        result = probe.result(task_id, timeout=90)
    assert result == {"reserved": {"book": 2}, "tracking": f"track-{order_id}"}

    status, body = call(shop_db, "GET", f"/orders/{order_id}/")
    assert status == 200, body
    assert body == {"order_id": order_id, "state": "processed", "result": result, "error": None}
