"""The store's policy decides from the rows its queries return: its flows fed canned rows,
without a database (the contract suite runs them on both). Each test says which queries a
flow sends, what it writes, what it returns and whom its commit wakes."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from stepwarden.errors import PermanentStoreError
from stepwarden.records import (
    DispatchedStep,
    EventBeyond,
    EventBounds,
    Expired,
    NewStep,
    SendOutcome,
    StepOutcome,
    StepSwept,
    TaskOutcome,
    step_key,
)
from stepwarden.retry import Backoff
from stepwarden.rules import AlertReason, pickup_failure
from stepwarden.states import StepState, TaskState
from stepwarden.store import policy
from stepwarden.store._flow import (
    CHANNEL_CALLS,
    CHANNEL_REQUESTS,
    CHANNEL_RESULTS,
    Flow,
    Query,
    Rows,
    Wakeups,
)
from stepwarden.store._flow import CHANNEL_TASK_DONE as DONE

from .flows import Answer, drive, each

T = TypeVar("T")
BY = {"lease": "supervisor", "holder": "sup1", "term": 3}
HELD: Rows = [{"term": 3}]
"""The lease row, locked: the sweep's fence holds."""


def under_lease(flow: Callable[..., Flow[T]], **params: Any) -> Callable[[Wakeups], Flow[T]]:
    """A supervisor's flow (its wake-ups a keyword, as the Store calls it) under `BY`."""
    return lambda wake: flow(wake=wake, **BY, **params)


def applied(*rows: dict[str, Any]) -> Callable[[Query], Rows]:
    """An answer to a batch query: for each row of the batch, the canned row of its task,
    numbered by the batch row's `ord`; none for a task without one (its write refused)."""
    by_task = {r["task_id"]: r for r in rows}

    def answer(query: Query) -> Rows:
        batch = enumerate(each(query))
        return [{**by_task[r["task_id"]], "ord": i} for i, r in batch if r["task_id"] in by_task]

    return answer


# -- the supervisor's lease ---------------------------------------------------------------


def test_a_lease_nobody_took_is_taken_at_term_1() -> None:
    run = drive(
        partial(policy.acquire_lease, "supervisor", "sup1", 5.0),
        {"lock_lease_row": [], "put_lease": [{"term": 1}]},
    )
    assert run.result == 1
    put = run.one("put_lease").params
    assert put == {"name": "supervisor", "holder": "sup1", "term": 1, "seen": None, "ttl": 5.0}


def test_a_lease_another_holds_in_time_is_left_alone() -> None:
    held = [{"holder": "sup2", "term": 4, "live": True, "lapses_in": 3.5}]
    run = drive(partial(policy.acquire_lease, "supervisor", "sup1", 5.0), {"lock_lease_row": held})
    assert run.result is None
    assert run.names() == [["lock_lease_row"]]


def test_a_try_of_a_lease_another_holds_says_when_it_lapses_after_ending_stalled_sessions() -> None:
    held = [{"holder": "sup2", "term": 4, "live": True, "lapses_in": 3.5}]
    stalled = Query("end_stalled_sessions", {"stalled": 5.0})
    run = drive(
        partial(policy.try_lease, "supervisor", "sup1", 5.0, stalled),
        {"lock_lease_row": held, "end_stalled_sessions": [{"pid": 7, "ended": True}]},
    )
    tried, ended = run.result
    assert (tried.term, tried.lapses_in) == (None, 3.5)
    assert ended == [{"pid": 7, "ended": True}]
    assert run.names() == [["end_stalled_sessions", "lock_lease_row"]]


def test_a_lapsed_lease_is_taken_at_the_next_term_unless_another_took_it_first() -> None:
    lapsed = [{"holder": "sup2", "term": 4, "live": False}]
    for written, term in [([{"term": 5}], 5), ([], None)]:
        run = drive(
            partial(policy.acquire_lease, "supervisor", "sup1", 5.0),
            {"lock_lease_row": lapsed, "put_lease": written},
        )
        assert run.result == term
        assert (run.one("put_lease").params["term"], run.one("put_lease").params["seen"]) == (5, 4)


