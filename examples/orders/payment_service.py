"""A remote payment service for the orders example: a real HTTP server with injectable faults.

It de-duplicates by idempotency key and logs every effect it applies in a ledger (an SQLite
file), so a run can be checked afterwards: each order charged at most once, whatever the
retries, re-dispatches and crashes.

    POST /charge  {"order_id", "amount", "card", "idempotency_key"}  -> {"charge", "duplicate"}
                  a card "declined" gets a 402 and no effect
    POST /refund  {"order_id", "idempotency_key"}                    -> {"refund", "duplicate"}
    GET  /stats   effects applied, duplicates prevented, orders charged more than once
    POST /faults  replace the fault settings (same fields as the command-line flags)

Faults, each drawn per request before any effect: `transient` (a 503), `slow` (sleep `slow_for`
seconds, longer than the caller's complete_by, then apply and answer late), `lost` (apply the
effect, then drop the connection without answering), `crash` (the process exits at once, as if
killed), and an outage window (`outage_start`, `outage_for` seconds after start: every request
gets a 503).

Run: python -m examples.orders.payment_service --port 8081 --ledger ledger.db --transient 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import time
import uuid
from dataclasses import asdict, dataclass, fields
from typing import Any

from aiohttp import web


@dataclass
class Faults:
    transient: float = 0.0
    slow: float = 0.0
    slow_for: float = 3.0
    lost: float = 0.0
    crash: float = 0.0
    outage_start: float = -1.0
    outage_for: float = 0.0
    seed: int | None = None


class Ledger:
    """Every applied effect, one row each; the idempotency key is unique per kind."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS effects (kind TEXT, idempotency_key TEXT, order_id TEXT,"
            " amount REAL, receipt TEXT, at REAL, PRIMARY KEY (kind, idempotency_key))"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS duplicates (kind TEXT, idempotency_key TEXT, at REAL)"
        )
        self.db.execute("CREATE TABLE IF NOT EXISTS faults (kind TEXT, at REAL)")

    def fault(self, kind: str) -> None:
        """Note a fault injected, so that a run can count them afterwards."""
        self.db.execute("INSERT INTO faults VALUES (?, ?)", (kind, time.time()))

    def apply(self, kind: str, key: str, order_id: str, amount: float) -> tuple[str, bool]:
        """Apply once per key: (receipt, whether this request was a duplicate). A charge
        for an order already refunded is refused (receipt "refused"), as a void would be: a
        late charge cannot land after the refund that undid it."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            row = self.db.execute(
                "SELECT receipt FROM effects WHERE kind = ? AND idempotency_key = ?", (kind, key)
            ).fetchone()
            if row:
                self.db.execute("INSERT INTO duplicates VALUES (?, ?, ?)", (kind, key, time.time()))
                self.db.execute("COMMIT")
                return str(row[0]), True
            if (
                kind == "charge"
                and self.db.execute(
                    "SELECT 1 FROM effects WHERE kind = 'refund' AND order_id = ?", (order_id,)
                ).fetchone()
            ):
                self.db.execute("COMMIT")
                return "refused", False
            receipt = f"{kind}-{uuid.uuid4().hex[:12]}"
            self.db.execute(
                "INSERT INTO effects VALUES (?, ?, ?, ?, ?, ?)",
                (kind, key, order_id, amount, receipt, time.time()),
            )
            self.db.execute("COMMIT")
            return receipt, False
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def stats(self) -> dict[str, Any]:
        return ledger_stats(self.db)


def ledger_stats(db: sqlite3.Connection) -> dict[str, Any]:
    def one(sql: str) -> int:
        count: int = db.execute(sql).fetchone()[0]
        return count

    return {
        "charges": one("SELECT count(*) FROM effects WHERE kind = 'charge'"),
        "refunds": one(
            "SELECT count(*) FROM effects r WHERE kind = 'refund' AND EXISTS"
            " (SELECT 1 FROM effects c WHERE c.kind = 'charge' AND c.order_id = r.order_id)"
        ),
        "orders_charged_not_refunded": one(
            "SELECT count(DISTINCT order_id) FROM effects c WHERE kind = 'charge' AND NOT EXISTS"
            " (SELECT 1 FROM effects r WHERE r.kind = 'refund' AND r.order_id = c.order_id)"
        ),
        "duplicates_prevented": one("SELECT count(*) FROM duplicates"),
        "orders_charged_twice": one(
            "SELECT count(*) FROM (SELECT order_id FROM effects WHERE kind = 'charge'"
            " GROUP BY order_id HAVING count(*) > 1)"
        ),
        "faults": dict(db.execute("SELECT kind, count(*) FROM faults GROUP BY kind").fetchall()),
        "orders_refunded_twice": one(
            "SELECT count(*) FROM (SELECT order_id FROM effects WHERE kind = 'refund'"
            " GROUP BY order_id HAVING count(*) > 1)"
        ),
    }


def read_stats(ledger_path: str) -> dict[str, Any]:
    """The ledger's figures, read straight from its file (the service may be down)."""
    db = sqlite3.connect(ledger_path)
    try:
        return ledger_stats(db)
    finally:
        db.close()


