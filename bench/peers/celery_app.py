"""The "order" workload on Celery: a chain of three tasks (reserve -> charge -> ship), Redis
as broker and result backend, acks_late=True.

Each task receives the previous one's result (Celery's chain); the order travels along so
that every task has it. The broker and the result backend are one Redis database given to the
benchmark alone (BENCH_REDIS_URL, its number in the path), emptied before and after each run.

    BENCH_REDIS_URL=redis://127.0.0.1:6379/13 celery -A bench.peers.celery_app worker --pool solo
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_ready

RESERVE = "bench.reserve"
CHARGE = "bench.charge"
SHIP = "bench.ship"


def make_app(redis_url: str) -> Celery:
    app = Celery("bench", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.update(
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=3600,
        worker_hijack_root_logger=False,
    )

    @app.task(name=RESERVE)
    def reserve(order: dict[str, Any]) -> dict[str, Any]:
        return {"order": order, "reserved": order["items"]}

    @app.task(name=CHARGE, bind=True)
    def charge(self: Any, previous: dict[str, Any]) -> dict[str, Any]:
        order = previous["order"]
        return {"order": order, "receipt": self.request.id, "amount": order["amount"]}

    @app.task(name=SHIP)
    def ship(previous: dict[str, Any]) -> dict[str, Any]:
        return {"tracking": f"t-{previous['order']['id']}"}

    return app


_apps: dict[str, Celery] = {}


def app_for(redis_url: str) -> Celery:
    """One app per URL and process: Celery warns when a task name is registered twice."""
    if redis_url not in _apps:
        _apps[redis_url] = make_app(redis_url)
    return _apps[redis_url]


app = app_for(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))


@worker_ready.connect
def _ready(**_: Any) -> None:
    ready = os.environ.get("BENCH_READY_FILE")
    if ready:
        Path(ready).write_text(str(os.getpid()))
