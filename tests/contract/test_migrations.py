"""Upgrading a store that holds work: migrations convert what older versions wrote."""

from __future__ import annotations

from typing import Any

import stepwarden as sw
from stepwarden import _json
from stepwarden.records import CallStop
from stepwarden.sealing import input_digest
from stepwarden.store import _sql, open_one

from ..rawsql import is_sqlite, script, seconds_until, sql
from ..support.worker import running


def build_at(url: str, version: int) -> None:
    """The schema as stepwarden left it at `version` (its migrations up to there, recorded)."""
    dialect = "sqlite" if is_sqlite(url) else "postgres"
    script(
        url,
        "CREATE TABLE stepwarden_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
        " applied_at REAL NOT NULL DEFAULT 0)"
        if dialect == "sqlite"
        else _sql.queries(dialect)["create_schema_table"],
    )
    for m in _sql.migrations(dialect):
        if m.version <= version:
            script(url, m.sql)
            sql(url, f"INSERT INTO stepwarden_schema (version, name) VALUES ({m.version},"
                     f" '{m.name}')")  # fmt: skip


async def test_steps_abandoned_before_the_flag_existed_are_flagged(empty_store_url: str) -> None:
    url = empty_store_url
    build_at(url, 4)
    now = "0" if is_sqlite(url) else "now()"
    sql(
        url,
        "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
        f" complete_within, eligible_at, created_at, updated_at) VALUES ('t1', 'wf', '{{}}',"
        f" 'compensating', 3, 30, {now}, {now}, {now})",
    )
    for seq, state, error in [
        (1, "failed", "abandoned: the task is compensating"),
        (2, "failed", "PermanentError: declined"),
        (3, "completed", None),
    ]:
        sql(
            url,
            "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
            " task_attempt, priority, complete_by, idempotency_key, input, error, created_at,"
            f" dispatched_at) VALUES ('t1', {seq}, 'pay.charge', 'pay', 'charge', '{state}', 1,"
            f" 1, 0, {now}, 't1/{seq}', '[]', {'NULL' if error is None else repr(error)},"
            f" {now}, {now})",
        )
    store = open_one(url)
    await store.open(migrate=True)
    try:
        assert await store.schema_version() == _sql.latest_version(store.dialect)
        steps = await store.get_steps("t1")
        assert [(s.seq, s.abandoned) for s in steps] == [(1, True), (2, False), (3, False)]
    finally:
        await store.close()


async def test_steps_and_waits_recorded_before_positions_are_found_at_their_seq(
    empty_store_url: str,
) -> None:
    """A task in flight across the upgrade that brought parallel steps: its steps and waits,
    numbered in order, take that number as their place, so its replay finds them; a
    compensation step has no place."""
    url = empty_store_url
    build_at(url, 8)
    now = "0" if is_sqlite(url) else "now()"
    sql(  # claimed once before the upgrade (attempt 1), pending again since
        url,
        "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
        f" complete_within, eligible_at, created_at, updated_at, attempt) VALUES ('t1', 'wf',"
        f" '{{}}', 'pending', 3, 30, {now}, {now}, {now}, 1)",
    )
    for seq, compensates in [(1, "NULL"), (3, "NULL"), (4, "1")]:
        sql(
            url,
            "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
            " task_attempt, priority, complete_by, idempotency_key, input, created_at,"
            f" dispatched_at, compensates) VALUES ('t1', {seq}, 'pay.charge', 'pay', 'charge',"
            f" 'completed', 1, 1, 0, {now}, 't1/{seq}', '[]', {now}, {now}, {compensates})",
        )
    sql(
        url,
        "INSERT INTO stepwarden_waits (task_id, seq, kind, name, wake_at, state, created_at)"
        f" VALUES ('t1', 2, 'timer', '', {now}, 'done', {now})",
    )
    store = open_one(url)
    await store.open(migrate=True)
    try:
        steps = await store.get_steps("t1")
        assert [(s.seq, s.position) for s in steps] == [(1, "1"), (3, "3"), (4, None)]
        [claimed] = await store.claim_tasks("s1", ["wf"], 1)
        assert claimed.waits == {"2": (2, "timer", "")}
    finally:
        await store.close()


