"""The dashboard's JSON API: typed routes (FastAPI) over the store's reads and `App.operate`.
Its OpenAPI document is generated from these routes and the models of `_models.py`.

Reads answer with the data of `_data.Reader` as it is (every `Secret` masked); a request the
models refuse is answered 400 with `{"error": ...}`; actions need the API token, or a
signed-in session and its CSRF token, checked before the request's body is read. Mounted in
another application (`create_app(..., auth=...)`), that application's own dependency guards
every route instead, and names who acts."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations, some of
# which are local to `router`.
import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from pydantic import StringConstraints
from starlette.responses import Response

from .. import _check, _json
from .._text import SAFE_PATTERN, TENANT_PATTERN
from ..app import App
from ..errors import EventRefused, StepwardenError, StoreError, TaskNotFound, UnknownNameError
from ..records import ActionOutcome, BulkFork, BulkPlan, BulkProgress, TaskFilter
from ..states import TaskState
from . import _metrics
from ._auth import MAX_FAILURES, Guard
from ._data import Reader
from ._models import (
    MAX_BULK,
    MAX_BULK_PLAN,
    MAX_EVENT_ID,
    MAX_LIST,
    TAG_PATTERN,
    ActionRequest,
    AgentsAnswer,
    AlertsAnswer,
    BulkAnswer,
    BulkFilterAnswer,
    BulkFilterRequest,
    BulkRequest,
    Error,
    ForkRequest,
    OutcomeAnswer,
    Overview,
    RedriveAnswer,
    ScheduleAnswer,
    SchedulesAnswer,
    SendAnswer,
    SendRequest,
    SkipRequest,
    TaskAnswer,
    TasksAnswer,
    WhyAnswer,
)

DEFAULT_BY = "dashboard"
EVENT_PAGE = 100
"""Events of a task's history per page, newest first."""
SECURED: list[dict[str, list[str]]] = [{"bearer": []}, {"session": [], "csrf": []}]
TaskId = Annotated[str, Path(min_length=1, max_length=_check.MAX_NAME, pattern=SAFE_PATTERN)]
NameQuery = Query(min_length=1, max_length=_check.MAX_NAME, pattern=SAFE_PATTERN)
Limit = Annotated[int, Query(ge=1, le=MAX_LIST)]


