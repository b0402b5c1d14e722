"""The dashboard's web application: the pages, the JSON API (`_api.py`, with its generated
OpenAPI document at /openapi.json), the application API (`_app_api.py`, under /api/v1, with
its own document at /api/v1/openapi.json), /metrics, and the guards in front of them all:
the Host check, the refusal of a POST a page of another site makes a browser send (the
sign-in's included), the body limit, and the access check."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__, _check, _tokens
from ..app import App
from ..errors import ConfigurationError, PayloadError, StepwardenError, StoreError
from ..states import FINISHED_TASK_STATES, OPERATOR_ACTIONS, TaskState
from . import _agent_api, _app_api
from ._api import (
    EVENT_PAGE,
    BadRequest,
    error,
    json_response,
    outer_actor,
    router,
    token_actor,
)
from ._auth import (
    CSRF_FIELD,
    MAX_FAILURES,
    SESSION_COOKIE,
    SESSION_SECONDS,
    Guard,
    through_proxy,
)
from ._data import Reader
from ._models import API_BODY, BULK_ACTIONS, MAX_LIST
from ._quotas import Quotas
from ._views import activity_chart, render, step_timeline

logger = logging.getLogger("stepwarden.dashboard")

FORM_BODY = 64 * 1024
"""The largest body of a form (sign-in, sign-out), in bytes."""
_CONFIRM = {
    "cancel": "Cancel this task? It stops for good.",
    "compensate": "Cancel this task and undo its steps?",
}
_LABELS = {
    "retry": "Retry",
    "pause": "Pause",
    "resume": "Resume",
    "cancel": "Cancel",
    "compensate": "Cancel and compensate",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
DESCRIPTION = (
    "Read the tasks, steps, history and alerts of a stepwarden store, and act on tasks as an "
    "operator. Reads need nothing on a loopback address, and the API token (or a signed-in "
    "session) elsewhere (401 without); actions are POSTs that need the dashboard's API token, "
    "or a signed-in session and its CSRF token, checked before the body is read (401, 403); "
    "a POST that a page of another site makes a browser send is refused (403). The right "
    f"token is always taken; an address that sends {MAX_FAILURES} wrong API tokens within a "
    "minute has its wrong ones answered 429 (Retry-After) for a minute, the sign-in's apart. "
    "A body over 2 MiB is refused (413) "
    'before it is read. Values marked secret are shown as "***". The application API, under '
    "/api/v1 (its own document: /api/v1/openapi.json), needs a client's token instead, with "
    "the scope of each route, and answers an invalid request 422."
)
SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer"},
    "session": {"type": "apiKey", "in": "cookie", "name": SESSION_COOKIE},
    "csrf": {"type": "apiKey", "in": "header", "name": "X-CSRF-Token"},
    **_app_api.SECURITY_SCHEMES,
}


# -- reading parameters ---------------------------------------------------------------------


def _param(request: Request, name: str, *, lenient: bool) -> str | None:
    values = request.query_params.getlist(name)
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"{name} is given more than once")
    if values[0] == "" and lenient:  # an empty field of the pages' filter form
        return None
    return values[0]


def _filters(request: Request, *, lenient: bool) -> dict[str, Any]:
    try:
        state = _check.state(_param(request, "state", lenient=lenient))
        workflow = _param(request, "workflow", lenient=lenient)
        if workflow is not None:
            _check.name("workflow", workflow)
        search = _param(request, "search", lenient=lenient)
        if search is not None:
            _check.name("search", search)
        tenant = _param(request, "tenant", lenient=lenient)
        if tenant is not None:
            _check.tenant(tenant)
        given = [t for t in request.query_params.getlist("tag") if t or not lenient]
        tags = _check.tag_texts(given) or None
    except StepwardenError as exc:
        raise BadRequest(str(exc)) from None
    return {
        "state": state,
        "workflow": workflow,
        "search": search,
        "tenant": tenant,
        "tags": tags,
        "limit": _limit(request, lenient=lenient),
    }


def _limit(request: Request, *, lenient: bool, default: int = 100) -> int:
    raw = _param(request, "limit", lenient=lenient)
    if raw is None:
        return default
    try:
        value = int(raw) if raw.strip().lstrip("-").isdigit() else None
    except ValueError:
        value = None
    if value is None or not 1 <= value <= MAX_LIST:
        raise BadRequest(f"limit must be an integer from 1 to {MAX_LIST}, not {raw!r}")
    return value


def _events_before(request: Request, *, lenient: bool) -> int | None:
    """The `events_before` parameter: the history's page of events older than this id."""
    raw = _param(request, "events_before", lenient=lenient)
    if raw is None:
        return None
    value = int(raw) if raw.isdigit() and len(raw) <= 19 else 0
    if not 1 <= value <= _check.MAX_BIGINT:
        raise BadRequest(f"events_before must be an event id (a positive integer), not {raw!r}")
    return value


