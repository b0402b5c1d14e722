"""One adapter per system under test: prepare a fresh store, start the worker processes,
submit the "order" workflows (W1) or run them one after another (W2), and say when each
finished by the system's own record of it.

Every adapter is driven the same way by `bench.run`:

    prepare(run) -> start_workers(n) -> throughput(n, variant) | latency(n) -> stop -> cleanup()

W1 comes in three variants (`VARIANTS`), which differ only in how the client submits:
"batch" (batches of SUBMIT_BATCH where the system can batch), "single" (one workflow per
call, each call awaited before the next) and "concurrent" (`submitters` submitters in the
client process, each submitting its share one at a time: asyncio tasks where the client API
is async, threads where it is sync).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import json
import os
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from .common import (
    ROOT,
    Child,
    Resources,
    log_contains,
    log_lines,
    median,
    wait_for,
)
from .workload import order_input

SUBMIT_BATCH = 100
"""Workflows per submission call where the system has a batch submit."""
COMPLETION_POLL = 0.05
"""Seconds between the harness's reads of how many workflows are done (W1)."""
RESULT_POLL = 0.01
"""Seconds between a client's reads of one workflow's result, where the system offers no
wake-up for it (DBOS's handle, procrastinate): the observation's granularity in W2."""
W1_TIMEOUT = 600.0
VARIANTS = ("batch", "single", "concurrent")
"""W1's ways of submitting: batches where the system can batch, one workflow per call,
`SUBMITTERS` concurrent submitters each one workflow per call."""
SUBMITTERS = 16


@dataclass
class Throughput:
    n: int
    elapsed: float
    """Seconds from the first submit to the last completion (as the system recorded it)."""
    submit_seconds: float
    """Seconds the client took to submit all of them."""
    harness_queries: int
    """Transactions the harness itself ran on the system's database while measuring
    (completion polls); subtracted from the commit count."""
    submit_latencies: list[float] = field(default_factory=list)
    """Seconds of each submit call (variants "single" and "concurrent")."""


@dataclass
class AsyncSubmit:
    """Submits workflow i through an async client API, on the client's event loop."""

    runner: asyncio.Runner
    one: Callable[[int], Awaitable[object]]


@dataclass
class SyncSubmit:
    """Submits workflow i through a blocking client API (threads submit concurrently)."""

    one: Callable[[int], object]


def submit_each(
    submit: AsyncSubmit | SyncSubmit, n: int, submitters: int, start: int = 0
) -> list[float]:
    """Submit workflows start..start+n-1 one per call: `submitters` submitters, submitter k
    taking start+k, start+k+submitters, ...; each awaits its call before its next. Returns
    each call's seconds."""

    if isinstance(submit, AsyncSubmit):
        one_async = submit.one

        async def share_async(k: int) -> list[float]:
            out = []
            for i in range(start + k, start + n, submitters):
                began = time.perf_counter()
                await one_async(i)
                out.append(time.perf_counter() - began)
            return out

        async def all_async() -> list[list[float]]:
            if submitters == 1:
                return [await share_async(0)]
            return list(await asyncio.gather(*(share_async(k) for k in range(submitters))))

        shares = submit.runner.run(all_async())
    else:
        one_sync = submit.one

        def share_sync(k: int) -> list[float]:
            out = []
            for i in range(start + k, start + n, submitters):
                began = time.perf_counter()
                one_sync(i)
                out.append(time.perf_counter() - began)
            return out

        if submitters == 1:
            shares = [share_sync(0)]
        else:
            with ThreadPoolExecutor(submitters, thread_name_prefix="submitter") as pool:
                shares = list(pool.map(share_sync, range(submitters)))
    return [x for share in shares for x in share]


