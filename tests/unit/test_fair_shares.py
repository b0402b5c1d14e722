"""The fair share rule (`rules.fair_shares`, stride scheduling): shares by weight, ties by
name, a tenant of no row or of a pass behind the clock starting at the clock, and the clock
moving on to the least pass of the tenants waiting, never back."""

from __future__ import annotations

from stepwarden.rules import TenantTurn, TenantWork, claim_fairly, fair_shares, least_pass


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


def _row(tenant: str, key: float, live: bool = True, pass_: float | None = None) -> TenantWork:
    return TenantWork(tenant, ("wf", 1), key, live, 1.0, key if pass_ is None else pass_)


def test_the_tenants_of_least_pass_are_read_from_the_first_rows() -> None:
    # Ordered by max(clock, pass) then name: "z" and "y" behind the clock (5) are at it.
    rows = [_row("z", 1.0), _row("y", 4.0), _row("a", 5.0), _row("b", 6.0), _row("c", 7.0)]
    least = least_pass(rows, 5.0, 3, scan=5)
    assert least is not None and [t.tenant for t in least] == ["a", "y", "z"]
    # With the pair's rows all read (fewer than scan), fewer tenants than asked are all.
    least = least_pass(rows[:2], 5.0, 3, scan=5)
    assert least is not None and [t.tenant for t in least] == ["y", "z"]


def test_more_rows_are_read_when_those_read_may_not_hold_them() -> None:
    # A row of a tenant whose tasks are gone (not live) fills the scan: read on.
    assert least_pass([_row("a", 1.0), _row("b", 2.0, live=False)], 0.0, 2, scan=2) is None
    # A row behind its tenant's pass (key 1, pass 9) is read first; rows unread come after
    # the last read (2.0), not after 9: read on.
    rows = [_row("a", 1.0, pass_=9.0), _row("b", 2.0)]
    assert least_pass(rows, 0.0, 2, scan=2) is None
    least = least_pass([*rows, _row("c", 3.0)], 0.0, 2, scan=4)
    assert least is not None and [t.tenant for t in least] == ["b", "c"]