# -- the application ------------------------------------------------------------------------


def create_app(
    app: App,
    *,
    token: str | None = None,
    hosts: Sequence[str] | None = None,
    auth_reads: bool | None = None,
    auth: Callable[..., Any] | None = None,
    api_tokens: str | os.PathLike[str] | None = None,
) -> FastAPI:
    """The dashboard of `app` (its store), as an ASGI application. State-changing requests
    need `token` (at least 16 characters), or a signed-in session and its CSRF token; with
    `auth_reads`, so do reads (pages, API, metrics); by default (None), so do the reads of a
    request that came through a proxy (`Forwarded`, `X-Forwarded-For`, ...); with False,
    reads are open to every request. With `hosts`, requests naming another
    host (`Host` header) are refused: a web page whose name was pointed at this machine's
    address (DNS rebinding) cannot read the dashboard through the browser. Every request
    body is limited before it is read (64 KiB for a form, 2 MiB for the API).

    The application API (`/api/v1/...`: submit, status, result, status messages, events,
    cancel) needs a client's token from the tokens file `api_tokens` (`NAME SCOPES SHA256
    [SETTING=VALUE ...]` lines, `stepwarden api-token`; read again when it changes), with
    the scope of each route, within the bounds of the client's settings; without the file,
    every request to it is refused (401). The broker destinations a client may name are
    those of the App's destinations file (`app.destinations`) that its settings give it. Its
    long polls and streams end when the server that `serve` runs stops (`web.state.stopping`
    set).

    `auth`, instead of `token`, is for the API mounted in the application's own FastAPI
    service (`service.mount("/ops", create_app(app, auth=staff))`): a FastAPI dependency of
    that service's own auth, which refuses a caller it does not know (raising, e.g.
    HTTPException(401)) and returns the name of one it knows. It guards every request, reads
    and actions alike (after the body is read, at most 2 MiB, as any FastAPI dependency), and
    the name it returns is recorded as each action's `authenticated`. Only the API is served
    (`/api/...`, `/metrics`, `/openapi.json`), not the pages, whose sign-in is the token's; the
    service opens and closes the App (a mounted application's lifespan does not run)."""
    if (token is None) == (auth is None):
        raise ConfigurationError("the dashboard takes an API token or an auth dependency: one")
    if auth is not None:
        if auth_reads is not None:
            raise ConfigurationError("auth guards every request: auth_reads is the token's")
        if api_tokens is not None:
            raise ConfigurationError("the application API is served with the token, not auth")
        return _mounted_api(app, auth, hosts)
    assert token is not None
    guard = Guard(token)
    reader = Reader(app)
    clients = (
        None
        if api_tokens is None
        else _tokens.TokensFile(api_tokens, destinations=app.destinations.names())
    )
    stopping = asyncio.Event()
    quotas = Quotas(app.destinations)
    application = _app_api.router(app, stopping, quotas)
    agents = _agent_api.router(app, stopping, quotas)
    served_routes = [*application.routes, *agents.routes]
    clients_guard = _app_api.ClientGuard(clients, served_routes)

    def page(
        request: Request, template: str, live: str, status: int = 200, **context: Any
    ) -> Response:
        if request.headers.get("x-live") == "1":
            template = live
        path = quote(request.url.path) + (f"?{request.url.query}" if request.url.query else "")
        html = render(
            template,
            title=context.pop("title", ""),
            page=context.pop("page", ""),
            csrf=guard.csrf_for(request),
            app_name=app.name,
            path=path,
            now=datetime.now(UTC),
            **context,
        )
        return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})

    def html_error(request: Request, status: int, message: str) -> Response:
        return page(request, "error.html", "error.html", status, title="Error", message=message)

    # -- pages ------------------------------------------------------------------------------
    async def overview_page(request: Request) -> Response:
        data = await reader.overview()
        return page(
            request,
            "overview.html",
            "_overview_live.html",
            title="Overview",
            page="overview",
            data=data,
            activity_chart=activity_chart(data["activity"]),
        )

    async def tasks_page(request: Request) -> Response:
        try:
            filters = _filters(request, lenient=True)
        except BadRequest as exc:
            return html_error(request, 400, str(exc))
        data = await reader.tasks(**filters)
        return page(
            request,
            "tasks.html",
            "_tasks_live.html",
            title="Tasks",
            page="tasks",
            data=data,
            filters=filters,
            limit=filters["limit"],
            bulk_actions=BULK_ACTIONS,
        )

    async def task_page(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        try:
            _check.name("task_id", task_id)
            before = _events_before(request, lenient=True)
        except (StepwardenError, BadRequest) as exc:
            return html_error(request, 400, str(exc))
        data = await reader.task(task_id, limit=EVENT_PAGE, before=before)
        if data is None:
            return html_error(request, 404, f"no task {task_id!r}")
        state = TaskState(data["task"]["process_state"])
        actions = [
            {
                "name": name,
                "label": _LABELS[name],
                "confirm": _CONFIRM.get(name),
                "allowed": state in OPERATOR_ACTIONS[name],
                "why": f"not when the task is {state}",
            }
            for name in BULK_ACTIONS
        ]
        return page(
            request,
            "task.html",
            "_task_live.html",
            title=f"Task {task_id}",
            page="tasks",
            data=data,
            actions=actions,
            skip_allowed=state in OPERATOR_ACTIONS["skip"],
            retry_allowed=state in OPERATOR_ACTIONS["retry"],
            fork_starts=[
                {"start": s["position"] or str(s["seq"]), "seq": s["seq"], "name": s["name"]}
                for s in data["steps"]
                if s["compensates"] is None
            ],
            finished_states=[str(s) for s in FINISHED_TASK_STATES],
            waiting_event=_event_waited_for(data["task"]["waiting_for"]),
            timeline=step_timeline(data["task"], data["steps"], datetime.now(UTC)),
            why=await reader.why(task_id),
        )

    async def alerts_page(request: Request) -> Response:
        try:
            limit = _limit(request, lenient=True, default=200)
        except BadRequest as exc:
            return html_error(request, 400, str(exc))
        return page(
            request,
            "alerts.html",
            "_alerts_live.html",
            title="Alerts",
            page="alerts",
            data=await reader.alerts(limit),
        )

    async def agents_page(request: Request) -> Response:
        return page(
            request,
            "agents.html",
            "_agents_live.html",
            title="Agents",
            page="agents",
            data=await reader.agents(),
        )

    async def schedules_page(request: Request) -> Response:
        return page(
            request,
            "schedules.html",
            "_schedules_live.html",
            title="Schedules",
            page="schedules",
            data=await reader.schedules(),
        )

    async def login_page(request: Request) -> Response:
        next_ = _safe_next(request.query_params.get("next"))
        return page(request, "login.html", "login.html", title="Sign in", next=next_, failed=False)

    async def login(request: Request) -> Response:
        form = _form(await request.body())
        next_ = _safe_next(form.get("next"))
        verdict = guard.try_token(request, form.get("token", ""), signing_in=True)
        if verdict.status == 429:
            refused = html_error(request, 429, verdict.reason)
            refused.headers.update(verdict.headers)
            return refused
        if not verdict.allowed:
            return page(
                request, "login.html", "login.html", 401, title="Sign in", next=next_, failed=True
            )
        response = RedirectResponse(next_, status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            guard.sign_in(),
            max_age=SESSION_SECONDS,
            httponly=True,
            secure=request.url.scheme == "https",
            samesite="strict",
            path="/",
        )
        return response

    async def logout(request: Request) -> Response:
        verdict = guard.check(request, _form(await request.body()).get(CSRF_FIELD))
        if not verdict.allowed:
            return html_error(request, verdict.status, verdict.reason)
        guard.sign_out(request)
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    # -- errors -----------------------------------------------------------------------------
    async def on_bad_request(request: Request, exc: Exception) -> Response:
        path = _route_path(request.scope)
        if path.startswith(_app_api.PREFIX + "/"):
            return error(422, str(exc))
        if path.startswith("/api/"):
            return error(400, str(exc))
        return html_error(request, 400, str(exc))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers or {})
        path = _route_path(request.scope)
        if path.startswith(_app_api.PREFIX + "/") and exc.status_code == 400:
            # FastAPI's answer to a body it cannot read (not UTF-8): an invalid request.
            return error(422, f"the body is not JSON text (UTF-8): {exc.detail}")
        if path.startswith("/api/"):
            return json_response({"error": exc.detail}, exc.status_code, headers or None)
        response = html_error(request, exc.status_code, exc.detail)
        response.headers.update(headers)
        return response

    async def on_invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        application_api = _route_path(request.scope).startswith(_app_api.PREFIX + "/")
        return error(422 if application_api else 400, _first_problem(exc))

    async def on_store_error(request: Request, exc: Exception) -> Response:
        message = f"the store is unavailable: {' '.join(str(exc).split())}"
        path = _route_path(request.scope)
        if path.startswith("/api/") or path == "/metrics":
            return error(503, message)
        return html_error(request, 503, message)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await app.store()  # open it (and fail early) before the first request
        try:
            yield
        finally:
            await app.aclose()

    pages = [
        Route("/", overview_page),
        Route("/tasks", tasks_page),
        Route("/tasks/{task_id:path}", task_page),
        Route("/alerts", alerts_page),
        Route("/agents", agents_page),
        Route("/schedules", schedules_page),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("stepwarden.dashboard", "static")])),
    ]
    web = FastAPI(
        title="stepwarden dashboard",
        version=__version__,
        description=DESCRIPTION,
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
        routes=pages,
        middleware=[
            Middleware(_ClientGone),
            Middleware(_SecurityHeaders),
            *([Middleware(_HostCheck, hosts=hosts)] if hosts is not None else []),
            Middleware(_SameOrigin, exempt=(_app_api.PREFIX + "/",)),
            Middleware(_BodyLimit),
            Middleware(_Access, guard=guard, auth_reads=auth_reads, clients=clients_guard),
        ],
        lifespan=lifespan,
        exception_handlers={
            BadRequest: on_bad_request,
            PayloadError: on_bad_request,  # a value too deep to read, wherever it is met
            HTTPException: on_http_error,
            RequestValidationError: on_invalid,
            StoreError: on_store_error,
        },
    )
    web.include_router(router(app, reader, token_actor(guard)))
    web.include_router(application)
    web.include_router(agents)
    web.state.stopping = stopping
    _document(web, SECURITY_SCHEMES)
    application_document: dict[str, Any] = {}

    async def application_openapi(request: Request) -> Response:
        if not application_document:
            application_document.update(_app_api.document(served_routes))
        return json_response(application_document)

    web.add_route(_app_api.DOCUMENT, application_openapi, include_in_schema=False)
    return web


