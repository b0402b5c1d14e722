"""The command line: run workers, submit and inspect tasks, migrate the store.

Every option also reads an environment variable, named in its help.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib
import logging
import os
import shlex
import signal
import sys
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any, TypeVar, cast

import click
import orjson

from . import _check, _json, _tokens, sealing, upgrade
from ._logs import JsonFormatter
from ._text import EscapingFormatter, cut, escape, escape_json
from .app import MAX_EVENT_PAGE, App, TaskView, refuse_conflict
from .destinations import ENV as DESTINATIONS_ENV
from .destinations import Destinations
from .errors import ConfigurationError, StepwardenError
from .records import (
    DEFAULT_MAX_EVENT_PAYLOAD,
    DEFAULT_MAX_EVENTS_PER_TASK,
    ActionOutcome,
    BulkFork,
    BulkPlan,
    BulkProgress,
    EventBounds,
    Gate,
    Redrive,
    SendOutcome,
    Submitted,
    TaskFilter,
    TaskRecord,
    WaitReason,
    Why,
)
from .retry import Backoff
from .rules import BULK_ACTIONS
from .runner import DEFAULT_GONE_AFTER, DEFAULT_HEARTBEAT
from .scheduler import DEFAULT_GONE_AFTER as DEFAULT_SCHEDULER_GONE_AFTER
from .scheduler import DEFAULT_HEARTBEAT as DEFAULT_SCHEDULER_HEARTBEAT
from .states import COMPENSATION_STATES, TaskState
from .store import ShardedStore, Store, open_one, open_store, shown_url
from .store.reseal import PLACES, Cursor
from .supervisor import DEFAULT_RETENTION
from .supervisor import LEASE as SUPERVISOR_LEASE
from .worker import ROLES, Worker, WorkerOptions, parse_roles
from .workflow import MAX_WAIT

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
HTTP_CLIENT_LOGGERS = ("httpx", "httpcore")
"""The HTTP client's loggers, whose line per request a worker shows only at --log-level
debug."""


class _Ctx:
    def __init__(self, app_ref: str | None, store: str | None) -> None:
        self.app_ref = app_ref
        self.store = store

    def app(self, ref: str | None = None) -> App:
        ref = ref or self.app_ref
        if not ref:
            raise click.UsageError(
                "name the application: --app MODULE:ATTRIBUTE (or STEPWARDEN_APP)"
            )
        app = load_app(ref)
        if self.store:
            try:
                open_store(self.store)  # validate before anything else happens
            except StepwardenError as exc:
                raise click.BadParameter(_one_line(exc), param_hint="--store") from exc
            app.store_url = self.store
        return app

    def store_app(self) -> App:
        """An App of the store alone (no workflow of its own), for the commands that read or
        act on the store's tasks; a bad store URL is refused in one line (exit code 1), as
        the store's own errors are."""
        url = self.store_url()
        try:
            return App("stepwarden-cli", store=url, auto_migrate=False)
        except StepwardenError as exc:
            raise click.ClickException(_one_line(exc)) from exc

    def store_url(self) -> str:
        if self.store:
            return self.store
        if self.app_ref:
            return load_app(self.app_ref).store_url
        raise click.UsageError(
            "name the store (--store URL or STEPWARDEN_STORE) or the application (--app)"
        )


def load_app(ref: str) -> App:
    """Import `module:attribute` (the current directory is importable) and return the App."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr or module_name.startswith("."):
        raise click.UsageError(f"invalid application {ref!r}: expected MODULE:ATTRIBUTE")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.UsageError(f"cannot import module {module_name!r}: {exc}") from exc
    except StepwardenError as exc:  # e.g. the module's App names an invalid store URL
        raise click.UsageError(f"cannot load application {ref!r}: {_one_line(exc)}") from exc
    if not hasattr(module, attr):
        raise click.UsageError(f"module {module_name!r} has no attribute {attr!r}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise click.UsageError(f"{ref!r} is not a stepwarden.App (it is {type(app).__name__})")
    return app


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except StepwardenError as exc:
        raise click.ClickException(_one_line(exc)) from exc


def _one_line(exc: BaseException) -> str:
    """The error's message on one line (a driver's message may span several), its control
    characters escaped."""
    return escape(" ".join(str(exc).split()))


def _json_argument(text: str, hint: str, what: str) -> Any:
    """The value of a JSON argument: text that is not JSON is a usage error naming `hint`;
    a value past a payload limit is refused like the App refuses it."""
    try:
        return _json.loads(text, what=what)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=hint) from exc
    except StepwardenError as exc:
        raise click.ClickException(_one_line(exc)) from exc


def _echo(text: str, *, err: bool = False) -> None:
    """Print one line with its control characters escaped: a task id, an error or a reason
    cannot move the cursor, reorder the line or forge another."""
    click.echo(escape(text), err=err)


def _echo_json(document: str) -> None:
    """Print a JSON document: the same value, its control characters written as escapes."""
    click.echo(escape_json(document))


def _opt(*names: str, envvar: str, **kwargs: Any) -> Callable[[F], F]:
    """An option that also reads `envvar`, and says so in its help."""
    return click.option(*names, envvar=envvar, show_envvar=True, **kwargs)


def _tag_option(help: str) -> Callable[[F], F]:
    return _opt(
        "--tag",
        "tags",
        envvar="STEPWARDEN_TAG",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_tags,
        help=f"{help} Given again for more tags (at most {_check.MAX_TAGS}; a key of 1 to "
        f"{_check.MAX_TAG_KEY} characters, a letter or digit then letters, digits and "
        f"_ . : / -; a value of 1 to {_check.MAX_TAG_VALUE} characters). The variable holds "
        "them separated by spaces.",
    )


def _tags(
    ctx: click.Context, param: click.Parameter, given: tuple[str, ...]
) -> dict[str, str] | None:
    """The tags of `--tag KEY=VALUE` options (None: none given), checked as the App does."""
    if not given:
        return None
    try:
        return _check.tag_texts(given)
    except StepwardenError as exc:
        raise click.BadParameter(_one_line(exc), ctx=ctx, param=param) from exc


def _time_option(name: str, help: str) -> Callable[[F], F]:
    return _opt(
        name,
        envvar="STEPWARDEN_" + name[2:].upper().replace("-", "_"),
        default=None,
        metavar="TIME",
        callback=lambda ctx, param, text: None if text is None else _datetime(text, name),
        help=f"{help} (ISO 8601, with its time zone).",
    )


_FILTER_PARAMS = (
    "states",
    "workflow",
    "workflow_version",
    "error",
    "created_after",
    "created_before",
    "finished_after",
    "finished_before",
    "tenant",
    "tags",
)


def _filter_options(states_note: str = "") -> Callable[[F], F]:
    """The options of a filter of tasks (a `TaskFilter`), one definition for each command
    that takes one (`tasks`, `bulk`): the command is given them as one argument, `match`."""
    options = [
        _opt(
            "--state",
            "states",
            envvar="STEPWARDEN_STATE",
            multiple=True,
            type=click.Choice([s.value for s in TaskState]),
            help=f"Only tasks in this state; given again for more.{states_note}",
        ),
        _opt("--workflow", envvar="STEPWARDEN_WORKFLOW", default=None, help="Only this workflow."),
        _opt(
            "--version",
            "workflow_version",
            envvar="STEPWARDEN_WORKFLOW_VERSION",
            default=None,
            type=click.IntRange(min=1, max=_check.MAX_INT),
            metavar="N",
            help="Only the tasks that run this version of their workflow.",
        ),
        _opt(
            "--error",
            envvar="STEPWARDEN_ERROR",
            default=None,
            metavar="TEXT",
            help="Only the tasks whose error contains this text (case-sensitive).",
        ),
        _time_option("--created-after", "Only the tasks created at or after this time"),
        _time_option("--created-before", "Only the tasks created before this time"),
        _time_option("--finished-after", "Only the tasks that finished at or after this time"),
        _time_option("--finished-before", "Only the tasks that finished before this time"),
        _opt(
            "--tenant",
            envvar="STEPWARDEN_TENANT",
            default=None,
            metavar="NAME",
            help='Only the tasks of this tenant ("": those of none).',
        ),
        _tag_option("Only the tasks that have this tag (and every other one given)."),
    ]

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def filtered(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in _FILTER_PARAMS}
            kwargs["match"] = TaskFilter(
                states=frozenset(TaskState(s) for s in given["states"]),
                workflow=given["workflow"],
                version=given["workflow_version"],
                error=given["error"],
                created_after=given["created_after"],
                created_before=given["created_before"],
                finished_after=given["finished_after"],
                finished_before=given["finished_before"],
                tenant=given["tenant"],
                tags=given["tags"],
            )
            return fn(*args, **kwargs)

        wrapped: Any = filtered
        for option in reversed(options):
            wrapped = option(wrapped)
        return cast(F, wrapped)

    return decorate


def _destinations_option(what: str) -> Callable[[F], F]:
    return _opt(
        "--destinations",
        envvar=DESTINATIONS_ENV,
        default=None,
        metavar="FILE",
        type=click.Path(exists=True, dir_okay=False),
        help="The broker destinations status messages may go to: one `NAME BROKER NAMES` "
        "line each (the broker as scheme://host[:port], its queues, streams or subjects "
        f"separated by commas, PREFIX* for those starting so, * for any). {what} Without "
        "it, no reply_to may name a broker. A file others may write is refused.",
    )


def _listed(app: App, path: str | None) -> None:
    """Give the App the destinations file at `path`, when one is given."""
    if path is not None:
        try:
            app.destinations = Destinations.from_file(path)
        except StepwardenError as exc:
            raise click.BadParameter(_one_line(exc), param_hint="--destinations") from exc


class _Cli(click.Group):
    """The command line's group. Its options that take a value (`--app`, `--store`,
    `--log-level`, `--log-format`) are accepted after the command too (`stepwarden worker
    --app shop:app`): they are moved before it, where the group reads them, so that given
    twice the one after the command wins. Nothing after `--` is moved."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._hoisted(ctx, args))

    def _hoisted(self, ctx: click.Context, args: list[str]) -> list[str]:
        own = _valued_options([self])
        at = 0
        while at < len(args) and args[at].startswith("-") and args[at] != "--":
            at += 2 if args[at] in own else 1
        if at >= len(args) or args[at] == "--":
            return args
        command = self.get_command(ctx, args[at])
        if command is None:
            return args
        below = [command, *(command.commands.values() if isinstance(command, click.Group) else ())]
        theirs = _valued_options(below)
        moved: list[str] = []
        kept: list[str] = []
        rest = iter(args[at + 1 :])
        for arg in rest:
            if arg == "--":
                kept += [arg, *rest]
            elif arg in own:
                value = next(rest, None)
                if value is None:
                    raise click.UsageError(f"Option '{arg}' requires an argument.", ctx=ctx)
                moved += [arg, value]
            elif arg.partition("=")[0] in own:
                moved.append(arg)
            else:
                kept.append(arg)
                if arg in theirs:  # its value is the command's, whatever it reads like
                    kept += [value for value in [next(rest, None)] if value is not None]
        return [*args[:at], *moved, args[at], *kept]


