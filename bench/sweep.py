"""The supervisor's sweep among many finished tasks: `finished` processed tasks (three
completed steps each, as the order workflow leaves them) and `expired` held tasks whose
complete_by passed, each with an open step whose complete_by passed, are inserted with SQL
straight into stepwarden_tasks / stepwarden_steps; then one `store.sweep(...)` is timed, as
the supervisor leader calls it (lease held, limit 500), and then a few sweeps with nothing
left to recover (what every supervisor tick costs)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sqlite3
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from .common import Resources, database_name, log, median

LEASE = "supervisor"
HOLDER = "bench-sweeper"
BATCH = 500  # the Supervisor's default batch
CHUNK = 100_000
EMPTY_SWEEPS = 5

ORDER_INPUT = '{"id": 1, "items": ["book", "lamp"], "amount": 19.5}'
STEP_RESULTS = (
    '{"reserved": ["book", "lamp"], "order": 1}',
    '{"receipt": "o1/2", "amount": 19.5}',
    '{"tracking": "t-1"}',
)
STEP_NAMES = (("inventory", "reserve"), ("payments", "charge"), ("shipping", "ship"))
TASK_RESULT = (
    '{"reserved": {"reserved": ["book", "lamp"], "order": 1}, "receipt": {"receipt": "o1/2",'
    ' "amount": 19.5}, "shipped": {"tracking": "t-1"}}'
)


async def _time_sweeps(url: str, expired: int) -> dict[str, Any]:
    from stepwarden.retry import Backoff
    from stepwarden.store import open_store

    store = open_store(url)
    await store.open(migrate=False)
    try:
        term = await store.acquire_lease(LEASE, HOLDER, 60.0)
        assert term is not None, "the lease is free in a new store"
        start = time.perf_counter()
        recovered = await store.sweep(
            lease=LEASE,
            holder=HOLDER,
            term=term,
            limit=BATCH,
            backoff=Backoff(initial=0.5, maximum=30.0),
        )
        first = time.perf_counter() - start
        if len(recovered) != expired:
            raise RuntimeError(f"the sweep recovered {len(recovered)} tasks, not {expired}")
        empty = []
        for _ in range(EMPTY_SWEEPS):
            start = time.perf_counter()
            again = await store.sweep(
                lease=LEASE,
                holder=HOLDER,
                term=term,
                limit=BATCH,
                backoff=Backoff(initial=0.5, maximum=30.0),
            )
            empty.append(time.perf_counter() - start)
            assert not again, again
        await store.release_lease(LEASE, HOLDER)
    finally:
        await store.close()
    return {
        "sweep_ms": round(first * 1000, 2),
        "recovered": expired,
        "empty_sweep_ms_median": round(median(empty) * 1000, 2),
        "empty_sweep_ms": [round(e * 1000, 2) for e in empty],
    }


async def _migrate(url: str) -> None:
    from stepwarden.store import open_store

    store = open_store(url)
    await store.open(migrate=True)
    await store.close()


# -- PostgreSQL ---------------------------------------------------------------------------
CACHE_PREFIX = "swbench_sweepcache_"
TABLES = ("stepwarden_tasks", "stepwarden_steps")


def _cache_key(finished: int, expired: int) -> str:
    """Changes whenever the engine's schema (its migrations) or this loader changes."""
    import stepwarden

    digest = hashlib.sha256(f"{finished}/{expired}".encode())
    sql_dir = Path(stepwarden.__file__).parent / "store" / "sql" / "postgres"
    for path in sorted(sql_dir.glob("[0-9]*.sql")):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:12]


LOAD_SETTINGS = (
    "SET synchronous_commit = off",
    "SET maintenance_work_mem = '256MB'",
    "SET max_parallel_maintenance_workers = 0",  # the loader runs one job per core itself
)