def _mounted_api(app: App, auth: Callable[..., Any], hosts: Sequence[str] | None) -> FastAPI:
    """The API alone, every route guarded by the mounting service's dependency `auth`."""

    async def on_api_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, BadRequest | PayloadError):
            return error(400, str(exc))
        if isinstance(exc, RequestValidationError):
            return error(400, _first_problem(exc))
        if isinstance(exc, StoreError):
            return error(503, f"the store is unavailable: {' '.join(str(exc).split())}")
        assert isinstance(exc, HTTPException)
        return json_response({"error": exc.detail}, exc.status_code, dict(exc.headers or {}))

    web = FastAPI(
        title="stepwarden dashboard API",
        version=__version__,
        description="Read the tasks, steps, history and alerts of a stepwarden store, and act "
        "on tasks as an operator, as the service this API is mounted in lets its callers.",
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
        middleware=[
            Middleware(_ClientGone),
            Middleware(_SecurityHeaders),
            *([Middleware(_HostCheck, hosts=hosts)] if hosts is not None else []),
            Middleware(_SameOrigin),
            Middleware(_BodyLimit),
        ],
        exception_handlers={
            kind: on_api_error
            for kind in (
                BadRequest,
                PayloadError,
                HTTPException,
                RequestValidationError,
                StoreError,
            )
        },
    )
    web.include_router(router(app, Reader(app), outer_actor(auth), guard_reads=True))
    _document(web, None)
    return web


