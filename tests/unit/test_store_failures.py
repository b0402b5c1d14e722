"""How the loops of the roles and the Store take a store failure: a transient one is a
warning and tried again soon; a permanent one is an error with its traceback, tried again
slowly; a read or a submit is tried a few times only."""

from __future__ import annotations

import asyncio
import logging

import pytest

from stepwarden.errors import PermanentStoreError, StoreError, TransientStoreError
from stepwarden.retry import NEW_FILE_TRIES, after_store_failure, answered, new_file
from stepwarden.store.sqlite import SQLiteStore

log = logging.getLogger("tests.store_failures")


def test_a_transient_failure_is_a_warning_tried_again_within_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=log.name):
        delays = [
            after_store_failure(log, "claim", TransientStoreError("lost"), n) for n in (1, 2, 50)
        ]
    assert delays == [0.1, 0.2, 5.0]
    assert {r.levelno for r in caplog.records} == {logging.WARNING}
    assert all(r.exc_info is None for r in caplog.records)


def test_a_permanent_failure_is_an_error_with_its_traceback_tried_again_slowly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=log.name):
        delays = [
            after_store_failure(log, "claim", PermanentStoreError("refused"), n) for n in (1, 9)
        ]
    assert delays == [1.0, 60.0]
    assert {r.levelno for r in caplog.records} == {logging.ERROR}
    assert all(r.exc_info is not None for r in caplog.records)


class Failing:
    """A store call that fails `failures` times (with `error`), then answers."""

    def __init__(self, failures: int, error: StoreError) -> None:
        self.left, self.error, self.calls = failures, error, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.left:
            self.left -= 1
            raise self.error
        return "answer"


class Waits:
    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float, stop: asyncio.Event | None = None) -> None:
        self.seconds.append(seconds)


async def test_a_read_is_tried_five_times_over_a_second_and_a_half_while_the_store_fails() -> None:
    store = SQLiteStore("sqlite:///never-opened.db")
    waits = Waits()
    store.wait_to_retry = waits  # type: ignore[method-assign]
    failing = Failing(99, TransientStoreError("lost"))
    with pytest.raises(TransientStoreError):
        await store._again_if_transient(failing)
    assert (failing.calls, waits.seconds) == (5, [0.1, 0.2, 0.4, 0.8])
    waits.seconds.clear()
    assert await store._again_if_transient(Failing(2, TransientStoreError("lost"))) == "answer"
    assert waits.seconds == [0.1, 0.2]
    # A refusal is not tried again.
    refused = Failing(1, PermanentStoreError("refused"))
    with pytest.raises(PermanentStoreError):
        await store._again_if_transient(refused)
    assert refused.calls == 1


async def test_a_role_tries_until_answered_unless_waiting_more_is_pointless(
    caplog: pytest.LogCaptureFixture,
) -> None:
    waits = Waits()
    with caplog.at_level(logging.WARNING, logger=log.name):
        got = await answered(log, "claim", Failing(3, TransientStoreError("lost")), wait=waits)
    assert got == "answer" and waits.seconds == [0.1, 0.2, 0.4]
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * 3
    waits.seconds.clear()
    late = Failing(9, TransientStoreError("lost"))
    with pytest.raises(TransientStoreError):
        await answered(log, "claim", late, pointless=lambda delay: delay > 0.3, wait=waits)
    assert (late.calls, waits.seconds) == (3, [0.1, 0.2])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=log.name), pytest.raises(PermanentStoreError):
        await answered(log, "claim", Failing(1, PermanentStoreError("refused")), wait=waits)
    assert [(r.levelno, r.exc_info is not None) for r in caplog.records] == [(logging.ERROR, True)]


def test_a_new_database_file_is_tried_for_about_four_seconds() -> None:
    delays = [new_file(n) or 0.0 for n in range(1, NEW_FILE_TRIES)]
    assert delays[0] == 0.01 and delays[-1] == 2.0
    assert delays == sorted(delays) and 3.8 < sum(delays) < 3.9
    assert new_file(NEW_FILE_TRIES) is None
