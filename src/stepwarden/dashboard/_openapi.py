"""The OpenAPI 3.1 document of the dashboard's JSON API (served at /openapi.json).

Written by hand next to the handlers in `_server.py`; tests/dashboard checks the API against
it (schemathesis)."""

from __future__ import annotations

from typing import Any

from .. import __version__
from .._check import MAX_INT, MAX_NAME, MAX_REASON
from .._text import SAFE_PATTERN
from ..states import StepState, TaskState

NAME = {"type": "string", "minLength": 1, "maxLength": MAX_NAME, "pattern": SAFE_PATTERN}
TIME = {"type": "string", "format": "date-time"}
STATES = [str(s) for s in TaskState]
TASK_ACTIONS = ("retry", "skip", "pause", "resume", "cancel", "compensate")
BULK_ACTIONS = ("retry", "pause", "resume", "cancel", "compensate")


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        return {"anyOf": [schema, {"type": "null"}]}
    out = dict(schema)
    kind = out.pop("type")
    out["type"] = [kind, "null"]
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    return out


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


TASK_SUMMARY = {
    "task_id": {"type": "string"},
    "workflow": {"type": "string"},
    "process_state": {"type": "string", "enum": STATES},
    "failure_count": {"type": "integer"},
    "compensation_failures": {"type": "integer"},
    "max_failures": {"type": "integer"},
    "attempt": {"type": "integer"},
    "priority": {"type": "integer"},
    "locked_by": _nullable({"type": "string"}),
    "complete_by": _nullable(TIME),
    "created_at": TIME,
    "updated_at": TIME,
    "finished_at": _nullable(TIME),
    "error": _nullable({"type": "string"}),
}
FILTERS = [{"required": ["state"]}, {"required": ["workflow"]}]
ANY = {"description": 'A JSON value; values marked secret are shown as "***".'}

