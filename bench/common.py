"""What every system's measurement shares: child processes, databases, PostgreSQL servers of
the benchmark's own, temporary files and the Redis database, always cleaned up (also on
Ctrl-C, SIGTERM and failure); peak RSS and CPU time sampling, PostgreSQL commit counts, and
small statistics."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TMP = RESULTS / "tmp"
DB_PREFIX = "swbench"
PG_VERSION = "15"
"""The PostgreSQL version of the servers the benchmark makes (Debian's pg_createcluster)."""
CLUSTER_PREFIX = "swbsh"
"""The names of the benchmark's own PostgreSQL servers: swbsh<pid>x<index>."""
COPIED_SETTINGS = (
    "max_connections",
    "shared_buffers",
    "work_mem",
    "effective_cache_size",
    "wal_level",
    "wal_buffers",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "max_wal_size",
    "min_wal_size",
    "checkpoint_timeout",
    "autovacuum",
    "jit",
)
"""The settings of the shared server (--admin-url) that the benchmark's own servers take, so
that a figure measured on one of those compares with one measured on the shared server."""


class Interrupted(BaseException):
    """SIGTERM or SIGHUP received: unwind like Ctrl-C, so that every cleanup runs."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    """In the child, before exec: be killed if the benchmark process dies (Linux)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Cluster:
    """A PostgreSQL server of the benchmark's own: a cluster made with pg_createcluster on a
    free port of 127.0.0.1 (trust authentication), dropped when the benchmark is done with
    it."""

    name: str
    port: int
    settings: dict[str, str]

    @property
    def admin_url(self) -> str:
        """Its `postgres` database, from which the benchmark creates and drops its own."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cannot_make_clusters() -> str | None:
    """Why this process cannot make PostgreSQL servers of its own (None: it can): Debian's
    pg_createcluster is needed, run as root."""
    if shutil.which("pg_createcluster") is None:
        return "no pg_createcluster (Debian's postgresql-common) on this machine"
    if os.geteuid() != 0:
        return "pg_createcluster needs root"
    if not Path(f"/usr/lib/postgresql/{PG_VERSION}/bin/postgres").exists():
        return f"no PostgreSQL {PG_VERSION} server binaries"
    return None


def server_settings(admin_url: str) -> dict[str, str]:
    """The shared server's values of COPIED_SETTINGS (with their units: 128MB)."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)"
            " ORDER BY name",
            (list(COPIED_SETTINGS),),
        ).fetchall()
    return {str(name): str(value) for name, value in rows}


