"""Units of healthy, capable agents: the circuit breaker, limits and how claims pick within
them (no store)."""

from __future__ import annotations

import pytest

import stepwarden as sw
from stepwarden.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from stepwarden.records import OpLimit
from stepwarden.rules import pick_within_limits


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_breaker_opens_after_consecutive_failures_and_closes_after_a_good_trial() -> None:
    clock = Clock()
    seen: list[str] = []
    b = CircuitBreaker(sw.Breaker(failures=3, reset_after=10), seen.append, clock)
    for _ in range(2):
        assert b.allow()
        b.failure()
    assert b.allow()
    b.success()  # a success in between: the count starts again
    for _ in range(3):
        assert b.state == CLOSED and b.allow()
        b.failure()
    assert b.state == OPEN and b.room() == 0 and not b.allow()
    assert b.snapshot() == {"failures": 3, "opened": 1, "half_open_in": 10.0}
    clock.now += 9.9
    assert not b.allow()
    clock.now += 0.1
    assert b.allow() and b.state == HALF_OPEN  # one trial call
    assert not b.allow()  # and only one
    b.success()
    assert b.state == CLOSED and b.room() is None and b.failures == 0
    assert seen == [OPEN, HALF_OPEN, CLOSED]


def test_a_failed_trial_opens_the_breaker_again_and_a_lost_one_frees_its_slot() -> None:
    clock = Clock()
    b = CircuitBreaker(sw.Breaker(failures=1, reset_after=5, trial_calls=2), clock=clock)
    b.allow()
    b.failure()
    clock.now += 5
    assert b.allow() and b.allow() and not b.allow()
    b.abandon()  # a trial that ended with no word on the service
    assert b.room() == 1
    b.failure()
    assert b.state == OPEN and b.opened == 2 and b.reopens_in() == 5.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failures": 0},
        {"failures": True},
        {"reset_after": 0},
        {"reset_after": float("nan")},
        {"trial_calls": 0},
    ],
)
def test_bad_breaker_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(sw.ConfigurationError):
        sw.Breaker(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrency": 0},
        {"per_instance": -1},
        {"rate": 1.5},
        {"per": 0},
        {"per": True},
        {"key": "customer"},
    ],
)
def test_bad_limits_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(sw.ConfigurationError):
        sw.Limit(**kwargs)  # type: ignore[arg-type]


def test_a_limit_key_comes_from_the_steps_arguments() -> None:
    limit = sw.Limit(concurrency=1, key=lambda order: order["customer"])
    assert limit.key_of([{"customer": "c-7"}]) == "c-7"
    assert sw.Limit(rate=1).key_of([{}]) is None
    bads: tuple[list[dict[str, str | None]], ...] = (
        [{}],
        [{"customer": None}],
        [{"customer": ""}],
        [{"customer": "x" * 201}],
    )
    for bad in bads:
        with pytest.raises(sw.PayloadError):
            limit.key_of(bad)


def test_claims_pick_in_order_within_every_limit() -> None:
    queued = [("a", "k1"), ("a", "k1"), ("a", "k2"), ("b", None), ("c", None), ("a", "k3")]
    limits = {"a": OpLimit(concurrency=1), "b": OpLimit(room=0)}
    assert pick_within_limits(queued, limits, {}, {}, 10) == [0, 2, 4, 5]
    assert pick_within_limits(queued, limits, {("a", "k2"): 1}, {}, 10) == [0, 4, 5]
    assert pick_within_limits(queued, limits, {}, {}, 2) == [0, 2]
    rated = {"a": OpLimit(rate=2)}
    assert pick_within_limits(queued, rated, {}, {("a", "k1"): 1}, 10) == [0, 2, 3, 4, 5]
    roomy = {"a": OpLimit(room=2)}
    assert pick_within_limits(queued, roomy, {}, {}, 10) == [0, 1, 3, 4]


def test_a_fair_claim_picks_each_share_first_then_what_the_limits_leave_by_rank() -> None:
    """Shares (`rules.fair_shares`' counts) go first, each tenant's of its own requests in
    claim order; a share a limit holds back goes to the others, by rank."""
    queued = [("a", "x"), ("a", "x"), ("a", "x"), ("a", "y"), ("a", "z"), ("a", "w")]
    tenants = ["big", "big", "big", "small", "small", "small"]
    free = {"a": OpLimit(concurrency=10)}
    shares = {"big": 1, "small": 2}
    picked = pick_within_limits(queued, free, {}, {}, 3, tenants=tenants, shares=shares)
    assert picked == [0, 3, 4]
    # big's key x runs one at a time: the claim of 4 is small's 3 and big's 1.
    one = {"a": OpLimit(concurrency=1)}
    shares = {"big": 2, "small": 2}
    picked = pick_within_limits(queued, one, {}, {}, 4, tenants=tenants, shares=shares)
    assert picked == [0, 3, 4, 5]
    # Without shares, by rank alone.
    assert pick_within_limits(queued, free, {}, {}, 3, tenants=tenants) == [0, 1, 2]