class BadRequest(Exception):
    """A request the API refuses (400), with a message for the caller."""


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    # `display` masks every Secret: a payload's secret is never sent. Nothing is cached: an
    # answer holds payloads and errors.
    return Response(
        _json.display(data),
        status_code=status,
        media_type="application/json",
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


def error(status: int, message: str, **extra: Any) -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return json_response({"error": message, **extra}, status, headers)


def outcome_dict(o: ActionOutcome) -> dict[str, Any]:
    return {
        "task_id": o.task_id,
        "applied": o.applied,
        "before": None if o.before is None else str(o.before),
        "after": None if o.after is None else str(o.after),
        "message": o.message,
    }


def _answers(**codes: tuple[type[Any], str]) -> dict[int | str, dict[str, Any]]:
    answers: dict[int | str, dict[str, Any]] = {
        int(code[1:]): {"model": m, "description": d} for code, (m, d) in codes.items()
    }
    if 429 in answers:
        answers[429]["headers"] = {"Retry-After": RETRY_AFTER}
    return answers


BAD = (Error, "The request is invalid.")
UNAUTHORISED = (Error, "No API token, or a wrong one (and no signed-in session).")
FORBIDDEN = (Error, "A signed-in session without its CSRF token.")
THROTTLED = (
    Error,
    f"{MAX_FAILURES} wrong API tokens came from this address within a minute: every token it "
    "sends is refused for a minute.",
)
RETRY_AFTER = {
    "description": "Seconds before this address may send a token again.",
    "schema": {"type": "integer"},
}


def one(request: Request, name: str) -> None:
    """A query parameter may be given once: a second value is refused, not ignored."""
    if len(request.query_params.getlist(name)) > 1:
        raise BadRequest(f"{name} is given more than once")


def token_actor(guard: Guard) -> Callable[[Request], str | None]:
    """The actor of a request that carries the API token or a session: how it was
    authenticated. The guard in front of the routes (`_server._Access`) has refused a request
    without either before its body was read."""

    def acting(request: Request) -> str | None:
        verdict = guard.check(request)
        if not verdict.allowed:
            raise HTTPException(verdict.status, verdict.reason, headers=verdict.headers)
        return verdict.identity

    return acting


def outer_actor(auth: Callable[..., Any]) -> Callable[..., str]:
    """The actor of a request that the application the dashboard is mounted in has let in:
    its dependency `auth` refuses a caller it does not know (raising, e.g. HTTPException(401))
    and returns the name of one it knows, recorded as the action's `authenticated`."""

    def acting(who: Annotated[Any, Depends(auth)]) -> str:
        if not isinstance(who, str):
            raise TypeError(f"the dashboard's auth dependency returned {who!r}, not a name")
        return who

    return acting


def router(
    app: App, reader: Reader, acting: Callable[..., str | None], *, guard_reads: bool = False
) -> APIRouter:
    """The API's routes; actions need `acting`, and with `guard_reads` so does every other
    route (reads, /metrics)."""
    api = APIRouter(dependencies=[Depends(acting)] if guard_reads else [])
    Identity = Annotated[str | None, Depends(acting)]

    @api.get(
        "/api/overview",
        operation_id="overview",
        summary="Tasks by state, the last hour's activity, the supervisor leader, the tasks "
        "in error and the latest alerts.",
        responses=_answers(r200=(Overview, "The overview.")),
    )
    async def overview() -> Response:
        return json_response(await reader.overview())

    @api.get(
        "/api/tasks",
        operation_id="listTasks",
        summary="Tasks, newest first, by state, workflow, version, tenant, part of the id and "
        "tags.",
        responses=_answers(
            r200=(TasksAnswer, "The tasks found, and every workflow name (for filters)."),
            r400=BAD,
        ),
    )
    async def tasks(
        request: Request,
        state: TaskState | None = None,
        workflow: Annotated[str | None, NameQuery] = None,
        search: Annotated[
            str | None,
            Query(
                min_length=1,
                max_length=_check.MAX_NAME,
                pattern=SAFE_PATTERN,
                description="Only tasks whose id contains this.",
            ),
        ] = None,
        limit: Limit = 100,
        version: Annotated[
            int | None,
            Query(
                ge=1,
                le=_check.MAX_INT,
                description="Only tasks that run this version of their workflow.",
            ),
        ] = None,
        tenant: Annotated[
            str | None,
            Query(
                pattern=f"^{TENANT_PATTERN.pattern}$",
                description="Only the tasks of this tenant.",
            ),
        ] = None,
        tag: Annotated[
            list[Annotated[str, StringConstraints(pattern=TAG_PATTERN)]] | None,
            Query(
                max_length=_check.MAX_TAGS,
                description="Only tasks that have this tag, written KEY=VALUE; given again, "
                "only those that have every tag given (read through the tags' index).",
            ),
        ] = None,
    ) -> Response:
        for name in ("state", "workflow", "search", "limit", "version", "tenant"):
            one(request, name)
        for what, value in (("workflow", workflow), ("search", search)):
            if value is not None:
                _checked(what, value)
        try:
            tags = _check.tag_filter(tag or ())
        except StepwardenError as exc:
            raise BadRequest(str(exc)) from None
        if tags is None:  # a key asked with two values: no task has both
            names = await (await app.store()).workflow_names()
            return json_response({"tasks": [], "workflows": names})
        found = await reader.tasks(
            state=state,
            workflow=workflow,
            search=search,
            limit=limit,
            version=version,
            tenant=tenant,
            tags=tags,
        )
        return json_response(found)

    @api.get(
        "/api/tasks/{task_id:path}",
        operation_id="getTask",
        summary="A task with its steps and a page of its history (100 events, newest first).",
        responses=_answers(r200=(TaskAnswer, "The task."), r400=BAD, r404=(Error, "No such task.")),
    )
    async def task(
        request: Request,
        task_id: TaskId,
        events_before: Annotated[
            int | None,
            Query(
                ge=1,
                le=MAX_EVENT_ID,
                description="The page of events older than this event id (the previous "
                "page's events_before).",
            ),
        ] = None,
    ) -> Response:
        one(request, "events_before")
        _checked("task_id", task_id)
        data = await reader.task(task_id, limit=EVENT_PAGE, before=events_before)
        if data is None:
            return error(404, f"no task {task_id!r}")
        return json_response(data)

    @api.get(
        "/api/why/{task_id:path}",
        operation_id="whyTask",
        summary="Why a task waits: what holds it now, and each of its open steps, as a reason "
        "and its facts.",
        responses=_answers(
            r200=(WhyAnswer, "Why it waits."), r400=BAD, r404=(Error, "No such task.")
        ),
    )
    async def why(task_id: TaskId) -> Response:
        _checked("task_id", task_id)
        data = await reader.why(task_id)
        if data is None:
            return error(404, f"no task {task_id!r}")
        return json_response(data)

    @api.post(
        "/api/tasks/{task_id:path}/skip",
        operation_id="skipStep",
        summary="Mark a step completed with a given result, as if its operation had returned "
        "it; recorded in the task's history.",
        openapi_extra={"security": SECURED},
        responses=_answers(
            r200=(OutcomeAnswer, "Done."),
            r400=BAD,
            r401=UNAUTHORISED,
            r403=FORBIDDEN,
            r429=THROTTLED,
            r404=(Error, "No such task."),
            r409=(Error, "The task's state, or the step's, does not allow a skip."),
        ),
    )
    async def skip(task_id: TaskId, body: SkipRequest, identity: Identity) -> Response:
        return await _act(
            task_id,
            "skip",
            body.reason,
            body.by,
            identity,
            seq=body.seq,
            result=_json.revive(body.result, what="the step result"),
        )

    @api.post(
        "/api/tasks/{task_id:path}/fork",
        operation_id="forkTask",
        summary="Fork a finished task from a step: a new task of the same workflow, version "
        "and input whose steps before it keep their results and whose steps from it run "
        "again (under the original's idempotency keys, or new ones from new_keys_from); with "
        "plan, the plan only. Recorded in both tasks' history.",
        openapi_extra={"security": SECURED},
        responses=_answers(
            r200=(RedriveAnswer, "Forked, or (plan) what the fork would do per step."),
            r400=BAD,
            r401=UNAUTHORISED,
            r403=FORBIDDEN,
            r429=THROTTLED,
            r404=(Error, "No such task."),
            r409=(
                Error,
                "Refused: the task is not finished, has no step there, or the id is taken.",
            ),
        ),
    )
    async def fork(task_id: TaskId, body: ForkRequest, identity: Identity) -> Response:
        try:
            redrive = await app.fork_async(
                task_id,
                start=body.start,
                new_task_id=body.task_id,
                new_keys_from=body.new_keys_from,
                plan=body.plan,
                by=DEFAULT_BY if body.by is None else body.by,
                reason=body.reason,
                identity=identity,
            )
        except TaskNotFound as exc:
            return error(404, str(exc))
        except StoreError:
            raise
        except StepwardenError as exc:
            raise BadRequest(str(exc)) from None
        if redrive.refused:
            return error(409, redrive.message)
        return json_response(dataclasses.asdict(redrive))

    @api.get(
        "/api/retry-plan/{task_id:path}",
        operation_id="retryPlan",
        summary="What a retry of the task would do to each recorded step (kept, run again "
        "under the same key, undone first); changes nothing.",
        responses=_answers(
            r200=(RedriveAnswer, "The plan."), r400=BAD, r404=(Error, "No such task.")
        ),
    )
    async def retry_plan(task_id: TaskId) -> Response:
        _checked("task_id", task_id)
        try:
            redrive = await app.retry_plan_async(task_id)
        except TaskNotFound as exc:
            return error(404, str(exc))
        return json_response(dataclasses.asdict(redrive))

    @api.post(
        "/api/tasks/{task_id:path}/send",
        operation_id="sendEvent",
        summary="Send an event to a task: kept until its workflow waits for that name, and "
        "waking the task if it waits for it now (e.g. an approval).",
        openapi_extra={"security": SECURED},
        responses=_answers(
            r200=(
                SendAnswer,
                "Sent, or sent before with this event_id (sent is false), whatever the "
                "task's state now.",
            ),
            r400=BAD,
            r401=UNAUTHORISED,
            r403=FORBIDDEN,
            r429=THROTTLED,
            r404=(Error, "No such task."),
            r409=(Error, "The task is finished: it takes no event it did not take before."),
            r413=(
                Error,
                "The event is beyond a bound, named in the error: the task keeps "
                "max_events_per_task events already, or the payload has more bytes than "
                "max_event_payload.",
            ),
        ),
    )
    async def send(task_id: TaskId, body: SendRequest, identity: Identity) -> Response:
        try:
            sent = await app.send_event_async(
                task_id, body.name, _json.revive(body.payload), event_id=body.event_id
            )
        except TaskNotFound as exc:
            return error(404, str(exc))
        except EventRefused as exc:
            return error(409 if exc.bound is None else 413, str(exc))
        except StoreError:
            raise
        except StepwardenError as exc:
            raise BadRequest(str(exc)) from None
        return json_response({"sent": sent.sent, "woke": sent.woke})

    @api.post(
        "/api/tasks/{task_id:path}/{action}",
        operation_id="actOnTask",
        summary="An operator action on one task, recorded in its history.",
        openapi_extra={"security": SECURED},
        responses=_answers(
            r200=(OutcomeAnswer, "Done."),
            r400=BAD,
            r401=UNAUTHORISED,
            r403=FORBIDDEN,
            r429=THROTTLED,
            r404=(Error, "No such task."),
            r409=(Error, "The action does not apply to the task's state."),
        ),
    )
    async def act(
        task_id: TaskId,
        action: Literal["retry", "pause", "resume", "cancel", "compensate"],
        identity: Identity,
        body: ActionRequest | None = None,
    ) -> Response:
        body = body or ActionRequest()
        return await _act(task_id, action, body.reason, body.by, identity)

    async def _act(
        task_id: str,
        action: str,
        reason: str | None,
        by: str | None,
        identity: str | None,
        **more: Any,
    ) -> Response:
        try:
            [outcome] = await app.operate_async(
                action,
                [task_id],
                reason=reason,
                by=DEFAULT_BY if by is None else by,
                identity=identity,
                **more,
            )
        except StoreError:
            raise
        except StepwardenError as exc:
            raise BadRequest(str(exc)) from None
        if outcome.before is None:
            return error(404, outcome.message)
        if not outcome.applied:
            return error(409, outcome.message, outcome=outcome_dict(outcome))
        return json_response({"outcome": outcome_dict(outcome)})

    @api.post(
        "/api/actions",
        operation_id="bulkAction",
        summary="An operator action on the tasks named, or on those matching a filter; with "
        "dry_run, nothing is changed and each outcome says what would be.",
        openapi_extra={"security": SECURED},
        responses=_answers(
            r200=(BulkAnswer, "The outcome for each task."),
            r400=BAD,
            r401=UNAUTHORISED,
            r403=FORBIDDEN,
            r429=THROTTLED,
        ),
    )
    async def bulk(body: BulkRequest, identity: Identity) -> Response:
        try:
            outcomes = await app.operate_async(
                body.action,
                body.task_ids,
                state=body.state,
                workflow=body.workflow,
                limit=body.limit or MAX_BULK,
                reason=body.reason,
                by=DEFAULT_BY if body.by is None else body.by,
                dry_run=body.dry_run,
                identity=identity,
            )
        except StoreError:
            raise
        except StepwardenError as exc:
            raise BadRequest(str(exc)) from None
        would = [o for o in outcomes if o.message.startswith("would ")] if body.dry_run else []
        applied = len(would) if body.dry_run else sum(o.applied for o in outcomes)
        return json_response(
            {
                "dry_run": body.dry_run,
                "applied": applied,
                "refused": len(outcomes) - applied,
                "outcomes": [outcome_dict(o) for o in outcomes],
            }
        )

    @api.post(
        "/api/bulk",
        operation_id="bulkByFilter",
        summary="A bulk action (retry, cancel, compensate, pause, resume, fork) on the tasks a "
        "filter matches, as `stepwarden bulk` does: with plan, what it would do (the same "
        "plan as `stepwarden bulk --plan`), changing nothing; otherwise at most batch tasks, "
        "by task id, each as the action on one task would. The same request again goes on "
        "with the rest, until done.",
        openapi_extra={"security": SECURED},
        responses=_answers(
            r200=(BulkFilterAnswer, "The plan, or what this request did."),
            r400=BAD,
            r401=UNAUTHORISED,
            r403=FORBIDDEN,
            r429=THROTTLED,
        ),
    )
    async def bulk_by_filter(body: BulkFilterRequest, identity: Identity) -> Response:
        given = body.filter
        match = TaskFilter(
            states=frozenset(given.states),
            workflow=given.workflow,
            version=given.version,
            error=given.error,
            created_after=given.created_after,
            created_before=given.created_before,
            finished_after=given.finished_after,
            finished_before=given.finished_before,
            tenant=given.tenant,
            tags=given.tags,
        )
        fork = None
        if body.fork is not None:
            fork = BulkFork(
                start=body.fork.start, name=body.fork.name, new_keys_from=body.fork.new_keys_from
            )
        try:
            if body.plan:
                plan = await app.bulk_plan_async(
                    match, body.action, after=body.after, fork=fork, limit=MAX_BULK_PLAN
                )
                return json_response({"action": body.action, "plan": _plan(plan), "progress": None})
            progress = await app.bulk_async(
                match,
                body.action,
                batch=body.batch,
                limit=body.batch,
                after=body.after,
                fork=fork,
                reason=body.reason,
                by=DEFAULT_BY if body.by is None else body.by,
                identity=identity,
            )
        except StoreError:
            raise
        except StepwardenError as exc:
            raise BadRequest(str(exc)) from None
        return json_response({"action": body.action, "plan": None, "progress": _done(progress)})

    @api.get(
        "/api/alerts",
        operation_id="listAlerts",
        summary="Alerts (the outbox's channel 'alerts'), newest first.",
        responses=_answers(r200=(AlertsAnswer, "The alerts."), r400=BAD),
    )
    async def alerts(request: Request, limit: Limit = 100) -> Response:
        one(request, "limit")
        return json_response(await reader.alerts(limit))

    @api.get(
        "/api/agents",
        operation_id="listAgents",
        summary="The agent registry: every agent instance (those gone within the last hour "
        "included), and the steps of each agent's operations.",
        responses=_answers(r200=(AgentsAnswer, "The agents.")),
    )
    async def agents() -> Response:
        return json_response(await reader.agents())

    @api.get(
        "/api/schedules",
        operation_id="listSchedules",
        summary="The schedules a supervisor stored: timing, next tick, paused or not.",
        responses=_answers(r200=(SchedulesAnswer, "The schedules.")),
    )
    async def schedules() -> Response:
        return json_response(await reader.schedules())

    @api.post(
        "/api/schedules/{name}/{action}",
        operation_id="actOnSchedule",
        summary="Pause or resume a schedule, or trigger it: run its workflow now, once.",
        openapi_extra={"security": SECURED},
        responses=_answers(
            r200=(ScheduleAnswer, "Done."),
            r400=BAD,
            r401=UNAUTHORISED,
            r403=FORBIDDEN,
            r429=THROTTLED,
            r404=(Error, "No such schedule."),
        ),
    )
    async def act_on_schedule(
        name: Annotated[str, Path(min_length=1, max_length=_check.MAX_NAME, pattern=SAFE_PATTERN)],
        action: Literal["pause", "resume", "trigger"],
        identity: Identity,
    ) -> Response:
        try:
            if action == "trigger":
                task_id = await app.trigger_schedule_async(name)
                return json_response({"name": name, "paused": None, "task_id": task_id})
            await app.pause_schedule_async(name, paused=action == "pause")
        except UnknownNameError as exc:
            return error(404, str(exc))
        except StoreError:
            raise
        except StepwardenError as exc:
            raise BadRequest(str(exc)) from None
        return json_response({"name": name, "paused": action == "pause", "task_id": None})

    @api.get(
        "/metrics",
        operation_id="metrics",
        summary="Prometheus metrics, read from the store at scrape time.",
        responses={
            200: {
                "description": "Prometheus text format.",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    async def metrics() -> Response:
        return Response(await _metrics.render(app), media_type=_metrics.CONTENT_TYPE)

    return api


def _plan(plan: BulkPlan) -> dict[str, Any]:
    return {
        "matched": plan.matched,
        "by_workflow": [
            {"workflow": name, "version": version, "tasks": n}
            for (name, version), n in sorted(plan.by_workflow.items())
        ],
        "moves": dict(sorted(plan.moves.items())),
        "steps": dict(plan.steps),
        "sample": list(plan.sample),
        "skipped": plan.skipped,
        "last": plan.last,
        "done": plan.done,
    }


def _done(progress: BulkProgress) -> dict[str, Any]:
    return {
        "acted": progress.acted,
        "refused": progress.refused,
        "skipped": progress.skipped,
        "last": progress.last,
        "done": progress.done,
    }


def _checked(what: str, value: str) -> None:
    try:
        _check.name(what, value)
    except StepwardenError as exc:
        raise BadRequest(str(exc)) from None
