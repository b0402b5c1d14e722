"""A flow of the store's policy run without a database: each query it yields is answered
from canned rows by name, as a driver would answer it (`store/_flow.py`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from stepwarden.errors import StoreError
from stepwarden.store._flow import CHANNEL_TASKS, Flow, Query, Rows, Wakeups

T = TypeVar("T")
Answer = Rows | StoreError | Callable[[Query], "Rows | StoreError"]
"""Rows, a failure (of a query in a savepoint: raised in the flow at its `yield`, as the
drivers do), or a function of the query giving either."""


@dataclass
class Run(Generic[T]):
    result: T
    rounds: list[list[Query]]
    """The queries of each round, in the order the flow yielded them."""
    wake: Wakeups = field(default_factory=Wakeups)

    def names(self) -> list[list[str]]:
        return [[q.name for q in batch] for batch in self.rounds]

    def sent(self, name: str) -> list[Query]:
        return [q for batch in self.rounds for q in batch if q.name == name]

    def one(self, name: str) -> Query:
        [query] = self.sent(name)
        return query

    def woken(self, channel: str) -> list[str]:
        return [p for c, payloads in self.wake.due if c == channel for p in payloads]

    def wakes_tasks(self) -> bool:
        return bool(self.woken(CHANNEL_TASKS))


def drive(flow: Callable[[Wakeups], Flow[T]], answers: Mapping[str, Answer]) -> Run[T]:
    """Run `flow` to its end, answering each query from `answers` by its name; a query
    without an answer fails the test (the flow sent what the test did not expect)."""
    wake = Wakeups()
    steps = flow(wake)
    rounds: list[list[Query]] = []
    try:
        batch = next(steps)
        while True:
            rounds.append(batch)
            rows: list[Rows] = []
            failure: StoreError | None = None
            for query in batch:
                assert query.name in answers, f"unexpected query {query.name!r}"
                answer = answers[query.name]
                got = answer(query) if callable(answer) else answer
                if isinstance(got, StoreError):
                    assert query.savepoint, f"{query.name} failed outside a savepoint"
                    failure = got
                    break
                rows.append(got)
            batch = steps.throw(failure) if failure is not None else steps.send(rows)
    except StopIteration as stop:
        return Run(stop.value, rounds, wake)


def each(query: Query) -> list[Mapping[str, Any]]:
    """A batch query's rows (`Query.each`)."""
    assert query.each is not None, f"{query.name} is not a batch"
    return list(query.each)