def _in_parallel(url: str, jobs: list[tuple[str, Any]], threads: int = 2) -> None:
    """Run the statements (sql, params) on `threads` connections at once."""
    pending = list(jobs)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        with psycopg.connect(url, autocommit=True) as db:
            for setting in LOAD_SETTINGS:
                db.execute(setting)
            while not errors:
                with lock:
                    if not pending:
                        return
                    sql, params = pending.pop(0)
                try:
                    db.execute(sql, params)
                except BaseException as exc:
                    errors.append(exc)
                    raise

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def _load_postgres(url: str, finished: int, expired: int) -> None:
    """Insert the rows with INSERT ... SELECT generate_series, one statement per table, with
    the two tables' keys, foreign key and indexes dropped first and built again after (one
    sort each instead of millions of index insertions), two connections at a time; then
    VACUUM ANALYZE. The database is new and dropped if this fails: nothing needs a single
    transaction."""
    with psycopg.connect(url, autocommit=True) as db:
        constraints = db.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), contype"
            " FROM pg_constraint WHERE (conrelid = ANY(%s::regclass[])"
            " OR confrelid = ANY(%s::regclass[])) AND contype IN ('p', 'u', 'f')",
            (list(TABLES), list(TABLES)),
        ).fetchall()
        indexes = db.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = ANY(%s)"
            " AND indexname NOT IN (SELECT conname FROM pg_constraint)",
            (list(TABLES),),
        ).fetchall()
        with db.transaction():
            for table, name, _, _ in sorted(constraints, key=lambda c: c[3] != "f"):
                db.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            for name, _ in indexes:
                db.execute(f'DROP INDEX "{name}"')
    tasks = (
        "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state,"
        " max_failures, attempt, complete_within, eligible_at, result,"
        " created_at, updated_at, finished_at) "
        "SELECT 'f' || i, 'order', %s::json, 'processed', 3, 1, 60,"
        " now() - interval '1 day', %s::json,"
        " now() - interval '1 day' + i * interval '50 ms',"
        " now() - interval '1 day' + i * interval '50 ms',"
        " now() - interval '1 day' + i * interval '50 ms'"
        " FROM generate_series(1, %s::int) AS i",
        (ORDER_INPUT, TASK_RESULT, finished),
    )
    steps = (
        "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation,"
        " state, attempt, task_attempt, priority, complete_by,"
        " idempotency_key, input, result, tries, created_at, dispatched_at,"
        " claimed_at, finished_at) "
        "SELECT 'f' || i, s.seq, s.name, s.agent, s.op, 'completed', 1, 1, 0,"
        " now() - interval '1 day' + i * interval '50 ms' + interval '30 s',"
        " 'f' || i || '/' || s.seq, %s::json, s.result, 1,"
        " now() - interval '1 day', now() - interval '1 day',"
        " now() - interval '1 day', now() - interval '1 day'"
        " FROM generate_series(1, %s::int) AS i CROSS JOIN (VALUES"
        " (1, %s, %s, %s, %s::json), (2, %s, %s, %s, %s::json), (3, %s, %s, %s, %s::json))"
        " AS s(seq, name, agent, op, result)",
        (
            ORDER_INPUT,
            finished,
            *(
                x
                for (agent, op), result in zip(STEP_NAMES, STEP_RESULTS, strict=True)
                for x in (f"{agent}.{op}", agent, op, result)
            ),
        ),
    )
    _in_parallel(url, [steps, tasks])  # the longer first
    log(f"sweep/postgres: {finished:,} finished tasks, {3 * finished:,} steps inserted")
    with psycopg.connect(url, autocommit=True) as db:
        _expired_postgres(db, expired)
    keys = [
        (f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}', None)
        for table, name, definition, kind in constraints
        if kind != "f"
    ]
    _in_parallel(url, [*keys, *((definition, None) for _, definition in indexes)])
    _in_parallel(
        url,
        [
            (f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}', None)
            for table, name, definition, kind in constraints
            if kind == "f"
        ],
    )
    log("sweep/postgres: keys, foreign key and indexes built")
    _in_parallel(url, [(f"VACUUM ANALYZE {table}", None) for table in TABLES])


