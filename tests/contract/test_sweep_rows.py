"""No row wedges the supervisor: delays stay bounded however many failures a task or an alert
has seen, and a task the sweep cannot recover is set aside for an operator while the others
are recovered. On each store."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from stepwarden.alerts import AlertDeliverer
from stepwarden.records import StepOutcome, Submission, TaskOutcome
from stepwarden.retry import Backoff
from stepwarden.rules import AlertReason
from stepwarden.states import StepState, TaskState
from stepwarden.store import Store
from stepwarden.supervisor import LEASE, Supervisor

from ..rawsql import CLOCK_GRAIN, is_sqlite, script, seconds_ago, seconds_until, sql
from ..support.store import claim_one, dispatch, undoable

BACKOFF = Backoff(initial=0.5, maximum=30.0)


def task(task_id: str, *, on_failure: str = "compensate", max_failures: int = 3) -> Submission:
    return Submission(
        task_id=task_id,
        workflow="wf",
        input="{}",
        priority=0,
        complete_within=30,
        max_failures=max_failures,
        on_failure=on_failure,
    )


def expire(url: str, task_id: str, **columns: Any) -> None:
    """The task's complete_by a minute ago (and other columns set), as a crashed scheduler
    would leave it, without waiting."""
    sets = ", ".join([f"complete_by = {seconds_ago(url, 60)}"] + [f"{k} = {v!r}" for k, v in
                                                                    columns.items()])  # fmt: skip
    sql(url, f"UPDATE stepwarden_tasks SET {sets} WHERE task_id = '{task_id}'")


async def sweep(store: Store) -> dict[str, Any]:
    term = await store.acquire_lease(LEASE, "sup", 30)
    assert term is not None
    swept = await store.sweep(lease=LEASE, holder="sup", term=term, limit=100, backoff=BACKOFF)
    return {e.task_id: e for e in swept}


async def test_a_task_retried_2000_times_is_swept_with_the_capped_delay(
    store: Store, store_url: str
) -> None:
    await store.submit([task("t1", on_failure="retry")])
    await claim_one(store)
    expire(store_url, "t1", failure_count=2000)
    swept = await sweep(store)
    assert (swept["t1"].process_state, swept["t1"].failure_count) == (TaskState.PENDING, 2001)
    t1 = await store.get_task("t1")
    assert t1 is not None and t1.failure_count == 2001 and t1.locked_by is None
    [[wait]] = sql(
        store_url,
        f"SELECT {seconds_until(store_url, 'eligible_at')} FROM stepwarden_tasks"
        " WHERE task_id = 't1'",
    )
    assert BACKOFF.maximum - 5 < wait <= BACKOFF.maximum + CLOCK_GRAIN
    # The alert of max_failures was raised once, long ago: none now.
    [expired] = await store.events(task_id="t1", kind="expired")
    assert expired.detail["failure_count"] == 2001
    assert await store.events(task_id="t1", kind="alert") == []


class Refusing:
    """An alert sink that is always down."""

    name = "down"

    def __init__(self) -> None:
        self.tried = 0

    async def send(self, alert: dict[str, Any]) -> None:
        self.tried += 1
        raise RuntimeError("down")


async def test_an_alert_that_failed_2000_times_is_still_retried_and_the_purge_runs(
    store: Store, store_url: str
) -> None:
    # A finished task to purge, and an alert whose delivery has failed 2,000 times.
    await store.submit([task("done"), task("failing")])
    claimed = {c.task.task_id: c.task.attempt for c in await store.claim_tasks("s1", ["wf"], 2)}
    outcomes = [
        TaskOutcome(task_id="done", attempt=claimed["done"], scheduler="s1",
                    state=TaskState.PROCESSED, result="1", error=None),
        TaskOutcome(task_id="failing", attempt=claimed["failing"], scheduler="s1",
                    state=TaskState.ERROR, result=None, error="boom"),
    ]  # fmt: skip
    assert await store.finish_tasks(outcomes) == [True, True]
    sql(store_url, "UPDATE stepwarden_outbox SET attempts = 2000 WHERE task_id = 'failing'")
    sink = Refusing()
    deliverer = AlertDeliverer(store, [sink])
    supervisor = Supervisor(store, instance="sup", alerts=deliverer, retention=0.0)
    await supervisor.tick()
    await deliverer.deliver_due()
    assert sink.tried == 1
    [alert] = await store.outbox(channel="alerts", task_id="failing")
    assert alert.attempts == 2001 and alert.delivered_to == ()
    [[wait]] = sql(
        store_url,
        f"SELECT {seconds_until(store_url, 'next_at')} FROM stepwarden_outbox"
        " WHERE task_id = 'failing'",
    )
    maximum = deliverer.backoff.maximum
    assert maximum - 5 < wait <= maximum + CLOCK_GRAIN
    assert await store.get_task("done") is None  # purged by the tick
    assert await store.get_task("failing") is not None  # in error: kept for the operator


async def test_a_task_the_rules_cannot_read_is_set_aside_and_the_others_recovered(
    store: Store, store_url: str
) -> None:
    await store.submit([task("good"), task("bad"), task("also-good")])
    claimed = await store.claim_tasks("s1", ["wf"], 3)
    attempt = {c.task.task_id: c.task.attempt for c in claimed}
    await store.dispatch_steps([dispatch("bad", attempt["bad"])])
    for task_id in attempt:
        expire(store_url, task_id)
    # A value no rule knows (written by a newer version, or by hand).
    sql(store_url, "UPDATE stepwarden_tasks SET on_failure = 'bogus' WHERE task_id = 'bad'")
    swept = await sweep(store)
    assert swept["good"].process_state == swept["also-good"].process_state == TaskState.PENDING
    assert swept["bad"].set_aside and swept["bad"].process_state == TaskState.ERROR
    await assert_set_aside(store, "bad", "ValueError")
    # Set aside, it is no longer held: the next sweep does not meet it again.
    assert await sweep(store) == {}


async def test_a_task_the_database_refuses_is_set_aside_and_the_others_recovered(
    store: Store, store_url: str
) -> None:
    await store.submit([task("good"), task("refused")])
    for c in await store.claim_tasks("s1", ["wf"], 2):
        expire(store_url, c.task.task_id)
    # The database refuses to release this one task (a constraint of the application's, say).
    if is_sqlite(store_url):
        script(
            store_url,
            "CREATE TRIGGER refuse BEFORE UPDATE OF process_state ON stepwarden_tasks"
            " WHEN NEW.task_id = 'refused' AND NEW.process_state = 'pending'"
            " BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END;",
        )
    else:
        sql(
            store_url,
            "ALTER TABLE stepwarden_tasks ADD CONSTRAINT refuse"
            " CHECK (task_id <> 'refused' OR process_state <> 'pending')",
        )
    swept = await sweep(store)
    assert swept["good"].process_state == TaskState.PENDING
    assert swept["refused"].set_aside and swept["refused"].process_state == TaskState.ERROR
    await assert_set_aside(store, "refused", "PermanentStoreError")
    good = await store.get_task("good")
    assert good is not None and good.failure_count == 1


async def assert_set_aside(store: Store, task_id: str, why: str) -> None:
    record = await store.get_task(task_id)
    assert record is not None
    assert record.process_state == TaskState.ERROR and record.locked_by is None
    assert record.error is not None and record.error.startswith("set aside for an operator: ")
    assert why in record.error
    kinds = [e.kind for e in await store.events(task_id=task_id)]
    assert kinds == ["set_aside", "alert"]
    [alert] = await store.events(task_id=task_id, kind="alert")
    assert alert.detail["reason"] == AlertReason.SET_ASIDE and alert.detail["then"] == "error"
    # No request of it is left for an agent: its open steps are closed, as abandoned.
    for step in await store.get_steps(task_id):
        assert step.state == StepState.FAILED and step.abandoned
    assert await store.claim_requests("a1", "pay", ["charge"], 10) == []


async def test_a_step_whose_error_reads_abandoned_is_not_compensated(store: Store) -> None:
    """Whether a step is undone is a fact of the store, not a reading of its error: a step
    that failed on its own is not compensated, whatever its error text says."""
    await store.submit([task("t1")])
    attempt = await claim_one(store)
    assert await store.dispatch_steps([undoable(dispatch("t1", attempt))]) != [None]
    [request] = await store.claim_requests("a1", "pay", ["charge"], 1)
    failed = StepOutcome(
        task_id="t1", seq=1, attempt=request.attempt, agent_instance="a1",
        state=StepState.FAILED, result=None, error="abandoned: the customer gave up", tries=1,
    )  # fmt: skip
    assert await store.complete_steps([failed]) == [True]
    outcome = TaskOutcome(task_id="t1", attempt=attempt, scheduler="s1", state=TaskState.ERROR,
                          result=None, error="step failed")  # fmt: skip
    assert await store.finish_tasks([outcome]) == [True]
    t1 = await store.get_task("t1")
    assert t1 is not None and t1.process_state == TaskState.ERROR  # nothing to undo
    [step] = await store.get_steps("t1")
    assert not step.abandoned


async def test_an_open_step_closed_with_its_task_is_abandoned_and_compensated(
    store: Store,
) -> None:
    await store.submit([task("t1")])
    attempt = await claim_one(store)
    assert await store.dispatch_steps([undoable(dispatch("t1", attempt))]) != [None]
    outcome = TaskOutcome(task_id="t1", attempt=attempt, scheduler="s1", state=TaskState.ERROR,
                          result=None, error="a later step failed")  # fmt: skip
    assert await store.finish_tasks([outcome]) == [True]
    t1 = await store.get_task("t1")
    assert t1 is not None and t1.process_state == TaskState.COMPENSATING
    [step] = await store.get_steps("t1")
    assert step.state == StepState.FAILED and step.abandoned
    assert step.error == "abandoned: the task is compensating"


async def test_a_tick_goes_on_batch_after_batch_while_a_batch_comes_back_full(
    store: Store, store_url: str
) -> None:
    """One tick of a supervisor that sweeps `batch` at a time recovers every expired task and
    wakes every task whose time has come, however many: it sweeps again while a batch comes
    back full."""
    expired = [f"t{i}" for i in range(5)]
    await store.submit([task(t) for t in expired])
    assert len(await store.claim_tasks("s1", ["wf"], 5)) == 5
    for t in expired:
        expire(store_url, t)
    past = datetime.now(UTC) - timedelta(minutes=1)
    due = [replace(task(f"d{i}"), start_at=past) for i in range(3)]
    await store.submit(due)
    supervisor = Supervisor(store, instance="sup", batch=2, backoff=BACKOFF, retention=None)
    recovered = await supervisor.tick()
    assert sorted(e.task_id for e in recovered) == expired
    woken = [await store.get_task(t.task_id) for t in due]
    assert {t and t.process_state for t in woken} == {TaskState.PENDING}