class Service:
    def __init__(self, ledger: Ledger, faults: Faults) -> None:
        self.ledger = ledger
        self.set_faults(faults)
        self.started = time.monotonic()

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults
        self.rng = random.Random(faults.seed)

    def _in_outage(self) -> bool:
        f = self.faults
        elapsed = time.monotonic() - self.started
        return f.outage_start >= 0 and f.outage_start <= elapsed < f.outage_start + f.outage_for

    async def _effect(self, request: web.Request, kind: str) -> web.StreamResponse:
        try:
            body = await request.json()
            key, order_id = str(body["idempotency_key"]), str(body["order_id"])
            amount = float(body.get("amount", 0))
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "bad request"}, status=400)
        if kind == "charge" and body.get("card") == "declined":
            return web.json_response({"error": "card declined"}, status=402)
        f = self.faults
        if self._in_outage():
            self.ledger.fault("outage")
            return web.json_response({"error": "outage"}, status=503)
        if self.rng.random() < f.crash:
            self.ledger.fault("crash")
            os._exit(17)
        if self.rng.random() < f.transient:
            self.ledger.fault("transient")
            return web.json_response({"error": "try again"}, status=503)
        slow = self.rng.random() < f.slow
        lost = self.rng.random() < f.lost
        if slow:
            self.ledger.fault("slow")
            await asyncio.sleep(f.slow_for)
        receipt, duplicate = self.ledger.apply(kind, key, order_id, amount)
        if lost and request.transport is not None:
            self.ledger.fault("lost")
            request.transport.close()  # the effect is applied, the answer never arrives
            raise ConnectionResetError("answer dropped on purpose")
        return web.json_response({kind: receipt, "duplicate": duplicate})

    async def charge(self, request: web.Request) -> web.StreamResponse:
        return await self._effect(request, "charge")

    async def refund(self, request: web.Request) -> web.StreamResponse:
        return await self._effect(request, "refund")

    async def stats(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.ledger.stats())

    async def put_faults(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        known = {f.name for f in fields(Faults)}
        self.set_faults(Faults(**{k: v for k, v in body.items() if k in known}))
        self.started = time.monotonic()
        return web.json_response(asdict(self.faults))

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.post("/charge", self.charge),
                web.post("/refund", self.refund),
                web.get("/stats", self.stats),
                web.post("/faults", self.put_faults),
            ]
        )
        return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--ledger", default="payments-ledger.db")
    for f in fields(Faults):
        kind = int if f.name == "seed" else float
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default)
    args = parser.parse_args(argv)
    faults = Faults(**{f.name: getattr(args, f.name) for f in fields(Faults)})
    service = Service(Ledger(args.ledger), faults)
    web.run_app(service.app(), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