def _expired_postgres(db: psycopg.Connection[Any], expired: int) -> None:
    db.execute(
        "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state, locked_by,"
        " complete_by, max_failures, attempt, complete_within, eligible_at, created_at,"
        " updated_at) "
        "SELECT 'x' || i, 'order', %s::json, 'processing', 'scheduler-gone',"
        " now() - interval '1 minute', 3, 1, 60, now() - interval '2 minutes',"
        " now() - interval '2 minutes', now() - interval '2 minutes'"
        " FROM generate_series(1, %s::int) AS i",
        (ORDER_INPUT, expired),
    )
    db.execute(
        "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
        " task_attempt, priority, complete_by, idempotency_key, input, result, tries,"
        " created_at, dispatched_at, claimed_at, finished_at) "
        "SELECT 'x' || i, 1, 'inventory.reserve', 'inventory', 'reserve', 'completed', 1, 1, 0,"
        " now() - interval '90 s', 'x' || i || '/1', %s::json, %s::json, 1,"
        " now() - interval '2 minutes', now() - interval '2 minutes',"
        " now() - interval '2 minutes', now() - interval '2 minutes'"
        " FROM generate_series(1, %s::int) AS i",
        (ORDER_INPUT, STEP_RESULTS[0], expired),
    )
    db.execute(
        "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state, attempt,"
        " task_attempt, priority, complete_by, idempotency_key, input, locked_by, tries,"
        " created_at, dispatched_at, claimed_at) "
        "SELECT 'x' || i, 2, 'payments.charge', 'payments', 'charge', 'running', 1, 1, 0,"
        " now() - interval '1 minute', 'x' || i || '/2', %s::json, 'agent-gone', 1,"
        " now() - interval '90 s', now() - interval '90 s', now() - interval '90 s'"
        " FROM generate_series(1, %s::int) AS i",
        (ORDER_INPUT, expired),
    )


def _table_mb(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as db:
        row = db.execute(
            "SELECT pg_total_relation_size('stepwarden_tasks')"
            " + pg_total_relation_size('stepwarden_steps')"
        ).fetchone()
    return round((row[0] if row else 0) / 2**20, 1)


def _cached(res: Resources, name: str) -> dict[str, Any] | None:
    with psycopg.connect(res.admin_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            (name,),
        ).fetchone()
    if row is None:
        return None
    try:
        return dict(json.loads(row[0] or "{}"))
    except ValueError:
        return {}


def _build_template(
    res: Resources, finished: int, expired: int, cache: str | None
) -> tuple[str, dict[str, Any]]:
    """A database holding the rows, never swept itself: each measurement sweeps a copy.
    With `cache`, it is kept on the server under that name for the next benchmark."""
    url = res.create_database("sweepsrc")
    start = time.perf_counter()
    asyncio.run(_migrate(url))
    _load_postgres(url, finished, expired)
    info = {
        "load_seconds": round(time.perf_counter() - start, 1),
        "built": datetime.now(UTC).isoformat(timespec="seconds"),
        "tables_mb": _table_mb(url),
    }
    name = database_name(url)
    if cache is None:
        return name, info
    with psycopg.connect(res.admin_url, autocommit=True) as admin:
        for (old,) in admin.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s",
            (f"{CACHE_PREFIX}{finished}\\_%",),
        ).fetchall():
            log(f"sweep/postgres: dropping {old}, a cache made for another schema or loader")
            admin.execute(f'DROP DATABASE IF EXISTS "{old}" WITH (FORCE)')
        admin.execute(f'ALTER DATABASE "{name}" RENAME TO "{cache}"')
        admin.execute(f"COMMENT ON DATABASE \"{cache}\" IS '{json.dumps(info)}'")
    res.databases.remove(name)
    return cache, info


def sweep_postgres(
    res: Resources, finished: int, expired: int, *, runs: int = 1, cache: bool = True
) -> dict[str, Any]:
    cache_name = f"{CACHE_PREFIX}{finished}_{_cache_key(finished, expired)}" if cache else None
    info = _cached(res, cache_name) if cache_name else None
    if info is not None and cache_name:
        template = cache_name
        load = f"cached in {cache_name} (built {info.get('built')} in {info.get('load_seconds')} s)"
        log(f"sweep/postgres: {load}")
    else:
        template, info = _build_template(res, finished, expired, cache_name)
        load = f"{info['load_seconds']} s" + (f", kept as {cache_name}" if cache_name else "")
    samples = []
    copies = []
    try:
        for run in range(runs):
            start = time.perf_counter()
            url = res.create_database(f"sweep{run}", template=template)
            copies.append(round(time.perf_counter() - start, 1))
            try:
                samples.append(asyncio.run(_time_sweeps(url, expired)))
            finally:
                res.drop_database(url)
            log(f"sweep/postgres run {run + 1}: {samples[-1]['sweep_ms']} ms")
    finally:
        if cache_name is None:
            res.drop_database(template)
    return {
        "sweep_ms": round(median([s["sweep_ms"] for s in samples]), 2),
        "sweep_ms_runs": [s["sweep_ms"] for s in samples],
        "empty_sweep_ms_median": round(median([s["empty_sweep_ms_median"] for s in samples]), 2),
        "recovered": expired,
        "finished_tasks": finished,
        "finished_steps": 3 * finished,
        "expired_tasks": expired,
        "load": load,
        "load_seconds": info.get("load_seconds"),
        "copy_seconds": copies,
        "tables_mb": info.get("tables_mb"),
        "runs": samples,
        "note": "each run sweeps a fresh copy (CREATE DATABASE ... TEMPLATE) of a database "
        "loaded with INSERT ... SELECT generate_series, keys and indexes built after the "
        "load, then VACUUM ANALYZE (what autovacuum does)",
    }


