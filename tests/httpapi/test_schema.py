"""The application API answers as its OpenAPI document (/api/v1/openapi.json, generated from
its typed models) says: requests generated from the document, valid and invalid, sent with a
client's token to a real server and worker, get no server error and no answer the document
does not describe."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import positive_data_acceptance

from stepwarden.dashboard import _auth

from .conftest import Tokens, serving

Operation = schemathesis.APIOperation[Any, Any, Any, Any]
EXAMPLES = 6
"""Generated requests per operation and mode: few, so that the test stays fast."""
UNCHECKED: list[schemathesis.CheckFunction] = [positive_data_acceptance]
"""Every check but that each valid request is accepted: the engine refuses what a JSON schema
does not say (a version another workflow has, an integer beyond 64 bits), with 422."""
LONG_POLL = "GET /api/v1/results/{task_id}"
WAKEUPS = "GET /api/v1/agents/{agent}/wakeups"


def test_the_application_api_matches_its_openapi_document(
    sqlite_url: str, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each case answered 2xx is sent again with a wrong token, which the checks want refused
    # with 401: the server (in this process) counts no wrong token here, or the eleventh of a
    # minute would be a 429 (tests/httpapi/test_access.py tests that).
    monkeypatch.setattr(_auth, "MAX_FAILURES", 10**9)
    # Only the workflows that end by themselves: a generated read of a task a generated submit
    # made (ids like "0" meet) answers once the task ends, and a stream ends with it.
    with serving(sqlite_url, tokens.path, waits=False) as served:
        schema = schemathesis.openapi.from_url(served.url + "/api/v1/openapi.json")
        operations: list[Operation] = []
        for result in schema.get_all_operations():
            if isinstance(result, Err):
                raise result.err()
            operations.append(result.ok())
        assert {op.label for op in operations} == {
            "POST /api/v1/tasks",
            "GET /api/v1/tasks/{task_id}",
            LONG_POLL,
            "GET /api/v1/messages/{task_id}",
            "POST /api/v1/events/{task_id}",
            "POST /api/v1/cancel/{task_id}",
            "GET /api/v1/agents/whoami",
            WAKEUPS,
            *(
                f"POST /api/v1/agents/{{agent}}/{route}"
                for route in (
                    "beat",
                    "leave",
                    "breaker",
                    "claim",
                    "held",
                    "lost",
                    "heartbeat",
                    "complete",
                    "hand-back",
                    "stopped",
                )
            ),
        }
        # The submits last: the reads before them meet no task of theirs that has not ended.
        operations.sort(key=lambda op: op.label == "POST /api/v1/tasks")
        headers = tokens.auth("billing")  # every scope
        for operation in operations:
            for mode in schemathesis.GenerationMode:  # valid requests, and invalid ones

                @given(case=operation.as_strategy(generation_mode=mode))
                @settings(
                    max_examples=EXAMPLES,
                    deadline=None,
                    database=None,
                    derandomize=True,  # the same requests each run: no flaky CI
                    suppress_health_check=list(HealthCheck),
                )
                def check(case: schemathesis.Case[Operation]) -> None:
                    if case.operation.label == LONG_POLL:
                        _shorten(case)
                    if case.operation.label == WAKEUPS:  # a stream ends after `seconds`
                        case.query = {**(case.query or {})}
                        case.query.setdefault("seconds", 0.2)
                        _shorten(case, "seconds", 3600)
                    case.call_and_validate(headers=headers, excluded_checks=UNCHECKED, timeout=30)

                check()


def _shorten(case: schemathesis.Case[Operation], name: str = "timeout", most: float = 60) -> None:
    """A long poll's (or a stream's) valid duration made short: its answer is the same,
    sooner."""
    value = (case.query or {}).get(name)
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= most:
        case.query = {**(case.query or {}), name: min(value, 0.2)}
