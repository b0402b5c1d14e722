"""The application API, under /api/v1: what services in other languages need to run tasks.

    POST /api/v1/tasks                  submit (idempotent by task_id)       scope submit
    GET  /api/v1/tasks/{task_id}        the task's status                    scope read
    GET  /api/v1/results/{task_id}      its result: a long poll (?timeout=)  scope read
    GET  /api/v1/messages/{task_id}     its status messages, server-sent     scope read
    POST /api/v1/events/{task_id}       send it an event                     scope events
    POST /api/v1/cancel/{task_id}       cancel it                            scope cancel

The task's id comes last in each path, so that an id holding slashes names one route only.
Every route needs a client's bearer token (`stepwarden._tokens`) whose scopes include the
route's, checked before the request's body is read (`ClientGuard`, called by the server's
access guard); the route's scope is its OpenAPI security requirement, the one place it is
said. The dashboard's own token and sessions are not clients' tokens, nor the reverse.
Requests the models or the engine refuse are answered 422, every error as JSON
`{"error": ...}`. Each client asks within the bounds its settings in the tokens file set
(`_quotas.py`): its rates, its input's size, its priorities, its unfinished tasks, its long
polls and streams at once, the channels and destinations it may name and read. A client sees
only its tenants' tasks (`_tokens.Client.may_see`: its own name's, those its `tenants`
setting grants, and of any tenant those of the workflows its `workflows` setting grants);
any other is answered 404, as a task that does not exist. The OpenAPI document of these
routes alone is at /api/v1/openapi.json."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations, some of
# which are local to `router`.
import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi.openapi.utils import get_openapi
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from .. import __version__, _json, _tokens
from ..app import App, refuse_conflict
from ..errors import (
    EventRefused,
    StepwardenError,
    StoreError,
    SubmitConflict,
    TaskFailed,
    TaskNotFound,
)
from ..records import OutboxMessage, Submitted, TaskRecord, status_of
from ..states import FINISHED_TASK_STATES
from ._api import RETRY_AFTER, TaskId, error, json_response, outcome_dict
from ._app_models import (
    CancelRequest,
    StatusMessage,
    SubmitAnswer,
    TaskResult,
    TaskStatus,
    submit_request,
)
from ._auth import MAX_FAILURES, Throttle, Verdict, client_address
from ._models import MAX_EVENT_ID, Error, OutcomeAnswer, SendAnswer, SendRequest
from ._quotas import HeldStream, Quotas

PREFIX = "/api/v1"
DOCUMENT = f"{PREFIX}/openapi.json"
AGENTS = f"{PREFIX}/agents"
"""The agent protocol's routes (`_agent_api`), throttled apart from the others."""
SCHEME = "client"
"""The security scheme of the clients' bearer tokens in the OpenAPI documents."""
CLIENT_TOKEN = "client-token"
"""How a client's action was authenticated, recorded beside its name (`authenticated`)."""
CLIENT_KEY = "stepwarden_client"
SCOPES_KEY = "stepwarden_client_scopes"
"""Where the request's state keeps its client's scopes."""
ENTRY_KEY = "stepwarden_client_entry"
"""Where the request's state keeps its client, as the tokens file names it (its settings)."""
ANY_AGENT = "agent:*"
"""The scope of a route any agent's token may call (`agent:NAME`, whatever the name)."""
"""Where the guard leaves the name of the request's client (the request's state)."""
MAX_POLL = 60.0
"""The longest a result's long poll waits, in seconds (proxies end idle requests at 60 s)."""
DEFAULT_POLL = 30.0
KEEPALIVE = 15.0
"""Seconds without a status message after which a stream sends a comment (`: keepalive`),
so that a proxy does not take the connection for idle and the end of a client is seen."""
RETRY_MS = 2000
"""The reconnection delay a stream asks of its client (SSE `retry:`), in milliseconds."""

