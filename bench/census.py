"""A census of what W1 one at a time asks of PostgreSQL: each statement of the workers and
the client, counted per workflow.

`python -m bench.census [--n 200] [--log /var/log/postgresql/postgresql-15-main.log]` makes
a database of its own on the server (`--admin-url`), sets `log_statement = 'all'` for that
database alone, starts two `stepwarden worker bench.workload:app` processes, submits `--n`
orders one at a time (each awaited before the next, as W1 one at a time does), stops the
workers, and reads the statements the server logged for that database: each counted under
its first words (the named queries start with their comment), per workflow, and by who
sent it: the client (its sessions, named `census-client`) or the workers. BEGIN and
COMMIT are the explicit transactions; every other statement outside them is one of its own,
or one of a pipeline's (the statements between two of its syncs).

Logging every statement slows the server: the figures are counts, not times; what runs on a
clock (beats, the supervisor's ticks, polls) is counted over a longer run than without the
log, so it weighs more here than in W1. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from .common import ROOT, log, wait_for

LOG = Path("/var/log/postgresql/postgresql-15-main.log")
LINE = re.compile(r"\S+ \S+ \S+ \[(\d+)\] (\S+)@(\S+) LOG:  (?:statement|execute [^:]*): (.*)")
"""A statement as the server logs it with Debian's log_line_prefix ('%m [%p] %q%u@%d ')."""


def census(admin_url: str, n: int, server_log: Path) -> dict[str, object]:
    db = f"swcensus_{os.getpid()}"
    admin = psycopg.connect(admin_url, autocommit=True)
    admin.execute(f"CREATE DATABASE {db}")
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=db)
    store_url = f"postgresql://{admin.info.user}@{admin.info.host}:{admin.info.port}/{db}"
    workers: list[subprocess.Popen[bytes]] = []
    try:
        admin.execute(f"ALTER DATABASE {db} SET log_statement = 'all'")
        os.environ["STEPWARDEN_STORE"] = f"{store_url}?application_name=census-client"
        from .workload import app

        def registered() -> bool:
            with psycopg.connect(url) as c:
                found = c.execute("SELECT to_regclass('stepwarden_schedulers')").fetchone()
                if found is None or found[0] is None:
                    return False
                rows = c.execute("SELECT count(*) FROM stepwarden_schedulers").fetchone()
                return rows is not None and rows[0] == 2

        command = [sys.executable, "-m", "stepwarden", "worker", "bench.workload:app"]
        for _ in range(2):
            workers.append(
                subprocess.Popen(
                    [*command, "--store", store_url],
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        wait_for(registered, timeout=60, what="both workers registered")
        start = server_log.stat().st_size
        began = time.perf_counter()

        async def submit() -> None:
            for i in range(n):
                order = {"id": i, "items": 2, "amount": 10}
                await app.submit_async("order", order, task_id=f"o{i}")
                await app.result_async(f"o{i}", timeout=60)
            with psycopg.connect(url) as c:  # the client's sessions, before they close
                rows = c.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'census-client'"
                ).fetchall()
            client.update(str(pid) for (pid,) in rows)
            await app.aclose()

        client: set[str] = set()

        asyncio.run(submit())
        elapsed = time.perf_counter() - began
        end = server_log.stat().st_size
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=60)
        with server_log.open("rb") as f:
            f.seek(start)
            text = f.read(end - start).decode(errors="replace")
        counts: collections.Counter[str] = collections.Counter()
        for line in text.splitlines():
            m = LINE.match(line)
            if m and m.group(3) == db:
                who = "client" if m.group(1) in client else "workers"
                counts[f"{who:<8} {' '.join(m.group(4).split()[:9])}"] += 1
        return {"n": n, "elapsed_s": round(elapsed, 2), "statements": counts}
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        admin.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.census", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200, help="workflows, one at a time [200]")
    p.add_argument("--log", type=Path, default=LOG, help=f"the server's log [{LOG}]")
    p.add_argument(
        "--admin-url",
        default=os.environ.get(
            "BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = p.parse_args(argv)
    got = census(args.admin_url, args.n, args.log)
    counts = got["statements"]
    assert isinstance(counts, collections.Counter)
    n = args.n
    log(f"{n} workflows one at a time in {got['elapsed_s']} s (statements logged: slower)")
    print(f"statements: {sum(counts.values())} ({sum(counts.values()) / n:.2f} per workflow)")
    for text, count in counts.most_common(40):
        print(f"{count / n:7.3f}/wf {count:7d}  {text[:140]}")


if __name__ == "__main__":
    main()
