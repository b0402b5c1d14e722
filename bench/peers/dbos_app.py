"""The "order" workload on DBOS: a workflow of three steps, run by queue workers.

DBOS is a library: workflows run in the process that launched DBOS. To compare like with
like (a client that submits, separate worker processes that execute), this follows DBOS's
"queue worker" pattern: each worker process launches DBOS and dequeues from a queue; the
benchmark's client enqueues with DBOSClient, which talks only to the system database.

    BENCH_DBOS_URL=postgresql://... BENCH_DBOS_EXECUTOR=w1 python -m bench.peers.dbos_app
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from dbos import DBOS, DBOSConfig

APP_NAME = "bench"
QUEUE = "orders"
WORKER_CONCURRENCY = int(os.environ.get("BENCH_DBOS_WORKER_CONCURRENCY", "100"))
"""Workflows one worker process runs at once (as stepwarden's agent concurrency, 100).
Without a limit, DBOS's first poll claims the whole queue for one process."""
POLLING_INTERVAL = float(os.environ.get("BENCH_DBOS_POLLING_INTERVAL", "0.05"))
"""Seconds between a worker's queue polls. DBOS's default is 1.0; 0.05 is stepwarden's
polling interval on SQLite, so that W2 measures DBOS rather than its idle wait."""


@DBOS.step(name="reserve")
def reserve(order: dict[str, Any]) -> dict[str, Any]:
    return {"reserved": order["items"], "order": order["id"]}


@DBOS.step(name="charge")
def charge(order: dict[str, Any]) -> dict[str, Any]:
    return {"receipt": f"{DBOS.workflow_id}/2", "amount": order["amount"]}


@DBOS.step(name="ship")
def ship(order: dict[str, Any]) -> dict[str, Any]:
    return {"tracking": f"t-{order['id']}"}


@DBOS.workflow(name="order")
def order(order: dict[str, Any]) -> dict[str, Any]:
    reserved = reserve(order)
    receipt = charge(order)
    shipped = ship(order)
    return {"reserved": reserved, "receipt": receipt, "shipped": shipped}


def main() -> None:
    url = os.environ["BENCH_DBOS_URL"]
    if "--migrate-only" in sys.argv:
        DBOS.migrate(url)
        return
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": url,
        "executor_id": os.environ.get("BENCH_DBOS_EXECUTOR", f"bench-{os.getpid()}"),
        "application_version": "bench",  # the same in every process, whatever the path
        "log_level": "WARNING",
        "run_migrations": False,  # done once by the benchmark before the workers start
    }
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=WORKER_CONCURRENCY,
        polling_interval_sec=POLLING_INTERVAL,
        on_conflict="always_update",
    )
    print("BENCH-READY", flush=True)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=10)


if __name__ == "__main__":
    main()