DESCRIPTION = (
    "Run tasks from services in any language: submit a task (idempotent by its id), read its "
    "status, wait for its result (a long poll), follow its status messages (server-sent "
    "events), send it an event, cancel it. Every route needs a client's token, "
    "`Authorization: Bearer TOKEN`, whose scopes include the route's (submit, read, events or "
    "cancel; the clients are the server's tokens file, --api-tokens): without a known token "
    f"401, without the scope 403, both decided before the body is read. A known token is "
    f"always taken; an address that sends {MAX_FAILURES} wrong tokens within a minute has its "
    "wrong tokens answered 429 (Retry-After) for a minute. "
    "Each client asks within the bounds of its settings in the tokens file (submits and bytes "
    "of input a second, an input's size, its priorities, its unfinished tasks, its long polls "
    "and streams at once, the channels and broker destinations it may name): past one, 429 "
    "(Retry-After), 413 or 422, the error naming the bound and its setting. "
    "Every task belongs to a tenant: by default its submitting client, or a tenant its "
    "tokens entry grants (tenants setting). A client reads, waits for, follows, sends events "
    "to and cancels only the tasks of its own tenants and of the workflows its entry grants "
    "(workflows setting): any other task is answered 404, as one that does not exist. A "
    "submit under an id another client's task holds is refused 409 all the same (it tells "
    "only that the id is taken): use generated ids, or ids under a prefix of your own. "
    "Requests and answers are JSON (but the status messages' text/event-stream); a body over "
    '2 MiB is refused (413); a request refused is answered {"error": ...}: 422 when it is '
    "invalid (an unknown workflow: the error names those declared). Values marked secret are "
    'shown as "***".'
)
SECURITY_SCHEMES = {
    SCHEME: {
        "type": "http",
        "scheme": "bearer",
        "description": "A client's token (`stepwarden api-token`); its scopes are the "
        "operations' security requirements.",
    }
}


def _scoped(scope: str) -> dict[str, Any]:
    return {"security": [{SCHEME: [scope]}]}


def route_scope(route: BaseRoute) -> str | None:
    """The scope a route of this API needs: its security requirement's."""
    extra: dict[str, Any] = getattr(route, "openapi_extra", None) or {}
    for requirement in extra.get("security", []):
        for scope in requirement.get(SCHEME, []):
            return str(scope)
    return None


def _answers(**codes: tuple[type[Any], str]) -> dict[int | str, dict[str, Any]]:
    answers: dict[int | str, dict[str, Any]] = {
        int(code[1:]): {"model": m, "description": d} for code, (m, d) in codes.items()
    }
    for code, answer in ((401, UNAUTHORISED), (403, FORBIDDEN), (429, THROTTLED)):
        answers[code] = {"model": answer[0], "description": answer[1]}
    answers[429]["headers"] = {"Retry-After": RETRY_AFTER}
    return answers