async def test_tasks_stored_before_versions_are_version_1_and_run_on_version_1_code(
    empty_store_url: str,
) -> None:
    """A store upgraded to workflow versions (0011): the tasks it held are version 1, and a
    scheduler whose code declares the workflow without a version (version 1) runs them; the
    registry's rows run version 1 of their workflows, and schedules make version 1 tasks."""
    url = empty_store_url
    build_at(url, 10)  # the schema as it was before 0011
    now = "0" if is_sqlite(url) else "now()"
    sql(
        url,
        "INSERT INTO stepwarden_tasks (task_id, workflow, input, max_failures, complete_within,"
        f" eligible_at, created_at, updated_at) VALUES ('old-1', 'wf', '{{\"n\": 1}}', 3, 30,"
        f" {now}, {now}, {now})",
    )
    sql(
        url,
        "INSERT INTO stepwarden_schedulers (instance, workflows, capacity, held, started_at,"
        f" heartbeat_at, expires_at) VALUES ('s-old', '[\"wf\", \"other\"]', 10, 0, {now},"
        f" {now}, {now})",
    )
    sql(
        url,
        "INSERT INTO stepwarden_schedules (name, workflow, input, timezone, complete_within,"
        " max_failures, on_failure, catch_up, next_at, updated_at) VALUES ('nightly', 'wf',"
        f" 'null', 'UTC', 30, 3, 'compensate', 'skip', {now}, {now})",
    )
    store = open_one(url)
    await store.open(migrate=True)
    try:
        assert await store.schema_version() == _sql.latest_version(store.dialect)
        [task] = await store.list_tasks()
        assert (task.task_id, task.version) == ("old-1", 1)
        [old] = await store.list_schedulers()
        assert sorted(old.versions) == [("other", 1), ("wf", 1)]
        [schedule] = await store.schedules()
        assert schedule.version == 1
        # A claim for version 2 of the workflow leaves it alone.
        assert await store.claim_tasks("v2-only", [("wf", 2)], 10) == []
    finally:
        await store.close()

    app = sw.App("old", store=url)

    @app.workflow
    async def wf(ctx: sw.Context, value: Any) -> Any:
        return value

    try:
        async with running(app):
            assert await app.result_async("old-1", timeout=30) == {"n": 1}
        assert (await app.status_async("old-1")).version == 1
    finally:
        await app.aclose()


async def test_a_compensation_waiting_before_the_upgrade_still_waits_for_complete_by(
    empty_store_url: str,
) -> None:
    # Migration 0010 converts no row: a step abandoned before it has no call_stopped_at, and
    # a compensating task no backoff_until. Its agent's word that the call stopped, after the
    # upgrade, is recorded, but brings the compensation no sooner than before: the abandoned
    # step's complete_by.
    url = empty_store_url
    build_at(url, 8)
    sqlite = is_sqlite(url)
    now = "((julianday('now') - 2440587.5) * 86400.0)" if sqlite else "now()"
    later = f"({now} + 60)" if sqlite else "(now() + interval '60 seconds')"
    sql(
        url,
        "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
        f" complete_within, eligible_at, created_at, updated_at) VALUES ('t1', 'wf', '{{}}',"
        f" 'compensating', 3, 30, {later}, {now}, {now})",
    )
    sql(
        url,
        "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
        " task_attempt, priority, complete_by, idempotency_key, input, error, created_at,"
        " dispatched_at, abandoned, locked_by) VALUES ('t1', 1, 'pay.charge', 'pay', 'charge',"
        f" 'failed', 1, 1, 0, {later}, 't1/1', '[]', 'abandoned: the task is compensating',"
        f" {now}, {now}, {'1' if sqlite else 'true'}, 'a1')",
    )
    store = open_one(url)
    await store.open(migrate=True)
    try:
        assert await store.schema_version() == _sql.latest_version(store.dialect)
        [step] = await store.get_steps("t1")
        assert (step.abandoned, step.call_stopped_at) == (True, None)
        stop = CallStop(task_id="t1", seq=1, attempt=1, agent_instance="a1", reason="test")
        assert await store.stop_calls([stop]) == [True]
        assert (await store.get_steps("t1"))[0].call_stopped_at is not None
        assert await store.claim_tasks("s1", ["wf"], 1) == []
        [(left,)] = sql(
            url,
            f"SELECT {seconds_until(url, 'eligible_at')} FROM stepwarden_tasks"
            " WHERE task_id = 't1'",
        )
        assert float(left) > 30
    finally:
        await store.close()