def sweep_sqlite(res: Resources, finished: int, expired: int, *, runs: int = 1) -> dict[str, Any]:
    workdir = res.temp_dir("sweep-sqlite")
    path = workdir / "store.db"
    url = f"sqlite:///{path}"
    try:
        asyncio.run(_migrate(url))
        start = time.perf_counter()
        db = sqlite3.connect(path, isolation_level=None)
        try:
            now = time.time()
            day = now - 86400
            series = (
                "WITH RECURSIVE s(i) AS (SELECT :first UNION ALL SELECT i + 1 FROM s"
                " WHERE i < :last) "
            )
            for first in range(1, finished + 1, CHUNK):
                last = min(finished, first + CHUNK - 1)
                p = {"first": first, "last": last, "day": day, "input": ORDER_INPUT}
                db.execute("BEGIN")
                db.execute(
                    series
                    + "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state,"
                    " max_failures, attempt, complete_within, eligible_at, result, created_at,"
                    " updated_at, finished_at) "
                    "SELECT 'f' || i, 'order', :input, 'processed', 3, 1, 60, :day, :result,"
                    " :day + i * 0.05, :day + i * 0.05, :day + i * 0.05 FROM s",
                    {**p, "result": TASK_RESULT},
                )
                for seq, ((agent, op), result) in enumerate(
                    zip(STEP_NAMES, STEP_RESULTS, strict=True), start=1
                ):
                    db.execute(
                        series
                        + "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation,"
                        " state, attempt, task_attempt, priority, complete_by, idempotency_key,"
                        " input, result, tries, created_at, dispatched_at, claimed_at,"
                        " finished_at) "
                        "SELECT 'f' || i, :seq, :name, :agent, :op, 'completed', 1, 1, 0,"
                        " :day + i * 0.05 + 30, 'f' || i || '/' || :seq, :input, :result, 1,"
                        " :day, :day, :day, :day FROM s",
                        {
                            **p,
                            "seq": seq,
                            "name": f"{agent}.{op}",
                            "agent": agent,
                            "op": op,
                            "result": result,
                        },
                    )
                db.execute("COMMIT")
                log(f"sweep/sqlite: {last:,}/{finished:,} finished tasks inserted")
            p = {"first": 1, "last": expired, "now": now, "input": ORDER_INPUT}
            db.execute("BEGIN")
            db.execute(
                series + "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state,"
                " locked_by, complete_by, max_failures, attempt, complete_within, eligible_at,"
                " created_at, updated_at) "
                "SELECT 'x' || i, 'order', :input, 'processing', 'scheduler-gone', :now - 60,"
                " 3, 1, 60, :now - 120, :now - 120, :now - 120 FROM s",
                p,
            )
            db.execute(
                series
                + "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state,"
                " attempt, task_attempt, priority, complete_by, idempotency_key, input, result,"
                " tries, created_at, dispatched_at, claimed_at, finished_at) "
                "SELECT 'x' || i, 1, 'inventory.reserve', 'inventory', 'reserve', 'completed',"
                " 1, 1, 0, :now - 90, 'x' || i || '/1', :input, :result, 1, :now - 120,"
                " :now - 120, :now - 120, :now - 120 FROM s",
                {**p, "result": STEP_RESULTS[0]},
            )
            db.execute(
                series
                + "INSERT INTO stepwarden_steps (task_id, seq, name, agent, operation, state,"
                " attempt, task_attempt, priority, complete_by, idempotency_key, input,"
                " locked_by, tries, created_at, dispatched_at, claimed_at) "
                "SELECT 'x' || i, 2, 'payments.charge', 'payments', 'charge', 'running', 1, 1,"
                " 0, :now - 60, 'x' || i || '/2', :input, 'agent-gone', 1, :now - 90,"
                " :now - 90, :now - 90 FROM s",
                p,
            )
            db.execute("COMMIT")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
        load = time.perf_counter() - start
        samples = []
        for run in range(runs):  # each run sweeps a copy of the loaded file
            copy = workdir / f"run{run}.db"
            shutil.copyfile(path, copy)
            samples.append(asyncio.run(_time_sweeps(f"sqlite:///{copy}", expired)))
            copy.unlink()
            log(f"sweep/sqlite run {run + 1}: {samples[-1]['sweep_ms']} ms")
        return {
            "sweep_ms": round(median([s["sweep_ms"] for s in samples]), 2),
            "sweep_ms_runs": [s["sweep_ms"] for s in samples],
            "empty_sweep_ms_median": round(
                median([s["empty_sweep_ms_median"] for s in samples]), 2
            ),
            "recovered": expired,
            "finished_tasks": finished,
            "finished_steps": 3 * finished,
            "expired_tasks": expired,
            "load": f"{load:.1f} s",
            "load_seconds": round(load, 1),
            "file_mb": round(path.stat().st_size / 2**20, 1),
            "runs": samples,
            "note": "no ANALYZE (SQLite does not run it by itself)",
        }
    finally:
        res.remove_path(workdir)


