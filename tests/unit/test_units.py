"""Units that need no store: retry policy, group commit, states, the public surface."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal

import pytest

import stepwarden as sw
from stepwarden import _json
from stepwarden._batch import Batcher
from stepwarden.retry import backoff
from stepwarden.rules import AlertReason, plan_expiry
from stepwarden.states import (
    STEP_TRANSITIONS,
    TASK_TRANSITIONS,
    StepState,
    TaskState,
)


def test_public_names_are_all_exported() -> None:
    public = {
        n
        for n, v in vars(sw).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)
    } - {"annotations"}
    assert public == set(sw.__all__) - {"__version__"}
    for name in sw.__all__:
        assert hasattr(sw, name), name


def test_retry_delays_grow_and_stay_bounded() -> None:
    r = sw.Retry(initial=0.1, maximum=1.0, multiplier=2.0, jitter=False)
    assert [r.delay(n) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    jittered = sw.Retry(initial=0.1, maximum=1.0)
    for n in range(1, 10):
        assert 0 <= jittered.delay(n) <= min(1.0, 0.1 * 2 ** (n - 1))


def test_retry_knows_permanent_errors() -> None:
    r = sw.Retry(permanent=(KeyError,))
    assert r.is_permanent(sw.PermanentError("x"))
    assert r.is_permanent(KeyError("x"))
    assert not r.is_permanent(ConnectionError("x"))


@pytest.mark.parametrize(
    "kwargs",
    [{"max_attempts": 0}, {"initial": 2, "maximum": 1}, {"multiplier": 0.5}, {"initial": -1}],
)
def test_retry_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(sw.ConfigurationError):
        sw.Retry(**kwargs)  # type: ignore[arg-type]


def test_backoff_escalates_to_its_maximum() -> None:
    b = sw.Backoff(initial=0.5, maximum=3)
    assert [b.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3, 3]


@pytest.mark.parametrize("failures", [1_025, 2_000, 10**9])
def test_a_delay_stays_at_its_maximum_however_many_failures(failures: int) -> None:
    """The exponent is capped: a count that keeps rising gives the maximum, not an
    OverflowError (a task retried for days, an alert undeliverable for a week)."""
    assert sw.Backoff(initial=0.5, maximum=30).delay(failures) == 30
    assert sw.Backoff(initial=1.0, maximum=300).delay(failures) == 300
    assert sw.Retry(initial=0.1, maximum=5, multiplier=1e9, jitter=False).delay(failures) == 5
    assert backoff(failures, initial=1e-300, maximum=1e6, multiplier=1e300) == 1e6


def test_delays_are_finite_and_bounded() -> None:
    for bad in (float("inf"), float("nan"), -1.0):
        with pytest.raises(sw.ConfigurationError):
            sw.Backoff(initial=0.5, maximum=bad)
    with pytest.raises(sw.ConfigurationError):
        sw.Backoff(initial=0.5, maximum=10**12)
    with pytest.raises(sw.ConfigurationError):
        sw.Retry(multiplier=float("inf"))


def test_only_an_operator_takes_a_finished_task_up_again() -> None:
    assert TASK_TRANSITIONS[TaskState.PROCESSED] == frozenset()
    assert TASK_TRANSITIONS[TaskState.COMPENSATED] == frozenset()
    assert TASK_TRANSITIONS[TaskState.CANCELLED] == frozenset()
    assert STEP_TRANSITIONS[StepState.COMPLETED] == frozenset()
    assert TaskState.PENDING in TASK_TRANSITIONS[TaskState.PROCESSING]


@pytest.mark.parametrize(
    ("held_as", "on_failure", "count", "compensable", "expected"),
    [
        (TaskState.PROCESSING, "compensate", 1, True, (TaskState.PENDING, 1, None)),
        # Compensation starts: the forward path's count is kept (its own starts at 0).
        (TaskState.PROCESSING, "compensate", 3, True, (TaskState.COMPENSATING, 3, "max_failures")),
        (TaskState.PROCESSING, "compensate", 3, False, (TaskState.ERROR, 3, "max_failures")),
        (TaskState.PROCESSING, "stop", 3, True, (TaskState.ERROR, 3, "max_failures")),
        # Waiting for the fault to clear: pending again, one alert when the threshold is met.
        (TaskState.PROCESSING, "retry", 3, True, (TaskState.PENDING, 3, "max_failures")),
        (TaskState.PROCESSING, "retry", 4, True, (TaskState.PENDING, 4, None)),
        (TaskState.COMPENSATING, "compensate", 2, True, (TaskState.COMPENSATING, 2, None)),
        (
            TaskState.COMPENSATING,
            "compensate",
            3,
            True,
            (TaskState.COMPENSATION_FAILED, 3, "compensation_failed"),
        ),
    ],
)
def test_where_the_supervisor_sends_an_expired_task(
    held_as: TaskState,
    on_failure: str,
    count: int,
    compensable: bool,
    expected: tuple[TaskState, int, str | None],
) -> None:
    compensating = held_as == TaskState.COMPENSATING
    plan = plan_expiry(
        held_as=held_as,
        on_failure=on_failure,
        failure_count=0 if compensating else count - 1,
        compensation_failures=count - 1 if compensating else 0,
        max_failures=3,
        seq=None,
        compensable=compensable,
        backoff=sw.Backoff(initial=0.5, maximum=30),
    )
    kept = plan.compensation_failures if compensating else plan.failure_count
    assert (plan.state, kept, plan.alert) == expected
    assert plan.expiries == count
    assert plan.delay == sw.Backoff(initial=0.5, maximum=30).delay(count)
    assert plan.abandon == (plan.state not in (TaskState.PENDING, held_as))
    assert (plan.error is None) == (plan.alert is None)
    if plan.alert is not None:
        assert AlertReason(plan.alert)


async def test_batcher_writes_concurrent_items_in_one_flush() -> None:
    flushes: list[list[int]] = []

    async def flush(items: Sequence[int]) -> list[int]:
        flushes.append(list(items))
        await asyncio.sleep(0)
        return [i * 10 for i in items]

    batcher: Batcher[int, int] = Batcher(flush)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(50)))
    assert results == [i * 10 for i in range(50)]
    assert flushes == [list(range(50))]


async def test_batcher_hands_a_failure_to_each_caller_of_the_batch() -> None:
    async def flush(items: Sequence[int]) -> list[int]:
        raise sw.StoreError("down")

    batcher: Batcher[int, int] = Batcher(flush)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, sw.StoreError) for r in results)


def test_declarations_refuse_duplicates_and_bad_names() -> None:
    app = sw.App("x", store="sqlite:///unused.db")
    agent = app.agent("pay")
    with pytest.raises(sw.ConfigurationError):
        app.agent("pay")
    with pytest.raises(sw.ConfigurationError):
        app.agent("bad name!")

    @agent.operation
    def charge(call: sw.Call) -> None: ...

    assert agent.charge is charge
    with pytest.raises(sw.ConfigurationError):
        agent.operation(charge.fn)
    with pytest.raises(AttributeError):
        _ = agent.refund
    with pytest.raises(sw.ConfigurationError, match="async"):
        app.workflow(lambda ctx, x: None)  # type: ignore[type-var]


@pytest.mark.parametrize(
    "value",
    [
        {"when": datetime.now(UTC)},
        [1.0, {"deep": [float("inf")]}],
        {"amount": float("nan")},
        Decimal("1.5"),
    ],
)
def test_only_json_values_are_accepted(value: object) -> None:
    with pytest.raises(sw.PayloadError):
        _json.dumps(value, what="the input")


def test_null_and_finite_floats_pass_untouched() -> None:
    value = {"a": None, "b": [1.5, "null", -0.0], "c": (1, 2)}
    assert _json.loads(_json.dumps(value)) == {"a": None, "b": [1.5, "null", -0.0], "c": [1, 2]}


def test_deeply_nested_payloads_are_refused_with_a_clear_error() -> None:
    deep: list[object] = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(sw.PayloadError, match="the input"):
        _json.dumps(deep, what="the input")


def test_a_secret_is_stored_whole_and_shown_masked() -> None:
    text = _json.dumps({"card": sw.Secret("4111"), "n": [sw.Secret({"pin": 1})]})
    assert _json.loads(text) == {"card": sw.Secret("4111"), "n": [sw.Secret({"pin": 1})]}
    assert _json.loads(text)["card"].reveal() == "4111"
    shown = _json.display(_json.loads(text))
    assert "4111" not in shown and "pin" not in shown and shown.count("***") == 2
    assert repr(sw.Secret("4111")) == "Secret('***')"