async def test_waits_recorded_before_children_existed_are_kept(empty_store_url: str) -> None:
    """Migration 0012 lets a wait have no wake_at (a child's); on SQLite it moves the waits to
    a new table: those recorded before keep every column."""
    url = empty_store_url
    build_at(url, 9)
    now = "0" if is_sqlite(url) else "now()"
    later = "100" if is_sqlite(url) else "now() + interval '100 seconds'"
    sql(
        url,
        "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
        f" complete_within, eligible_at, created_at, updated_at, wake_at, waiting_for) VALUES"
        f" ('t1', 'wf', '{{}}', 'waiting', 3, 30, {now}, {now}, {now}, {later}, 'event:go')",
    )
    sql(
        url,
        "INSERT INTO stepwarden_waits (task_id, seq, position, kind, name, wake_at, state,"
        f" created_at) VALUES ('t1', 2, '2', 'event', 'go', {later}, 'open', {now})",
    )
    store = open_one(url)
    await store.open(migrate=True)
    try:
        assert await store.schema_version() == _sql.latest_version(store.dialect)
        [wait] = await store.waits("t1")
        assert (wait.seq, wait.position, wait.kind, wait.name, wait.state) == (
            2, "2", "event", "go", "open",
        )  # fmt: skip
        assert wait.wake_at is not None
        task = await store.get_task("t1")
        assert task is not None and (task.parent_id, task.parent_position) == (None, None)
        sent = await store.send_event("t1", "go", '"yes"', "e1")  # its open wait wakes it
        assert isinstance(sent, sw.SendOutcome) and sent.woke
    finally:
        await store.close()


async def test_work_waiting_before_aging_is_ranked_by_its_age_and_priority(
    empty_store_url: str,
) -> None:
    """A store upgraded to aging priorities (0014): the tasks and requests it held are
    ranked as new ones are, their submit (or dispatch) less their priority's head start, and
    claims take them in that order: a task of priority 0 waiting 20 s goes before one of
    priority 10 waiting 5 s."""
    url = empty_store_url
    build_at(url, 13)
    sqlite = is_sqlite(url)

    def ago(seconds: int) -> str:
        if sqlite:
            return f"((julianday('now') - 2440587.5) * 86400.0 - {seconds})"
        return f"(now() - interval '{seconds} seconds')"

    for task_id, priority, age, state in [
        ("high-new", 10, 5, "pending"),
        ("low-old", 0, 20, "pending"),
        ("high-old", 10, 30, "pending"),
        ("held", 0, 60, "processing"),
    ]:
        sql(
            url,
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, priority, eligible_at, created_at, updated_at, attempt, locked_by)"
            f" VALUES ('{task_id}', 'wf', '{{}}', '{state}', 3, 30, {priority}, {ago(age)},"
            f" {ago(age)}, {ago(age)}, {int(state == 'processing')},"
            f" {'NULL' if state == 'pending' else repr('s0')})",
        )
    for seq, priority, age in [(1, 10, 5), (2, 0, 20)]:
        sql(
            url,
            "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
            " task_attempt, priority, complete_by, idempotency_key, input, created_at,"
            f" dispatched_at) VALUES ('held', {seq}, 'pay.charge', 'pay', 'charge',"
            f" 'not_started', 1, 1, {priority}, {ago(-60)}, 'held/{seq}', '[]', {ago(age)},"
            f" {ago(age)})",
        )
    store = open_one(url)
    await store.open(migrate=True)
    try:
        claimed = await store.claim_tasks("s1", ["wf"], 10)
        assert [c.task.task_id for c in claimed] == ["high-old", "low-old", "high-new"]
        requests = await store.claim_requests("a1", "pay", ["charge"], 10)
        assert [r.seq for r in requests] == [2, 1]
    finally:
        await store.close()