# -- the sweep ----------------------------------------------------------------------------


def expired(task_id: str, **kw: Any) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "seq": None,
        "attempt": 2,
        "process_state": "processing",
        "on_failure": "stop",
        "failure_count": 0,
        "compensation_failures": 0,
        "max_failures": 3,
        **kw,
    }


def sweep(answers: dict[str, Any]) -> Any:
    base: dict[str, Answer] = {"descendants": [], "compensation_facts": [], "wake_parents": []}
    flow = under_lease(policy.sweep, limit=10, backoff=Backoff(initial=0.5, maximum=30))
    return drive(flow, {**base, **answers})


def test_a_sweep_under_a_lease_no_longer_held_writes_nothing() -> None:
    run = sweep({"lock_lease": [], "expired_steps": [], "expired_tasks": [expired("t1")]})
    assert run.result == []
    assert run.names() == [["lock_lease", "expired_steps", "expired_tasks"]]
    assert not run.wake


def test_a_sweep_releases_an_expired_task_and_gives_up_one_at_max_failures() -> None:
    last = expired("t2", seq=4, on_failure="compensate", failure_count=2)
    run = sweep(
        {
            "lock_lease": HELD,
            "expired_steps": [last],
            "expired_tasks": [expired("t1")],
            "compensation_facts": [
                {
                    "task_id": "t2",
                    "state": "completed",
                    "abandoned": False,
                    "compensation": "pay.refund",
                    "compensates": None,
                }
            ],
            "hold_facts": [{"task_id": "t2", "remaining": 2.5, "call_stopped": False}],
            "reset_tasks": applied(
                {"task_id": "t2", "seq": 4, "failure_count": 3, "process_state": "compensating"},
                {"task_id": "t1", "seq": None, "failure_count": 1, "process_state": "pending"},
            ),
        }
    )
    assert run.result == [
        Expired(
            task_id="t2",
            seq=4,
            failure_count=3,
            process_state=TaskState.COMPENSATING,
            alert="max_failures",  # given up: the alert the sweep raised, for the metrics
        ),
        Expired(task_id="t1", seq=None, failure_count=1, process_state=TaskState.PENDING),
    ]
    reset = run.one("reset_tasks")
    assert (reset.params, reset.savepoint) == ({"holder": "sup1", "term": 3}, True)
    t2, t1 = each(reset)
    assert (t1["state"], t1["failure_count"], t1["delay"], t1["abandon"], t1["alert"]) == (
        "pending",
        1,
        0.5,
        False,
        None,
    )
    # Given up and compensated: its open steps abandoned, its compensation waiting for them.
    assert (t2["state"], t2["failure_count"], t2["abandon"], t2["hold"], t2["alert"]) == (
        "compensating",
        3,
        True,
        2.5,
        str(AlertReason.MAX_FAILURES),
    )
    assert run.one("hold_facts").params == {"task_ids": ["t2"]}
    assert run.wakes_tasks() and run.woken(CHANNEL_CALLS) == ["t2"]
    assert run.sent("wake_parents") == []  # nothing ended


def test_a_task_the_database_refuses_is_set_aside_and_the_others_recovered() -> None:
    refused = PermanentStoreError("check constraint violated")

    def reset(query: Query) -> Rows | PermanentStoreError:
        rows = each(query)
        if any(r["task_id"] == "bad" for r in rows):
            return refused
        return [
            {
                "ord": 0,
                "task_id": rows[0]["task_id"],
                "seq": None,
                "failure_count": 1,
                "process_state": "pending",
            }
        ]

    run = sweep(
        {
            "lock_lease": HELD,
            "expired_steps": [],
            "expired_tasks": [expired("bad"), expired("t1")],
            "reset_tasks": reset,
            "set_aside": [{"task_id": "bad", "failure_count": 0, "process_state": "error"}],
        }
    )
    assert run.result == [
        Expired(task_id="t1", seq=None, failure_count=1, process_state=TaskState.PENDING),
        Expired(
            task_id="bad",
            seq=None,
            failure_count=0,
            process_state=TaskState.ERROR,
            set_aside=True,
            alert="set_aside",
        ),
    ]
    # The batch whole, then one row at a time: the other row applies.
    assert [len(each(q)) for q in run.sent("reset_tasks")] == [2, 1, 1]
    [aside] = each(run.one("set_aside"))
    assert (aside["task_id"], aside["state"], aside["alert"]) == (
        "bad",
        "error",
        str(AlertReason.SET_ASIDE),
    )
    assert "check constraint violated" in aside["error"]
    assert run.woken(DONE) == ["bad"] and run.woken(CHANNEL_CALLS) == ["bad"]
    assert run.one("wake_parents").params == {"task_ids": ["bad"]}