@dataclass
class Resources:
    """Everything the benchmark creates; `close()` removes all of it, whatever happened."""

    admin_url: str
    children: list[Child] = field(default_factory=list)
    databases: list[str] = field(default_factory=list)
    clusters: list[Cluster] = field(default_factory=list)
    """The PostgreSQL servers of the benchmark's own (`own_cluster`), by index."""
    paths: list[Path] = field(default_factory=list)
    redis_url: str = "redis://127.0.0.1:6379/13"
    """A Redis database (number) given to the benchmark alone: it is flushed (FLUSHDB)
    before and after each system that uses it."""
    _redis_used: bool = False
    _closed: bool = False

    # -- processes ------------------------------------------------------------------------
    def spawn(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        log_dir: Path,
    ) -> Child:
        log_path = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            popen = subprocess.Popen(
                list(cmd),
                cwd=ROOT,
                env={**os.environ, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches the benchmark only; it stops them
                preexec_fn=_die_with_parent,
            )
        child = Child(name, popen, log_path)
        self.children.append(child)
        return child

    def stop(self, child: Child, *, timeout: float = 20.0, sig: int = signal.SIGTERM) -> None:
        """Signal the child's process group, wait, then SIGKILL what is left of it."""
        if child.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, sig)
            try:
                child.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"{child.name} did not stop within {timeout}s: SIGKILL")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)  # any grandchild left in its group
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.popen.wait(5)
        if child in self.children:
            self.children.remove(child)

    def stop_all(self, children: Sequence[Child] | None = None, timeout: float = 20.0) -> None:
        chosen = list(self.children if children is None else children)
        for child in chosen:  # signal all first: they drain in parallel
            if child.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in chosen:
            self.stop(child, timeout=max(0.1, deadline - time.monotonic()))

    # -- databases ------------------------------------------------------------------------
    def create_database(
        self, tag: str, *, template: str | None = None, admin_url: str | None = None
    ) -> str:
        """A new empty database (or a file copy of `template`); returns its URL. On the
        shared server, or on the server of `admin_url` (one of `clusters`: its databases go
        with it)."""
        name = f"{DB_PREFIX}_{os.getpid()}_{tag}_{uuid.uuid4().hex[:8]}"
        sql = f'CREATE DATABASE "{name}"'
        if template is not None:
            sql += f' TEMPLATE "{template}" STRATEGY FILE_COPY'
        admin_url = admin_url or self.admin_url
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql)
        if admin_url == self.admin_url:
            self.databases.append(name)
        return with_database(admin_url, name)

    def drop_database(self, url_or_name: str, *, admin_url: str | None = None) -> None:
        name = database_name(url_or_name)
        with psycopg.connect(admin_url or self.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.databases and (admin_url or self.admin_url) == self.admin_url:
            self.databases.remove(name)

    def drop_stale_databases(self) -> list[str]:
        """Drop the databases left by an earlier benchmark process that no longer runs
        (one killed with SIGKILL); only names this benchmark gives, with a dead pid."""
        dropped = []
        pattern = re.compile(rf"^{DB_PREFIX}_(\d+)_")
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            names = [r[0] for r in admin.execute("SELECT datname FROM pg_database")]
            for name in names:
                m = pattern.match(name)
                if m and not psutil.pid_exists(int(m.group(1))):
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    dropped.append(name)
        return dropped

    # -- PostgreSQL servers of the benchmark's own -----------------------------------------
    def own_cluster(self, index: int) -> Cluster:
        """The benchmark's own PostgreSQL server number `index` (0, 1, ...), made on first
        use (pg_createcluster, a free port, trust authentication on 127.0.0.1) with the
        shared server's COPIED_SETTINGS, so that every one of them is the same kind of
        server; the ones before it are made first. Dropped by `drop_clusters` or `close`."""
        while len(self.clusters) <= index:
            why = cannot_make_clusters()
            if why is not None:
                raise RuntimeError(f"cannot make a PostgreSQL server of the benchmark's own: {why}")
            settings = server_settings(self.admin_url)
            name = f"{CLUSTER_PREFIX}{os.getpid()}x{len(self.clusters)}"
            port = _free_port()
            options = [x for k, v in settings.items() for x in ("-o", f"{k}={v}")]
            log(f"making PostgreSQL server {name} on port {port}")
            subprocess.run(
                ["pg_createcluster", PG_VERSION, name, "-p", str(port), "--start", *options,
                 "--", "--auth-host=trust", "--auth-local=trust"],
                check=True, capture_output=True, timeout=180,
            )  # fmt: skip
            cluster = Cluster(name, port, settings)
            self.clusters.append(cluster)
            wait_for(
                functools.partial(_accepts, cluster.admin_url),
                timeout=60,
                what=f"PostgreSQL server {name} to accept connections",
            )
        return self.clusters[index]

    def drop_clusters(self) -> None:
        """Drop every PostgreSQL server of the benchmark's own (stopped first)."""
        while self.clusters:
            cluster = self.clusters.pop()
            result = subprocess.run(
                ["pg_dropcluster", PG_VERSION, cluster.name, "--stop"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if result.returncode != 0:
                log(f"cannot drop PostgreSQL server {cluster.name}: {result.stderr.strip()}")

    def drop_stale_clusters(self) -> list[str]:
        """Drop the servers left by an earlier benchmark process that no longer runs (one
        killed with SIGKILL); only names this benchmark gives, with a dead pid."""
        dropped = []
        pattern = re.compile(rf"^{CLUSTER_PREFIX}(\d+)x\d+$")
        with contextlib.suppress(OSError):
            for entry in Path(f"/etc/postgresql/{PG_VERSION}").iterdir():
                m = pattern.match(entry.name)
                if m and not psutil.pid_exists(int(m.group(1))):
                    subprocess.run(
                        ["pg_dropcluster", PG_VERSION, entry.name, "--stop"],
                        capture_output=True, timeout=120,
                    )  # fmt: skip
                    dropped.append(entry.name)
        return dropped

    # -- files ----------------------------------------------------------------------------
    def temp_dir(self, tag: str) -> Path:
        path = TMP / f"{tag}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        path.mkdir(parents=True)
        self.paths.append(path)
        return path

    def remove_path(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)
        if path in self.paths:
            self.paths.remove(path)

    # -- redis ----------------------------------------------------------------------------
    def fresh_redis(self) -> str:
        """The benchmark's Redis database, emptied (FLUSHDB); returns its URL."""
        flush_redis(self.redis_url)
        self._redis_used = True
        return self.redis_url

    def drop_redis(self) -> None:
        flush_redis(self.redis_url)
        self._redis_used = False

    # -- everything -----------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Ignore further Ctrl-C while cleaning up: a second one must not leave things behind.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.stop_all(timeout=10)
            for name in list(self.databases):
                try:
                    self.drop_database(name)
                except Exception as exc:
                    log(f"cannot drop database {name}: {exc}")
            if self._redis_used:
                try:
                    self.drop_redis()
                except Exception as exc:
                    log(f"cannot flush {self.redis_url}: {exc}")
            self.drop_clusters()
            for path in list(self.paths):
                self.remove_path(path)
            with contextlib.suppress(OSError):
                TMP.rmdir()  # only when empty
        finally:
            signal.signal(signal.SIGINT, previous)


def _accepts(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.Error:
        return False


def flush_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


def install_signal_handlers() -> None:
    def raise_interrupted(signum: int, frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, raise_interrupted)
    signal.signal(signal.SIGHUP, raise_interrupted)
    # KeyboardInterrupt on SIGINT even when started where it is ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)


def with_database(url: str, name: str) -> str:
    base, _, query = url.partition("?")
    base = base.rsplit("/", 1)[0] + "/" + name
    return f"{base}?{query}" if query else base


def database_name(url_or_name: str) -> str:
    if "://" not in url_or_name:
        return url_or_name
    return url_or_name.partition("?")[0].rsplit("/", 1)[1]


def wait_for(
    predicate: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    children: Sequence[Child] = (),
) -> None:
    """Wait until predicate() is true; fail early if one of `children` died."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        for child in children:
            if not child.alive():
                raise RuntimeError(
                    f"{child.name} exited ({child.popen.returncode}) while waiting for {what}:\n"
                    + child.tail()
                )
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def log_lines(child: Child, text: str) -> int:
    """How many lines of the child's log hold `text`."""
    try:
        return sum(text in line for line in child.log_path.read_text(errors="replace").splitlines())
    except OSError:
        return 0


def log_contains(child: Child, text: str) -> bool:
    try:
        return text in child.log_path.read_text(errors="replace")
    except OSError:
        return False


# -- peak RSS ---------------------------------------------------------------------------
class RssSampler:
    """Samples the RSS of the worker processes (each with its descendants) every
    `interval` seconds in a thread; peaks of the largest process tree and of their sum."""

    def __init__(self, pids: Sequence[int], interval: float = 0.1) -> None:
        self.pids = list(pids)
        self.interval = interval
        self.peak_total = 0
        self.peak_each = 0
        self.thread_cpu_s = 0.0
        """CPU seconds the sampling thread has used so far (updated after each sample): the
        client's CPU figure leaves it out."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss")

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self) -> None:
        total = 0
        for pid in self.pids:
            tree = 0
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                tree = proc.memory_info().rss
                for kid in proc.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        tree += kid.memory_info().rss
            self.peak_each = max(self.peak_each, tree)
            total += tree
        self.peak_total = max(self.peak_total, total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
            self.thread_cpu_s = time.thread_time()


# -- CPU time ----------------------------------------------------------------------------
def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _tree_cpu(pids: Sequence[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            out[pid] = _cpu(proc)
            for kid in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    out[kid.pid] = _cpu(kid)
    return out


def _postgres_cpu() -> dict[int, float]:
    out: dict[int, float] = {}
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] == "postgres":
            with contextlib.suppress(psutil.Error):
                out[proc.pid] = _cpu(proc)
    return out


def _machine_cpu() -> float:
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def _delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


@dataclass
class Server:
    """The server process(es) of a system's store, for their CPU time: `pids()` lists them
    as they are at the moment (PostgreSQL starts a backend per connection)."""

    kind: str
    """"postgresql" or "redis"."""
    pids: Callable[[], list[int]]
    db_backends: Callable[[], list[int]] | None = None
    """PostgreSQL: the backends connected to the system's database now."""
    parts: list[Server] = field(default_factory=list)
    """When the store is on several servers (shards on servers of their own): each one,
    whose CPU is also given apart (`server_parts_s`)."""


def servers(parts: Sequence[Server]) -> Server | None:
    """Several servers' processes as one (each process counted once: shards that are
    databases of one server share its processes), each part kept; None for none, the one
    itself for one."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    kinds = {p.kind for p in parts}

    def pids() -> list[int]:
        return list(dict.fromkeys(pid for p in parts for pid in p.pids()))

    def db_backends() -> list[int]:
        return list(dict.fromkeys(pid for p in parts if p.db_backends for pid in p.db_backends()))

    postmasters = [p.pids()[:1] for p in parts]
    apart = len({pid for first in postmasters for pid in first}) == len(parts)
    return Server(
        kinds.pop() if len(kinds) == 1 else "mixed",
        pids,
        db_backends if any(p.db_backends for p in parts) else None,
        list(parts) if apart else [],  # databases of one server: no part of its own
    )


def _is(pid: int, name: str) -> bool:
    with contextlib.suppress(psutil.Error):
        return name in psutil.Process(pid).name()
    return False


def postgres_server(admin_url: str, db_url: str | None = None) -> Server | None:
    """The PostgreSQL server behind admin_url: its postmaster (the parent of this
    connection's backend) and the postmaster's children (every backend, of every database,
    and the background processes: WAL writer, checkpointer, ...). None when it is not a
    process of this machine."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        row = admin.execute("SELECT pg_backend_pid()").fetchone()
        # While the connection is open: its backend exits once it is closed.
        if not row or not _is(int(row[0]), "postgres"):
            return None
        try:
            postmaster = psutil.Process(int(row[0])).ppid()
        except psutil.Error:
            return None
    if not _is(postmaster, "postgres"):
        return None

    def pids() -> list[int]:
        with contextlib.suppress(psutil.Error):
            return [postmaster, *(c.pid for c in psutil.Process(postmaster).children())]
        return []

    def db_backends() -> list[int]:
        assert db_url is not None
        with psycopg.connect(admin_url, autocommit=True) as admin:
            rows = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (database_name(db_url),),
            ).fetchall()
        return [int(r[0]) for r in rows]

    return Server("postgresql", pids, db_backends if db_url else None)


def redis_server(redis_url: str) -> Server | None:
    """The redis-server process behind redis_url (INFO's process_id), when it is one of this
    machine's."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        pid = int(client.info("server")["process_id"])
    finally:
        client.close()
    if not _is(pid, "redis"):
        return None
    return Server("redis", lambda: [pid])


def _cpu_of(pids: Sequence[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out[pid] = _cpu(psutil.Process(pid))
    return out


class CpuMeter:
    """CPU seconds spent between `start()` and `stop()`: by the worker processes (with their
    descendants), by this process (the client, and the harness's polling; less the RSS
    sampler's thread when given), by the PostgreSQL server's processes (every database's:
    other users of the server count too; a backend that exits in between is missed), by the
    system's own server when given (`server_s`: PostgreSQL's postmaster and all its children,
    or redis-server; `server_db_backends_s`: PostgreSQL's backends connected to the system's
    database at the end) and by the whole machine."""

    def __init__(
        self,
        worker_pids: Sequence[int],
        *,
        server: Server | None = None,
        harness_cpu: Callable[[], float] | None = None,
    ) -> None:
        self.worker_pids = list(worker_pids)
        self.server = server
        self.harness_cpu = harness_cpu
        self.figures: dict[str, Any] = {}

    def start(self) -> None:
        self._t = time.perf_counter()
        self._workers = _tree_cpu(self.worker_pids)
        self._pg = _postgres_cpu()
        self._server = _cpu_of(self.server.pids()) if self.server else {}
        self._machine = _machine_cpu()
        # Last, so that the meter's own reads above are not counted as the client's.
        self._harness = self.harness_cpu() if self.harness_cpu else 0.0
        self._client = time.process_time()

    def stop(self) -> dict[str, Any]:
        # First, for the same reason.
        client = time.process_time() - self._client
        harness = (self.harness_cpu() if self.harness_cpu else 0.0) - self._harness
        figures: dict[str, float] = {
            "wall_s": time.perf_counter() - self._t,
            "workers_s": _delta(self._workers, _tree_cpu(self.worker_pids)),
            "client_s": client - harness,
        }
        parts: list[float] = []
        if self.server is not None:
            backends = self.server.db_backends() if self.server.db_backends else None
            after = _cpu_of(self.server.pids())
            figures["server_s"] = _delta(self._server, after)
            parts = [
                round(_delta(self._server, {p: after[p] for p in part.pids() if p in after}), 3)
                for part in self.server.parts
            ]
            if backends is not None:
                own = set(backends)
                figures["server_db_backends_s"] = _delta(
                    self._server, {p: v for p, v in after.items() if p in own}
                )
        figures["postgres_s"] = _delta(self._pg, _postgres_cpu())
        figures["machine_s"] = _machine_cpu() - self._machine
        self.figures = {k: round(v, 3) for k, v in figures.items()}
        if self.server is not None:
            self.figures["server"] = self.server.kind
            if parts:
                self.figures["server_parts_s"] = parts
        return self.figures


# -- PostgreSQL commit counts -------------------------------------------------------------
def xact_commit(admin_url: str, db_url: str) -> int:
    """pg_stat_database.xact_commit of the database, read from the admin database (so that
    the read itself is not counted in it)."""
    name = database_name(db_url)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (name,)
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def wait_no_backends(admin_url: str, db_url: str, timeout: float = 10.0) -> bool:
    """Wait until no session is connected to the database: each has flushed its statistics
    (PostgreSQL flushes a backend's counters when it exits). False if some are left."""
    name = database_name(db_url)

    def none_left() -> bool:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            ).fetchone()
        return bool(row) and int(row[0]) == 0

    try:
        wait_for(none_left, timeout=timeout, what=f"sessions on {name} to end", interval=0.1)
    except TimeoutError:
        log(f"sessions still connected to {name} after {timeout}s: its commit count may be low")
        return False
    return True


# -- statistics ---------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextlib.contextmanager
def timed() -> Iterator[Callable[[], float]]:
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())
