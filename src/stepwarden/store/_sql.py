"""Loads the SQL files of a dialect: versioned migrations and named queries."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations(dialect: str) -> list[Migration]:
    folder = resources.files(__package__).joinpath("sql", dialect)
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def queries(dialect: str) -> dict[str, str]:
    """The queries of `sql/<dialect>/queries.sql`, each headed by `-- name: NAME`."""
    text = resources.files(__package__).joinpath("sql", dialect, "queries.sql").read_text()
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def latest_version(dialect: str) -> int:
    return migrations(dialect)[-1].version
