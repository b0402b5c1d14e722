"""The state store: the Store (`base.py`) and its policy (`policy/`), written once, over one
driver per database (`sqlite.py`, `postgres.py`)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from ..sealing import Keyring
from ._flow import (
    CHANNEL_CALLS,
    CHANNEL_OUTBOX,
    CHANNEL_REQUESTS,
    CHANNEL_RESULTS,
    CHANNEL_TASK_DONE,
    CHANNEL_TASKS,
)
from .base import Store, Subscription, Transaction
from .sharded import ShardedStore


def open_store(url: str, *, keys: Keyring | None = None) -> Store | ShardedStore:
    """The store for `url` (not yet opened): sqlite:///path.db or postgresql://..., or
    several postgresql://... URLs separated by whitespace: a store of shards (`sharded.py`),
    which serves the application's port and the reads only (`ports.ApplicationStore`).
    `keys`: the keyring its secrets are sealed and opened with (`sealing`), checked against
    the store's when it opens."""
    _check_url(url)
    store = ShardedStore(url) if len(url.split()) > 1 else _store_for(url)
    store.keys = keys
    return store


def open_one(url: str, *, keys: Keyring | None = None, read_only: bool = False) -> Store:
    """The store of the one database at `url` (not yet opened), as `open_store` opens it;
    several URLs (a store of shards) are refused. `read_only`: its connections refuse every
    write (`Store.read_only`): open it with `migrate=False`."""
    _check_url(url)
    if len(url.split()) > 1:
        raise ConfigurationError("this store is one database: several URLs name shards")
    store = _store_for(url)
    store.keys = keys
    store.read_only = read_only
    return store


def _check_url(url: str) -> None:
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"a store URL must be a non-empty string, not {url!r}")
    if "\x00" in url:
        raise ConfigurationError(f"invalid store URL {_masked(url)!r}: it holds a NUL character")


def _store_for(url: str) -> Store:
    try:
        scheme = urlsplit(url).scheme
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 host
        raise ConfigurationError(f"invalid store URL {_masked(url)!r}: {exc}") from None
    if scheme == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore(url)
    if scheme in ("postgresql", "postgres"):
        try:
            from .postgres import PostgresStore
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ConfigurationError(
                "PostgreSQL support needs the postgres extra: pip install 'stepwarden[postgres]'"
            ) from exc
        store: Store = PostgresStore(url)
        return store
    raise ConfigurationError(
        f"invalid store URL {_masked(url)!r}: use sqlite:///path.db or postgresql://user@host/db"
    )


def shown_url(url: str) -> str:
    """What may be shown of a store URL (the name of the store a dashboard serves): its
    scheme, host, port and database or file (`sqlite:///shop.db`), never its user, password
    or options."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}{parts.path}"


def _masked(url: str) -> str:
    """`url` with the password of its user (user:password@host) replaced by ***."""
    return re.sub(r"^([^:/]*://[^/@:]*:)[^/]*@", r"\1***@", url)


__all__ = [
    "CHANNEL_CALLS",
    "CHANNEL_OUTBOX",
    "CHANNEL_REQUESTS",
    "CHANNEL_RESULTS",
    "CHANNEL_TASKS",
    "CHANNEL_TASK_DONE",
    "ShardedStore",
    "Store",
    "Subscription",
    "Transaction",
    "open_one",
    "open_store",
    "shown_url",
]