def _valued_options(commands: Sequence[click.Command]) -> set[str]:
    """The option strings of `commands` that take a value."""
    return {
        name
        for command in commands
        for param in command.params
        if isinstance(param, click.Option) and not param.is_flag and not param.count
        for name in param.opts
    }


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@_opt(
    "--app",
    "app_ref",
    envvar="STEPWARDEN_APP",
    metavar="MODULE:ATTR",
    help="The application, e.g. shop:app.",
)
@_opt(
    "--store",
    envvar="STEPWARDEN_STORE",
    metavar="URL",
    help="The store URL, overriding the application's (sqlite:///path.db, postgresql://...).",
)
@_opt(
    "--log-level",
    envvar="STEPWARDEN_LOG_LEVEL",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Logging level.",
)
@_opt(
    "--log-format",
    envvar="STEPWARDEN_LOG_FORMAT",
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="The log's form: text, one escaped line a record; or json, one JSON object a line "
    "(time, level, logger, message; on a line about a task its task_id, workflow, step, seq "
    "and attempt; trace_id and span_id while an OpenTelemetry span is current).",
)
@click.version_option(package_name="stepwarden")
@click.pass_context
def cli(
    ctx: click.Context, app_ref: str | None, store: str | None, log_level: str, log_format: str
) -> None:
    """stepwarden: durable multi-step operations (Scheduler-Agent-Supervisor).

    --app, --store, --log-level and --log-format may be given before the command or after it
    (`stepwarden worker --app shop:app`)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, log_level.upper()), handlers=[handler])
    ctx.obj = _Ctx(app_ref, store)


def _worker_default(name: str) -> Any:
    """The default of a `WorkerOptions` field: the worker's options default to it, so that
    the command line and the Python API cannot differ."""
    return WorkerOptions.__dataclass_fields__[name].default


_BACKOFF = Backoff()


@cli.command()
@click.argument("app_ref", required=False, metavar="[MODULE:ATTR]")
@_opt(
    "--roles",
    envvar="STEPWARDEN_ROLES",
    default=",".join(ROLES),
    show_default=True,
    help="Comma-separated roles to run in this process: scheduler, agents, supervisor.",
)
@_opt(
    "--agents",
    envvar="STEPWARDEN_AGENTS",
    default=None,
    help="Comma-separated agents to run (default: all of the application's agents).",
)
@_opt(
    "--concurrency",
    envvar="STEPWARDEN_CONCURRENCY",
    default=_worker_default("concurrency"),
    show_default=True,
    type=click.IntRange(min=1),
    help="Workflows the scheduler drives at once.",
)
@_opt(
    "--beyond-capacity",
    envvar="STEPWARDEN_BEYOND_CAPACITY",
    is_flag=True,
    help="Claim tasks up to --concurrency even when the registered agents are full (by "
    "default a scheduler claims no more than their capacity less the steps queued and "
    "running: a task left pending has no deadline running).",
)
@_opt(
    "--agent-concurrency",
    envvar="STEPWARDEN_AGENT_CONCURRENCY",
    default=_worker_default("agent_concurrency"),
    show_default=True,
    type=click.IntRange(min=1),
    help="Calls each agent makes at once.",
)
@_opt(
    "--poll-interval",
    envvar="STEPWARDEN_POLL_INTERVAL",
    default=None,
    type=click.FloatRange(min=0.001),
    help="Seconds between polls when no wake-up arrives [default: 0.05 SQLite, 0.5 PostgreSQL].",
)
@_opt(
    "--supervisor-interval",
    envvar="STEPWARDEN_SUPERVISOR_INTERVAL",
    default=_worker_default("supervisor_interval"),
    show_default=True,
    type=click.FloatRange(min=0.01),
    help="Seconds between sweeps (sooner when a registry row or another's lease is due to expire).",
)
@_opt(
    "--lease-ttl",
    envvar="STEPWARDEN_LEASE_TTL",
    default=None,
    type=click.FloatRange(min=0.1),
    help="Seconds a supervisor's leadership lasts unless renewed [default: max(5, 3 x interval)].",
)
@_opt(
    "--backoff-initial",
    envvar="STEPWARDEN_BACKOFF_INITIAL",
    default=_BACKOFF.initial,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds a reset task waits after its first failure.",
)
@_opt(
    "--backoff-max",
    envvar="STEPWARDEN_BACKOFF_MAX",
    default=_BACKOFF.maximum,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Longest wait of a reset task.",
)
@_opt(
    "--drain-timeout",
    envvar="STEPWARDEN_DRAIN_TIMEOUT",
    default=_worker_default("drain_timeout"),
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds given to work under way on SIGTERM.",
)
@_opt(
    "--retention",
    envvar="STEPWARDEN_RETENTION",
    default=DEFAULT_RETENTION,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds finished tasks are kept before the supervisor deletes them.",
)
@_opt(
    "--agent-heartbeat",
    envvar="STEPWARDEN_AGENT_HEARTBEAT",
    default=DEFAULT_HEARTBEAT,
    show_default=True,
    type=click.FloatRange(min=0.05, max=3600),
    help="Seconds between each agent instance's heartbeats in the registry.",
)
@_opt(
    "--agent-gone-after",
    envvar="STEPWARDEN_AGENT_GONE_AFTER",
    default=DEFAULT_GONE_AFTER,
    show_default=True,
    type=click.FloatRange(min=0.1, max=86400),
    help="Seconds without a heartbeat after which an agent instance is gone and its running "
    "steps go to another.",
)
@_opt(
    "--scheduler-heartbeat",
    envvar="STEPWARDEN_SCHEDULER_HEARTBEAT",
    default=DEFAULT_SCHEDULER_HEARTBEAT,
    show_default=True,
    type=click.FloatRange(min=0.05, max=3600),
    help="Seconds between each scheduler instance's heartbeats in the registry.",
)
@_opt(
    "--scheduler-gone-after",
    envvar="STEPWARDEN_SCHEDULER_GONE_AFTER",
    default=DEFAULT_SCHEDULER_GONE_AFTER,
    show_default=True,
    type=click.FloatRange(min=0.1, max=86400),
    help="Seconds without a heartbeat after which a scheduler instance is gone and its tasks "
    "are given back for another scheduler to resume.",
)
@_opt(
    "--alert-webhook",
    "alert_webhooks",
    envvar="STEPWARDEN_ALERT_WEBHOOK",
    multiple=True,
    metavar="[NAME=]URL",
    help="POST alerts to this URL too (repeatable; the variable is space-separated). Shown "
    "as NAME, or as the URL's scheme, host and port: never its path, user, password or query.",
)
@_opt(
    "--alert-webhook-file",
    envvar="STEPWARDEN_ALERT_WEBHOOK_FILE",
    default=None,
    type=click.File("r", encoding="utf-8"),
    help="Read more alert webhooks from this file, one [NAME=]URL a line (blank lines and "
    "lines starting with # skipped), or from standard input with -: a URL with a secret in "
    "it stays out of the process list and the shell's history.",
)
@_opt(
    "--metrics-port",
    envvar="STEPWARDEN_METRICS_PORT",
    default=None,
    type=click.IntRange(min=0, max=65535),
    help="Serve this worker's Prometheus metrics at http://HOST:PORT/metrics (0: a free port, "
    "said in the log) [default: none served].",
)
@_opt(
    "--metrics-host",
    envvar="STEPWARDEN_METRICS_HOST",
    default=_worker_default("metrics_host"),
    show_default=True,
    help="The address --metrics-port listens on (0.0.0.0 for every IPv4 address: the metrics "
    "have no access control).",
)
@_opt(
    "--metrics-tenants",
    envvar="STEPWARDEN_METRICS_TENANTS",
    default=None,
    metavar="T1,T2",
    help="Name these tenants in the metrics' tenant label (stepwarden_tenant_tasks_ended); "
    "every other tenant is counted as _other, a task of none as _none [default: none named].",
)
@_opt(
    "--agent-url",
    envvar="STEPWARDEN_AGENT_URL",
    default=None,
    metavar="URL",
    help="Serve the agents over HTTP, from the agent protocol of the stepwarden server at URL "
    "(`stepwarden dashboard --api-tokens`): no store is opened, and only the agents role "
    "runs; a server out of reach is waited for, asked again a growing delay apart. The "
    "client's token is read from STEPWARDEN_AGENT_TOKEN or --agent-token-file.",
)
@_opt(
    "--agent-token-file",
    envvar="STEPWARDEN_AGENT_TOKEN_FILE",
    default=None,
    type=click.File("r", encoding="utf-8"),
    help="Read the token of --agent-url from this file (or standard input with -).",
)
@_opt(
    "--shards",
    envvar="STEPWARDEN_SHARDS",
    default=None,
    metavar="S1,S2",
    help="With a store of shards: serve only these (their names in the shard map, as "
    "`stepwarden shards` shows them) [default: every shard].",
)
@_destinations_option(
    "The relay sends only to those; a message stored for another is refused, never sent."
)
@click.pass_obj
def worker(
    obj: _Ctx,
    app_ref: str | None,
    roles: str,
    agents: str | None,
    concurrency: int,
    beyond_capacity: bool,
    agent_concurrency: int,
    poll_interval: float | None,
    supervisor_interval: float,
    lease_ttl: float | None,
    backoff_initial: float,
    backoff_max: float,
    drain_timeout: float,
    retention: float,
    agent_heartbeat: float,
    agent_gone_after: float,
    scheduler_heartbeat: float,
    scheduler_gone_after: float,
    alert_webhooks: tuple[str, ...],
    alert_webhook_file: IO[str] | None,
    metrics_port: int | None,
    metrics_host: str,
    metrics_tenants: str | None,
    agent_url: str | None,
    agent_token_file: IO[str] | None,
    shards: str | None,
    destinations: str | None,
) -> None:
    """Run scheduler, agents and supervisor (or the --roles given) until SIGTERM. With a
    store of shards, the roles run on each shard served, apart."""
    if alert_webhook_file is not None:
        lines = (line.strip() for line in alert_webhook_file.read().splitlines())
        alert_webhooks += tuple(line for line in lines if line and not line.startswith("#"))
    app = obj.app(app_ref)
    _listed(app, destinations)
    agent_token = None
    if agent_url is not None:
        agent_token = (
            agent_token_file.read().strip()
            if agent_token_file is not None
            else os.environ.get("STEPWARDEN_AGENT_TOKEN", "").strip()
        )
        if not agent_token:
            raise click.UsageError(
                "--agent-url needs the client's token: STEPWARDEN_AGENT_TOKEN or --agent-token-file"
            )
        if roles == ",".join(ROLES):  # the default: an agent server serves the agents only
            roles = "agents"
    try:
        options = WorkerOptions(
            roles=parse_roles(roles.split(",")),
            agents=frozenset(a.strip() for a in agents.split(",") if a.strip()) if agents else None,
            concurrency=concurrency,
            admission=not beyond_capacity,
            agent_concurrency=agent_concurrency,
            poll_interval=poll_interval,
            supervisor_interval=supervisor_interval,
            lease_ttl=lease_ttl,
            backoff=Backoff(initial=backoff_initial, maximum=max(backoff_max, backoff_initial)),
            drain_timeout=drain_timeout,
            retention=retention,
            agent_heartbeat=agent_heartbeat,
            agent_gone_after=agent_gone_after,
            scheduler_heartbeat=scheduler_heartbeat,
            scheduler_gone_after=scheduler_gone_after,
            alert_webhooks=alert_webhooks,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            metrics_tenants=(
                frozenset(t.strip() for t in metrics_tenants.split(",") if t.strip())
                if metrics_tenants
                else None
            ),
            agent_url=agent_url,
            agent_token=agent_token,
            shards=frozenset(x.strip() for x in shards.split(",") if x.strip()) if shards else None,
        )
        if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
            # One line per HTTP request (an agent protocol's call, a webhook's delivery) is
            # for debugging: the worker says what went wrong with them itself.
            for name in HTTP_CLIENT_LOGGERS:
                logging.getLogger(name).setLevel(logging.WARNING)
        Worker(app, options).run_forever()
    except StepwardenError as exc:
        raise click.ClickException(_one_line(exc)) from exc


@cli.command()
@click.argument("workflow")
@click.argument("input_json", required=False, default=None, metavar="[INPUT_JSON]")
@_opt(
    "--input-file",
    envvar="STEPWARDEN_INPUT_FILE",
    default=None,
    type=click.File("r", encoding="utf-8"),
    help="Read the input JSON from this file, or from standard input with -, instead of "
    "INPUT_JSON: a secret in it stays out of the process list and the shell's history.",
)
@_opt(
    "--task-id",
    envvar="STEPWARDEN_TASK_ID",
    default=None,
    help="The task id (default: a random one). Submitting an id again creates nothing: "
    "the same submit (same workflow, version and input) prints the id, its other options "
    "ignored; another fails, naming what differs.",
)
@_opt(
    "--priority",
    envvar="STEPWARDEN_PRIORITY",
    default=0,
    show_default=True,
    type=click.IntRange(min=-_check.MAX_INT - 1, max=_check.MAX_INT),
    help="Higher runs first, a level being worth a second of waiting (within ±3600): a "
    "task waits only behind higher ones submitted less than the difference, in seconds, "
    "after it.",
)
@_opt(
    "--start-after",
    envvar="STEPWARDEN_START_AFTER",
    default=None,
    type=click.FloatRange(min=0, max=MAX_WAIT.total_seconds()),
    metavar="SECONDS",
    help="Start no sooner than this many seconds from now (the task waits until then).",
)
@_opt(
    "--start-at",
    envvar="STEPWARDEN_START_AT",
    default=None,
    metavar="ISO-8601",
    help="Start no sooner than this time, with its time zone (e.g. 2026-12-01T02:00:00+00:00).",
)
@_opt(
    "--version",
    "workflow_version",
    envvar="STEPWARDEN_WORKFLOW_VERSION",
    default=None,
    type=click.IntRange(min=1, max=_check.MAX_INT),
    metavar="N",
    help="The version of WORKFLOW the task runs, one the application declares [default: "
    "the newest it declares].",
)
@_opt(
    "--reply-to",
    envvar="STEPWARDEN_REPLY_TO",
    default=None,
    metavar="CHANNEL",
    help="The channel of the task's status messages (received, step_completed, processed, "
    "...), or a broker destination the operator lists (amqp://, nats://, redis://) "
    "[default: none].",
)
@_opt(
    "--tenant",
    envvar="STEPWARDEN_TENANT",
    default=None,
    metavar="NAME",
    help="Who the task belongs to (its children too) [default: none].",
)
@_tag_option("A tag of the task, what it is about: `stepwarden tasks --tag` finds it by it.")
@click.pass_obj
def submit(
    obj: _Ctx,
    workflow: str,
    input_json: str | None,
    input_file: IO[str] | None,
    task_id: str | None,
    priority: int,
    start_after: float | None,
    start_at: str | None,
    workflow_version: int | None,
    reply_to: str | None,
    tenant: str | None,
    tags: dict[str, str] | None,
) -> None:
    """Submit a task of WORKFLOW with INPUT_JSON (default null) or the JSON of --input-file
    as its input; prints the task id. The task runs to its end on the newest version of
    WORKFLOW the application declares, or on --version. A value written {"$secret": VALUE}
    is a Secret: stored for its operation, never shown."""
    if input_json is not None and input_file is not None:
        raise click.UsageError("give the input as INPUT_JSON or --input-file, not both")
    hint = "INPUT_JSON"
    if input_file is not None:
        hint = "--input-file"
        try:
            input_json = input_file.read()
        except UnicodeDecodeError as exc:
            raise click.BadParameter(f"not UTF-8 text: {exc}", param_hint=hint) from exc
    value = _json_argument("null" if input_json is None else input_json, hint, "the task input")
    when = None if start_at is None else _datetime(start_at, "--start-at")
    app = obj.app()

    async def go() -> Submitted:
        try:
            task = app.new_task(
                workflow,
                value,
                task_id=task_id,
                priority=priority,
                reply_to=reply_to,
                start_at=when,
                start_after=start_after,
                version=workflow_version,
                tenant=tenant,
                tags=tags,
            )
            [answer] = await app.submit_many_async([task])
            refuse_conflict(task, answer)
            return answer
        finally:
            await app.aclose()

    answer = _run(go())
    _echo(answer.task_id)
    if answer.outcome == "same":
        _echo(
            f"task {answer.task_id!r} was submitted before with the same workflow, version and "
            "input: nothing submitted",
            err=True,
        )


@cli.command()
@_filter_options()
@_opt(
    "--limit",
    envvar="STEPWARDEN_LIMIT",
    default=100,
    show_default=True,
    type=click.IntRange(min=1, max=_check.MAX_INT),
    help="At most this many tasks.",
)
@_opt(
    "--after",
    envvar="STEPWARDEN_AFTER",
    default=None,
    metavar="TASK",
    help="Only the tasks listed after this one: the last task of the page before.",
)
@_opt("--json", "as_json", envvar="STEPWARDEN_JSON", is_flag=True, help="One JSON object a line.")
@click.pass_obj
def tasks(obj: _Ctx, match: TaskFilter, limit: int, after: str | None, as_json: bool) -> None:
    """List the tasks that match the filter (every task, without one), oldest first, with a
    count per state (of every task); the same filter as `stepwarden bulk` takes. With --tag,
    they are looked up by the tags' index. A page holds --limit tasks at most; when it is
    full, the next is listed with --after and the last task id of this one (as the line after
    the list says)."""
    app = obj.store_app()

    async def go() -> tuple[list[TaskRecord], dict[TaskState, int]]:
        try:
            found = await app.tasks_matching_async(match, after=after, limit=limit)
            return found, await (await app.store()).count_tasks()
        finally:
            await app.aclose()

    found, counts = _run(go())
    more = len(found) == limit
    if as_json:
        for t in found:
            _echo_json(_json.display(_task_dict(t)))
        if more:
            _echo(f"more: --after {found[-1].task_id}", err=True)
        return
    _echo("  ".join(f"{s.value}: {n}" for s, n in counts.items()))
    ids = _width(28, (t.task_id for t in found))
    names = _width(18, (t.workflow for t in found))
    tenants = _width(6, (t.tenant or "-" for t in found))
    if found:
        _echo(
            f"{'TASK':<{ids}} {'WORKFLOW':<{names}} {'VER':>3} {'STATE':<11} {'FAIL':>4} "
            f"{'ATT':>3} {'TENANT':<{tenants}}  UPDATED"
        )
    for t in found:
        waiting = f"  {t.waiting_for} until {_time(t.wake_at)}" if t.waiting_for else ""
        _echo(
            f"{t.task_id:<{ids}} {t.workflow:<{names}} {t.version:>3} "
            f"{t.process_state.value:<11} {t.failure_count:>4} {t.attempt:>3} "
            f"{t.tenant or '-':<{tenants}}  {_time(t.updated_at)}{waiting}"
        )
    if more:
        _echo(f"more: --after {found[-1].task_id}", err=True)


def _width(least: int, values: Iterable[str]) -> int:
    """A column's width: `least`, or the longest of its values (a long task id, a long
    instance name), so that the columns after it stay aligned."""
    return max([least, *(len(v) for v in values)])


@cli.command()
@_opt("--json", "as_json", envvar="STEPWARDEN_JSON", is_flag=True, help="One JSON object a line.")
@click.pass_obj
def agents(obj: _Ctx, as_json: bool) -> None:
    """List the agent registry: each agent instance, alive or gone, with its capacity, calls
    in flight (none for a gone one: its steps are given back) and circuit breaker."""
    found = _run(_read_store(obj, lambda store: store.list_agents()))
    names = _width(16, (a.agent for a in found))
    instances = _width(24, (a.instance for a in found))
    if not as_json and not found:
        _echo("no agent instance has registered")
    elif not as_json:
        _echo(
            f"{'AGENT':<{names}} {'INSTANCE':<{instances}} {'STATUS':<6} {'INFLIGHT':>8} "
            f"{'CAPACITY':>8}  {'BREAKER':<9}  HEARTBEAT"
        )
    for a in found:
        status = "alive" if a.alive else "gone"
        inflight = a.inflight if a.alive else "-"  # a gone one's steps are given back
        line = (
            f"{a.agent:<{names}} {a.instance:<{instances}} {status:<6} {inflight:>8} "
            f"{a.capacity:>8}  {a.breaker:<9}  {_time(a.heartbeat_at)}"
        )
        _echo_record(a, as_json, line)


@cli.command()
@_opt("--json", "as_json", envvar="STEPWARDEN_JSON", is_flag=True, help="One JSON object a line.")
@click.pass_obj
def schedulers(obj: _Ctx, as_json: bool) -> None:
    """List the scheduler registry: each scheduler instance, alive or gone, with the tasks it
    holds, how many it drives at once and the workflow versions it runs (WORKFLOW@VERSIONS:
    it claims the tasks of those only). A gone one's tasks are given back at once."""
    found = _run(_read_store(obj, lambda store: store.list_schedulers()))
    if not as_json and not found:
        _echo("no scheduler instance has registered")
    elif not as_json:
        _echo(
            f"{'INSTANCE':<28} {'STATUS':<6} {'HELD':>6} {'CAPACITY':>8}  {'HEARTBEAT':<29}  RUNS"
        )
    for s in found:
        status = "alive" if s.alive else "gone"
        line = (
            f"{s.instance:<28} {status:<6} {s.held:>6} {s.capacity:>8}  "
            f"{_time(s.heartbeat_at):<29}  {_runs(s.versions)}"
        )
        _echo_record(s, as_json, line)