SCHEMAS: dict[str, Any] = {
    "Error": _object({"error": {"type": "string"}, "outcome": _ref("Outcome")}, required=["error"]),
    "TaskSummary": _object(TASK_SUMMARY),
    "Task": _object(
        {
            **TASK_SUMMARY,
            "input": ANY,
            "result": ANY,
            "complete_within": {"type": "number"},
            "on_failure": {"type": "string"},
            "reply_to": _nullable({"type": "string"}),
        },
        required=[*TASK_SUMMARY, "complete_within", "on_failure", "reply_to"],
    ),
    "Step": _object(
        {
            "seq": {"type": "integer"},
            "name": {"type": "string"},
            "agent": {"type": "string"},
            "operation": {"type": "string"},
            "state": {"type": "string", "enum": [str(s) for s in StepState]},
            "attempt": {"type": "integer", "description": "Dispatches of the step."},
            "task_attempt": {"type": "integer"},
            "tries": {"type": "integer", "description": "Calls made by the agent."},
            "reassignments": {
                "type": "integer",
                "description": "Times handed to another agent instance, no failure counted.",
            },
            "heartbeat_at": _nullable(TIME),
            "idempotency_key": {"type": "string"},
            "locked_by": _nullable({"type": "string"}),
            "complete_by": TIME,
            "created_at": TIME,
            "claimed_at": _nullable(TIME),
            "finished_at": _nullable(TIME),
            "missed_deadline": {
                "type": "boolean",
                "description": "The step finished after its complete_by.",
            },
            "input": ANY,
            "result": ANY,
            "error": _nullable({"type": "string"}),
            "compensation": _nullable({"type": "string"}),
            "compensates": _nullable({"type": "integer"}),
        },
        required=[],  # set below: every property but the payloads
    ),
    "Event": _object(
        {"id": {"type": "integer"}, "at": TIME, "kind": {"type": "string"}, "detail": ANY},
        required=["id", "at", "kind"],
    ),
    "Alert": _object(
        {
            "id": {"type": "integer"},
            "task_id": _nullable({"type": "string"}),
            "kind": {"type": "string"},
            "detail": ANY,
            "at": TIME,
            "attempts": {"type": "integer"},
            "delivered_to": {"type": "array", "items": {"type": "string"}},
        },
        required=["id", "task_id", "kind", "at", "attempts", "delivered_to"],
    ),
    "Outcome": _object(
        {
            "task_id": {"type": "string"},
            "applied": {"type": "boolean"},
            "before": _nullable({"type": "string", "enum": STATES}),
            "after": _nullable({"type": "string", "enum": STATES}),
            "message": {"type": "string"},
        }
    ),
    "Overview": _object(
        {
            "counts": _object({s: {"type": "integer", "minimum": 0} for s in STATES}),
            "oldest_pending_age": _nullable({"type": "number", "minimum": 0}),
            "leader": _nullable(
                _object(
                    {
                        "holder": {"type": "string"},
                        "term": {"type": "integer"},
                        "expires_at": TIME,
                        "remaining": {"type": "number"},
                        "last_sweep": _nullable(
                            {
                                "type": "number",
                                "description": "Seconds since the leader last renewed its "
                                "lease, which it does before each sweep.",
                            }
                        ),
                        "live": {"type": "boolean"},
                        "released": {
                            "type": "boolean",
                            "description": "Let go by a supervisor that stopped.",
                        },
                    }
                )
            ),
            "activity": _object(
                {
                    "now": TIME,
                    "bucket": {"type": "number"},
                    "window": {"type": "number"},
                    "buckets": {
                        "type": "array",
                        "items": _object(
                            {
                                "start": TIME,
                                "processed": {"type": "integer"},
                                "failed": {"type": "integer"},
                            }
                        ),
                    },
                }
            ),
            "failed_tasks": {"type": "array", "items": _ref("TaskSummary")},
            "alerts": {"type": "array", "items": _ref("Alert")},
        }
    ),
    "AgentInstance": _object(
        {
            "instance": {"type": "string"},
            "agent": {"type": "string"},
            "operations": {"type": "array", "items": {"type": "string"}},
            "capacity": {"type": "integer"},
            "inflight": {"type": "integer"},
            "breaker": {"type": "string", "enum": ["closed", "open", "half_open"]},
            "breaker_detail": {"type": "object"},
            "started_at": TIME,
            "heartbeat_at": TIME,
            "expires_at": TIME,
            "alive": {"type": "boolean"},
        }
    ),
    "OperationStats": _object(
        {
            "agent": {"type": "string"},
            "operation": {"type": "string"},
            "started": {"type": "integer"},
            "completed": {"type": "integer"},
            "failed": {"type": "integer"},
            "reassignments": {"type": "integer"},
        }
    ),
    "ActionRequest": _object(
        {
            "reason": _nullable({"type": "string", "maxLength": MAX_REASON}),
            "by": _nullable(NAME),
        },
        required=[],
    ),
    "SkipRequest": _object(
        {
            "seq": {"type": "integer", "minimum": 1, "maximum": MAX_INT},
            "result": {
                "description": 'The step\'s result, a JSON value ({"$secret": VALUE} is a secret).'
            },
            "reason": _nullable({"type": "string", "maxLength": MAX_REASON}),
            "by": _nullable(NAME),
        },
        required=["seq"],
    ),
    "BulkRequest": _object(
        {
            "action": {"type": "string", "enum": list(BULK_ACTIONS)},
            "task_ids": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 10_000},
            "state": {"type": "string", "enum": STATES},
            "workflow": NAME,
            "limit": {"type": "integer", "minimum": 1, "maximum": 10_000},
            "reason": _nullable({"type": "string", "maxLength": MAX_REASON}),
            "by": _nullable(NAME),
            "dry_run": {"type": "boolean", "default": False},
        },
        required=["action"],
    )
    | {
        # The tasks named, or a filter: one of the two.
        "oneOf": [
            {"required": ["task_ids"], "not": {"anyOf": FILTERS}},
            {"not": {"required": ["task_ids"]}, "anyOf": FILTERS},
        ]
    },
}
SCHEMAS["Step"]["required"] = [
    k for k in SCHEMAS["Step"]["properties"] if k not in ("input", "result")
]


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERROR = _ref("Error")
BAD = _json(ERROR, "The request is invalid.")
UNAUTHORISED = _json(ERROR, "No API token, or a wrong one (and no signed-in session).")
FORBIDDEN = _json(ERROR, "A signed-in session without its CSRF token.")
SECURED: list[dict[str, list[str]]] = [{"bearer": []}, {"session": [], "csrf": []}]
LIMIT = {
    "name": "limit",
    "in": "query",
    "required": False,
    "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
}


