"""Both dialects answer every named query the Store and its policy send, with every parameter
their SQL reads given by each call: checked from the source, without a database, so that a
query missing from one dialect's queries.sql, or a parameter renamed on one side, fails here
rather than at run time on that dialect alone.

The calls are read statically (`query_sites`): every call site counts, including those on
paths a run seldom takes (a refused batch tried row by row, a set-aside), which an
instrumented run would see only if a test drove it there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import stepwarden.store as store_package
from stepwarden.store import _sql
from stepwarden.store.sqlite import _split

from .query_sites import Site, driver_names, query_sites

STORE = Path(store_package.__file__).parent
DIALECTS = ("postgres", "sqlite")

ONE_DIALECT = {
    "insert_tasks_fenced": (
        "postgres",
        "a submit on a shard, fenced by the shard map's generation: shards are PostgreSQL's",
    ),
    "any_pending": (
        "sqlite",
        "read before a claim only where writes wait for each other (Store._worth_writing: "
        "SQLite has one writer); a PostgreSQL claim skips the rows others hold, at once",
    ),
    "any_request": ("sqlite", "as any_pending, before an agent's claim"),
    "notify": (
        "postgres",
        "the driver's NOTIFY of a transaction's wake-ups; SQLite's processes poll",
    ),
    "end_stalled_sessions": (
        "postgres",
        "ends the sessions of frozen clients that hold locks (the supervisor); a SQLite "
        "transaction ends with its process",
    ),
    "migration_lock": ("postgres", "the PostgreSQL driver's migrations: concurrent ones wait"),
    "create_schema_table": ("postgres", "the PostgreSQL driver's migrations"),
    "schema_table_exists": ("postgres", "the PostgreSQL driver's migrations"),
    "schema_version": ("postgres", "the PostgreSQL driver's migrations"),
    "record_migration": (
        "postgres",
        "the PostgreSQL driver's migrations (SQLite's driver migrates with SQL of its own, "
        "under the file's write lock)",
    ),
}
"""Queries that one dialect alone answers, and why."""

IMPLICIT = {"postgres": {"ord"}, "sqlite": {"ord", "now"}}
"""Parameters a driver adds: `ord` (a batch row's position; its array on PostgreSQL) and,
on SQLite, `now` (the transaction's clock reading)."""


def _code(sql: str) -> str:
    """SQL without its comments and the contents of its string literals (which may hold a
    colon or a percent sign that is no parameter)."""
    # One pass, left to right: an apostrophe in a comment opens no string.
    return re.sub(r"'(?:[^']|'')*'|--[^\n]*", lambda m: "''" if m[0].startswith("'") else "", sql)


def placeholders(dialect: str, statement: str) -> set[str]:
    pattern = r"%\((\w+)\)s" if dialect == "postgres" else r"(?<![:\w]):([A-Za-z_]\w*)"
    return set(re.findall(pattern, _code(statement)))


def columns(statement: str) -> set[str] | None:
    """The names of the columns a statement returns (RETURNING, or its SELECT list), or
    None when they cannot be read (`*`)."""
    code = _code(statement)
    flat = "".join(c if depth0 else " " for c, depth0 in _mask(code))
    returning = [m.end() for m in re.finditer(r"\bRETURNING\b", flat, re.IGNORECASE)]
    if returning:
        listed = code[returning[-1] :]
    else:
        select = re.search(r"\bSELECT\b", flat, re.IGNORECASE)
        end = re.search(r"\bFROM\b", flat[select.end() :], re.IGNORECASE) if select else None
        if select is None:
            return set()
        listed = code[select.end() : select.end() + end.start() if end else len(code)]
    names = set()
    for item in _split_top(listed.rstrip().rstrip(";")):
        item = item.strip()
        if item == "*" or item.endswith(".*"):
            return None
        named = re.search(r"\bAS\s+(\w+)\s*$", item, re.IGNORECASE) or re.search(r"(\w+)\s*$", item)
        if named:
            names.add(named.group(1))
    return names


def _mask(code: str) -> list[tuple[str, bool]]:
    depth, out = 0, []
    for c in code:
        if c == "(":
            depth += 1
        out.append((c, depth == 0))
        if c == ")":
            depth -= 1
    return out


def _split_top(listed: str) -> list[str]:
    parts, current, depth = [], "", 0
    for c in listed:
        depth += (c == "(") - (c == ")")
        if c == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
    return [*parts, current]


def unsupplied(dialect: str, site: Site, sql: str) -> set[str]:
    """The parameters the dialect's SQL for the site's query reads that the call does not
    give. A SQLite query of several statements runs the others once for each row of the
    first, that row's columns added to the parameters."""
    given = site.params | IMPLICIT[dialect]
    if dialect == "postgres":
        return placeholders(dialect, sql) - given
    first, *then = _split(sql)
    missing = placeholders(dialect, first) - given
    if then:
        returned = columns(first)
        later = set().union(*(placeholders(dialect, s) for s in then))
        missing |= later - given - (returned if returned is not None else later)
    return missing


QUERIES = {d: _sql.queries(d) for d in DIALECTS}
FOUND = query_sites(
    *sorted((STORE / "policy").glob("*.py")), STORE / "reseal.py", STORE / "base.py"
)
USED = {s.name for s in FOUND.sites}


def test_every_call_site_is_read() -> None:
    assert FOUND.unread == [], "sites whose query or parameters cannot be followed"
    assert len(USED) > 100  # the reading found the store's queries, not a few of them


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_query_used_is_answered_by_the_dialect(dialect: str) -> None:
    missing = {
        name
        for name in USED
        if name not in QUERIES[dialect] and ONE_DIALECT.get(name, (dialect,))[0] == dialect
    }
    assert missing == set(), f"queries the Store sends that {dialect}'s queries.sql lacks"


def test_both_dialects_answer_the_same_names_but_the_listed_ones() -> None:
    pg, lite = set(QUERIES["postgres"]), set(QUERIES["sqlite"])
    alone = {name: "postgres" for name in pg - lite} | {name: "sqlite" for name in lite - pg}
    assert alone == {name: dialect for name, (dialect, _) in ONE_DIALECT.items()}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_query_of_a_dialect_is_sent(dialect: str) -> None:
    sent = USED | driver_names(STORE / f"{dialect}.py")
    assert set(QUERIES[dialect]) - sent == set(), "queries nothing sends"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_parameter_a_query_reads_is_given_by_each_call(dialect: str) -> None:
    wrong = {
        f"{site.where} {site.name}": sorted(missing)
        for site in FOUND.sites
        if site.name in QUERIES[dialect]
        and (missing := unsupplied(dialect, site, QUERIES[dialect][site.name]))
    }
    assert wrong == {}