@cli.command()
@_opt("--json", "as_json", envvar="STEPWARDEN_JSON", is_flag=True, help="One JSON object a line.")
@click.pass_obj
def relay(obj: _Ctx, as_json: bool) -> None:
    """Status messages for brokers not yet delivered, per destination (reply_to amqp://,
    nats://, redis://): how many, the delivery lag (the oldest one's age), how many failed
    and are tried again (a task's later messages wait for its failed one), the most tries of
    one, the next try and the newest error. Nothing listed: all delivered."""
    found = _run(_read_store(obj, lambda store: store.relay_backlog()))
    if not as_json and not found:
        _echo("every status message for a broker is delivered")
    elif not as_json:
        _echo(f"{'DESTINATION':<40} {'PENDING':>7} {'LAG':>9} {'FAILING':>7} {'TRIES':>5}  "
              f"{'NEXT TRY':>8}  ERROR")  # fmt: skip
    for b in found:
        retry = "-" if b.retry_in is None else f"{b.retry_in:.1f}s"
        line = (
            f"{b.destination:<40} {b.pending:>7} {b.lag:>8.1f}s {b.failing:>7} "
            f"{b.attempts:>5}  {retry:>8}  {b.error or ''}"
        )
        _echo_record(b, as_json, line)


def _runs(versions: Sequence[tuple[str, int]]) -> str:
    """(workflow, version) pairs as `name@1,2 other@1`."""
    by_name: dict[str, list[int]] = {}
    for name, version in versions:
        by_name.setdefault(name, []).append(version)
    return " ".join(
        f"{name}@{','.join(str(v) for v in sorted(vs))}" for name, vs in sorted(by_name.items())
    )


