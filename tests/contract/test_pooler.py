"""The store behind PgBouncer in transaction mode (`?pooler=transaction`): each transaction
gets whichever server session is free, so the store prepares no statement, sends no session
setting and makes no LISTEN (wake-ups come from polling), and it refuses to start unless the
server sessions end a stalled transaction by themselves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from stepwarden.errors import ConfigurationError
from stepwarden.store import open_one
from stepwarden.store.postgres import PostgresStore

from ..pgbouncer import pgbouncer

ROOT = Path(__file__).resolve().parents[2]


def _through(pg_url: str, port: int) -> str:
    name = pg_url.rsplit("/", 1)[1]
    return f"postgresql://postgres@127.0.0.1:{port}/{name}?pooler=transaction"


def _set_timeouts(pg_url: str, ms: int | None) -> None:
    name = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        for setting in ("lock_timeout", "idle_in_transaction_session_timeout"):
            if ms is None:
                admin.execute(f'ALTER DATABASE "{name}" RESET {setting}')
            else:
                admin.execute(f'ALTER DATABASE "{name}" SET {setting} = {ms}')


def test_a_transaction_pooler_takes_no_options_and_prepares_nothing() -> None:
    store = PostgresStore("postgresql://u@bouncer:6432/shop?pooler=transaction")
    assert store.connect_kwargs["prepare_threshold"] is None
    assert "options" not in store.connect_kwargs
    with pytest.raises(ConfigurationError, match="does not pass `options`"):
        PostgresStore("postgresql://u@b/shop?pooler=transaction&options=-c%20lock_timeout%3D1")
    with pytest.raises(ConfigurationError, match="pooler must be one of"):
        PostgresStore("postgresql://u@b/shop?pooler=statement")


async def test_behind_a_transaction_pooler_the_store_needs_the_servers_timeouts(
    pg_url: str,
) -> None:
    with pgbouncer(pg_url) as port:
        store = open_one(_through(pg_url, port))
        with pytest.raises(
            ConfigurationError,
            match="must set idle_in_transaction_session_timeout and lock_timeout",
        ):
            await store.open()
    _set_timeouts(pg_url, 5000)  # for the sessions made from now on
    with pgbouncer(pg_url) as port:
        store = open_one(_through(pg_url, port))
        await store.open()
        try:
            assert await store.acquire_lease("supervisor", "a", 30) == 1
        finally:
            await store.close()


@pytest.mark.slow
def test_the_order_demo_runs_through_pgbouncer_in_transaction_mode(
    pg_url: str, tmp_path: Path
) -> None:
    _set_timeouts(pg_url, 5000)
    # Fewer server sessions than the workers' pools ask for: transactions share them.
    with pgbouncer(pg_url, pool_size=6) as port:
        cmd = [
            sys.executable, "-m", "examples.orders.demo",
            "--orders", "60", "--workers", "2", "--kill-at", "0.2",
            "--declined", "0.1", "--undeliverable", "0.1", "--unapproved", "0.3",
            "--store", _through(pg_url, port),
            "--workdir", str(tmp_path), "--timeout", "150", "--json",
        ]  # fmt: skip
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=200)
    logs = "\n".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("*.log")))
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{logs}"
    summary = json.loads(run.stdout)
    assert summary["submitted"] == 60 and summary["lost"] == 0, summary
    assert summary["processed"] + summary["compensated"] + summary["error"] == 60, summary
    assert summary["duplicate_effects_applied"] == 0, summary
    assert summary["charged_not_processed"] == 0, summary
    assert "prepared statement" not in logs, logs