async def test_tasks_stored_before_input_digests_get_theirs_when_migrated(
    empty_store_url: str,
) -> None:
    """A store upgraded to input digests (0019): every task it held gets the digest of its
    canonical input (keys sorted), the same a new submit of that input computes, so that a
    re-submit of an old task compares by it."""
    url = empty_store_url
    build_at(url, 18)
    now = "0" if is_sqlite(url) else "now()"
    for n in range(3):
        sql(
            url,
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            f" complete_within, eligible_at, created_at, updated_at) VALUES ('old-{n}', 'wf',"
            f' \'{{"b": {n}, "a": {{"$secret": "pin-{n}"}}}}\', \'pending\', 3, 30, {now},'
            f" {now}, {now})",
        )
    store = open_one(url)
    await store.open(migrate=True)
    try:
        for n in range(3):
            task = await store.get_task(f"old-{n}")
            assert task is not None
            digest = input_digest(_json.dumps({"a": sw.Secret(f"pin-{n}"), "b": n}))
            assert task.input_digest == digest
    finally:
        await store.close()


async def test_requests_queued_before_tenants_of_steps_are_shared_by_their_tasks_tenants(
    empty_store_url: str,
) -> None:
    """A store upgraded to the fair share of the agents' queue (0024): each step it held gets
    its task's tenant, so that the requests queued before it are shared among those tenants
    at once: acme's four, queued first, and globex's four, two each to a claim of four."""
    url = empty_store_url
    build_at(url, 22)
    sqlite = is_sqlite(url)

    def ago(seconds: int) -> str:
        if sqlite:
            return f"((julianday('now') - 2440587.5) * 86400.0 - {seconds})"
        return f"(now() - interval '{seconds} seconds')"

    for tenant in ("acme", "globex"):
        sql(
            url,
            "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, max_failures,"
            " complete_within, eligible_at, created_at, updated_at, attempt, locked_by, tenant)"
            f" VALUES ('{tenant}', 'wf', '{{}}', 'processing', 3, 30, {ago(60)}, {ago(60)},"
            f" {ago(60)}, 1, 's0', '{tenant}')",
        )
    for tenant, age in (("acme", 40), ("globex", 20)):
        for seq in range(1, 5):
            sql(
                url,
                "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state,"
                " attempt, task_attempt, priority, complete_by, idempotency_key, input,"
                " created_at, dispatched_at, ranked_at) VALUES"
                f" ('{tenant}', {seq}, 'pay.charge', 'pay', 'charge', 'not_started', 1, 1, 0,"
                f" {ago(-60)}, '{tenant}/{seq}', '[]', {ago(age)}, {ago(age)}, {ago(age - seq)})",
            )
    store = open_one(url)
    await store.open(migrate=True)
    try:
        requests = await store.claim_requests("a1", "pay", ["charge"], 4)
        assert sorted((r.task_id, r.seq) for r in requests) == [
            ("acme", 1), ("acme", 2), ("globex", 1), ("globex", 2)
        ]  # fmt: skip
        tenants = sql(url, "SELECT DISTINCT task_id, tenant FROM stepwarden_steps")
        assert sorted(tenants) == [("acme", "acme"), ("globex", "globex")]
    finally:
        await store.close()