@cli.group(invoke_without_command=True)
@_opt("--json", "as_json", envvar="STEPWARDEN_JSON", is_flag=True, help="One JSON object a line.")
@click.pass_context
def shards(ctx: click.Context, as_json: bool) -> None:
    """A store of shards (--store names several PostgreSQL URLs, separated by spaces): each
    shard's name in the map, its database, the slots it owns in the map's newest generation,
    the tasks it holds and its supervisor leader (each shard has its own)."""
    if ctx.invoked_subcommand is not None:
        return
    obj: _Ctx = ctx.obj

    async def read(store: Store | ShardedStore) -> list[dict[str, Any]]:
        if not isinstance(store, ShardedStore) or store.shard_map is None:
            raise ConfigurationError("the store is one database, not shards")
        counts = store.shard_map.current.counts()
        found = []
        for name in store.names:
            part = store.part(name)
            lease = await part.read_lease(SUPERVISOR_LEASE)
            found.append(
                {
                    "shard": name,
                    "database": shown_url(part.url),
                    "generation": store.shard_map.generation,
                    "slots": counts.get(name, 0),
                    "tasks": sum((await part.count_tasks()).values()),
                    "leader": None if lease is None else lease.holder,
                    "term": None if lease is None else lease.term,
                }
            )
        return found

    rows = _run(_read_store(obj, read))
    if not as_json:
        _echo(f"{'SHARD':<6} {'SLOTS':>5} {'TASKS':>9}  {'LEADER (TERM)':<40}  DATABASE")
    for row in rows:
        if as_json:
            _echo_json(_json.display(row))
            continue
        leader = "-" if row["leader"] is None else f"{row['leader']} ({row['term']})"
        _echo(
            f"{row['shard']:<6} {row['slots']:>5} {row['tasks']:>9}  {leader:<40}  "
            f"{row['database']}"
        )


@shards.command("add")
@click.argument("url")
@click.pass_obj
def shards_add(obj: _Ctx, url: str) -> None:
    """Add the PostgreSQL database at URL (migrated here; it must hold no task) as a shard:
    a new generation of the map gives it an even share of the slots and moves no task. Run
    it once, then give every process the store's URL with URL added. Safe to run again."""

    async def add(store: Store | ShardedStore) -> str:
        if not isinstance(store, ShardedStore):
            raise ConfigurationError(
                "the store is one database: name two or more to make a store of shards"
            )
        return await store.add_shard(url)

    name = _run(_read_store(obj, add))
    _echo(f"added shard {name}: give every process the store's URL with it added")


async def _read_store(obj: _Ctx, read: Callable[[Store | ShardedStore], Awaitable[T]]) -> T:
    """What `read` finds in the store of the command, opened for it alone."""
    store = open_store(obj.store_url())
    await store.open(migrate=False)
    try:
        return await read(store)
    finally:
        await store.close()


def _echo_record(record: Any, as_json: bool, line: str) -> None:
    if as_json:
        fields = record.__dataclass_fields__
        _echo_json(_json.display({k: _plain(getattr(record, k)) for k in fields}))
    else:
        _echo(line)


@cli.command()
@click.argument("task_id")
@_opt("--json", "as_json", envvar="STEPWARDEN_JSON", is_flag=True, help="Print JSON.")
@click.pass_obj
def why(obj: _Ctx, task_id: str, as_json: bool) -> None:
    """Say why a task waits: what holds it now (a reason and its facts: a timer, an event,
    its children, an operator, a backoff, no scheduler for its version, its rank, the
    instance that holds it), and for each of its open steps (no agent alive, breakers open,
    its operation's concurrency or rate full, no free slot, its rank in the queue, the
    instance that runs it). With --app, the App's operation limits are known too; with
    --store alone, no limit is judged."""
    app = obj.app() if obj.app_ref else obj.store_app()

    async def go() -> Why:
        try:
            return await app.why_async(task_id)
        finally:
            await app.aclose()

    found = _run(go())
    if as_json:
        _echo_json(_json.display(dataclasses.asdict(found), indent=True))
        return
    _echo(f"task {found.task_id}  workflow {found.workflow}  version {found.version}")
    _echo(f"  state    {found.state.value}")
    _echo(f"  waits    {_gate_line(found.holding)}")
    if found.holding != found.gate:
        _echo(f"  task     {_gate_line(found.gate)}")
    for s in found.steps:
        _echo(f"  step {s.seq} {s.name} ({s.agent}.{s.operation}, {s.state.value})")
        _echo(f"           {_gate_line(s.gate)}")


def _tenant(name: str | None) -> str:
    return f"tenant {name}" if name else "no tenant"


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


def _gate_line(g: Gate) -> str:
    """A gate for a person, from its reason and facts."""
    r = WaitReason
    lines: dict[WaitReason, Callable[[], str]] = {
        r.FINISHED: lambda: f"nothing: it ended {g.state} at {_when(g.since)}",
        r.SET_ASIDE: lambda: (
            f"an operator: it is {g.state} since {_when(g.since)}"
            + (f", alert {g.alert}" if g.alert else "")
            + (f" ({cut(g.error, 200)})" if g.error else "")
        ),
        r.PAUSED: lambda: (
            f"an operator: paused by {g.by} at {_when(g.since)}"
            + (f" ({g.note})" if g.note else "")
        ),
        r.START: lambda: f"its delayed start at {_when(g.until)}",
        r.TIMER: lambda: f"a timer until {_when(g.until)}",
        r.EVENT: lambda: f"event {g.event!r} until {_when(g.until)}",
        r.CHILDREN: lambda: (
            "its children: " + ", ".join(f"{c.task_id} ({c.state})" for c in g.children)
        ),
        r.BACKOFF: lambda: f"a retry's backoff until {_when(g.until)}",
        r.NO_SCHEDULER: lambda: (
            f"a scheduler of {g.workflow} version {g.version}: none alive"
            + (f" since {_when(g.since)}" if g.since else " (none in the registry)")
        ),
        r.RANKED: lambda: (
            f"its turn: rank {g.rank}, behind {g.ahead}"
            + (
                ""
                if g.share is None
                else f" ({g.tenant_ahead} of {_tenant(g.tenant)}, whose share of the claims "
                f"is {g.share:.0%})"
            )
            + ", for "
            + ", ".join(g.schedulers)
        ),
        r.HELD: lambda: (
            f"{g.holder}, which holds it"
            + ("" if g.beat_age is None else f" (last beat {g.beat_age:.1f}s ago)")
            + ("" if g.holder_alive else ", gone")
            + f"; the supervisor takes it back by {_when(g.until)}"
        ),
        r.NO_AGENT: lambda: (
            f"an instance of agent {g.agent} serving {g.operation}: none alive"
            + (f" since {_when(g.since)}" if g.since else " (none in the registry)")
        ),
        r.BREAKER_OPEN: lambda: (
            "a breaker: every instance's is open ("
            + ", ".join(g.instances)
            + f"), the next try at {_when(g.until)}"
        ),
        r.CONCURRENCY_FULL: lambda: (
            f"its operation's concurrency: {g.in_use} of {g.limit}, held by " + ", ".join(g.held_by)
        ),
        r.RATE_FULL: lambda: (
            f"its operation's rate: {g.in_use} of {g.limit} per {g.per}s, until {_when(g.until)}"
        ),
        r.NO_CAPACITY: lambda: "a free slot: every one of " + ", ".join(g.instances) + " is busy",
        r.QUEUED: lambda: (
            f"its turn in the queue: rank {g.rank}, behind {g.ahead}, for " + ", ".join(g.instances)
        ),
    }
    return f"[{g.reason.value}] {lines[g.reason]()}"


@cli.command()
@click.argument("task_id")
@_opt("--json", "as_json", envvar="STEPWARDEN_JSON", is_flag=True, help="Print JSON.")
@_opt(
    "--events",
    "events",
    envvar="STEPWARDEN_EVENTS",
    default=50,
    show_default=True,
    type=click.IntRange(min=1, max=MAX_EVENT_PAGE),
    help="Show this many events of the history, newest first.",
)
@_opt(
    "--before",
    "before",
    envvar="STEPWARDEN_BEFORE",
    default=None,
    type=click.IntRange(min=1, max=_check.MAX_BIGINT),
    metavar="EVENT_ID",
    help="Show the events older than this event id (the next page of the history).",
)
@click.pass_obj
def show(obj: _Ctx, task_id: str, as_json: bool, events: int, before: int | None) -> None:
    """Show a task: its state, its workflow's version, its parent and children, each step
    with its place, attempts, errors, times and when its call stopped, and its history,
    newest first (a page of --events; the last line says how to see older ones)."""
    url = obj.store_url()

    async def go() -> TaskView | None:
        _check.name("task_id", task_id)
        store = open_store(url)
        await store.open(migrate=False)
        try:
            task = await store.get_task(task_id)
            if task is None:
                return None
            page = await store.history(task_id, limit=events, before=before)
            steps = await store.get_steps(task_id)
            children = await store.children(task_id)
            return TaskView(task, steps, page.events, page.more, children)
        finally:
            await store.close()

    view = _run(go())
    if view is None:
        raise click.ClickException(f"no task {task_id!r}")
    if as_json:
        data = _task_dict(view.task)
        data["steps"] = [
            {k: _plain(getattr(s, k)) for k in s.__dataclass_fields__} for s in view.steps
        ]
        data["events"] = [
            {"id": e.id, "at": _plain(e.at), "kind": e.kind, "detail": e.detail}
            for e in view.events
        ]
        data["more_events"] = view.more_events
        data["children"] = [
            {
                "task_id": c.task_id,
                "workflow": c.workflow,
                "process_state": c.process_state.value,
                "position": c.parent_position,
            }
            for c in view.children
        ]
        _echo_json(_json.display(data, indent=True))
        return
    t = view.task
    _echo(f"task {t.task_id}  workflow {t.workflow}  version {t.version}  priority {t.priority}")
    if t.tenant is not None:
        _echo(f"  tenant         {t.tenant}")
    if t.parent_id is not None:
        _echo(f"  parent         {t.parent_id}  (started at its position {t.parent_position})")
    _echo(f"  process_state  {t.process_state.value}")
    _echo(f"  failure_count  {t.failure_count} of max {t.max_failures}")
    if t.compensation_failures or t.process_state in COMPENSATION_STATES:
        _echo(f"  compensation   {t.compensation_failures} failure(s) of max {t.max_failures}")
    _echo(f"  attempt        {t.attempt}")
    _echo(f"  locked_by      {t.locked_by or '-'}")
    if t.process_state == TaskState.WAITING:
        _echo(f"  waiting_for    {t.waiting_for}  until {_time(t.wake_at)}")
    _echo(f"  complete_by    {_time(t.complete_by)}")
    _echo(f"  created        {_time(t.created_at)}   finished {_time(t.finished_at)}")
    if t.tags:
        _echo(f"  tags           {' '.join(f'{k}={v}' for k, v in sorted(t.tags.items()))}")
    _echo(f"  input          {_json.display(t.input)}")
    if t.result is not None:
        _echo(f"  result         {_json.display(t.result)}")
    if t.error:
        _echo(f"  error          {t.error}")
    _echo("steps:")
    for s in view.steps:
        _echo(
            f"  {s.seq:>3} {s.name:<24} {s.state.value:<11} attempt {s.attempt} "
            f"tries {s.tries}  key {s.idempotency_key}"
            + (f"  at {s.position}" if s.position is not None else "")
        )
        _echo(
            f"      dispatched {_time(s.created_at)}  claimed {_time(s.claimed_at)}  "
            f"finished {_time(s.finished_at)}  complete_by {_time(s.complete_by)}"
        )
        if s.reassignments:
            _echo(f"      reassigned {s.reassignments} time(s) (not counted as failures)")
        if s.heartbeat_at is not None:
            _echo(f"      heartbeat {_time(s.heartbeat_at)}  {_json.display(s.heartbeat)}")
        if s.call_stopped_at is not None:
            _echo(f"      call stopped {_time(s.call_stopped_at)}  (by {s.locked_by})")
        if s.error:
            _echo(f"      error: {s.error}")
    if view.children:
        _echo("children:")
        for c in view.children:
            _echo(
                f"  {c.task_id:<28} {c.process_state.value:<19} workflow {c.workflow}  "
                f"position {c.parent_position}"
            )
    if view.events:
        _echo("history (newest first):")
        for e in view.events:
            _echo(f"  {e.id:>8}  {_time(e.at)}  {e.kind:<12} {_json.display(e.detail)}")
    if view.more_events:
        older = view.events[-1].id
        _echo(f"  ... older events: stepwarden show {shlex.quote(t.task_id)} --before {older}")