def test_a_sweep_of_steps_reassigns_a_gone_instances_and_fails_one_never_picked_up() -> None:
    gone = {
        "task_id": "t1",
        "seq": 1,
        "attempt": 1,
        "locked_by": "a1",
        "task_attempt": 2,
        "task_state": "compensating",
        "task_locked_by": "s1",
        "task_holder_gone": True,  # gone with the agent: its task is released
        "agent": "pay",
    }
    paused = {
        **gone,
        "task_id": "t3",
        "task_state": "paused",
        "task_locked_by": None,
        "task_holder_gone": False,
    }
    late = {
        "task_id": "t2",
        "seq": 3,
        "attempt": 1,
        "state": "not_started",
        "pickup_within": 5.0,
        "agent": "ship",
        "locked_by": None,
    }
    answers: dict[str, Answer] = {
        "lock_lease": HELD,
        "gone_holders": [gone, paused],
        "pickup_expired": [late],
        "total_expired": [],
        "reassign_steps": applied({"task_id": "t1", "seq": 1, "attempt": 2}),
        "fail_steps": applied({"task_id": "t2", "seq": 3, "attempt": 1}),
        "forget_agents": [],
    }
    run = drive(
        under_lease(policy.sweep_steps, limit=10, forget_after=60.0, reassign=True), answers
    )
    assert run.result == [
        StepSwept(task_id="t1", seq=1, kind="reassigned", agent="pay", instance="a1"),
        StepSwept(task_id="t2", seq=3, kind="pickup", agent="ship", instance=None),
    ]
    moved, requeued = each(run.one("reassign_steps"))
    assert (moved["instance"], moved["in_time"], moved["held_as"], moved["released_as"]) == (
        "a1",
        True,
        "compensating",
        "compensating",
    )
    # A paused task's step: past its complete_by, the task (held by none) left as it is.
    assert (requeued["task_id"], requeued["in_time"], requeued["released_as"]) == (
        "t3",
        False,
        None,
    )
    [failed] = each(run.one("fail_steps"))
    assert (failed["error"], failed["abandoned"]) == pickup_failure(5.0)
    assert run.one("forget_agents").params == {"forget_after": 60.0}
    assert run.woken(CHANNEL_REQUESTS) == ["pay"] and run.wakes_tasks()
    assert run.woken(CHANNEL_RESULTS) == [step_key("t2", 3)]

    # Until the store has answered long enough, no instance is taken for gone.
    alone = drive(
        under_lease(policy.sweep_steps, limit=10, forget_after=60.0, reassign=False),
        {**answers, "gone_holders": []},
    )
    assert alone.one("gone_holders").params == {"limit": 0}


# -- the scheduler's group commit ---------------------------------------------------------


def outcome(task_id: str) -> StepOutcome:
    return StepOutcome(
        task_id=task_id,
        seq=1,
        attempt=1,
        agent_instance="a1",
        state=StepState.COMPLETED,
        result="1",
        error=None,
        tries=1,
    )


def new_step(task_id: str, agent: str) -> NewStep:
    return NewStep(
        task_id=task_id,
        task_attempt=1,
        scheduler="s1",
        seq=2,
        name=f"{agent}.go",
        agent=agent,
        operation="go",
        input="{}",
        priority=0,
        complete_within=30.0,
    )


def dispatched(query: Query) -> Rows:
    return [{"ord": i, "attempt": 1, "remaining": 30.0} for i in range(len(each(query)))]


