"""What finished workflows leave in the database, for a capacity model: the size of
stepwarden's tables (each with its indexes and TOAST) per million finished "order" workflows
(three steps), and the WAL each workflow writes.

    python -m bench.sizes [--n 20000] [--variant batch] [--json PATH]

N workflows are run by the benchmark's usual workers (2 x `stepwarden worker
bench.workload:app`, engine defaults) on a PostgreSQL server of the benchmark's own (made
with pg_createcluster with the shared server's settings, as the shard systems' servers;
`--server shared` puts the database on the shared server instead, and the WAL figure
is then left out: other users write to that server's WAL too). Then, for each stepwarden_*
table: its rows, and `pg_total_relation_size` as the run left it (with the dead row versions
of its updates, which only a vacuum makes reusable) and after `VACUUM FULL` (its live rows
alone, packed), each table whose rows grow with the workflows scaled to a million of them
(the others hold a few rows whatever the number: the registry, the leases). The WAL is
`pg_current_wal_lsn()` from before the first submit to after the last workflow is done, per
workflow (it includes what the workers write meanwhile besides the workflows: heartbeats).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from .common import (
    Interrupted,
    Resources,
    cannot_make_clusters,
    install_signal_handlers,
    log,
)
from .systems import StepwardenShards

MILLION = 1_000_000


def _wal_lsn(admin_url: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as db:
        row = db.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _wal_bytes(admin_url: str, since: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as db:
        row = db.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (since,)).fetchone()
    assert row is not None
    return int(row[0])


TABLES = """
SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid),
       pg_indexes_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND c.relname LIKE 'stepwarden\\_%' AND n.nspname = current_schema()
ORDER BY c.relname
"""


def _tables(url: str) -> dict[str, dict[str, int]]:
    """Each stepwarden_* table: rows, total bytes (heap, indexes, TOAST), heap, indexes."""
    out: dict[str, dict[str, int]] = {}
    with psycopg.connect(url, autocommit=True) as db:
        for name, total, heap, indexes in db.execute(TABLES).fetchall():
            row = db.execute(f'SELECT count(*) FROM "{name}"').fetchone()
            assert row is not None
            out[str(name)] = {
                "rows": int(row[0]),
                "total_bytes": int(total),
                "heap_bytes": int(heap),
                "index_bytes": int(indexes),
            }
    return out


GROWS = 0.01
"""A table with fewer rows per workflow than this does not grow with the workflows (the
registry, the leases, the schema, the shard map: a few pages whatever N): it is not scaled."""


def _grows(table: dict[str, int], n: int) -> bool:
    return table["rows"] >= GROWS * n


def _per_million(tables: dict[str, dict[str, int]], n: int) -> dict[str, float]:
    """The total size in MB per million workflows of each table that grows with them, and
    "all" of those."""
    grows = {name: t for name, t in tables.items() if _grows(t, n)}
    out = {name: round(t["total_bytes"] * MILLION / n / 2**20, 1) for name, t in grows.items()}
    out["all"] = round(sum(t["total_bytes"] for t in grows.values()) * MILLION / n / 2**20, 1)
    return out


def measure(res: Resources, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    system = StepwardenShards(
        res, workers=args.workers, log_dir=log_dir, shards=1, own_servers=args.own_servers
    )
    system.prepare(0)
    try:
        [(admin_url, url)] = system.postgres_databases()
        children = system.start_workers("sizes")
        try:
            system.watch(children)
            lsn = _wal_lsn(admin_url)
            log(f"{args.n:,} order workflows ({args.variant})")
            tp = system.throughput(args.n, args.variant)
            wal = _wal_bytes(admin_url, lsn)
        finally:
            system.watch([])
            system.stop_workers(children)
        system.close_client()
        log(f"done: {args.n / tp.elapsed:,.0f} workflows/s; reading the tables' sizes")
        as_left = _tables(url)
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("VACUUM FULL")
        packed = _tables(url)
        out: dict[str, Any] = {
            "n": args.n,
            "variant": args.variant,
            "server": "own" if args.own_servers else "shared",
            "wf_per_s": round(args.n / tp.elapsed, 1),
            "tables_as_left": as_left,
            "tables_packed": packed,
            "mb_per_million_as_left": _per_million(as_left, args.n),
            "mb_per_million_packed": _per_million(packed, args.n),
        }
        if args.own_servers:
            out["wal_bytes_per_wf"] = round(wal / args.n)
        return out
    finally:
        system.cleanup()


def table(result: dict[str, Any]) -> str:
    n = result["n"]
    lines = [
        f"{n:,} finished order workflows ({result['variant']}, {result['wf_per_s']:,.0f} wf/s); "
        "sizes with indexes and TOAST, MB per million workflows: as the run left them "
        "(dead row versions included) / after VACUUM FULL",
        f"{'table':<26} {'rows/wf':>8} {'as left':>10} {'packed':>10}",
    ]
    as_left, packed = result["mb_per_million_as_left"], result["mb_per_million_packed"]
    fixed = 0
    for name, t in result["tables_as_left"].items():
        if name not in as_left:
            fixed += t["total_bytes"]
            continue
        lines.append(
            f"{name:<26} {t['rows'] / n:>8.2f} {as_left[name]:>10,.1f} {packed[name]:>10,.1f}"
        )
    lines.append(f"{'all':<26} {'':>8} {as_left['all']:>10,.1f} {packed['all']:>10,.1f}")
    lines.append(
        f"the other tables (a few rows each, whatever the workflows): {fixed / 1024:,.0f} kB"
    )
    if "wal_bytes_per_wf" in result:
        lines.append(f"WAL per workflow: {result['wal_bytes_per_wf']:,} bytes")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sizes", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="workflows [20,000]")
    p.add_argument("--variant", choices=["batch", "single"], default="batch",
                   help="how the client submits them (as W1) [batch]")  # fmt: skip
    p.add_argument("--workers", type=int, default=2, help="worker processes [2]")
    p.add_argument(
        "--server",
        choices=["auto", "own", "shared"],
        default="auto",
        help="own: a PostgreSQL server of the benchmark's own (pg_createcluster); shared: a "
        "database of --admin-url's server; auto: own where it can [auto]",
    )
    p.add_argument(
        "--admin-url",
        default=os.environ.get(
            "BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="the shared PostgreSQL server [$BENCH_POSTGRES_URL or "
        "postgresql://postgres@127.0.0.1:5432/postgres]",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)
    why = cannot_make_clusters()
    if args.server == "own" and why is not None:
        p.error(f"--server own: {why}")
    args.own_servers = args.server == "own" or (args.server == "auto" and not why)
    install_signal_handlers()
    res = Resources(admin_url=args.admin_url)
    try:
        log_dir = res.temp_dir("sizes-logs")
        result = measure(res, args, log_dir)
        result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(table(result))
        return 0
    except (KeyboardInterrupt, Interrupted) as exc:
        log(f"interrupted ({type(exc).__name__} {exc})")
        return 130
    finally:
        res.close()


if __name__ == "__main__":
    sys.exit(main())