def _event_bound_options(fn: F) -> F:
    """The bounds of what a task keeps of the events sent to it (App(max_events_per_task=...,
    max_event_payload=...)): those given, else the application's, else the defaults."""
    options = [
        _opt(
            "--max-events-per-task",
            envvar="STEPWARDEN_MAX_EVENTS_PER_TASK",
            default=None,
            type=click.IntRange(min=1, max=_check.MAX_INT),
            help="Refuse an event to a task that keeps this many already, taken by a wait or "
            f"not [default: the application's, else {DEFAULT_MAX_EVENTS_PER_TASK}].",
        ),
        _opt(
            "--max-event-payload",
            envvar="STEPWARDEN_MAX_EVENT_PAYLOAD",
            default=None,
            metavar="BYTES",
            type=click.IntRange(min=1, max=_json.MAX_PAYLOAD_BYTES),
            help="Refuse an event whose JSON payload has more bytes [default: the "
            f"application's, else {DEFAULT_MAX_EVENT_PAYLOAD}].",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _bounded(app: App, events: int | None, payload: int | None, like: App | None = None) -> App:
    """`app`, keeping the events sent through it within the bounds given, else those of the
    application `like` (or its own)."""
    own = (like or app).event_bounds
    app.event_bounds = EventBounds(events=events or own.events, payload=payload or own.payload)
    return app


@cli.command()
@click.argument("task_id")
@click.argument("name")
@click.argument("payload_json", required=False, default="null", metavar="[PAYLOAD_JSON]")
@_opt(
    "--event-id",
    envvar="STEPWARDEN_EVENT_ID",
    default=None,
    help="The event's id (default: a new one): an id sent before is not sent again.",
)
@_event_bound_options
@click.pass_obj
def send(
    obj: _Ctx,
    task_id: str,
    name: str,
    payload_json: str,
    event_id: str | None,
    max_events_per_task: int | None,
    max_event_payload: int | None,
) -> None:
    """Send the event NAME with PAYLOAD_JSON to TASK_ID: kept until its workflow waits for
    NAME (ctx.wait_for_event), and waking the task if it waits for it now. An --event-id
    sent before is not sent again (exit 0, said on stderr), whatever the task's state now.
    Refused (exit 1) for a finished task, or beyond --max-events-per-task or
    --max-event-payload."""
    payload = _json_argument(payload_json, "PAYLOAD_JSON", "the event's payload")
    app = _bounded(
        App("stepwarden-send", store=obj.store_url(), auto_migrate=False),
        max_events_per_task,
        max_event_payload,
        like=load_app(obj.app_ref) if obj.app_ref else None,
    )

    async def go() -> SendOutcome:
        try:
            return await app.send_event_async(task_id, name, payload, event_id=event_id)
        finally:
            await app.aclose()

    outcome = _run(go())
    if not outcome.sent:
        _echo(f"{task_id}: event {name!r} was sent before: nothing sent", err=True)
    else:
        _echo(f"{task_id}: event {name!r} sent" + (", the task woke" if outcome.woke else ""))


@cli.command()
@_opt("--json", "as_json", envvar="STEPWARDEN_JSON", is_flag=True, help="One JSON object a line.")
@click.pass_obj
def schedules(obj: _Ctx, as_json: bool) -> None:
    """List the schedules a supervisor stored: each one's timing, next tick and whether it is
    paused."""
    found = _run(_read_store(obj, lambda store: store.schedules()))
    if not as_json and not found:
        _echo("no schedule is stored (a supervisor stores the application's)")
    elif not as_json:
        _echo(f"{'SCHEDULE':<24} {'WORKFLOW':<18} {'WHEN':<18} {'STATE':<7}  NEXT")
    for s in found:
        when = s.cron if s.cron is not None else f"every {s.every:g}s"
        state = "paused" if s.paused else "active"
        line = f"{s.name:<24} {s.workflow:<18} {when:<18} {state:<7}  {_time(s.next_at)}"
        _echo_record(s, as_json, line)


@cli.command()
@click.argument("action", type=click.Choice(["pause", "resume", "trigger"]))
@click.argument("name")
@click.pass_obj
def schedule(obj: _Ctx, action: str, name: str) -> None:
    """Pause or resume the schedule NAME, or trigger it: run its workflow now, once."""
    app = App("stepwarden-schedule", store=obj.store_url(), auto_migrate=False)

    async def go() -> str:
        try:
            if action == "trigger":
                return f"{name}: task {await app.trigger_schedule_async(name)} submitted"
            await app.pause_schedule_async(name, paused=action == "pause")
            return f"{name}: {'paused' if action == 'pause' else 'resumed'}"
        finally:
            await app.aclose()

    _echo(_run(go()))


@cli.command()
@click.pass_obj
def migrate(obj: _Ctx) -> None:
    """Create or upgrade the store's schema; prints the version in place."""
    url = obj.store_url()

    async def go() -> int:
        store = open_store(url)
        await store.open(migrate=True)
        try:
            return await store.schema_version()
        finally:
            await store.close()

    _echo(f"schema version {_run(go())}")


def _operator_options(fn: F) -> F:
    """The options every operator command shares: the tasks (by id, or by filter for bulk),
    who and why, and a dry run."""
    options = [
        click.argument("task_ids", nargs=-1, metavar="[TASK]..."),
        _opt(
            "--state",
            envvar="STEPWARDEN_STATE",
            default=None,
            type=click.Choice([s.value for s in TaskState]),
            help="Bulk: every task in this state.",
        ),
        _opt("--workflow", envvar="STEPWARDEN_WORKFLOW", default=None, help="Bulk: this workflow."),
        _opt(
            "--limit",
            envvar="STEPWARDEN_LIMIT",
            default=10_000,
            show_default=True,
            type=click.IntRange(min=1, max=_check.MAX_INT),
            help="Bulk: at most this many tasks.",
        ),
        _opt("--reason", envvar="STEPWARDEN_REASON", default=None, help="Why, for the history."),
        _opt(
            "--by",
            envvar="STEPWARDEN_BY",
            default=None,
            help="Who, for the history (default: the user running this).",
        ),
        _opt(
            "--dry-run",
            envvar="STEPWARDEN_DRY_RUN",
            is_flag=True,
            help="Say what would happen; change nothing.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _operate(
    obj: _Ctx,
    action: str,
    task_ids: tuple[str, ...],
    *,
    state: str | None,
    workflow: str | None,
    limit: int,
    reason: str | None,
    by: str | None,
    dry_run: bool,
    seq: int | None = None,
    result: Any = None,
) -> None:
    if task_ids and (state or workflow):
        raise click.UsageError("name tasks, or filter with --state/--workflow, not both")
    if not task_ids and not (state or workflow):
        raise click.UsageError("name the task(s), or filter with --state and/or --workflow")
    app = obj.store_app()

    async def go() -> list[ActionOutcome]:
        try:
            return await app.operate_async(
                action,
                list(task_ids) or None,
                state=state,
                workflow=workflow,
                limit=limit,
                reason=reason,
                by=by,
                dry_run=dry_run,
                seq=seq,
                result=result,
            )
        finally:
            await app.aclose()

    outcomes = _run(go())
    refused = 0
    for o in outcomes:
        if o.applied:
            _echo(f"{o.task_id}: {o.before} -> {o.after}")
        elif (
            dry_run
            and o.before is not None
            and o.after is not None
            and o.message.startswith("would")
        ):
            _echo(f"{o.task_id}: {o.message}")
        else:
            refused += 1
            _echo(f"{o.task_id}: refused: {o.message}", err=True)
    if not outcomes:
        _echo("no task matches", err=True)
    if refused:
        raise click.ClickException(f"{refused} of {len(outcomes)} task(s) refused")


@cli.command()
@_operator_options
@_opt(
    "--plan",
    envvar="STEPWARDEN_PLAN",
    is_flag=True,
    help="Print what the retry does to each recorded step of the tasks named (kept, run "
    "again under the same idempotency key, undone first); change nothing.",
)
@click.pass_obj
def retry(obj: _Ctx, /, task_ids: tuple[str, ...], plan: bool, **options: Any) -> None:
    """Resubmit tasks in error (or whose compensation failed): their failed steps run again
    under new attempts and the same idempotency keys; completed steps are kept. With
    --plan, say so per step first, and change nothing."""
    if not plan:
        _operate(obj, "retry", task_ids, **options)
        return
    if not task_ids or options["state"] or options["workflow"]:
        raise click.UsageError(
            "--plan takes the tasks by name (the plan of a filter: stepwarden bulk retry --plan)"
        )
    app = obj.store_app()

    async def go() -> list[Redrive]:
        try:
            return [await app.retry_plan_async(t) for t in task_ids]
        finally:
            await app.aclose()

    for redrive in _run(go()):
        _echo_plan(redrive)


@cli.command()
@click.argument("task_id")
@_opt(
    "--from",
    "start",
    envvar="STEPWARDEN_FROM",
    required=True,
    metavar="POSITION",
    help="The place of the first step that runs again (1, 2, 3.1: `stepwarden show` gives "
    "each step's); the steps before it keep their recorded results.",
)
@_opt(
    "--task-id",
    "new_task_id",
    envvar="STEPWARDEN_TASK_ID",
    default=None,
    help="The new task's id [default: TASK_ID~fork- and a random suffix].",
)
@_opt(
    "--new-keys-from",
    envvar="STEPWARDEN_NEW_KEYS_FROM",
    default=None,
    type=click.IntRange(min=1, max=_check.MAX_INT),
    metavar="SEQ",
    help="The steps of this seq and after run again under new idempotency keys (NEW/seq) "
    "[default: every step runs again under the original's key, which the service "
    "deduplicates].",
)
@_opt(
    "--plan",
    envvar="STEPWARDEN_PLAN",
    is_flag=True,
    help="Print what the fork does to each recorded step (kept, run again under the same "
    "key, run again under a new key); change nothing.",
)
@_opt("--reason", envvar="STEPWARDEN_REASON", default=None, help="Why, for the history.")
@_opt(
    "--by",
    envvar="STEPWARDEN_BY",
    default=None,
    help="Who, for the history (default: the user running this).",
)
@click.pass_obj
def fork(
    obj: _Ctx,
    task_id: str,
    start: str,
    new_task_id: str | None,
    new_keys_from: int | None,
    plan: bool,
    reason: str | None,
    by: str | None,
) -> None:
    """Run a finished task again from the step at --from as a new task of the same
    workflow, version and input: the steps before it keep their recorded results, those from
    it run again under the original's idempotency keys (or new ones from --new-keys-from).
    Prints the plan per step, then what it did (nothing with --plan); exit code 1 when the
    fork is refused."""
    app = obj.store_app()

    async def go() -> Redrive:
        try:
            return await app.fork_async(
                task_id,
                start=start,
                new_task_id=new_task_id,
                new_keys_from=new_keys_from,
                plan=plan,
                by=by,
                reason=reason,
            )
        finally:
            await app.aclose()

    redrive = _run(go())
    if redrive.refused:
        raise click.ClickException(f"{task_id}: {redrive.message}")
    _echo_plan(redrive)


_PLANS = {
    "kept": "kept",
    "same_key": "run again, same key",
    "new_key": "run again, new key",
    "undone": "undone first",
}


def _echo_plan(redrive: Redrive) -> None:
    """A redrive's plan, a line per step, after a line of what it did or would do."""
    head = redrive.message
    if redrive.action == "fork" and not redrive.applied:
        head = f"would fork as {redrive.runs_as}"
    _echo(f"{redrive.task_id}: {head}")
    if redrive.steps:
        width = _width(8, (p.position or "-" for p in redrive.steps))
        names = _width(20, (p.name for p in redrive.steps))
        _echo(f"  {'SEQ':>4} {'POSITION':<{width}} {'STEP':<{names}} {'PLAN':<19}  KEY")
    for p in redrive.steps:
        _echo(
            f"  {p.seq:>4} {p.position or '-':<{width}} {p.name:<{names}} "
            f"{_PLANS[p.plan]:<19}  {p.key}"
        )


@cli.command()
@_operator_options
@click.pass_obj
def pause(obj: _Ctx, /, task_ids: tuple[str, ...], **options: Any) -> None:
    """Pause pending, processing or waiting tasks: no scheduler takes them up until resumed;
    the calls of their running steps are cancelled and the steps queued again for then."""
    _operate(obj, "pause", task_ids, **options)


@cli.command()
@_operator_options
@click.pass_obj
def resume(obj: _Ctx, /, task_ids: tuple[str, ...], **options: Any) -> None:
    """Resume paused tasks."""
    _operate(obj, "resume", task_ids, **options)


@cli.command()
@_operator_options
@_opt(
    "--compensate",
    envvar="STEPWARDEN_COMPENSATE",
    is_flag=True,
    help="Undo the steps done first (the tasks end compensated, or compensation_failed).",
)
@click.pass_obj
def cancel(obj: _Ctx, /, task_ids: tuple[str, ...], compensate: bool, **options: Any) -> None:
    """Cancel tasks: they stop for good, their open steps are closed, and the calls of their
    running steps are cancelled. It reaches their children that have not ended (and
    theirs), newest first."""
    _operate(obj, "compensate" if compensate else "cancel", task_ids, **options)


@cli.command()
@click.argument("action", type=click.Choice(BULK_ACTIONS))
@_filter_options(
    " Only those in a state the action moves are reached (retry: error, "
    "compensation_failed; resume: paused; ...)."
)
@_opt(
    "--plan",
    envvar="STEPWARDEN_PLAN",
    is_flag=True,
    help="Print how many tasks match (per workflow and version, per move; for a retry their "
    "steps kept and run again) and the first 5 by id; change nothing.",
)
@_opt(
    "--yes",
    envvar="STEPWARDEN_YES",
    is_flag=True,
    help="Act without asking first (otherwise the plan is printed and a yes asked for).",
)
@_opt(
    "--batch",
    envvar="STEPWARDEN_BATCH",
    default=100,
    show_default=True,
    type=click.IntRange(min=1, max=10_000),
    help="Tasks acted on per batch (a line of progress each).",
)
@_opt(
    "--limit",
    envvar="STEPWARDEN_LIMIT",
    default=None,
    type=click.IntRange(min=1, max=_check.MAX_INT),
    help="At most this many tasks [default: every one that matches].",
)
@_opt(
    "--after",
    envvar="STEPWARDEN_AFTER",
    default="",
    metavar="TASK",
    help="Only the tasks whose id comes after this one: the last id an interrupted run printed.",
)
@_opt(
    "--from",
    "start",
    envvar="STEPWARDEN_FROM",
    default=None,
    metavar="POSITION",
    help="fork: the place of the first step that runs again (as `stepwarden fork --from`).",
)
@_opt(
    "--as",
    "fork_name",
    envvar="STEPWARDEN_AS",
    default=None,
    metavar="NAME",
    help="fork: each fork's id is TASK~NAME; the same NAME again forks no task twice.",
)
@_opt(
    "--new-keys-from",
    envvar="STEPWARDEN_NEW_KEYS_FROM",
    default=None,
    type=click.IntRange(min=1, max=_check.MAX_INT),
    metavar="SEQ",
    help="fork: the steps of this seq and after run again under new idempotency keys.",
)
@_opt("--reason", envvar="STEPWARDEN_REASON", default=None, help="Why, for the history.")
@_opt(
    "--by",
    envvar="STEPWARDEN_BY",
    default=None,
    help="Who, for the history (default: the user running this).",
)
@click.pass_obj
def bulk(
    obj: _Ctx,
    action: str,
    match: TaskFilter,
    plan: bool,
    yes: bool,
    batch: int,
    limit: int | None,
    after: str,
    start: str | None,
    fork_name: str | None,
    new_keys_from: int | None,
    reason: str | None,
    by: str | None,
) -> None:
    """Apply ACTION (retry, cancel, compensate, pause, resume, fork) to every task that matches
    the filter and is in a state the action moves, by task id, a batch at a time, each task
    as `stepwarden ACTION TASK` would (the same rules, a history entry each). With --plan,
    print what it would do and change nothing; without --plan or --yes, print it and ask
    for a yes first. Acting, it prints a line per batch: the tasks acted on,
    those refused (moved meanwhile), and the last task id reached. Resumable: a task acted
    on no longer matches, so the same command again goes on with the rest (--after LAST
    also skips those before LAST, one retried that has failed again among them). Exit code
    1 when a task was refused. A fork (--from, --as) forks each finished task as
    TASK~NAME, as `stepwarden fork` does; a task forked so already is skipped, and the forks
    are left alone."""
    fork = None
    if action == "fork":
        if start is None or fork_name is None:
            raise click.UsageError("bulk fork needs --from POSITION and --as NAME")
        fork = BulkFork(start=start, name=fork_name, new_keys_from=new_keys_from)
    elif start is not None or fork_name is not None or new_keys_from is not None:
        raise click.UsageError("--from, --as and --new-keys-from are a bulk fork's")
    app = obj.store_app()

    def counts(p: BulkProgress) -> str:
        before = f", {p.skipped} forked before" if action == "fork" else ""
        return f"{p.acted} acted, {p.refused} refused{before}"

    def said(p: BulkProgress) -> None:
        _echo(f"{action}: {counts(p)}, through {p.last}")

    async def go() -> BulkProgress | None:
        try:
            if plan or not yes:
                found = await app.bulk_plan_async(match, action, after=after, fork=fork)
                _echo_bulk_plan(found)
                if plan or not found.matched:
                    return None
                click.confirm(f"{action} {found.matched} task(s)?", abort=True, err=True)
            return await app.bulk_async(
                match, action, batch=batch, limit=limit, after=after, fork=fork, reason=reason,
                by=by, progress=said,
            )  # fmt: skip
        finally:
            await app.aclose()

    ended = _run(go())
    if ended is None:
        return
    if ended.done:
        _echo(f"{action}: done: {counts(ended)}")
    else:
        _echo(f"{action}: stopped at the limit: {counts(ended)}; go on with --after {ended.last}")
    if ended.refused:
        raise click.ClickException(f"{ended.refused} task(s) refused (they moved meanwhile)")


def _echo_bulk_plan(plan: BulkPlan) -> None:
    """A bulk action's plan: the count, per workflow and version, per move, the steps, the
    sample."""
    _echo(f"{plan.action}: {plan.matched} task(s) match")
    for (name, version), n in sorted(plan.by_workflow.items()):
        _echo(f"  {name} v{version}: {n}")
    for move, n in sorted(plan.moves.items()):
        _echo(f"  {move}: {n}")
    if plan.skipped:
        _echo(f"  forked before: {plan.skipped}")
    if plan.steps:
        steps = ", ".join(f"{plan.steps[k]} {_PLANS[k]}" for k in _PLANS if k in plan.steps)
        _echo(f"  steps: {steps}")
    if plan.sample:
        _echo(f"  first: {' '.join(plan.sample)}")


@cli.command()
@click.argument("task_id")
@_opt(
    "--step",
    "seq",
    envvar="STEPWARDEN_STEP",
    required=True,
    type=click.IntRange(min=1, max=_check.MAX_INT),
    help="The step's seq.",
)
@_opt(
    "--result",
    "result_json",
    envvar="STEPWARDEN_RESULT",
    default="null",
    show_default=True,
    help='The step\'s result, as JSON ({"$secret": VALUE} is a Secret).',
)
@_opt("--reason", envvar="STEPWARDEN_REASON", default=None, help="Why, for the history.")
@_opt("--by", envvar="STEPWARDEN_BY", default=None, help="Who, for the history.")
@click.pass_obj
def skip(
    obj: _Ctx, task_id: str, seq: int, result_json: str, reason: str | None, by: str | None
) -> None:
    """Mark a stuck step completed with a given result, as if its operation returned it."""
    value = _json_argument(result_json, "--result", "the step result")
    _operate(
        obj,
        "skip",
        (task_id,),
        state=None,
        workflow=None,
        limit=1,
        reason=reason,
        by=by,
        dry_run=False,
        seq=seq,
        result=value,
    )


@cli.command()
@_opt(
    "--older-than",
    envvar="STEPWARDEN_OLDER_THAN",
    default=DEFAULT_RETENTION,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds since the task finished.",
)
@_opt(
    "--batch",
    envvar="STEPWARDEN_BATCH",
    default=500,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tasks deleted per transaction.",
)
@_opt(
    "--tenant",
    envvar="STEPWARDEN_TENANT",
    default=None,
    metavar="NAME",
    help='Only the tasks of this tenant ("": those of none) [default: every tenant\'s].',
)
@click.pass_obj
def purge(obj: _Ctx, older_than: float, batch: int, tenant: str | None) -> None:
    """Delete finished tasks (processed, compensated, cancelled) older than --older-than,
    of one tenant with --tenant, with their steps and history. Tasks in error wait for
    their operator and are kept."""
    url = obj.store_url()

    async def go() -> int:
        if tenant:
            _check.tenant(tenant)
        store = open_store(url)
        await store.open(migrate=False)
        try:
            total = 0
            while True:
                n = await store.purge(older_than, batch, tenant)
                total += n
                if n < batch:
                    return total
        finally:
            await store.close()

    _echo(f"purged {_run(go())} task(s)")


@cli.command()
@click.argument("app_ref", required=False, metavar="[MODULE:ATTR]")
@_opt(
    "--host",
    envvar="STEPWARDEN_DASHBOARD_HOST",
    default="127.0.0.1",
    show_default=True,
    help="The address to listen on (127.0.0.1: this machine only).",
)
@_opt(
    "--port",
    envvar="STEPWARDEN_DASHBOARD_PORT",
    default=8080,
    show_default=True,
    type=click.IntRange(min=0, max=65535),
    help="The port to listen on (0: any free one).",
)
@_opt(
    "--token",
    envvar="STEPWARDEN_DASHBOARD_TOKEN",
    default=None,
    help="The API token operator actions need, at least 16 characters. Given as an option it "
    "shows in the process list: prefer the variable or --token-file. Given neither, a new one "
    "is written to a file only you may read, under $XDG_STATE_HOME/stepwarden (by default "
    "~/.local/state/stepwarden), its path printed; the file is removed when the dashboard "
    "stops.",
)
@_opt(
    "--token-file",
    envvar="STEPWARDEN_DASHBOARD_TOKEN_FILE",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Read the API token from this file (its surrounding whitespace ignored). A file its "
    "group or others may read or write is refused (chmod 600).",
)
@_opt(
    "--allowed-host",
    "allowed_hosts",
    envvar="STEPWARDEN_DASHBOARD_ALLOWED_HOST",
    multiple=True,
    metavar="NAME",
    help="Also serve requests addressed to this host name or address (repeatable; the "
    "variable is space-separated). Served always: localhost, 127.0.0.1, ::1 and the --host "
    "address; any other Host header is refused.",
)
@_opt(
    "--auth-reads/--no-auth-reads",
    envvar="STEPWARDEN_DASHBOARD_AUTH_READS",
    default=None,
    help="Reads (pages, API, metrics) need the API token or a signed-in session too "
    "[default: on, unless --host is a loopback address, where only a request that came "
    "through a proxy (Forwarded, X-Forwarded-For) needs them].",
)
@_opt(
    "--api-tokens",
    envvar="STEPWARDEN_API_TOKENS",
    default=None,
    metavar="FILE",
    type=click.Path(exists=True, dir_okay=False),
    help="The application API's and the agent protocol's clients (/api/v1): one `NAME "
    "SCOPES SHA256 [SETTING=VALUE ...]` line each, as `stepwarden api-token` makes them "
    "(scopes submit, read, events, cancel, agent:NAME, separated by commas; only the token's "
    "SHA-256 digest is kept; the settings bound what the client may ask), and one line "
    "`defaults SETTING=VALUE ...` for every client. Read at start, and again within about a "
    "second of each change (a file become wrong keeps the clients read before, and logs the "
    "error). Without it, every request of /api/v1 is refused. A file others may write is "
    "refused.",
)
@_destinations_option(
    "A client's `destinations` setting names the entries it may name; the App's own code "
    "may name any."
)
@_opt(
    "--forwarded-allow-ips",
    envvar="STEPWARDEN_FORWARDED_ALLOW_IPS",
    default="",
    metavar="ADDRESSES",
    help="The reverse proxies whose X-Forwarded-For and X-Forwarded-Proto headers are "
    "believed (the client's address for the count of wrong tokens, https for the session "
    "cookie): addresses or networks separated by commas (10.0.0.0/8), or * for any. Given "
    "none (the default), every request counts against its peer's address, whatever it says.",
)
@_opt(
    "--header-timeout",
    envvar="STEPWARDEN_DASHBOARD_HEADER_TIMEOUT",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.1, max=3600),
    help="Seconds a connection has to send a request's headers whole (from its start, or "
    "from the end of the previous answer); past them it is closed (answered 408 if it had "
    "sent part of a request).",
)
@_opt(
    "--body-timeout",
    envvar="STEPWARDEN_DASHBOARD_BODY_TIMEOUT",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0.1, max=3600),
    help="Seconds a request has to send its body whole, once its headers have arrived; past "
    "them it is answered 408 and closed.",
)
@_opt(
    "--max-connections",
    envvar="STEPWARDEN_DASHBOARD_MAX_CONNECTIONS",
    default=4096,
    show_default=True,
    type=click.IntRange(min=1),
    help="Connections open at once (long polls and streams included), never more than the "
    "open-file limit allows (less the files open at start and 64 more; the soft limit is "
    "raised toward the hard one if need be). Past it, a new connection takes the place of "
    "one that has waited over a second for its request's headers, or is answered 503.",
)
@_event_bound_options
@click.pass_obj
def dashboard(
    obj: _Ctx,
    app_ref: str | None,
    host: str,
    port: int,
    token: str | None,
    token_file: str | None,
    allowed_hosts: tuple[str, ...],
    auth_reads: bool | None,
    api_tokens: str | None,
    destinations: str | None,
    forwarded_allow_ips: str,
    header_timeout: float,
    body_timeout: float,
    max_connections: int,
    max_events_per_task: int | None,
    max_event_payload: int | None,
) -> None:
    """Serve the operator's dashboard: pages, a JSON API (/openapi.json) and /metrics; and
    the application API that services call with their clients' tokens (/api/v1: submit,
    status, result, status messages, events, cancel; /api/v1/openapi.json)."""
    try:
        from . import dashboard as web
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs the dashboard extra: pip install 'stepwarden[dashboard]' ({exc})"
        ) from exc
    try:
        proxies = web.forwarded_allow_ips(forwarded_allow_ips)
    except StepwardenError as exc:
        raise click.BadParameter(_one_line(exc), param_hint="--forwarded-allow-ips") from exc
    token = _dashboard_token(token, token_file)
    if app_ref or obj.app_ref:
        app = obj.app(app_ref)
    else:  # no App of its own: named by the store it serves
        url = obj.store_url()
        app = App(cut(escape(shown_url(url)), _check.MAX_NAME), store=url, auto_migrate=False)
    _listed(app, destinations)
    clients = None
    if api_tokens is not None:
        try:
            clients = _tokens.read(api_tokens, app.destinations.names())
        except StepwardenError as exc:
            raise click.BadParameter(_one_line(exc), param_hint="--api-tokens") from exc
    _bounded(app, max_events_per_task, max_event_payload)
    try:
        sock = web.bind(host, port)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from exc
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"stepwarden dashboard of {app.name}: http://{shown}:{sock.getsockname()[1]}/")
    if auth_reads is None and not web.is_loopback(host):
        auth_reads = True
    if auth_reads:
        click.echo("reads need the API token or a signed-in session (--auth-reads)")
    if clients is not None:
        _echo(f"application API (/api/v1): {len(clients)} client(s) of {api_tokens}")
    room, open_files = web.connection_room(max_connections)
    if room < max_connections:
        _echo(
            f"at most {room} connections at once (--max-connections {max_connections}): the "
            f"open-file limit is {open_files} (ulimit -n)"
        )
    limits = web.Limits(
        header_timeout=header_timeout, body_timeout=body_timeout, max_connections=room
    )
    written = None
    if token is None:
        try:
            token, written = web.write_new_token()
        except StepwardenError as exc:
            sock.close()
            raise click.ClickException(
                f"{_one_line(exc)}; give a token by --token-file or STEPWARDEN_DASHBOARD_TOKEN"
            ) from exc
        click.echo(f"API token (for operator actions) written to {escape(str(written))}")
    try:
        with _removed_at_exit(written):
            web.serve(
                app,
                sock,
                token=token,
                allowed_hosts=allowed_hosts,
                auth_reads=auth_reads,
                api_tokens=api_tokens,
                forwarded_allow_ips=proxies,
                limits=limits,
            )
    except StepwardenError as exc:
        raise click.ClickException(_one_line(exc)) from exc
    finally:
        sock.close()