def _document(web: FastAPI, schemes: dict[str, Any] | None) -> None:
    def document() -> dict[str, Any]:
        if web.openapi_schema is None:
            web.openapi_schema = _openapi_document(web, schemes)
        return web.openapi_schema

    web.openapi = document  # type: ignore[method-assign]


def _openapi_document(web: FastAPI, schemes: dict[str, Any] | None) -> dict[str, Any]:
    """The document FastAPI generates from the routes and models, with the API's security
    schemes (the token's; none when the mounting service guards it), and without the 422
    answers it would add: a refused request is a 400 (but for the application API's)."""
    doc = get_openapi(
        title=web.title,
        version=web.version,
        openapi_version=web.openapi_version,
        description=web.description,
        routes=web.routes,
    )
    for path, operations in doc.get("paths", {}).items():
        if path.startswith(_app_api.PREFIX + "/"):
            continue
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
            if schemes is None:
                operation.pop("security", None)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    if schemes is not None:
        doc["components"]["securitySchemes"] = schemes
        _app_api.complete(doc)
    return doc


def _first_problem(exc: RequestValidationError) -> str:
    """What a refused request got wrong, on one line: where, and why."""
    problems = []
    for e in exc.errors()[:3]:
        if e.get("type") == "json_invalid":
            problems.append(f"the body is not JSON: {e.get('ctx', {}).get('error', 'invalid')}")
            continue
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "the body"
        problems.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(problems)