class System(abc.ABC):
    name: str
    store: str
    postgres: bool = False
    submit_mode: str = ""
    submit_one_mode: str = ""
    worker_mode: str = ""

    server: str | None = None
    """The store's server process, whose CPU W1 measures: "postgresql", "redis" or None."""
    concurrency: str = ""
    """How the client's submitters share its connections (variant "concurrent")."""

    def __init__(self, res: Resources, *, workers: int, log_dir: Path) -> None:
        self.res = res
        self.workers = workers
        self.log_dir = log_dir
        self.db_url: str | None = None
        self._watched: list[Child] = []

    @abc.abstractmethod
    def prepare(self, run: int) -> None:
        """A fresh store (database, file or Redis database) with its schema in place."""

    @abc.abstractmethod
    def start_workers(self, phase: str) -> list[Child]:
        """Start `self.workers` worker processes and wait until they are ready."""

    def watch(self, children: Sequence[Child]) -> None:
        """The worker processes whose exit fails W1 at once (rather than at its timeout)."""
        self._watched = list(children)

    def _check_workers(self) -> None:
        for child in self._watched:
            if not child.alive():
                raise RuntimeError(
                    f"{child.name} exited ({child.popen.returncode}) during W1:\n" + child.tail()
                )

    def throughput(
        self, n: int, variant: str = "batch", submitters: int = SUBMITTERS
    ) -> Throughput:
        """W1: submit workflows 0..n-1 the variant's way, then wait until all are done."""
        latencies: list[float] = []
        if variant == "batch":
            submit_all = self.batch_submitter(n)
        elif variant in ("single", "concurrent"):
            each = self.one_submitter()
            k = 1 if variant == "single" else submitters

            def submit_all() -> None:
                latencies.extend(submit_each(each, n, k))
        else:
            raise ValueError(f"unknown W1 variant {variant!r}")
        t0 = time.time()
        start = time.perf_counter()
        submit_all()
        submit_seconds = time.perf_counter() - start
        last, queries = self.wait_done(n)
        return Throughput(n, last - t0, submit_seconds, queries, latencies)

    @abc.abstractmethod
    def batch_submitter(self, n: int) -> Callable[[], None]:
        """What submits workflows 0..n-1 in W1's "batch" variant (built before the clock
        starts)."""

    @abc.abstractmethod
    def one_submitter(self) -> AsyncSubmit | SyncSubmit:
        """What submits workflow i alone (variants "single" and "concurrent")."""

    @abc.abstractmethod
    def wait_done(self, n: int) -> tuple[float, int]:
        """Wait until the n workflows are done: the last one's completion (epoch seconds, as
        the system recorded it) and the queries the harness ran on the system's database."""

    @abc.abstractmethod
    def latency(self, n: int, offset: int) -> list[float]:
        """Seconds from submit to result of each of n workflows run one after another."""

    def latency_breakdown(self) -> dict[str, float] | None:
        """Where W2's time went, where the system records enough to say."""
        return None

    def around_throughput(
        self, workers: Sequence[Child], measure: Callable[[], Throughput]
    ) -> Throughput:
        """Run W1's measure (a profiler may wrap it)."""
        return measure()

    def stop_workers(self, children: Sequence[Child]) -> None:
        self.res.stop_all(children)

    @abc.abstractmethod
    def open_client(self) -> None:
        """Connect the client (as a measured phase does before it submits)."""

    @abc.abstractmethod
    def close_client(self) -> None:
        """Close the client's connections (so that their statistics are flushed)."""

    @abc.abstractmethod
    def cleanup(self) -> None:
        """Remove the store made by prepare()."""

    def describe(self) -> dict[str, Any]:
        return {
            "submit": self.submit_mode,
            "submit_one": self.submit_one_mode,
            "concurrent_submitters": self.concurrency,
            "workers": self.worker_mode,
            "server": self.server,
        }

    def postgres_databases(self) -> list[tuple[str, str]]:
        """(admin URL, database URL) of each PostgreSQL database of the system's store: W1
        counts the commits of each and the CPU of their servers."""
        if not self.postgres or self.db_url is None:
            return []
        return [(self.res.admin_url, self.db_url)]

    def worker_env(self) -> dict[str, str]:
        # The workers import bench.peers.* / bench.workload from the project's directory.
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        return {"PYTHONUNBUFFERED": "1", "PYTHONPATH": path}


def _wait_ready(children: Sequence[Child], ready: Any, what: str, timeout: float = 60) -> None:
    wait_for(lambda: all(ready(c) for c in children), timeout=timeout, what=what, children=children)


