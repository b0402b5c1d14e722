"""The JSON API answers as its OpenAPI document (/openapi.json) says, checked by schemathesis
against the real dashboard process: status codes, content types and response schemas, for
generated requests, valid and invalid, with the token (and, by schemathesis's own check,
without it)."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

from .conftest import TOKEN, Served

EXAMPLES = 6
"""Generated requests per operation and mode: few, so that the test stays fast."""


def test_the_api_matches_its_openapi_document(served: Served) -> None:
    schema = schemathesis.openapi.from_url(served.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {
        "GET /api/overview",
        "GET /api/tasks",
        "GET /api/tasks/{task_id}",
        "POST /api/tasks/{task_id}/{action}",
        "POST /api/tasks/{task_id}/skip",
        "POST /api/actions",
        "GET /api/alerts",
        "GET /metrics",
    }
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for operation in operations:
        modes = [schemathesis.GenerationMode.POSITIVE]
        if list(operation.iter_parameters()) or operation.get_request_payload_content_types():
            modes.append(schemathesis.GenerationMode.NEGATIVE)  # something to get wrong
        for mode in modes:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,  # the same requests each run: no flaky CI
                suppress_health_check=list(HealthCheck),
            )
            def check(case: schemathesis.Case) -> None:
                case.call_and_validate(headers=headers)

            check()