def advance(found: dict[str, Any]) -> Any:
    flow = partial(
        policy.advance, [outcome("t1")], [new_step("t1", "pay"), new_step("t2", "ship")], []
    )
    return drive(
        flow,
        {
            "complete_steps": [],  # refused
            "savepoint_dependents": [],
            "rollback_dependents": [],
            "dispatch_new": dispatched,
            "call_facts": [
                {
                    "task_id": "t1",
                    "seq": 1,
                    "call_stopped": False,
                    "process_state": "processing",
                    **found,
                }
            ],
        },
    )


def test_a_refused_outcome_takes_back_what_its_task_wrote_after_it() -> None:
    run = advance({"attempt": 2, "locked_by": "a2", "state": "running", "abandoned": False})
    done, steps, finished = run.result
    assert done == [False]
    assert steps == [None, DispatchedStep(task_id="t2", seq=2, attempt=1, remaining=30.0)]
    assert finished == []
    assert run.names() == [
        ["complete_steps", "savepoint_dependents", "dispatch_new"],
        ["call_facts"],
        ["rollback_dependents"],
        ["dispatch_new"],
    ]
    assert [d["task_id"] for d in each(run.sent("dispatch_new")[1])] == ["t2"]
    assert run.woken(CHANNEL_REQUESTS) == ["ship"]  # not the request rolled back


def test_an_outcome_refused_as_recorded_already_keeps_what_followed_it() -> None:
    # A try of the same write whose answer was lost: the step holds this very outcome.
    run = advance({"attempt": 1, "locked_by": "a1", "state": "completed", "abandoned": False})
    done, steps, _ = run.result
    assert done == [True]
    assert [s and s.task_id for s in steps] == ["t1", "t2"]
    assert run.sent("rollback_dependents") == []
    assert run.woken(CHANNEL_REQUESTS) == ["pay", "ship"]


# -- the end of a hold --------------------------------------------------------------------


def finish(task_id: str, state: Any, **kw: Any) -> TaskOutcome:
    return TaskOutcome(
        task_id=task_id,
        attempt=1,
        scheduler="s1",
        state=state,
        result=kw.get("result"),
        error=kw.get("error"),
    )


def test_an_error_with_something_to_undo_compensates_and_a_result_wakes_its_waiter() -> None:
    failed = finish("t1", TaskState.ERROR, error="boom")
    batch = [failed, failed, finish("t2", TaskState.PROCESSED, result="42")]
    run = drive(
        partial(policy.finish_tasks, batch),
        {
            "descendants": [],
            "compensation_facts": [
                {
                    "task_id": "t1",
                    "on_failure": "compensate",
                    "state": "completed",
                    "abandoned": False,
                    "compensation": "pay.refund",
                    "compensates": None,
                }
            ],
            "hold_facts": [{"task_id": "t1", "remaining": 2.5, "call_stopped": False}],
            "finish_tasks": applied(
                {
                    "task_id": "t1",
                    "process_state": "compensating",
                    "parent_id": None,
                    "awaited": False,
                },
                {"task_id": "t2", "process_state": "processed", "parent_id": None, "awaited": True},
            ),
        },
    )
    assert run.result == [True, False, True]  # the duplicate is written once
    t1, t2 = each(run.one("finish_tasks"))
    assert (t1["state"], t1["compensation_starts"], t1["finished"], t1["hold"], t1["alert"]) == (
        "compensating",
        True,
        False,
        2.5,
        str(AlertReason.TASK_ERROR),
    )
    assert (t2["state"], t2["finished"], t2["hold"], t2["result"]) == ("processed", True, 0.0, "42")
    assert run.woken(DONE) == ["t2"]  # only a task someone waits for
    assert run.woken(CHANNEL_CALLS) == ["t1"] and run.wakes_tasks()
    assert run.sent("wake_parents") == []  # neither is a child


