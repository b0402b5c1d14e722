"""Upgrading a store that holds work: migrations convert what older versions wrote."""

from __future__ import annotations

import stepwarden as sw
from stepwarden.store import _sql, open_store

from ..rawsql import is_sqlite, script, sql


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
    store = open_store(url)
    await store.open(migrate=True)
    try:
        assert await store.schema_version() == _sql.latest_version(store.dialect)
        steps = await store.get_steps("t1")
        assert [(s.seq, s.abandoned) for s in steps] == [(1, True), (2, False), (3, False)]
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
    store = open_store(url)
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
        assert not isinstance(sent, sw.TaskState) and sent is not None and sent.woke
    finally:
        await store.close()