@cli.command("api-token")
@click.argument("name")
@_opt(
    "--scope",
    "scopes",
    envvar="STEPWARDEN_API_TOKEN_SCOPE",
    multiple=True,
    required=True,
    metavar="SCOPE",
    help="What the client may do (repeatable; the variable is space-separated): submit "
    "(tasks), read (their status, result and status messages), events (send them events), "
    "cancel (them), agent:NAME (serve the agent NAME over the agent protocol, "
    "/api/v1/agents/NAME/...; its instances are named CLIENT/...).",
)
@_opt(
    "--set",
    "settings",
    envvar="STEPWARDEN_API_TOKEN_SET",
    multiple=True,
    metavar="SETTING=VALUE",
    help="A setting of the client, on its line (repeatable; the variable is space-separated); "
    "one not set is the tokens file's `defaults` line's, else its default. "
    + _tokens.settings_help()
    + ".",
)
@_opt(
    "--append",
    envvar="STEPWARDEN_API_TOKEN_APPEND",
    default=None,
    metavar="FILE",
    help="Append the client's line to this tokens file (made, 0600, when missing) instead of "
    "printing it; a name the file has already is refused.",
)
def api_token(
    name: str, scopes: tuple[str, ...], settings: tuple[str, ...], append: str | None
) -> None:
    """Make a client of the application API: a new token, printed once (only its SHA-256
    digest is kept), and the client's line for the tokens file (`stepwarden dashboard
    --api-tokens FILE`), with its settings (--set); a dashboard serving that file takes it
    up within about a second."""
    try:
        token, client = _tokens.new_client(name, scopes, settings)
    except StepwardenError as exc:
        raise click.BadParameter(_one_line(exc), param_hint="NAME, --scope or --set") from exc
    if append is not None:
        _append_client(Path(append), client)
    click.echo(f"the token of {client.name} (shown once; give it to the client):")
    click.echo(token)
    if append is None:
        click.echo("its line for the tokens file (--api-tokens FILE):")
        click.echo(client.line())
    else:
        _echo(f"its line is added to {append}: a dashboard serving it takes it up within a second")


