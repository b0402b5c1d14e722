"""The database behind a store URL, read and written without going through stepwarden: for
tests that set up what the engine would not write itself (a corrupt row, an old schema)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql as pgsql


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite:")


def sqlite_path(url: str) -> str:
    assert url.startswith("sqlite:///"), url
    return url[len("sqlite:///") :]


def sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    """Run one statement (no parameters) on the store's database; its rows."""
    if is_sqlite(url):
        conn = sqlite3.connect(sqlite_path(url), isolation_level=None)
        try:
            return [tuple(r) for r in conn.execute(statement).fetchall()]
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        cur = pg.execute(statement.encode())
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


def script(url: str, text: str) -> None:
    """Run a script of several statements (a migration, a trigger) on the store's database."""
    if is_sqlite(url):
        conn = sqlite3.connect(sqlite_path(url), isolation_level=None)
        try:
            conn.executescript(text)
        finally:
            conn.close()
        return
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(text.encode())


def seconds_ago(url: str, seconds: float) -> str:
    """An SQL expression for a time `seconds` before now, as the store keeps times."""
    if is_sqlite(url):
        return f"(((julianday('now') - 2440587.5) * 86400.0) - {seconds})"
    return f"(now() - make_interval(secs => {seconds}))"


CLOCK_GRAIN = 0.002
"""Seconds by which `seconds_until` may overstate (SQLite reads the time to the millisecond,
while the stores write it to the microsecond)."""


def seconds_until(url: str, column: str) -> str:
    """An SQL expression for the seconds from now until the time in `column` (up to
    CLOCK_GRAIN too many)."""
    if is_sqlite(url):
        return f"({column} - ((julianday('now') - 2440587.5) * 86400.0))"
    return f"extract(epoch FROM {column} - now())::float8"


def custom_plan(db: psycopg.Connection[Any], query: str, params: Mapping[str, Any]) -> str:
    """The PostgreSQL plan of `query` for these `params` (as a statement run once is
    planned)."""
    return "\n".join(r[0] for r in db.execute("EXPLAIN " + query, params).fetchall())


def generic_plan(
    db: psycopg.Connection[Any],
    query: str,
    params: Mapping[str, Any] | None = None,
    *,
    verbose: bool = False,
) -> str:
    """The PostgreSQL plan of `query` prepared with its parameters unknown, as a statement
    kept for many calls is planned, run with `params` (NULL for each one missing); with its
    expressions written out when `verbose`."""
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    db.execute("DEALLOCATE ALL")
    db.execute("PREPARE planned AS " + re.sub(r"%\((\w+)\)s", number, query))
    db.execute("SET plan_cache_mode = force_generic_plan")
    try:
        given = params or {}
        args = pgsql.SQL(", ").join(pgsql.Literal(given.get(n)) for n in names)
        options = "(VERBOSE) " if verbose else ""
        found = db.execute(pgsql.SQL(f"EXPLAIN {options}EXECUTE planned({{}})").format(args))
        plan = "\n".join(r[0] for r in found.fetchall())
    finally:
        db.execute("RESET plan_cache_mode")
    return plan