class _SecurityHeaders:
    """The security headers on every response (no framing, no inline script)."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.inner(scope, receive, with_headers)


def _event_waited_for(waiting_for: str | None) -> str:
    """The name of the event a task waits for ("event:NAME", first of several: "event:NAME
    +2"), or "" when it waits for none."""
    kind, _, name = (waiting_for or "").partition(":")
    return re.sub(r" \+\d+$", "", name) if kind == "event" else ""


def _host_name(header: str) -> str:
    """The host a Host header names, without its port, lower case, an IPv6 address without
    its brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    await json_response({"error": message}, status)(scope, _nothing, send)


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


class _HostCheck:
    """Requests naming a host the dashboard does not serve are refused (DNS rebinding)."""

    def __init__(self, inner: ASGIApp, hosts: Sequence[str]) -> None:
        self.inner = inner
        self.hosts = frozenset(_host_name(h) for h in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = _host_name(Headers(scope=scope).get("host", ""))
            if host not in self.hosts:
                known = ", ".join(sorted(self.hosts))
                await _refuse(
                    scope,
                    send,
                    421,
                    f"this dashboard does not serve the host {host!r} (served: {known}; "
                    "add one with --allowed-host)",
                )
                return
        await self.inner(scope, receive, send)


class _SameOrigin:
    """A state-changing request that a page of another site makes the browser send is
    refused (403), as the browser names it: by `Sec-Fetch-Site` (other than same-origin or
    none) when it sends one, which every current browser does; else by an `Origin` whose host
    is not the request's (or `null`). Calls from programs, which send neither, are not
    affected. Behind the service's own auth, which may rest on a cookie the browser sends by
    itself, this guards every action; in the token's dashboard, the sign-in too (a page of
    another site could sign a browser in, or spend an address's wrong tokens), and every POST
    but those under `exempt` (the application API's, whose clients are programs with a
    bearer token that no page can make a browser send)."""

    SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

    def __init__(self, inner: ASGIApp, exempt: Sequence[str] = ()) -> None:
        self.inner = inner
        self.exempt = tuple(exempt)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] not in self.SAFE
            and not _route_path(scope).startswith(self.exempt or ("\0",))
            and _cross_site(Headers(scope=scope))
        ):
            await _refuse(scope, send, 403, "an action sent from another site is refused")
            return
        await self.inner(scope, receive, send)


def _cross_site(headers: Headers) -> bool:
    """Whether the browser says that the request was made by a page of another site."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = headers.get("origin")
    return origin is not None and (
        origin == "null" or urlsplit(origin).netloc != headers.get("host", "")
    )


class _ClientGone:
    """A client that goes before its request's body has arrived (or that the server closes
    for being too slow) ends its request with one line in the log, at debug level, instead of
    a traceback: its connection is gone, and there is no one to answer."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        except ClientDisconnect:
            logger.debug(
                "%s %s: the client went before its request's body arrived",
                scope.get("method", ""),
                _route_path(scope),
            )


class _BodyLimit:
    """A request body over its limit is refused (413) before it is read: by its
    Content-Length when it has one, else as soon as what arrived passes the limit."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        limit = API_BODY if _route_path(scope).startswith("/api/") else FORM_BODY
        declared = Headers(scope=scope).get("content-length")
        too_big = f"the request body is over the limit of {limit} bytes"
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _refuse(scope, send, 413, too_big)
            return
        seen = 0
        exceeded = False

        async def counted() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise _TooBig
            return message

        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            if exceeded:  # whatever the application answers (FastAPI: a body it cannot parse)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        with contextlib.suppress(_TooBig):
            await self.inner(scope, counted, watched)
        if exceeded and not started:
            await _refuse(scope, send, 413, too_big)


class _TooBig(Exception):
    pass


_OPEN_PATHS = ("/login", "/openapi.json", _app_api.DOCUMENT)


class _Access:
    """Who may pass, decided from the request's headers before its body is read or parsed:
    an API action (a POST under /api/) needs the API token, or a signed-in session and its
    CSRF token; every other request but the sign-in page, the static files and the API's
    document needs the token or a session when reads are closed (`auth_reads`, or, with
    `auth_reads` None, for a request that came through a proxy), and a page asks to sign
    in. A request of the application API (under /api/v1, but its document) needs a client's
    token with the route's scope (`_app_api.ClientGuard`), whatever the address, and the
    route learns the client's name from the request's state."""

    def __init__(
        self,
        inner: ASGIApp,
        guard: Guard,
        auth_reads: bool | None,
        clients: _app_api.ClientGuard,
    ) -> None:
        self.inner = inner
        self.guard = guard
        self.auth_reads = auth_reads
        self.clients = clients

    def _reads_closed(self, request: Request) -> bool:
        if self.auth_reads is None:
            return through_proxy(request)
        return self.auth_reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        path = _route_path(scope)
        request = Request(scope)
        if self.clients.guards(path):  # the application API: a client's token, its scope
            verdict = self.clients.check(request)
            if verdict.allowed:
                scope.setdefault("state", {})[_app_api.CLIENT_KEY] = verdict.identity
        elif scope["method"] == "POST" and path.startswith("/api/"):
            verdict = self.guard.check(request)
        elif path in _OPEN_PATHS or path.startswith("/static/") or not self._reads_closed(request):
            await self.inner(scope, receive, send)
            return
        else:
            verdict = self.guard.check_read(request)
        if verdict.allowed:
            await self.inner(scope, receive, send)
            return
        if path.startswith("/api/") or path == "/metrics" or scope["method"] != "GET":
            response = json_response({"error": verdict.reason}, verdict.status, verdict.headers)
        else:
            wanted = quote(path) + (f"?{request.url.query}" if request.url.query else "")
            response = RedirectResponse(f"/login?{urlencode({'next': wanted})}", 303)
        await response(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The request's path within the dashboard: without the prefix of the application it is
    mounted in (`root_path`), which the path keeps."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _form(body: bytes) -> dict[str, str]:
    parsed = parse_qs(body.decode(errors="replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in parsed.items()}


def _safe_next(value: str | None) -> str:
    """Where to go after signing in: a path of this site only (browsers drop tabs and line
    breaks from URLs, and read a backslash as a slash)."""
    if not value or not value.startswith("/") or "\\" in value:
        return "/"
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in value):
        return "/"
    return "/" if value.startswith("//") else value