def test_a_child_that_ends_in_error_wakes_its_waiting_parent() -> None:
    run = drive(
        partial(policy.finish_tasks, [finish("c1", TaskState.ERROR, error="boom")]),
        {
            "descendants": [],
            "compensation_facts": [
                {
                    "task_id": "c1",
                    "on_failure": "stop",
                    "state": None,
                    "abandoned": None,
                    "compensation": None,
                    "compensates": None,
                }
            ],
            "hold_facts": [],
            "finish_tasks": applied(
                {"task_id": "c1", "process_state": "error", "parent_id": "p1", "awaited": False}
            ),
            "wake_parents": [{"parent_id": "p1", "woke": True}],
        },
    )
    assert run.result == [True]
    [row] = each(run.one("finish_tasks"))
    assert (row["state"], row["finished"], row["alert"]) == (
        "error",
        True,
        str(AlertReason.TASK_ERROR),
    )
    assert run.one("wake_parents").params == {"task_ids": ["c1"]}
    assert run.wakes_tasks()


# -- events -------------------------------------------------------------------------------


def send(kept: int, answers: dict[str, Any], *, sent_before: bool = False) -> Any:
    flow = partial(policy.send_event, "t1", "approved", '{"ok": true}', "e1", EventBounds(events=3))
    inbox = {"inbox_kept": [{"kept": kept, "sent_before": sent_before}]}
    return drive(flow, {**inbox, **answers})


def test_an_event_for_a_waiting_task_is_kept_and_wakes_it() -> None:
    run = send(
        0,
        {
            "send_read_task": [{"process_state": "waiting"}],
            "insert_inbox": [{"event_id": "e1"}],
            "wake_task": [{"task_id": "t1"}],
            "insert_events": [],
        },
    )
    assert run.result == SendOutcome(task_id="t1", sent=True, woke=True)
    assert run.one("wake_task").params == {"task_id": "t1", "name": "approved"}
    [event] = each(run.one("insert_events"))
    assert (event["kind"], json.loads(event["detail"])) == (
        "event_received",
        {"name": "approved", "event_id": "e1", "woke": True},
    )
    assert run.wakes_tasks()


def test_an_event_beyond_a_bound_or_for_an_ended_task_is_not_kept() -> None:
    full = send(3, {"send_read_task": [{"process_state": "processing"}]})
    assert full.result == EventBeyond(bound="max_events_per_task", limit=3, found=3)
    ended = send(0, {"send_read_task": [{"process_state": "processed"}]})
    assert ended.result == TaskState.PROCESSED
    missing = send(0, {"send_read_task": []})
    assert missing.result is None
    for run in (full, ended, missing):
        assert run.sent("insert_inbox") == [] and not run.wake


def test_an_event_sent_before_is_answered_as_sent_before_whatever_the_bounds() -> None:
    run = send(
        3,
        {"send_read_task": [{"process_state": "waiting"}], "insert_inbox": []},
        sent_before=True,
    )
    assert run.result == SendOutcome(task_id="t1", sent=False, woke=False)
    assert run.sent("wake_task") == [] and run.sent("insert_events") == []
    assert not run.wake


def test_an_idle_round_is_each_sweeps_first_batch_the_purge_and_the_next_expiry() -> None:
    """A supervisor round at rest: each sweep finds nothing, in the order the supervisor runs
    them, then the purge and the next expiry are read, all in one flow (one transaction),
    and nobody is woken. Without `release` (the others not heard from long enough) it looks
    at no gone scheduler and reassigns no step."""

    class Empty(dict[str, Answer]):
        def __missing__(self, name: str) -> Answer:
            return [{"seconds": 2.5}] if name == "next_expiry" else []

        def __contains__(self, name: object) -> bool:
            return True

    answers = Empty(lock_lease=HELD)
    for release in (True, False):
        run = drive(
            under_lease(
                policy.sweep_round,
                limit=500,
                backoff=Backoff(),
                forget_after=3600.0,
                release=release,
                keys=None,
                purge_after=60.0,
                purge_limit=200,
            ),
            answers,
        )
        names = [n for batch in run.names() for n in batch]
        assert ("gone_scheduler_tasks" in names) is release
        order = ["due_waiting", "due_schedules", "expired_tasks", "purge", "next_expiry"]
        assert [n for n in names if n in order] == order
        assert run.result.next_expiry == 2.5
        assert (run.result.released, run.result.woke, run.result.expired) == ([], [], [])
        assert not run.wake
