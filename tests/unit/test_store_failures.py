"""How the loops of the roles take a store failure: a transient one is a warning and tried
again soon; a permanent one is an error with its traceback, tried again slowly."""

from __future__ import annotations

import logging

import pytest

from stepwarden.errors import PermanentStoreError, TransientStoreError
from stepwarden.retry import after_store_failure

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