def _bin(name: str) -> str:
    """A console script installed next to this interpreter."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


# -- stepwarden ---------------------------------------------------------------------------
class Stepwarden(System):
    submit_mode = f"App.submit_many_async, batches of {SUBMIT_BATCH} (App.new_task)"
    submit_one_mode = "App.submit_async"

    def __init__(
        self,
        res: Resources,
        *,
        workers: int,
        log_dir: Path,
        postgres: bool,
        worker_args: Sequence[str] = (),
        tracing: str | None = None,
        wake: bool = True,
    ) -> None:
        super().__init__(res, workers=workers, log_dir=log_dir)
        self.postgres = postgres
        self.tracing = tracing
        """How the workers trace (`bench.tracing.MODES`), None: as the engine defaults."""
        if postgres and not wake:
            raise ValueError("wake-ups can be turned off on SQLite only (?wake=off)")
        self.wake = wake
        """SQLite: whether the processes on the file wake each other by datagrams (the
        default), or only poll (`?wake=off` in the URL of the workers and the client)."""
        if postgres:
            self.name = "stepwarden-postgres"
        else:
            self.name = "stepwarden-sqlite" if wake else "stepwarden-sqlite-poll"
        self.store = "PostgreSQL" if postgres else "SQLite"
        self.server = "postgresql" if postgres else None
        self.concurrency = "asyncio tasks sharing one App, " + (
            "whose store's pool has up to 10 connections (the default)"
            if postgres
            else "whose store has one connection, in one thread"
        )
        self.worker_args = list(worker_args)
        extra = "; " + " ".join(worker_args) if worker_args else ""
        if not wake:
            extra += "; ?wake=off: no wake-ups between processes, each polls every 0.05 s"
        self.worker_mode = (
            f"{workers} x `stepwarden worker bench.workload:app` (scheduler, agents and "
            f"supervisor in each; engine defaults{extra})"
        )
        self.url = ""
        self.path = ""
        """SQLite: the database file the harness reads (the URL may carry options)."""
        self._dir: Path | None = None
        self._runner: asyncio.Runner | None = None
        self._app: Any = None

    def prepare(self, run: int) -> None:
        if self.postgres:
            self.url = self.db_url = self.res.create_database(f"sw{run}")
        else:
            tag = "sqlite" if self.wake else "sqlite-poll"
            self._dir = self.res.temp_dir(f"sw-{tag}-{run}")
            self.path = str(self._dir / "store.db")
            self.url = f"sqlite:///{self.path}" + ("" if self.wake else "?wake=off")
        self._client()  # opens the store: migrates it before anything is counted

    def _client(self) -> Any:
        if self._runner is None:
            from . import workload

            # The workers' App, pointed at this run's store (as `stepwarden --store` does).
            self._runner = asyncio.Runner()
            self._app = workload.app
            self._app.store_url = self.url
            self._runner.run(self._app.store())
        return self._app

    def open_client(self) -> None:
        self._client()

    def submit(self, workflow: str, payload: Any, *, task_id: str) -> None:
        """Submit one task through the client (App.submit_async)."""
        app = self._client()
        assert self._runner is not None
        self._runner.run(app.submit_async(workflow, payload, task_id=task_id))

    def close_client(self) -> None:
        if self._runner is not None:
            self._runner.run(self._app.aclose())
            self._runner.close()
            self._runner = None
            self._app = None

    def worker_env(self) -> dict[str, str]:
        env = super().worker_env()
        if self.tracing is not None:
            env["BENCH_TRACING"] = self.tracing  # read by bench.workload at import
        return env

    def task_databases(self) -> list[str]:
        """The PostgreSQL databases holding the tasks (one; a store of shards: each shard)."""
        return [self.url]

    def worker_command(self, i: int) -> list[str]:
        cmd = [
            _bin("stepwarden"),
            "--store",
            self.url,
            "--log-level",
            "info",  # the hot path logs nothing at info; "worker ... running" says ready
            "worker",
            "bench.workload:app",
            *self.worker_args,
        ]
        return cmd

    def start_workers(self, phase: str) -> list[Child]:
        children = [
            self.res.spawn(
                f"{self.name}-{phase}-worker{i}",
                self.worker_command(i),
                env=self.worker_env(),
                log_dir=self.log_dir,
            )
            for i in range(self.workers)
        ]
        _wait_ready(children, self._ready, "stepwarden workers")
        return children

    def _ready(self, child: Child) -> bool:
        """The worker runs its roles (on every shard it serves: one line each)."""
        return log_lines(child, " running ") >= len(self.task_databases())

    # W1
    def batch_submitter(self, n: int) -> Callable[[], None]:
        app = self._client()
        runner = self._runner
        assert runner is not None
        tasks = [app.new_task("order", order_input(i), task_id=f"o{i}") for i in range(n)]

        async def submit_all() -> None:
            for i in range(0, n, SUBMIT_BATCH):
                await app.submit_many_async(tasks[i : i + SUBMIT_BATCH])

        return lambda: runner.run(submit_all())

    def one_submitter(self) -> AsyncSubmit:
        app = self._client()
        assert self._runner is not None

        async def one(i: int) -> None:
            await app.submit_async("order", order_input(i), task_id=f"o{i}")

        return AsyncSubmit(self._runner, one)

    def wait_done(self, n: int) -> tuple[float, int]:
        _, last, queries = self._wait_done(n)
        return last, queries

    def _wait_done(self, n: int, prefix: str = "") -> tuple[int, float, int]:
        """Wait until n tasks (those whose id starts with prefix) are processed."""
        queries = 0
        like = prefix + "%"
        deadline = time.monotonic() + W1_TIMEOUT
        if self.postgres:
            with contextlib.ExitStack() as stack:
                dbs = [
                    stack.enter_context(psycopg.connect(url, autocommit=True))
                    for url in self.task_databases()
                ]
                while True:
                    done = failed = 0
                    last: float | None = None
                    for conn in dbs:  # each shard's count (one database: the store's)
                        queries += 1
                        row = conn.execute(
                            "SELECT count(*) FILTER (WHERE process_state = 'processed'),"
                            " count(*) FILTER (WHERE process_state IN ('error', 'compensated',"
                            " 'compensation_failed', 'cancelled')),"
                            " extract(epoch FROM max(finished_at))::float8"
                            " FROM stepwarden_tasks WHERE task_id LIKE %s",
                            (like,),
                        ).fetchone()
                        assert row is not None
                        done, failed = done + int(row[0]), failed + int(row[1])
                        if row[2] is not None:
                            last = float(row[2]) if last is None else max(last, float(row[2]))
                    if failed:
                        raise RuntimeError(f"{failed} workflow(s) did not succeed")
                    if done >= n and last is not None:
                        return done, last, queries
                    self._check_workers()
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{done}/{n} done after {W1_TIMEOUT}s")
                    time.sleep(COMPLETION_POLL)
        db = sqlite3.connect(self.path, timeout=30)
        try:
            while True:
                row = db.execute(
                    "SELECT count(*) FILTER (WHERE process_state = 'processed'),"
                    " count(*) FILTER (WHERE process_state IN ('error', 'compensated',"
                    " 'compensation_failed', 'cancelled')), max(finished_at)"
                    " FROM stepwarden_tasks WHERE task_id LIKE ?",
                    (like,),
                ).fetchone()
                if row[1]:
                    raise RuntimeError(f"{row[1]} workflow(s) did not succeed")
                if row[0] >= n:
                    return int(row[0]), float(row[2]), 0
                self._check_workers()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{row[0]}/{n} done after {W1_TIMEOUT}s")
                time.sleep(COMPLETION_POLL)
        finally:
            db.close()

    # W2
    def latency(self, n: int, offset: int) -> list[float]:
        app = self._client()
        assert self._runner is not None

        async def one_by_one() -> list[float]:
            out = []
            for i in range(offset, offset + n):
                start = time.perf_counter()
                task_id = await app.submit_async("order", order_input(i), task_id=f"l{i}")
                result = await app.result_async(task_id, timeout=60)
                out.append(time.perf_counter() - start)
                assert result["shipped"] == {"tracking": f"t-{i}"}, result
            return out

        return self._runner.run(one_by_one())

    def latency_breakdown(self) -> dict[str, float] | None:
        """Where W2's time went, by the store's timestamps (median ms over its workflows):
        task created -> its first step dispatched (a scheduler claimed the task), each
        step's dispatched -> claimed by an agent -> finished, finished -> the next step
        dispatched (the scheduler learnt the result), the last step finished -> the task
        finished."""

        def sql(epoch: Callable[[str], str]) -> str:
            columns = ", ".join(
                epoch(c)
                for c in (
                    "t.created_at",
                    "t.finished_at",
                    "s.seq",
                    "s.dispatched_at",
                    "s.claimed_at",
                    "s.finished_at",
                )
            )
            return (
                f"SELECT t.task_id, {columns} FROM stepwarden_tasks t"
                " JOIN stepwarden_steps s ON s.task_id = t.task_id"
                " WHERE t.task_id LIKE 'l%' ORDER BY t.task_id, s.seq"
            )

        if self.postgres:
            rows = []
            for url in self.task_databases():
                with psycopg.connect(url, autocommit=True) as conn:
                    rows += conn.execute(
                        sql(lambda c: c if c == "s.seq" else f"extract(epoch FROM {c})::float8")
                    ).fetchall()
        else:
            db = sqlite3.connect(self.path, timeout=30)
            try:
                rows = db.execute(sql(lambda c: c)).fetchall()
            finally:
                db.close()
        tasks: dict[str, list[tuple[Any, ...]]] = {}
        for row in rows:
            tasks.setdefault(row[0], []).append(row)
        gaps: dict[str, list[float]] = {}

        def add(key: str, a: float | None, b: float | None) -> None:
            if a is not None and b is not None:
                gaps.setdefault(key, []).append((b - a) * 1000)

        for steps in tasks.values():
            created, finished = steps[0][1], steps[0][2]
            add("created_to_step1_dispatched", created, steps[0][4])
            for _, _, _, seq, dispatched, claimed, done in steps:
                add(f"step{seq}_dispatched_to_claimed", dispatched, claimed)
                add(f"step{seq}_claimed_to_finished", claimed, done)
            for prev, nxt in itertools.pairwise(steps):
                add(f"step{prev[3]}_finished_to_step{nxt[3]}_dispatched", prev[6], nxt[4])
            add(f"step{steps[-1][3]}_finished_to_task_finished", steps[-1][6], finished)
            add("created_to_task_finished", created, finished)
        return {k: round(median(v), 2) for k, v in gaps.items()}

    def cleanup(self) -> None:
        self.close_client()
        if self.postgres and self.db_url:
            self.res.drop_database(self.db_url)
        if self._dir is not None:
            self.res.remove_path(self._dir)
        self.db_url = None
        self._dir = None


class StepwardenShards(Stepwarden):
    """stepwarden on PostgreSQL servers of the benchmark's own (`Resources.own_cluster`, each
    with the shared server's settings): `shards` 1 is a store of one database on one of them,
    the twin of stepwarden-postgres on a server of its own; 2 or more, a store of shards, one
    database on each server (their URLs separated by a space). The same workers and client
    as stepwarden-postgres: `stepwarden worker` runs a scheduler, the agents and a supervisor
    on each shard. With `own_servers` False (no pg_createcluster here), the shards are
    databases of the shared server."""

    def __init__(
        self,
        res: Resources,
        *,
        workers: int,
        log_dir: Path,
        shards: int,
        own_servers: bool = True,
    ) -> None:
        super().__init__(res, workers=workers, log_dir=log_dir, postgres=True)
        self.shards = shards
        self.own_servers = own_servers
        self.name = shard_system_name(shards)
        self.store = "PostgreSQL" if shards == 1 else f"{shards} shards"
        if shards == 1:
            self.placement = "one database on " + (
                "a PostgreSQL server of the benchmark's own" if own_servers else "the shared server"
            )
        elif own_servers:
            self.placement = f"{shards} shards, each a database on a server of the benchmark's own"
        else:
            self.placement = f"{shards} shards, each a database on the shared server"
        self.worker_mode = (
            f"{workers} x `stepwarden worker bench.workload:app` (scheduler, agents and "
            "supervisor in each" + (", on each shard" if shards > 1 else "") + "; engine "
            "defaults)"
        )
        self.concurrency = (
            "asyncio tasks sharing one App, whose store has a pool of up to 10 connections "
            "(the default)" + (" per shard" if shards > 1 else "")
        )
        self._dbs: list[tuple[str, str]] = []
        self._settings: dict[str, str] | None = None

    def _admin_urls(self) -> list[str]:
        if not self.own_servers:
            return [self.res.admin_url] * self.shards
        clusters = [self.res.own_cluster(i) for i in range(self.shards)]
        self._settings = clusters[0].settings  # every one's (`Resources.own_cluster`)
        return [c.admin_url for c in clusters]

    def prepare(self, run: int) -> None:
        self._dbs = []
        for i, admin in enumerate(self._admin_urls()):
            db = self.res.create_database(f"sh{run}s{i + 1}", admin_url=admin)
            self._dbs.append((admin, db))
        self.url = " ".join(db for _, db in self._dbs)
        self.db_url = self._dbs[0][1]
        self._client()  # opens the store: migrates each shard, writes the map

    def task_databases(self) -> list[str]:
        return [db for _, db in self._dbs]

    def postgres_databases(self) -> list[tuple[str, str]]:
        return list(self._dbs)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["placement"] = self.placement
        if self._settings is not None:
            out["own_servers_settings"] = self._settings
        return out

    def cleanup(self) -> None:
        self.close_client()
        for admin, db in self._dbs:
            self.res.drop_database(db, admin_url=admin)
        self._dbs = []
        self.url = ""
        self.db_url = None


def shard_system_name(shards: int) -> str:
    """stepwarden-postgres-1shard, stepwarden-postgres-2shards, ..."""
    return f"stepwarden-postgres-{shards}shard" + ("s" if shards > 1 else "")


# -- DBOS ---------------------------------------------------------------------------------
class Dbos(System):
    name = "dbos"
    store = "PostgreSQL"
    postgres = True
    server = "postgresql"
    submit_one_mode = "DBOSClient.enqueue"
    concurrency = (
        "threads sharing one DBOSClient, whose pool has 5 connections (the default, no "
        "overflow); DBOSClient.enqueue is blocking (enqueue_async runs it in a thread)"
    )

    def __init__(self, res: Resources, *, workers: int, log_dir: Path) -> None:
        super().__init__(res, workers=workers, log_dir=log_dir)
        from .peers import dbos_app

        self.settings = dbos_app
        self.submit_mode = (
            f"DBOSClient.enqueue_in_transaction, {SUBMIT_BATCH} per transaction "
            f"(queue {dbos_app.QUEUE!r})"
        )
        self.worker_mode = (
            f"{workers} x `python -m bench.peers.dbos_app` (DBOS.launch(), queue worker: "
            f"worker_concurrency={dbos_app.WORKER_CONCURRENCY}, "
            f"polling_interval_sec={dbos_app.POLLING_INTERVAL}); sync workflow and steps"
        )
        self._client: Any = None
        self._engine: Any = None

    def prepare(self, run: int) -> None:
        self.db_url = self.res.create_database(f"dbos{run}")
        # DBOS creates its schema at launch: do it once here, so that the workers do not race
        # and nothing of it is counted.
        from dbos import DBOS

        DBOS.migrate(self.db_url)

    def worker_env(self) -> dict[str, str]:
        assert self.db_url is not None
        return {**super().worker_env(), "BENCH_DBOS_URL": self.db_url}

    def start_workers(self, phase: str) -> list[Child]:
        children = []
        for i in range(self.workers):
            env = {
                **self.worker_env(),
                "BENCH_DBOS_EXECUTOR": f"bench-{phase}-{i}-{uuid.uuid4().hex[:6]}",
            }
            children.append(
                self.res.spawn(
                    f"dbos-{phase}-worker{i}",
                    [sys.executable, "-m", "bench.peers.dbos_app"],
                    env=env,
                    log_dir=self.log_dir,
                )
            )
        _wait_ready(children, lambda c: log_contains(c, "BENCH-READY"), "DBOS workers")
        return children

    def client(self) -> Any:
        if self._client is None:
            import sqlalchemy as sa
            from dbos import DBOSClient

            assert self.db_url is not None
            self._client = DBOSClient(
                system_database_url=self.db_url, application_name=self.settings.APP_NAME
            )
            self._engine = sa.create_engine(
                self.db_url.replace("postgresql://", "postgresql+psycopg://", 1), pool_size=2
            )
        return self._client

    def open_client(self) -> None:
        self.client()

    def close_client(self) -> None:
        if self._client is not None:
            self._client.destroy()
            self._engine.dispose()
            self._client = None
            self._engine = None

    def _options(self, workflow_id: str) -> Any:
        return {
            "queue_name": self.settings.QUEUE,
            "workflow_name": "order",
            "workflow_id": workflow_id,
        }

    def batch_submitter(self, n: int) -> Callable[[], None]:
        client = self.client()

        def submit_all() -> None:
            for i in range(0, n, SUBMIT_BATCH):
                with self._engine.begin() as conn:
                    for j in range(i, min(n, i + SUBMIT_BATCH)):
                        client.enqueue_in_transaction(conn, self._options(f"o{j}"), order_input(j))

        return submit_all

    def one_submitter(self) -> SyncSubmit:
        # DBOSClient.enqueue is blocking (its enqueue_async runs it in a thread).
        client = self.client()
        return SyncSubmit(lambda i: client.enqueue(self._options(f"o{i}"), order_input(i)))

    def wait_done(self, n: int) -> tuple[float, int]:
        queries = 0
        deadline = time.monotonic() + W1_TIMEOUT
        assert self.db_url is not None
        with psycopg.connect(self.db_url, autocommit=True) as db:
            while True:
                queries += 1
                row = db.execute(
                    "SELECT count(*) FILTER (WHERE status = 'SUCCESS'),"
                    " count(*) FILTER (WHERE status IN ('ERROR', 'CANCELLED',"
                    " 'MAX_RECOVERY_ATTEMPTS_EXCEEDED')), max(updated_at)"
                    " FROM dbos.workflow_status WHERE workflow_uuid LIKE 'o%%'"
                ).fetchone()
                assert row is not None
                if row[1]:
                    raise RuntimeError(f"{row[1]} DBOS workflow(s) did not succeed")
                if row[0] >= n:
                    return row[2] / 1000.0, queries
                self._check_workers()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{row[0]}/{n} done after {W1_TIMEOUT}s")
                time.sleep(COMPLETION_POLL)

    def latency(self, n: int, offset: int) -> list[float]:
        client = self.client()
        out = []
        for i in range(offset, offset + n):
            start = time.perf_counter()
            handle = client.enqueue(self._options(f"l{i}"), order_input(i))
            result = handle.get_result(polling_interval_sec=RESULT_POLL)
            out.append(time.perf_counter() - start)
            assert result["shipped"] == {"tracking": f"t-{i}"}, result
        return out

    def cleanup(self) -> None:
        self.close_client()
        if self.db_url:
            self.res.drop_database(self.db_url)
        self.db_url = None


# -- Celery -------------------------------------------------------------------------------
class Celery(System):
    name = "celery"
    store = "Redis"
    submit_mode = (
        "chain(reserve.s(order), charge.s(), ship.s()).apply_async(), one by one (Celery "
        "has no batch submit)"
    )
    submit_one_mode = "chain(reserve.s(order), charge.s(), ship.s()).apply_async()"
    server = "redis"
    concurrency = (
        "threads sharing one Celery app (apply_async is blocking): its producer pool "
        "(broker_pool_limit, 10 by default) and its Redis result consumer"
    )

    def __init__(self, res: Resources, *, workers: int, log_dir: Path) -> None:
        super().__init__(res, workers=workers, log_dir=log_dir)
        self.worker_mode = (
            f"{workers} x `celery worker --pool solo` (one process each; Redis broker and "
            "result backend, acks_late=True, prefetch multiplier 4 (default))"
        )
        self.redis_url = ""
        self.app: Any = None
        self._final_ids: list[str] = []

    def prepare(self, run: int) -> None:
        self.redis_url = self.res.fresh_redis()
        self.app = None

    def worker_env(self) -> dict[str, str]:
        return {**super().worker_env(), "BENCH_REDIS_URL": self.redis_url}

    def _app(self) -> Any:
        if self.app is None:
            from .peers import celery_app

            self.app = celery_app.app_for(self.redis_url)
        return self.app

    def open_client(self) -> None:
        self._app()

    def start_workers(self, phase: str) -> list[Child]:
        children = []
        ready_files: dict[int, Path] = {}
        for i in range(self.workers):
            ready = self.log_dir / f"celery-{phase}-{i}-{uuid.uuid4().hex[:6]}.ready"
            env = {**self.worker_env(), "BENCH_READY_FILE": str(ready)}
            cmd = [
                _bin("celery"),
                "-A",
                "bench.peers.celery_app",
                "worker",
                "--pool",
                "solo",
                "--loglevel",
                "WARNING",
                "--hostname",
                f"bench{i}-{phase}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
            child = self.res.spawn(f"celery-{phase}-worker{i}", cmd, env=env, log_dir=self.log_dir)
            ready_files[child.pid] = ready
            children.append(child)
        _wait_ready(children, lambda c: ready_files[c.pid].exists(), "Celery workers")
        for path in ready_files.values():
            path.unlink(missing_ok=True)
        return children

    def _chain(self, i: int) -> Any:
        from celery import chain

        from .peers import celery_app

        app = self._app()
        return chain(
            app.signature(celery_app.RESERVE, args=(order_input(i),)),
            app.signature(celery_app.CHARGE),
            app.signature(celery_app.SHIP),
        )

    def batch_submitter(self, n: int) -> Callable[[], None]:
        # Celery has no batch submit: the same as one at a time.
        self._final_ids = []
        one = self.one_submitter().one

        def submit_all() -> None:
            for i in range(n):
                one(i)

        return submit_all

    def one_submitter(self) -> SyncSubmit:
        # apply_async is blocking; the client's threads share its producer pool
        # (broker_pool_limit, 10 by default) and its result consumer.
        self._app()
        self._final_ids = []
        ids = self._final_ids
        lock = threading.Lock()

        def one(i: int) -> None:
            final_id = self._chain(i).apply_async().id
            with lock:
                ids.append(final_id)

        return SyncSubmit(one)

    def wait_done(self, n: int) -> tuple[float, int]:
        import redis

        if len(self._final_ids) != n:
            raise RuntimeError(f"{len(self._final_ids)} chains submitted, not {n}")
        client = redis.Redis.from_url(self.redis_url)
        pending = [f"celery-task-meta-{tid}" for tid in self._final_ids]
        last = 0.0
        deadline = time.monotonic() + W1_TIMEOUT
        try:
            while True:
                # Read only the results not seen yet: the harness shares the machine.
                still = []
                for i in range(0, len(pending), 1000):
                    keys = pending[i : i + 1000]
                    for key, value in zip(keys, client.mget(keys), strict=True):
                        if value is None:
                            still.append(key)
                            continue
                        meta = json.loads(value)
                        if meta.get("status") != "SUCCESS":
                            raise RuntimeError(f"a Celery chain did not succeed: {meta}")
                        last = max(last, _iso_epoch(meta["date_done"]))
                pending = still
                if not pending:
                    return last, 0
                self._check_workers()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{n - len(pending)}/{n} done after {W1_TIMEOUT}s")
                time.sleep(COMPLETION_POLL)
        finally:
            client.close()

    def latency(self, n: int, offset: int) -> list[float]:
        self._app()
        out = []
        for i in range(offset, offset + n):
            start = time.perf_counter()
            result = self._chain(i).apply_async().get(timeout=60)
            out.append(time.perf_counter() - start)
            assert result == {"tracking": f"t-{i}"}, result
        return out

    def close_client(self) -> None:
        if self.app is not None:
            self.app.close()
            self.app = None

    def cleanup(self) -> None:
        self.close_client()
        if self.redis_url:
            self.res.drop_redis()
        self.redis_url = ""


def _iso_epoch(text: str) -> float:
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:  # Celery writes UTC
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


# -- procrastinate ------------------------------------------------------------------------
class Procrastinate(System):
    name = "procrastinate"
    store = "PostgreSQL"
    postgres = True
    submit_mode = f"reserve.batch_defer_async, batches of {SUBMIT_BATCH}"
    submit_one_mode = "reserve.defer_async"
    server = "postgresql"
    concurrency = (
        "asyncio tasks sharing one App, whose PsycopgConnector's pool has psycopg_pool's "
        "default size (4 connections)"
    )

    def __init__(self, res: Resources, *, workers: int, log_dir: Path) -> None:
        super().__init__(res, workers=workers, log_dir=log_dir)
        from .peers import procrastinate_app

        self.settings = procrastinate_app
        self.worker_mode = (
            f"{workers} x `procrastinate worker` (concurrency "
            f"{procrastinate_app.CONCURRENCY} each, LISTEN/NOTIFY); each job defers the next"
        )
        self._runner: asyncio.Runner | None = None
        self._app: Any = None

    def worker_env(self) -> dict[str, str]:
        assert self.db_url is not None
        return {**super().worker_env(), "BENCH_PROCRASTINATE_URL": self.db_url}

    def prepare(self, run: int) -> None:
        self.db_url = self.res.create_database(f"proc{run}")
        os.environ["BENCH_PROCRASTINATE_URL"] = self.db_url
        self._client()
        assert self._runner is not None
        self._runner.run(self._app.schema_manager.apply_schema_async())

    def _client(self) -> Any:
        if self._runner is None:
            assert self.db_url is not None
            self._runner = asyncio.Runner()
            self._app = self.settings.make_app(self.db_url)
            app = self._app

            async def open_app() -> None:  # open_async() returns an awaitable, no coroutine
                await app.open_async()

            self._runner.run(open_app())
        return self._app

    def open_client(self) -> None:
        self._client()

    def close_client(self) -> None:
        if self._runner is not None:
            app = self._app

            async def close_app() -> None:
                await app.close_async()

            self._runner.run(close_app())
            self._runner.close()
            self._runner = None
            self._app = None

    def start_workers(self, phase: str) -> list[Child]:
        assert self.db_url is not None
        names = [f"bench-{phase}-{i}-{uuid.uuid4().hex[:6]}" for i in range(self.workers)]
        children = [
            self.res.spawn(
                f"procrastinate-{phase}-worker{i}",
                [
                    _bin("procrastinate"),
                    "--app",
                    "bench.peers.procrastinate_app.app",
                    "--log-level",
                    "warning",
                    "worker",
                    "--name",
                    names[i],
                    "--concurrency",
                    str(self.settings.CONCURRENCY),
                ],
                env=self.worker_env(),
                log_dir=self.log_dir,
            )
            for i in range(self.workers)
        ]

        def all_registered() -> bool:
            with psycopg.connect(self.db_url or "", autocommit=True) as db:
                row = db.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
            return bool(row) and int(row[0]) >= self.workers

        wait_for(all_registered, timeout=60, what="procrastinate workers", children=children)
        # A worker registers itself, then starts listening: give it a moment.
        time.sleep(0.3)
        return children

    def batch_submitter(self, n: int) -> Callable[[], None]:
        app = self._client()
        runner = self._runner
        assert runner is not None
        reserve = app.tasks[self.settings.RESERVE]

        async def defer_all() -> None:
            for i in range(0, n, SUBMIT_BATCH):
                await reserve.batch_defer_async(
                    *({"order": order_input(j)} for j in range(i, min(n, i + SUBMIT_BATCH)))
                )

        return lambda: runner.run(defer_all())

    def one_submitter(self) -> AsyncSubmit:
        app = self._client()
        assert self._runner is not None
        reserve = app.tasks[self.settings.RESERVE]

        async def one(i: int) -> None:
            await reserve.defer_async(order=order_input(i))

        return AsyncSubmit(self._runner, one)

    def wait_done(self, n: int) -> tuple[float, int]:
        queries = 0
        deadline = time.monotonic() + W1_TIMEOUT
        assert self.db_url is not None
        with psycopg.connect(self.db_url, autocommit=True) as db:
            while True:
                queries += 1
                row = db.execute(
                    "SELECT count(*) FILTER (WHERE status = 'succeeded' AND task_name = %s),"
                    " count(*) FILTER (WHERE status IN ('failed', 'cancelled', 'aborted'))"
                    " FROM procrastinate_jobs",
                    (self.settings.SHIP,),
                ).fetchone()
                assert row is not None
                if row[1]:
                    raise RuntimeError(f"{row[1]} procrastinate job(s) did not succeed")
                if row[0] >= n:
                    queries += 1
                    last = db.execute(
                        "SELECT extract(epoch FROM max(e.at))::float8 FROM procrastinate_events e"
                        " JOIN procrastinate_jobs j ON j.id = e.job_id"
                        " WHERE e.type = 'succeeded' AND j.task_name = %s",
                        (self.settings.SHIP,),
                    ).fetchone()
                    assert last is not None
                    return float(last[0]), queries
                self._check_workers()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{row[0]}/{n} done after {W1_TIMEOUT}s")
                time.sleep(COMPLETION_POLL)

    def latency(self, n: int, offset: int) -> list[float]:
        app = self._client()
        assert self._runner is not None
        reserve = app.tasks[self.settings.RESERVE]
        connector = app.connector

        async def one_by_one() -> list[float]:
            out = []
            for i in range(offset, offset + n):
                start = time.perf_counter()
                first = await reserve.defer_async(order=order_input(i))
                # No result API: read until the order's last job (ship) has succeeded.
                while True:
                    row = await connector.execute_query_one_async(
                        "SELECT count(*) AS n FROM procrastinate_jobs WHERE id > %(first)s"
                        " AND task_name = %(task)s AND status = 'succeeded'"
                        " AND (args->'order'->>'id')::int = %(id)s",
                        first=first,
                        task=self.settings.SHIP,
                        id=i,
                    )
                    if row["n"]:
                        break
                    await asyncio.sleep(RESULT_POLL)
                out.append(time.perf_counter() - start)
            return out

        return self._runner.run(one_by_one())

    def cleanup(self) -> None:
        self.close_client()
        if self.db_url:
            self.res.drop_database(self.db_url)
        self.db_url = None
