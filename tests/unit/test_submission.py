"""One list of submit options: the option fields of `Submission` (`SUBMIT_OPTIONS`), which
the App's keywords (`SubmitOptions`, for the type checker), the application API's model and
`stepwarden submit` each take, and the one rule that tells a re-submit from a conflict."""

from __future__ import annotations

import dataclasses
import typing
from datetime import UTC, datetime, timedelta

import pytest

import stepwarden as sw
from stepwarden import app as app_module
from stepwarden import cli, rules
from stepwarden.dashboard._app_models import submit_request
from stepwarden.records import SUBMIT_OPTIONS
from stepwarden.rules import start_state
from stepwarden.states import TaskState


def test_the_options_of_every_entry_point_are_the_submission_s() -> None:
    fields = {f.name for f in dataclasses.fields(sw.Submission)}
    assert set(SUBMIT_OPTIONS) <= fields
    assert set(typing.get_type_hints(app_module.SubmitOptions)) == set(SUBMIT_OPTIONS)
    model = submit_request(["order"])
    assert set(model.model_fields) - {"workflow", "input"} == set(SUBMIT_OPTIONS)
    command = cli.cli.commands["submit"]
    names = {p.name for p in command.params} - {"workflow", "input_json", "input_file"}
    assert names == {"workflow_version", *(set(SUBMIT_OPTIONS) - {"version"})}


def test_an_unknown_option_is_refused() -> None:
    app = sw.App("units", store="sqlite:///:memory:")

    @app.workflow
    async def order(ctx: sw.Context, n: int) -> int:
        return n

    with pytest.raises(TypeError, match="unknown submit options: priorty"):
        app.new_task("order", 1, priorty=3)  # type: ignore[call-arg]
    task = app.new_task("order", 1, task_id="o-1", start_after=2.5)
    assert (task.task_id, task.priority, task.start_after, task.version) == ("o-1", 0, 2.5, 1)


def _new(**kw: typing.Any) -> sw.Submission:
    base = {"workflow": "order", "input": "1", "task_id": "o-1", "complete_within": 30.0,
            "max_failures": 3}  # fmt: skip
    return sw.Submission(**{**base, **kw})


def test_a_resubmit_is_the_same_only_with_the_same_workflow_version_input_and_client() -> None:
    new = _new(version=2, submitted_by="billing")
    same = rules.resubmit(new, workflow="order", version=2, submitted_by="billing", same_input=True)
    assert (same.outcome, same.differs) == ("same", ())
    differs = rules.resubmit(
        new, workflow="refund", version=1, submitted_by="billing", same_input=False
    )
    assert (differs.outcome, differs.differs) == ("conflict", ("workflow", "version", "input"))
    assert (differs.workflow, differs.version) == ("refund", 1)
    other = rules.resubmit(new, workflow="order", version=2, submitted_by=None, same_input=True)
    assert (other.outcome, other.differs, other.workflow) == ("conflict", ("client",), None)


def test_a_task_s_status_is_shaped_as_the_application_api_answers_it() -> None:
    from stepwarden.dashboard._app_models import TaskStatus as Answer

    fields = [f.name for f in dataclasses.fields(sw.TaskStatus)]
    assert fields == list(Answer.model_fields)


def test_a_duration_is_a_timedelta_or_seconds_everywhere() -> None:
    minute = timedelta(minutes=1)
    assert sw.Retry(initial=minute, maximum=2 * minute) == sw.Retry(initial=60, maximum=120.0)
    assert sw.Backoff(initial=minute, maximum=minute).maximum == 60.0
    assert sw.Breaker(reset_after=minute).reset_after == 60.0
    assert sw.Limit(rate=1, per=minute).per == 60.0
    options = sw.WorkerOptions(agent_heartbeat=timedelta(seconds=2), drain_timeout=minute)
    assert (options.agent_heartbeat, options.drain_timeout, options.retention) == (
        2.0,
        60.0,
        sw.WorkerOptions().retention,
    )
    for refused in ("60", True, float("nan"), -1):
        with pytest.raises(sw.ConfigurationError, match=r"Retry\.initial must be a timedelta or"):
            sw.Retry(initial=refused)  # type: ignore[arg-type]


def test_a_new_task_starts_pending_or_waiting_for_its_delayed_start() -> None:
    """Decided once (rules.start_state), handed to the store's insert as its state."""
    assert start_state(start_at=None, start_after=0.0) == TaskState.PENDING
    assert start_state(start_at=None, start_after=0.5) == TaskState.WAITING
    assert start_state(start_at=datetime(2030, 1, 1, tzinfo=UTC), start_after=0.0) == (
        TaskState.WAITING
    )