# -- waiting tasks: the supervisor's wake-up among many sleepers ----------------------------


async def _time_wakes(url: str, due: int) -> dict[str, Any]:
    from stepwarden.store import open_store

    store = open_store(url)
    await store.open(migrate=False)
    try:
        term = await store.acquire_lease(LEASE, HOLDER, 60.0)
        assert term is not None, "the lease is free in a new store"
        start = time.perf_counter()
        woken = await store.wake_due(lease=LEASE, holder=HOLDER, term=term, limit=BATCH)
        first = time.perf_counter() - start
        if len(woken) != due:
            raise RuntimeError(f"the supervisor woke {len(woken)} tasks, not {due}")
        empty = []
        for _ in range(EMPTY_SWEEPS):
            start = time.perf_counter()
            again = await store.wake_due(lease=LEASE, holder=HOLDER, term=term, limit=BATCH)
            empty.append(time.perf_counter() - start)
            assert not again, again
        await store.release_lease(LEASE, HOLDER)
    finally:
        await store.close()
    return {
        "wake_ms": round(first * 1000, 2),
        "empty_wake_ms_median": round(median(empty) * 1000, 2),
    }


def wake_postgres(res: Resources, waiting: int, due: int, *, runs: int = 1) -> dict[str, Any]:
    """`waiting` tasks asleep until tomorrow and `due` whose timer has fired, loaded straight
    into stepwarden_tasks; then the supervisor's wake-up (`store.wake_due`, lease held, limit
    500) is timed: it reads the index of waiting tasks by wake_at, so it costs what is due."""
    samples = []
    for run in range(runs):
        url = res.create_database(f"wake{run}")
        try:
            asyncio.run(_migrate(url))
            with psycopg.connect(url, autocommit=True) as db:
                db.execute(
                    "INSERT INTO stepwarden_tasks (task_id, workflow, input, process_state,"
                    " max_failures, complete_within, eligible_at, created_at, updated_at,"
                    " wake_at, waiting_for)"
                    " SELECT 'w' || g, 'order', %s::json, 'waiting', 3, 30, now(), now(), now(),"
                    " CASE WHEN g <= %s THEN now() - interval '1 s'"
                    " ELSE now() + interval '1 day' END, 'timer'"
                    " FROM generate_series(1, %s) AS g",
                    (ORDER_INPUT, due, waiting + due),
                )
                db.execute("ANALYZE stepwarden_tasks")
            log(f"wake/postgres run {run + 1}: {waiting:,} waiting + {due} due tasks loaded")
            samples.append(asyncio.run(_time_wakes(url, due)))
            log(f"wake/postgres run {run + 1}: {samples[-1]['wake_ms']} ms")
        finally:
            res.drop_database(url)
    return {
        "waiting_tasks": waiting,
        "due_tasks": due,
        "wake_ms": round(median([s["wake_ms"] for s in samples]), 2),
        "wake_ms_runs": [s["wake_ms"] for s in samples],
        "empty_wake_ms_median": round(median([s["empty_wake_ms_median"] for s in samples]), 2),
        "load": os.getloadavg(),
    }