def _append_client(path: Path, client: _tokens.Client) -> None:
    """Add the client's line to the tokens file at `path`, checked with it."""
    try:
        text = path.read_text() if path.exists() else ""
        _tokens.parse(text + "\n" + client.line(), repr(str(path)))
        if path.exists():
            _tokens.read(path)  # its mode, as the dashboard checks it
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as file:
            file.write(("" if not text or text.endswith("\n") else "\n") + client.line() + "\n")
    except OSError as exc:
        raise click.ClickException(f"cannot add the client to {path}: {exc}") from exc
    except StepwardenError as exc:
        raise click.ClickException(_one_line(exc)) from exc


class _Terminated(BaseException):
    """SIGTERM, raised where the process is so that its files are removed on the way out."""


@contextlib.contextmanager
def _removed_at_exit(path: Path | None) -> Iterator[None]:
    """Remove the file at `path` (the generated token's, dead with this process) when the
    block ends, SIGTERM included: the server re-raises the SIGTERM it shut down on, which
    would otherwise end the process at once. It still ends by SIGTERM, as it would have."""
    if path is None:
        yield
        return

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except _Terminated:
        path.unlink(missing_ok=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
        path.unlink(missing_ok=True)


def _dashboard_token(token: str | None, token_file: str | None) -> str | None:
    """The API token given (by --token, its variable or --token-file), checked; None when
    none is."""
    from .dashboard import check_token, read_token_file

    if token is not None and token_file is not None:
        raise click.UsageError(
            "give the API token once: --token (or STEPWARDEN_DASHBOARD_TOKEN) or --token-file"
        )
    hint = "--token-file" if token_file is not None else "--token"
    try:
        if token_file is not None:
            return read_token_file(token_file)
        if token is not None:
            check_token(token)
    except StepwardenError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from exc
    source = click.get_current_context().get_parameter_source("token")
    if source is click.core.ParameterSource.COMMANDLINE:
        _echo(
            "warning: --token shows in the process list to every user of this machine; "
            "give it by --token-file or STEPWARDEN_DASHBOARD_TOKEN",
            err=True,
        )
    return token


@cli.group(invoke_without_command=True)
@_opt("--json", "as_json", envvar="STEPWARDEN_JSON", is_flag=True, help="One JSON object a line.")
@click.pass_context
def tenants(ctx: click.Context, as_json: bool) -> None:
    """The tenants of the fair share of claims: each one's weight (1 unless set) and pass
    (how far its claims have gone), and the fair clock. Under saturation each tenant with
    tasks waiting gets claims in proportion to its weight; by priority within it. On a store
    of shards, each shard shares its own claims."""
    if ctx.invoked_subcommand is not None:
        return
    found = _run(_read_store(ctx.obj, lambda store: store.tenant_weights()))
    if not as_json:
        _echo(f"{'TENANT':<24} {'WEIGHT':>8} {'PASS':>12}")
    for t in found:
        _echo_record(t, as_json, f"{t.tenant or '-':<24} {t.weight:>8g} {t.pass_:>12.3f}")


@tenants.command("weight")
@click.argument("tenant")
@click.argument("weight", type=click.FloatRange(min=0, min_open=True, max=1e6))
@click.pass_obj
def tenants_weight(obj: _Ctx, tenant: str, weight: float) -> None:
    """Set TENANT's WEIGHT in the fair share of claims (a number above 0, 1 by default;
    "" for the tasks of no tenant): every scheduler's next claim reads it, without a
    restart."""

    async def go(store: Store | ShardedStore) -> None:
        if tenant:
            _check.tenant(tenant)
        await store.set_tenant_weight(tenant, weight)

    _run(_read_store(obj, go))
    _echo(f"tenant {tenant or '(none)'}: weight {weight:g}")


@cli.group()
def keys() -> None:
    """The keyring that seals secrets at rest (STEPWARDEN_KEYRING names its file). A key is
    never printed: it is written to the file, which only its owner may read."""


@keys.command("new")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def keys_new(file: Path) -> None:
    """Make a new keyring file (0600; one that exists is refused): a digest key, which keys
    the digests a re-submit is compared by and is never changed, and a seal key."""
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise click.ClickException(f"cannot make the keyring {file}: {exc.strerror}") from exc
    with os.fdopen(fd, "w") as out:
        out.write(sealing.new_keyring())
    _echo(f"made the keyring {file}: give its path to every process (STEPWARDEN_KEYRING)")


@keys.command("rotate")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def keys_rotate(file: Path) -> None:
    """Add a new seal key to the keyring FILE, after the others: once every process reads
    the new file (restart them), it seals new writes, and `stepwarden reseal` moves what the
    older keys sealed to it; remove an older key from the file only after that."""
    try:
        sealing.Keyring.from_file(file)  # its mode, and its text
        text, key_id = sealing.rotated(file.read_text(), repr(str(file)))
        fd = os.open(file, os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "w") as out:
            out.write(text)
    except OSError as exc:
        raise click.ClickException(f"cannot rotate the keyring {file}: {exc.strerror}") from exc
    except StepwardenError as exc:
        raise click.ClickException(_one_line(exc)) from exc
    _echo(f"added the seal key {key_id} to {file}; restart every process, then reseal")


@cli.command()
@_opt(
    "--batch",
    envvar="STEPWARDEN_BATCH",
    default=500,
    show_default=True,
    type=click.IntRange(min=1),
    help="Rows looked at per transaction.",
)
@click.pass_obj
def reseal(obj: _Ctx, batch: int) -> None:
    """Seal every secret of the store under the keyring's newest seal key (STEPWARDEN_KEYRING
    or STEPWARDEN_KEYS): those sealed under an older key, and those stored plain before a
    keyring was set; and key every task's input digest. In batches, each its own
    transaction, while workers run; stopped, run it again: what is done is skipped. Once a
    whole pass finds nothing left, the store forgets the older keys, and they may go from
    the keyring. Exits 1 when a value does not open (a key the keyring lacks)."""
    url = obj.store_url()
    try:
        ring = sealing.Keyring.from_env()
    except StepwardenError as exc:
        raise click.ClickException(_one_line(exc)) from exc
    if ring is None:
        raise click.ClickException(
            "reseal needs the keyring: STEPWARDEN_KEYRING (its file) or STEPWARDEN_KEYS"
        )

    async def go() -> tuple[int, int, list[str], list[str]]:
        store = open_store(url, keys=ring)
        if isinstance(store, ShardedStore):  # each shard's rows are resealed on its own
            raise ConfigurationError("reseal runs on one database: run it with each shard's URL")
        await store.open(migrate=False)
        try:
            total = failed = moved = 0
            errors: list[str] = []
            for _ in range(3):  # a pass that changes nothing says every value is current
                moved = failed = 0
                for place in PLACES:
                    cursor: Cursor | None = Cursor(place)
                    done = 0
                    while cursor is not None:
                        got = await store.reseal(cursor, batch)
                        done += got.resealed
                        failed += got.failed
                        errors.extend(e for e in got.errors if e not in errors)
                        cursor = got.next
                    if done:
                        _echo(f"{place}: {done} resealed")
                    moved += done
                total += moved
                if not moved:
                    break
            dropped: list[str] = []
            if not moved and not failed:
                dropped = [k for k in await store.sealing_keys() if k != ring.current]
                await store.drop_sealing_keys(dropped)
            return total, failed, errors[:5], dropped
        finally:
            await store.close()

    total, failed, errors, dropped = _run(go())
    _echo(f"resealed {total} record(s) under the key {ring.current}")
    if dropped:
        _echo(f"no value is sealed under {', '.join(dropped)} any more: the keyring may drop it")
    if failed:
        for error in errors:
            _echo(error, err=True)
        raise click.ClickException(f"{failed} value(s) did not open: they are left as they were")


# -- an upgrade checked against the tasks in flight ------------------------------------------
@cli.command("export-tasks")
@click.argument("file", type=click.Path(dir_okay=False, writable=True))
@_opt("--workflow", envvar="STEPWARDEN_WORKFLOW", default=None, help="Only this workflow.")
@_opt(
    "--limit",
    envvar="STEPWARDEN_LIMIT",
    default=upgrade.DEFAULT_LIMIT,
    show_default=True,
    type=click.IntRange(min=1, max=_check.MAX_INT),
    help="At most this many tasks of each state, oldest first.",
)
@click.pass_obj
def export_tasks(obj: _Ctx, file: str, workflow: str | None, limit: int) -> None:
    """Write the tasks an upgrade's new code would replay (every task not processed,
    compensated or cancelled), with their steps and waits, to FILE: a JSON document only its
    owner may read, for `check-upgrade --from-file` (in CI, say). Sealed secrets are written
    sealed, as the store holds them; secrets stored plain are masked. Reads only: the store
    is opened read-only."""
    url = obj.store_url()

    async def go() -> tuple[bytes, int, int]:
        store = open_one(url, read_only=True)
        await store.open(migrate=False)
        try:
            found = await upgrade.in_flight(store, workflow=workflow, limit=limit)
        finally:
            await store.close()
        document, masked = upgrade.export(found, source=shown_url(url), now=datetime.now(UTC))
        return document, len(found), masked

    document, count, masked = _run(go())
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(document)
    note = f"; {masked} secret(s) stored plain were masked" if masked else ""
    _echo(f"exported {count} task(s) to {file}{note}")


@cli.command("check-upgrade")
@click.argument("new_app", metavar="NEW_MODULE:APP")
@_opt(
    "--from-file",
    "from_file",
    envvar="STEPWARDEN_FROM_FILE",
    default=None,
    metavar="FILE",
    type=click.Path(exists=True, dir_okay=False),
    help="Check the tasks of this file of `stepwarden export-tasks` instead of a store's.",
)
@_opt("--workflow", envvar="STEPWARDEN_WORKFLOW", default=None, help="Only this workflow.")
@_opt(
    "--limit",
    envvar="STEPWARDEN_LIMIT",
    default=upgrade.DEFAULT_LIMIT,
    show_default=True,
    type=click.IntRange(min=1, max=_check.MAX_INT),
    help="At most this many tasks of each state, oldest first (a store's).",
)
@_opt("--json", "as_json", envvar="STEPWARDEN_JSON", is_flag=True, help="Print one JSON document.")
@click.pass_obj
def check_upgrade(
    obj: _Ctx, new_app: str, from_file: str | None, workflow: str | None, limit: int, as_json: bool
) -> None:
    """Replay, with the new code of NEW_MODULE:APP, every task it would run (those not
    processed, compensated or cancelled) against its recorded steps and waits, as a
    scheduler resumes it, calling no agent and writing nothing (the store is opened
    read-only). Lists the tasks whose replay diverges (the position, what is recorded there,
    what the new code asks for), those whose workflow version the new code no longer
    declares, those it makes raise, and a summary per workflow and version. The tasks come
    from the store (--store, or the new App's) or from --from-file. Sealed secrets open with
    the keyring (STEPWARDEN_KEYRING or STEPWARDEN_KEYS); without it they are replayed masked,
    and the report says how many tasks were. Exits 1 when a task would break, 0 otherwise."""
    app = load_app(new_app)
    try:
        keys = sealing.Keyring.from_env()
    except StepwardenError as exc:
        raise click.ClickException(_one_line(exc)) from exc
    operations = {op.qualname: op for a in app.agents.values() for op in a.operations.values()}
    url = None if from_file is not None else (obj.store or app.store_url)
    exported = None
    if from_file is not None:
        try:
            exported = Path(from_file).read_bytes()
        except OSError as exc:
            raise click.BadParameter(str(exc), param_hint="--from-file") from exc

    async def go() -> upgrade.Report:
        masked = 0
        if exported is not None:
            found, masked = upgrade.load(exported, keys)
            if workflow is not None:
                found = [t for t in found if t.task.workflow == workflow]
        else:
            assert url is not None
            store = open_one(url, keys=keys, read_only=True)
            await store.open(migrate=False)
            try:
                found = await upgrade.in_flight(store, workflow=workflow, limit=limit)
            finally:
                await store.close()
        return await upgrade.check(
            found, app.workflow_versions, operations, keys, masked_in_file=masked
        )

    report = _run(go())
    if as_json:
        _echo_json(orjson.dumps(report.as_dict()).decode())
    else:
        _echo_report(report)
    if not report.ok:
        click.get_current_context().exit(1)


def _echo_report(report: upgrade.Report) -> None:
    _echo(
        f"{report.checked} task(s) checked: {report.breaking} would break"
        + ("" if report.breaking else ", none diverges")
    )
    for t in report.tasks:
        if t.outcome == upgrade.Outcome.REPLAYS:
            continue
        where = "" if t.position is None else f" at position {t.position}"
        _echo(
            f"{t.outcome.upper():<11}  {t.task_id}  {t.workflow}@{t.version}  {t.state}{where}"
            + ("" if t.breaks else "  (does not break)")
        )
        if t.recorded is not None:
            _echo(f"    recorded:  {t.recorded}")
            _echo(f"    new code:  {t.asked}")
        if t.message is not None:
            _echo(f"    {t.message}")
    for s in report.summary:
        counts = ", ".join(f"{n} {o}" for o, n in s.counts.items() if n)
        declared = "declared" if s.declared else "NOT DECLARED by the new code"
        _echo(f"{s.workflow}@{s.version} ({declared}): {s.tasks} task(s): {counts}")
    if report.masked:
        _echo(
            f"{report.masked} task(s) hold sealed secrets, replayed masked: no keyring was given "
            "(STEPWARDEN_KEYRING or STEPWARDEN_KEYS); a workflow that reveals one is not checked"
        )
    if report.masked_in_file:
        _echo(f"the export masked {report.masked_in_file} secret(s) stored plain")


def _datetime(text: str, option: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise click.BadParameter(f"not an ISO 8601 time: {exc}", param_hint=option) from exc
    if value.tzinfo is None:
        raise click.BadParameter("give the time with its time zone (+00:00)", param_hint=option)
    return value


def _time(value: datetime | None) -> str:
    return value.isoformat(timespec="milliseconds") if value else "-"


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _task_dict(t: TaskRecord) -> dict[str, Any]:
    return {k: _plain(getattr(t, k)) for k in t.__dataclass_fields__}


def main() -> None:
    cli(prog_name="stepwarden")
