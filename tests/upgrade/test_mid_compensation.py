"""Stored data of the engine before compensation ran as a workflow through the Context: a
task caught mid-compensation by that engine (commit 3efd364, `saga_app.py` says how the
fixture was made) resumes and finishes under this one, each undo applied once."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import stepwarden as sw

from ..conftest import STORES, pg_database, unique
from ..support.worker import RESUME, running
from .saga_app import ORDER, SagaApp

HERE = Path(__file__).parent


@pytest.fixture(params=STORES)
def left_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store made from the fixture's SQL of its kind, as the killed worker left it."""
    dump = (HERE / f"mid_compensation.{request.param}.sql").read_text()
    if request.param == "sqlite":
        with sqlite3.connect(tmp_path / "store.db") as db:
            db.executescript(dump)
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    request.getfixturevalue("pg_template")  # the server reached, its warnings read
    with pg_database(unique("sw_up")) as url:
        with psycopg.connect(url, autocommit=True) as db:
            db.execute(dump.encode())
        yield url


async def test_a_task_caught_mid_compensation_by_the_previous_engine_finishes_compensated(
    left_url: str,
) -> None:
    url = left_url
    kind = "sqlite" if url.startswith("sqlite") else "postgres"
    before = Counter(json.loads((HERE / f"mid_compensation.{kind}.json").read_text()))
    # The fixture as made: the refund done, the release called when its worker was killed.
    assert before == Counter(reserve=1, charge=1, refund=1)
    saga = SagaApp(url)
    try:
        left = await saga.app.show_async(ORDER)
        assert left.task.process_state == sw.TaskState.COMPENSATING
        left_undo = [(s.seq, s.compensates, s.state) for s in left.steps if s.compensates]
        assert left_undo == [(4, 2, sw.StepState.COMPLETED), (5, 1, sw.StepState.RUNNING)]

        async with running(saga.app, RESUME):
            with pytest.raises(sw.TaskFailed) as failed:
                await saga.app.result_async(ORDER, timeout=30)
        assert failed.value.state == sw.TaskState.COMPENSATED
        view = await saga.app.show_async(ORDER)
    finally:
        await saga.app.aclose()
    # Each effect once across both engines: only the release, for the reservation, ran here.
    assert saga.effects == Counter(release=1)
    assert saga.undoes["release"] == [f"{ORDER}/1"]
    assert before + saga.effects == Counter(reserve=1, charge=1, refund=1, release=1)
    # The undo steps are those the previous engine recorded: none added, none run twice.
    undo = [(s.seq, s.name, s.compensates, s.state) for s in view.steps if s.compensates]
    assert undo == [
        (4, "compensate payments.charge", 2, sw.StepState.COMPLETED),
        (5, "compensate inventory.reserve", 1, sw.StepState.COMPLETED),
    ]
    assert "no courier" in (view.task.error or "")
