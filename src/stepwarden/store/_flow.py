"""How the store's policy talks to a database driver: named queries, flows and wake-ups.

A flow is one store method's transaction written once for every database: a generator that
yields lists of named queries and is sent their rows, decides with the rules in between
(`rules.py`), and returns the method's result. A driver (`sqlite.py`, `postgres.py`) runs it:
it opens the transaction, runs each query of a list with its own SQL (`sql/<dialect>/`),
sends the rows back, and commits when the flow returns. The queries of one list do not
depend on each other's rows, so a driver may send them together.

    def complete(batch, wake):
        [rows] = yield [Query("complete_steps", each=[...])]
        wake.results(...)
        return [...]
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
Row = dict[str, Any]
Rows = list[Row]

CHANNEL_TASKS = "tasks"
"""Woken when tasks become pending."""
CHANNEL_REQUESTS = "requests"
"""Woken when step requests are queued for agents; payloads are agent names."""
CHANNEL_RESULTS = "results"
"""Woken when steps finish; payloads are step keys (see `records.step_key`)."""
CHANNEL_TASK_DONE = "task_done"
"""Woken when tasks finish; payloads are task ids."""
CHANNEL_CALLS = "calls"
"""Woken when tasks stop holding their steps (cancelled, paused, compensating: the calls of
their running steps are to stop); payloads are task ids."""
CHANNEL_OUTBOX = "outbox"
"""Woken when outbox messages are written (PostgreSQL); payloads are outbox channels."""


@dataclass(frozen=True, slots=True)
class Query:
    """One named query of the dialect's queries.sql, with its parameters.

    With `each`, the query applies to a batch: once for each of these rows (their keys are
    parameters too, with `ord`, the row's position), or once for all of them as arrays
    (`ord` then numbers the array elements), as the dialect's SQL is written. Either way the
    rows it returns carry `ord` where the SQL names it.

    `after_commit`: the rows may be read once the transaction has committed (the last
    query of a flow, one that only reads). `savepoint`: the query runs in a savepoint, and
    a failure is raised inside the flow at its `yield`, the transaction still usable.
    """

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    each: Sequence[Mapping[str, Any]] | None = None
    after_commit: bool = False
    savepoint: bool = False


Flow = Generator[list[Query], list[Rows], T]
FlowFn = Callable[["Wakeups"], Flow[T]]


def fetch(query: str, /, **params: Any) -> Flow[Rows]:
    """One query's rows, inside a flow: `rows = yield from fetch("get_task", task_id=...)`."""
    [rows] = yield [Query(query, params)]
    return rows


def together(*flows: Flow[Any]) -> Flow[list[Any]]:
    """Flows that do not depend on each other, run side by side: each round sends the
    queries every one of them has next (in the order given), so that a driver sends them in
    one round trip. Their results, in order."""
    results: list[Any] = [None] * len(flows)
    batches: dict[int, list[Query]] = {}
    for i, flow in enumerate(flows):
        try:
            batches[i] = next(flow)
        except StopIteration as stop:
            results[i] = stop.value
    while batches:
        rows = yield [q for batch in batches.values() for q in batch]
        at = 0
        sent: dict[int, list[Query]] = {}
        for i, batch in batches.items():
            mine, at = rows[at : at + len(batch)], at + len(batch)
            try:
                sent[i] = flows[i].send(mine)
            except StopIteration as stop:
                results[i] = stop.value
        batches = sent
    return results


def first_of_each(items: Sequence[T], key: Callable[[T], Hashable]) -> list[int]:
    """Positions of the first item of each key. A batch writes only those: a later duplicate
    could only fail its fence once the first one has applied, as it does one at a time."""
    seen: set[Hashable] = set()
    keep = []
    for i, item in enumerate(items):
        k = key(item)
        if k not in seen:
            seen.add(k)
            keep.append(i)
    return keep


class Wakeups:
    """The wake-ups a transaction owes once it commits: which actors have new work (or calls
    to stop).

    The driver sends them to other processes where it can (PostgreSQL: NOTIFY, delivered on
    commit) and publishes them in this process after the commit."""

    def __init__(self) -> None:
        self.due: list[tuple[str, list[str]]] = []

    def __bool__(self) -> bool:
        return bool(self.due)

    def tasks(self) -> None:
        """Tasks became pending (or compensating, unheld): schedulers may claim them."""
        self.due.append((CHANNEL_TASKS, [""]))

    def requests(self, agents: Sequence[str]) -> None:
        """Requests were queued for these agents."""
        if agents:
            self.due.append((CHANNEL_REQUESTS, sorted(set(agents))))

    def results(self, keys: Sequence[str]) -> None:
        """These steps (step keys) finished: the schedulers waiting for them may go on."""
        if keys:
            self.due.append((CHANNEL_RESULTS, list(keys)))

    def calls(self, task_ids: Sequence[str]) -> None:
        """These tasks stopped holding their steps: agents calling one stop the call."""
        if task_ids:
            self.due.append((CHANNEL_CALLS, list(task_ids)))

    def add(self, other: Wakeups) -> None:
        """Owe the wake-ups `other` noted too."""
        self.due.extend(other.due)

    def done(self, task_ids: Sequence[str]) -> None:
        """These tasks finished: whoever waits for their result may read it."""
        if task_ids:
            self.due.append((CHANNEL_TASK_DONE, list(task_ids)))