def document() -> dict[str, Any]:
    paths: dict[str, Any] = {
        "/api/overview": {
            "get": {
                "operationId": "overview",
                "summary": "Tasks by state, the last hour's activity, the supervisor leader, "
                "the tasks in error and the latest alerts.",
                "responses": {"200": _json(_ref("Overview"), "The overview.")},
            }
        },
        "/api/tasks": {
            "get": {
                "operationId": "listTasks",
                "summary": "Tasks, newest first, by state, workflow and part of the id.",
                "parameters": [
                    {"name": "state", "in": "query", "schema": {"type": "string", "enum": STATES}},
                    {"name": "workflow", "in": "query", "schema": NAME},
                    {
                        "name": "search",
                        "in": "query",
                        "description": "Only tasks whose id contains this.",
                        "schema": NAME,
                    },
                    LIMIT,
                ],
                "responses": {
                    "200": _json(
                        _object(
                            {
                                "tasks": {"type": "array", "items": _ref("TaskSummary")},
                                "workflows": {"type": "array", "items": {"type": "string"}},
                            }
                        ),
                        "The tasks found, and every workflow name (for filters).",
                    ),
                    "400": BAD,
                },
            }
        },
        "/api/tasks/{task_id}": {
            "get": {
                "operationId": "getTask",
                "summary": "A task with its steps and a page of its history (100 events, "
                "newest first).",
                "parameters": [
                    {"name": "task_id", "in": "path", "required": True, "schema": NAME},
                    {
                        "name": "events_before",
                        "in": "query",
                        "required": False,
                        "description": "The page of events older than this event id (the "
                        "previous page's events_before).",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                    },
                ],
                "responses": {
                    "200": _json(
                        _object(
                            {
                                "task": _ref("Task"),
                                "steps": {"type": "array", "items": _ref("Step")},
                                "events": {"type": "array", "items": _ref("Event")},
                                "more_events": {"type": "boolean"},
                                "events_before": _nullable({"type": "integer"}),
                            }
                        ),
                        "The task; `more_events` when older events exist, and the "
                        "`events_before` that asks for them.",
                    ),
                    "400": BAD,
                    "404": _json(ERROR, "No such task."),
                },
            }
        },
        "/api/tasks/{task_id}/skip": {
            "post": {
                "operationId": "skipStep",
                "summary": "Mark a step completed with a given result, as if its operation "
                "had returned it; recorded in the task's history.",
                "security": SECURED,
                "parameters": [
                    {"name": "task_id", "in": "path", "required": True, "schema": NAME},
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("SkipRequest")}},
                },
                "responses": {
                    "200": _json(_object({"outcome": _ref("Outcome")}), "Done."),
                    "400": BAD,
                    "401": UNAUTHORISED,
                    "403": FORBIDDEN,
                    "404": _json(ERROR, "No such task."),
                    "409": _json(ERROR, "The task's state, or the step's, does not allow a skip."),
                },
            }
        },
        "/api/tasks/{task_id}/{action}": {
            "post": {
                "operationId": "actOnTask",
                "summary": "An operator action on one task, recorded in its history.",
                "security": SECURED,
                "parameters": [
                    {"name": "task_id", "in": "path", "required": True, "schema": NAME},
                    {
                        "name": "action",
                        "in": "path",
                        "required": True,
                        "schema": {
                            "type": "string",
                            "enum": [a for a in TASK_ACTIONS if a != "skip"],
                        },
                    },
                ],
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": _ref("ActionRequest")}},
                },
                "responses": {
                    "200": _json(_object({"outcome": _ref("Outcome")}), "Done."),
                    "400": BAD,
                    "401": UNAUTHORISED,
                    "403": FORBIDDEN,
                    "404": _json(ERROR, "No such task."),
                    "409": _json(ERROR, "The action does not apply to the task's state."),
                },
            }
        },
        "/api/actions": {
            "post": {
                "operationId": "bulkAction",
                "summary": "An operator action on the tasks named, or on those matching a "
                "filter; with dry_run, nothing is changed and each outcome says what would be.",
                "security": SECURED,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("BulkRequest")}},
                },
                "responses": {
                    "200": _json(
                        _object(
                            {
                                "dry_run": {"type": "boolean"},
                                "applied": {
                                    "type": "integer",
                                    "description": "Tasks changed (in a dry run: that would be).",
                                },
                                "refused": {"type": "integer"},
                                "outcomes": {"type": "array", "items": _ref("Outcome")},
                            }
                        ),
                        "The outcome for each task.",
                    ),
                    "400": BAD,
                    "401": UNAUTHORISED,
                    "403": FORBIDDEN,
                },
            }
        },
        "/api/alerts": {
            "get": {
                "operationId": "listAlerts",
                "summary": "Alerts (the outbox's channel 'alerts'), newest first.",
                "parameters": [LIMIT],
                "responses": {
                    "200": _json(
                        _object({"alerts": {"type": "array", "items": _ref("Alert")}}),
                        "The alerts.",
                    ),
                    "400": BAD,
                },
            }
        },
        "/api/agents": {
            "get": {
                "operationId": "listAgents",
                "summary": "The agent registry: every agent instance (those gone within the "
                "last hour included), and the steps of each agent's operations.",
                "responses": {
                    "200": _json(
                        _object(
                            {
                                "instances": {"type": "array", "items": _ref("AgentInstance")},
                                "operations": {
                                    "type": "array",
                                    "items": _ref("OperationStats"),
                                },
                            }
                        ),
                        "The agents.",
                    )
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics, read from the store at scrape time.",
                "responses": {
                    "200": {
                        "description": "Prometheus text format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "stepwarden dashboard",
            "version": __version__,
            "description": "Read the tasks, steps, history and alerts of a stepwarden store, "
            "and act on tasks as an operator. Reads need nothing on a loopback address, and "
            "the API token (or a signed-in session) elsewhere (401 without); actions are POSTs "
            "that need the dashboard's API token, or a signed-in session and its CSRF token. "
            "A body over 2 MiB is refused (413) before it is read. Values "
            'marked secret are shown as "***".',
        },
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "session": {"type": "apiKey", "in": "cookie", "name": "stepwarden_session"},
                "csrf": {"type": "apiKey", "in": "header", "name": "X-CSRF-Token"},
            },
        },
    }
