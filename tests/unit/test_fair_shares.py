"""The fair share rule (`rules.fair_shares`, stride scheduling): shares by weight, ties by
name, a tenant of no row or of a pass behind the clock starting at the clock, and the clock
moving on to the least pass of the tenants waiting, never back."""

from __future__ import annotations

from stepwarden.rules import TenantTurn, claim_fairly, fair_shares


def test_claims_go_by_weight_and_ties_by_name() -> None:
    even = fair_shares([TenantTurn("b", 1, 0), TenantTurn("a", 1, 0)], 0, 5)
    assert even.counts == {"a": 3, "b": 2}
    weighted = fair_shares([TenantTurn("a", 3, 0), TenantTurn("b", 1, 0)], 0, 8)
    assert weighted.counts == {"a": 6, "b": 2}


def test_a_tenant_behind_the_clock_starts_at_it() -> None:
    # "idle" fell far behind while away: it gets its share from the clock, not a catch-up.
    share = fair_shares([TenantTurn("busy", 1, 100.0), TenantTurn("idle", 1, 3.0)], 100.0, 10)
    assert share.counts == {"busy": 5, "idle": 5}
    assert fair_shares([TenantTurn("new", 1, None)], 7.5, 2).clock == 7.5


def test_the_clock_is_the_least_pass_waiting_and_never_goes_back() -> None:
    assert fair_shares([TenantTurn("a", 1, 12.0), TenantTurn("b", 1, 15.0)], 10.0, 1).clock == 12
    assert fair_shares([TenantTurn("a", 1, 2.0)], 10.0, 1).clock == 10
    assert fair_shares([], 4.0, 10).counts == {}


def test_a_claim_is_fair_after_one_that_took_all_it_asked_for_and_at_first() -> None:
    assert claim_fairly(last_claimed=None, last_asked=0)  # a scheduler's first claim
    assert claim_fairly(last_claimed=10, last_asked=10)  # a backlog: share it
    assert not claim_fairly(last_claimed=3, last_asked=10)  # it took every task there was
    assert not claim_fairly(last_claimed=0, last_asked=1)
