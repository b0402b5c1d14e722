"""What the flows of several roles share (`store.policy`): the lease's fence, the batch
helpers, the stored details' text."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar

from ... import _json
from ...rules import (
    compensation_wait,
)
from .._flow import Query, Row, Rows

logger = logging.getLogger("stepwarden.store")


T = TypeVar("T")


def _json_text(value: Any) -> str:
    return _json.dumps(value, what="a stored detail")


def _holds(rows: Rows) -> dict[str, float]:
    """Of `hold_facts` rows, the seconds each task's compensation waits for the steps an
    agent may still be calling (`rules.compensation_wait`)."""
    by_task: dict[str, Rows] = {}
    for r in rows:
        by_task.setdefault(r["task_id"], []).append(r)
    return {task_id: compensation_wait(steps) for task_id, steps in by_task.items()}


def _by_ord(rows: Rows, positions: Sequence[int]) -> dict[int, Row]:
    """The rows a batch query returned, by the position in the caller's list of the item
    each applies to (`positions[ord]`)."""
    return {positions[r["ord"]]: r for r in rows}


def lease_fence(lease: str, holder: str, term: int) -> Query:
    """The query of the lease's fence: the lease row, locked until commit (PostgreSQL), when
    `holder` holds it at `term`. Every flow under the lease reads it first and writes
    nothing when it comes back empty."""
    return Query("lock_lease", {"name": lease, "holder": holder, "term": term})