def _as_json(answers: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """Answers of a route whose own answer is not JSON (a stream), as JSON all the same."""

    def content(model: type[Any]) -> dict[str, Any]:
        return {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}

    return {
        code: {
            **{k: v for k, v in answer.items() if k != "model"},
            "content": content(answer["model"]),
        }
        for code, answer in answers.items()
    }


INVALID = (Error, "The request is invalid; the error says what is wrong, and where.")
NO_TASK = (
    Error,
    "No such task, or a task the client may not see (of another tenant: its tokens entry "
    "grants neither its tenant nor its workflow), answered alike.",
)
UNAUTHORISED = (Error, "No client token, or a wrong one (Authorization: Bearer TOKEN).")
FORBIDDEN = (
    Error,
    "The client's token does not have this route's scope (or the request names what is not "
    "the client's: a channel, an agent instance, a tenant).",
)
THROTTLED = (
    Error,
    "Refused for now, Retry-After seconds: past a bound of the client, which the error names "
    "(a rate, or what it may have at once: unfinished tasks, long polls, streams, agent "
    f"registrations), or the token is wrong and {MAX_FAILURES} wrong tokens came from this "
    "address within a minute (its wrong tokens are answered 429 for a minute; a known token "
    "is taken).",
)
TOO_BIG = (Error, "The request body is over 2 MiB.")


class ClientGuard:
    """Who may call a route of this API: a known client's token (401), with the route's
    scope (403), decided from the request's headers before its body is read; the clients
    are the tokens file's as it is now (`_tokens.TokensFile`, read again when it changes). A
    known token is always taken; wrong ones count against the request's address (429 past
    MAX_FAILURES), in a throttle of the application API's (`throttle`) or of the agent
    protocol's (`agent_throttle`), each apart from the dashboard's own."""

    def __init__(self, clients: _tokens.TokensFile | None, routes: Sequence[BaseRoute]) -> None:
        self.clients = clients
        self.routes = [r for r in routes if getattr(r, "path", "").startswith(PREFIX + "/")]
        self.throttle = Throttle()
        self.agent_throttle = Throttle()

    @staticmethod
    def guards(path: str) -> bool:
        """Whether a request for `path` (within the application) is this guard's to check."""
        return path.startswith(PREFIX + "/") and path != DOCUMENT

    def needed(self, scope: Scope) -> str | None:
        """The scope the route that serves the request needs (None: no route serves it):
        an agent's route needs the scope of the agent its path names (`agent:{agent}`)."""
        for route in self.routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                needed = route_scope(route)
                if needed is not None and "{agent}" in needed:
                    needed = needed.replace("{agent}", str(child["path_params"]["agent"]))
                return needed
        return None

    def check(self, request: Request) -> Verdict:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return Verdict(False, 401, "send a client's token: Authorization: Bearer TOKEN")
        known = None if self.clients is None else self.clients.clients()
        if not known:
            return Verdict(
                False,
                401,
                "this server knows no client: serve it with a tokens file (--api-tokens FILE "
                "or STEPWARDEN_API_TOKENS)",
            )
        client = known.find(given.strip())
        if client is None:
            path = request.scope.get("path", "")
            agents = path.startswith(request.scope.get("root_path", "") + AGENTS + "/")
            throttle = self.agent_throttle if agents else self.throttle
            return throttle.wrong(
                client_address(request), "the client's token is wrong", "wrong tokens"
            )
        needed = self.needed(request.scope)
        request.scope.setdefault("state", {})[SCOPES_KEY] = tuple(sorted(client.scopes))
        request.scope["state"][ENTRY_KEY] = client
        if needed == ANY_AGENT and any(s.startswith(_tokens.AGENT_SCOPE) for s in client.scopes):
            needed = None
        if needed is not None and needed not in client.scopes:
            return Verdict(
                False,
                403,
                f"the client {client.name!r} may not do this: it needs the scope {needed!r} "
                f"(its scopes: {', '.join(sorted(client.scopes))})",
            )
        return Verdict(True, identity=client.name)


def acting_client(request: Request) -> str:
    """The name of the request's client, as the guard found it."""
    name = request.scope.get("state", {}).get(CLIENT_KEY)
    if not isinstance(name, str):
        raise HTTPException(401, "send a client's token: Authorization: Bearer TOKEN")
    return name


ClientName = Annotated[str, Depends(acting_client)]


def client_entry(request: Request) -> _tokens.Client:
    """The request's client as the tokens file names it, with its settings."""
    found = request.scope.get("state", {}).get(ENTRY_KEY)
    if not isinstance(found, _tokens.Client):
        raise HTTPException(401, "send a client's token: Authorization: Bearer TOKEN")
    return found


ClientEntry = Annotated[_tokens.Client, Depends(client_entry)]


def status_dict(t: TaskRecord) -> dict[str, Any]:
    """A task's status (`records.TaskStatus`, `App.task_status`) as the answer's JSON."""
    answer = dataclasses.asdict(status_of(t))
    answer["state"] = str(answer["state"])
    return answer


def _result_dict(t: TaskRecord) -> dict[str, Any]:
    return {
        "task_id": t.task_id,
        "state": str(t.process_state),
        "result": t.result,
        "error": t.error,
        "finished_at": t.finished_at,
    }


def _sse(message: OutboxMessage) -> str:
    data = _json.display(
        {
            "id": message.id,
            "task_id": message.task_id,
            "kind": message.kind,
            "detail": message.detail,
            "at": message.at,
        }
    )
    return f"id: {message.id}\nevent: {' '.join(message.kind.split())}\ndata: {data}\n\n"


async def _stream(
    messages: AsyncIterator[OutboxMessage], stopping: asyncio.Event
) -> AsyncIterator[str]:
    """The messages as server-sent events, a comment after KEEPALIVE seconds without one;
    it ends with the messages, or when the server stops (the client resumes elsewhere with
    Last-Event-ID)."""
    queue: asyncio.Queue[OutboxMessage] = asyncio.Queue(64)

    async def pump() -> None:
        async for message in messages:
            await queue.put(message)

    pumping = asyncio.create_task(pump())
    stop = asyncio.create_task(stopping.wait())
    getter: asyncio.Task[OutboxMessage] | None = None
    try:
        yield f"retry: {RETRY_MS}\n\n"
        while True:
            getter = asyncio.create_task(queue.get())
            done, _ = await asyncio.wait(
                {getter, pumping, stop}, timeout=KEEPALIVE, return_when=asyncio.FIRST_COMPLETED
            )
            if getter in done:
                yield _sse(getter.result())
                continue
            getter.cancel()  # an item it was handed stays in the queue
            if stop in done:
                return
            if pumping in done:
                while not queue.empty():
                    yield _sse(queue.get_nowait())
                return
            yield ": keepalive\n\n"
    finally:
        for task in (getter, pumping, stop):
            if task is not None:
                task.cancel()
        if pumping.done() and not pumping.cancelled():
            pumping.exception()  # retrieved: a failed store ends the stream, the client resumes


class EventStream(HeldStream):
    media_type = "text/event-stream"


def router(app: App, stopping: asyncio.Event, quotas: Quotas | None = None) -> APIRouter:
    """The routes of this API, each with its scope, each client within its bounds
    (`quotas`: by default, of this router's own); their long polls and streams end when
    `stopping` is set (the server shuts down)."""
    api = APIRouter()
    quotas = quotas or Quotas(app.destinations)
    SubmitRequest = submit_request(sorted(app.workflows))

    async def _task(task_id: str, entry: _tokens.Client) -> TaskRecord | Response:
        """The task, when the client may see it (`Client.may_see`); a task of another
        tenant is answered as one that does not exist, so that the answer tells nothing
        of it."""
        try:
            found = await app.status_async(task_id)
        except TaskNotFound as exc:
            return error(404, str(exc))
        except StoreError:
            raise
        except StepwardenError as exc:
            return error(422, str(exc))
        if not entry.may_see(found.tenant, found.workflow):
            return error(404, f"no task {task_id!r}")
        return found

    @api.post(
        f"{PREFIX}/tasks",
        operation_id="submitTask",
        summary="Submit a task: a workflow the App declares and its JSON input. Idempotent by "
        "task_id.",
        status_code=201,
        openapi_extra=_scoped("submit"),
        responses=_answers(
            r201=(SubmitAnswer, "Created (Location: the task's status)."),
            r200=(
                SubmitAnswer,
                "A task of this id was submitted before by this client, with "
                "the same workflow, version and input: left as it is (created false), this "
                "submit's other options ignored.",
            ),
            r409=(
                Error,
                "A task of this id exists: submitted by another client (nothing of "
                "it is compared), or before with another workflow, version or input, which the "
                "error names.",
            ),
            r413=(
                Error,
                "The body is over 2 MiB, or the task's input over the client's "
                "bound (input_bytes), which the error names.",
            ),
            r422=(
                Error,
                "The request is invalid, its priority outside the client's "
                "(priority), or its reply_to a channel or destination the client may not name "
                "(channels, destinations); the error says which.",
            ),
            r429=(
                Error,
                "Past a bound of the client, which the error names: its submits a "
                "second (submit_rate), its bytes of input a second (submit_bytes), its tasks not "
                "finished (unfinished); or too many wrong tokens from this address. Retry-After: "
                "the seconds to wait.",
            ),
        ),
    )
    async def submit(
        request: Request,
        body: SubmitRequest,  # type: ignore[valid-type]
        client: ClientName,
        entry: ClientEntry,
    ) -> Response:
        given: Any = body
        options = given.options()
        options["tenant"] = options["tenant"] or client
        if not entry.may_submit_as(options["tenant"]):
            return error(
                403,
                f"the client {client!r} may not submit tasks of the tenant "
                f"{options['tenant']!r} (its tokens entry's tenants setting grants it none)",
            )
        try:
            task = app.new_task(
                given.workflow,
                _json.revive(given.input, what="the task input"),
                submitted_by=client,
                **options,
            )
        except StepwardenError as exc:
            return error(422, str(exc))
        size = len(task.input.encode())
        quotas.check_submit(entry, size, task.priority)
        if task.reply_to is not None:
            quotas.check_reply_to(entry, task.reply_to)
        quotas.take_submit(entry, size)
        store = await app.store()
        admission = await quotas.admit(entry, store.client_unfinished)
        answer: Submitted | None = None
        try:
            answer = await app.submit_one_async(task)
        finally:
            admission.created(answer is not None and answer.created)
        if answer.created:
            where = request.scope.get("root_path", "") + f"{PREFIX}/tasks/"
            return json_response(
                {"task_id": task.task_id, "created": True},
                201,
                {"Location": where + quote(task.task_id, safe="")},
            )
        try:
            refuse_conflict(task, answer)
        except SubmitConflict as exc:
            return error(409, str(exc))
        return json_response({"task_id": task.task_id, "created": False})

    @api.get(
        f"{PREFIX}/tasks/{{task_id:path}}",
        operation_id="taskStatus",
        summary="A task's status: its state, what it waits for, its error.",
        openapi_extra=_scoped("read"),
        responses=_answers(r200=(TaskStatus, "The task's status."), r404=NO_TASK, r422=INVALID),
    )
    async def status(task_id: TaskId, entry: ClientEntry) -> Response:
        found = await _task(task_id, entry)
        if isinstance(found, Response):
            return found
        return json_response(status_dict(found))

    @api.get(
        f"{PREFIX}/results/{{task_id:path}}",
        operation_id="taskResult",
        summary="A task's result, waiting up to `timeout` seconds for the task to finish "
        "(a long poll): 200 once it has finished (processed: its result; otherwise its "
        "state and error), 202 with its status when it has not finished in time (ask again).",
        openapi_extra=_scoped("read"),
        responses=_answers(
            r200=(TaskResult, "The task has finished."),
            r202=(TaskStatus, "The task has not finished within the timeout: its status."),
            r404=NO_TASK,
            r422=INVALID,
        ),
    )
    async def result(
        request: Request,
        task_id: TaskId,
        entry: ClientEntry,
        timeout: Annotated[
            float,
            Query(
                ge=0,
                le=MAX_POLL,
                description=f"Seconds to wait for the task to finish (at most {MAX_POLL:g}).",
            ),
        ] = DEFAULT_POLL,
    ) -> Response:
        if len(request.query_params.getlist("timeout")) > 1:
            return error(422, "timeout is given more than once")
        found = await _task(task_id, entry)
        if isinstance(found, Response):
            return found
        if found.process_state not in FINISHED_TASK_STATES and timeout > 0:
            async with quotas.holding(entry, _tokens.POLLS):
                await _until_finished(app, task_id, timeout, stopping, request)
            found = await _task(task_id, entry)
            if isinstance(found, Response):
                return found
        if found.process_state in FINISHED_TASK_STATES:
            return json_response(_result_dict(found))
        return json_response(status_dict(found), 202, {"Retry-After": "0"})

    @api.get(
        f"{PREFIX}/messages/{{task_id:path}}",
        operation_id="taskMessages",
        summary="A task's status messages as server-sent events (text/event-stream), in "
        "order, as they are published: each event's id is the message's id, its event the "
        "message's kind, its data the message (StatusMessage) as JSON. The stream ends after "
        "the message of a finished state; a client that reconnects with Last-Event-ID gets "
        "those after it (204 when the task has finished and none comes after it).",
        openapi_extra=_scoped("read"),
        response_class=EventStream,
        responses={
            **_as_json(
                _answers(
                    r404=NO_TASK,
                    r409=(
                        Error,
                        "The task was submitted without reply_to: it has no status messages.",
                    ),
                    r422=INVALID,
                )
            ),
            200: {
                "description": "The status messages, one event each (see StatusMessage).",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            204: {
                "description": "The task has finished and no message comes after "
                "Last-Event-ID: the stream is over (an EventSource stops reconnecting)."
            },
        },
    )
    async def messages(
        task_id: TaskId,
        entry: ClientEntry,
        last_event_id: Annotated[
            int | None,
            Header(
                alias="Last-Event-ID",
                ge=0,
                le=MAX_EVENT_ID,
                description="Resume after this message id (the last one handled).",
            ),
        ] = None,
    ) -> Response:
        found = await _task(task_id, entry)
        if isinstance(found, Response):
            return found
        if found.reply_to is None:
            return error(
                409,
                f"task {task_id!r} was submitted without reply_to: it has no status messages",
            )
        quotas.check_reply_to(entry, found.reply_to, 403)
        after = last_event_id or 0
        if found.process_state in FINISHED_TASK_STATES:
            store = await app.store()
            if not await store.outbox(
                channel=found.reply_to, task_id=task_id, after=after, limit=1
            ):
                return Response(status_code=204, headers={"Cache-Control": "no-store"})
        return EventStream(
            _stream(app.watch(task_id, after=after), stopping),
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
            held=quotas.hold(entry, _tokens.STREAMS),
        )

    @api.post(
        f"{PREFIX}/events/{{task_id:path}}",
        operation_id="sendTaskEvent",
        summary="Send an event to a task: kept until its workflow waits for that name "
        "(ctx.wait_for_event), and waking the task if it waits for it now.",
        openapi_extra=_scoped("events"),
        responses=_answers(
            r200=(
                SendAnswer,
                "Sent, or sent before with this event_id (sent is false), whatever the "
                "task's state now.",
            ),
            r404=NO_TASK,
            r409=(Error, "The task is finished: it takes no event it did not take before."),
            r413=(
                Error,
                "The body is over 2 MiB, or the event is beyond a bound named in the "
                "error (the events a task keeps, the bytes of a payload).",
            ),
            r422=INVALID,
        ),
    )
    async def send(task_id: TaskId, body: SendRequest, entry: ClientEntry) -> Response:
        found = await _task(task_id, entry)
        if isinstance(found, Response):
            return found
        try:
            sent = await app.send_event_async(
                task_id,
                body.name,
                _json.revive(body.payload, what="the event's payload"),
                event_id=body.event_id,
            )
        except TaskNotFound as exc:
            return error(404, str(exc))
        except EventRefused as exc:
            return error(409 if exc.bound is None else 413, str(exc))
        except StoreError:
            raise
        except StepwardenError as exc:
            return error(422, str(exc))
        return json_response({"sent": sent.sent, "woke": sent.woke})

    @api.post(
        f"{PREFIX}/cancel/{{task_id:path}}",
        operation_id="cancelTask",
        summary="Cancel a task (with compensate, undo its steps first); recorded in its "
        "history with the client's name. It reaches the task's children.",
        openapi_extra=_scoped("cancel"),
        responses=_answers(
            r200=(OutcomeAnswer, "Cancelled (or compensating)."),
            r404=NO_TASK,
            r409=(Error, "The task's state does not allow it (it has finished)."),
            r413=TOO_BIG,
            r422=INVALID,
        ),
    )
    async def cancel(
        task_id: TaskId, client: ClientName, entry: ClientEntry, body: CancelRequest | None = None
    ) -> Response:
        body = body or CancelRequest()
        found = await _task(task_id, entry)
        if isinstance(found, Response):
            return found
        try:
            [outcome] = await app.operate_async(
                "compensate" if body.compensate else "cancel",
                [task_id],
                reason=body.reason,
                by=client,
                identity=CLIENT_TOKEN,
            )
        except StoreError:
            raise
        except StepwardenError as exc:
            return error(422, str(exc))
        if outcome.before is None:
            return error(404, outcome.message)
        if not outcome.applied:
            return error(409, outcome.message, outcome=outcome_dict(outcome))
        return json_response({"outcome": outcome_dict(outcome)})

    return api


async def _until_finished(
    app: App, task_id: str, timeout: float, stopping: asyncio.Event, request: Request
) -> None:
    """Wait up to `timeout` seconds for the task to finish, for the server to stop, or for
    the client to go (asked each second: its long poll then no longer counts)."""
    waiter = asyncio.create_task(app.result_async(task_id))
    stop = asyncio.create_task(stopping.wait())
    gone = asyncio.create_task(_gone(request, stopping))
    try:
        await asyncio.wait(
            {waiter, stop, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in (waiter, stop, gone):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, TaskFailed, TaskNotFound):
            await waiter
        await asyncio.gather(stop, gone, return_exceptions=True)


async def _gone(request: Request, stopping: asyncio.Event) -> None:
    """Once the client of `request` has gone (or the server stops)."""
    while not await request.is_disconnected():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), 1.0)
            return


def document(routes: Sequence[BaseRoute]) -> dict[str, Any]:
    """The OpenAPI document of this API's routes (of `routes`, those under PREFIX)."""
    doc = get_openapi(
        title="stepwarden application API",
        version=__version__,
        description=DESCRIPTION,
        routes=[r for r in routes if getattr(r, "path", "").startswith(PREFIX + "/")],
    )
    complete(doc)
    doc["components"]["securitySchemes"] = SECURITY_SCHEMES
    return doc


def complete(doc: dict[str, Any]) -> None:
    """Add to a document that holds this API's routes the model of a status message (the
    data of each server-sent event), which no route's body names."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas["StatusMessage"] = StatusMessage.model_json_schema(
        ref_template="#/components/schemas/{model}"
    )
