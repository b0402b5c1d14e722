"""Hostile input at every public entry point: wrong types, out-of-range numbers, oversized and
deeply nested payloads, unknown names, control characters, and text that is not valid Unicode
(a lone surrogate; an undecodable byte of a command-line argument becomes one). Each is refused
with its documented error class (or exit status) and one line naming the bad value, before
anything is written: the store holds the same rows after as before, on SQLite and PostgreSQL.

What test_bad_input.py and test_api_bad_input.py already check is not repeated here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import stepwarden as sw
from stepwarden._json import MAX_PAYLOAD_BYTES
from tests.conftest import STORES, pg_database, unique

from ..support.worker import running
from . import cli_app
from .helpers import APP, assert_refused, error_line, invoke, is_sqlite, run, sqlite_path

LONG = "x" * 10_000
BIG = "x" * MAX_PAYLOAD_BYTES
"""A string whose JSON (with its quotes) is 2 bytes over the payload limit."""
NAN = float("nan")
XFF = os.fsdecode(b"\xff")
"""The byte 0xff, which is not UTF-8, as Python receives it in a command-line argument."""

NAME_LIMIT = "must be a string of 1 to 200 characters"
CONTROL = "must not contain control characters"
NOT_UNICODE = "is not valid Unicode text (an undecodable byte or a lone surrogate)"
INT_RANGE = "must be an integer from 1 to 2147483647"
PRIORITY_RANGE = "priority must be an integer from -2147483648 to 2147483647"
TIMEOUT = "timeout must be a timedelta or a number of seconds, at least 0"
REASON_LIMIT = "reason must be a string of at most 1000 characters"
NOT_JSON = "is not JSON-serialisable"
NOT_UTF8 = "str is not valid UTF-8"
OVER_LIMIT = f"over the limit of {MAX_PAYLOAD_BYTES}"
RESERVED = "holds a dict with the reserved key '$secret' or '$sealed'"


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def nested_json(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


DEEP_SECRET = nested_json(500, '{"$secret": 1}')
"""A secret 500 levels deep: within what JSON parsers read, beyond what a payload may be."""
DEEPER = "is nested deeper than 254 levels"


# -- a store holding one pending task, shared by the tests of a module on each store -------


@pytest.fixture(scope="module", params=STORES)
def seeded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A migrated store holding `t-1`, pending (an action that reached it would apply), with
    status messages on the channel `shop`."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'store.db'}"
        seed(url)
        yield url
        return
    with pg_database(unique("sw_hostile"), request.getfixturevalue("pg_template")) as url:
        seed(url)
        yield url


def seed(url: str) -> None:
    app = cli_app.build(url)
    try:
        app.submit("process", {"n": 1}, task_id="t-1", reply_to="shop")
    finally:
        app.close()


@pytest.fixture(scope="module")
def seeded_app(seeded: str) -> Iterator[sw.App]:
    app = cli_app.build(seeded)
    try:
        yield app
    finally:
        app.close()


ROWS = [
    "SELECT version, name FROM stepwarden_schema ORDER BY version",
    *(
        f"SELECT count(*) FROM stepwarden_{table}"
        for table in ("tasks", "steps", "events", "outbox")
    ),
    "SELECT process_state, attempt, updated_at FROM stepwarden_tasks WHERE task_id = 't-1'",
]


def rows(url: str) -> list[list[tuple[Any, ...]]]:
    """Everything a refused call could have written: the schema, tasks, steps, events, status
    messages and alerts, and the state of `t-1` (read in one connection)."""
    if is_sqlite(url):
        with contextlib.closing(sqlite3.connect(sqlite_path(url))) as conn:
            return [conn.execute(q).fetchall() for q in ROWS]
    with psycopg.connect(url, autocommit=True) as conn:
        return [conn.execute(q.encode()).fetchall() for q in ROWS]


# -- the App ---------------------------------------------------------------------------
# The arguments of the wrong type are wrong on purpose: a `type: ignore` marks each.

Call = Callable[[sw.App], object]


def _first(messages: Any) -> object:
    """The first item of an async iterator of the App (watch, subscribe), in a loop of its
    own: the check of its arguments runs on the first step."""

    async def first() -> object:
        return await anext(messages)

    return asyncio.run(first())


REFUSED: list[tuple[Call, str]] = [
    # submit: the task id, the priority, the channel
    (lambda a: a.submit("process", {}, task_id=5), f"task_id {NAME_LIMIT}, not 5"),  # type: ignore[call-overload]
    (lambda a: a.submit("process", {}, task_id=LONG), "not 'xxxxx"),
    (lambda a: a.submit("process", {}, task_id=LONG), "(10000 characters)"),
    (lambda a: a.submit("process", {}, task_id="a\x00"), f"task_id {CONTROL}: 'a\\x00'"),
    (lambda a: a.submit("process", {}, task_id="a\ud800"), f"task_id {NOT_UNICODE}: 'a\\ud800'"),
    (lambda a: a.submit("process", {}, task_id="a\x7f"), f"{CONTROL}: 'a\\x7f' holds U+007F"),
    (lambda a: a.submit("process", {}, task_id="a\x85"), f"{CONTROL}: 'a\\x85' holds U+0085"),
    (lambda a: a.submit("process", {}, task_id="a\u202eb"), "'a\\u202eb' holds U+202E"),
    (lambda a: a.submit("process", {}, task_id="a\u2066b"), "'a\\u2066b' holds U+2066"),
    (lambda a: a.submit("process", {}, task_id="a\u2028b"), "'a\\u2028b' holds U+2028"),
    (lambda a: a.submit("process", {}, task_id="."), "task_id must not be '.'"),
    (lambda a: a.submit("process", {}, task_id=".."), "task_id must not be '..'"),
    (lambda a: a.submit("process", {}, task_id=XFF), f"task_id {NOT_UNICODE}: '\\udcff'"),
    (lambda a: a.submit("process", {}, priority=2**31), f"{PRIORITY_RANGE}, not 2147483648"),
    (lambda a: a.submit("process", {}, priority=-(2**31) - 1), f"{PRIORITY_RANGE}, not -2147"),
    (lambda a: a.submit("process", {}, priority=1.5), f"{PRIORITY_RANGE}, not 1.5"),  # type: ignore[call-overload]
    (lambda a: a.submit("process", {}, reply_to=5), f"reply_to {NAME_LIMIT}, not 5"),  # type: ignore[call-overload]
    (lambda a: a.submit("process", {}, reply_to="   "), "reply_to must be a non-empty channel"),
    (lambda a: a.submit("process", {}, reply_to=LONG), f"reply_to {NAME_LIMIT}"),
    (lambda a: a.submit("process", {}, reply_to="a\x00b"), "reply_to must not contain control"),
    (lambda a: a.submit("process", {}, reply_to="\ud800"), f"reply_to {NOT_UNICODE}"),
    # following a task
    (lambda a: a.status(5), f"task_id {NAME_LIMIT}, not 5"),  # type: ignore[arg-type]
    (lambda a: a.status(""), f"task_id {NAME_LIMIT}, not ''"),
    (lambda a: a.status("a\x00"), CONTROL),
    (lambda a: a.show(LONG), f"task_id {NAME_LIMIT}"),
    (lambda a: a.show("\ud800"), f"task_id {NOT_UNICODE}"),
    (lambda a: a.result("t-1", timeout=-1), f"{TIMEOUT}, not -1"),
    (lambda a: a.result("t-1", timeout="soon"), f"{TIMEOUT}, not 'soon'"),  # type: ignore[call-overload]
    (lambda a: a.result("t-1", timeout=float("nan")), f"{TIMEOUT}, not nan"),
    (lambda a: _first(a.watch(5)), f"task_id {NAME_LIMIT}, not 5"),  # type: ignore[arg-type]
    (lambda a: _first(a.subscribe(5)), f"channel {NAME_LIMIT}, not 5"),  # type: ignore[arg-type]
    (lambda a: _first(a.subscribe("\ud800")), f"channel {NOT_UNICODE}"),
    (lambda a: _first(a.subscribe("shop", after=-1)), "after must be an integer from 0 to"),
    # listing tasks
    (lambda a: a.tasks(limit=-1), f"limit {INT_RANGE}, not -1"),
    (lambda a: a.tasks(limit=0), f"limit {INT_RANGE}, not 0"),
    (lambda a: a.tasks(limit="10"), f"limit {INT_RANGE}, not '10'"),  # type: ignore[arg-type]
    (lambda a: a.tasks(limit=2**63), f"limit {INT_RANGE}, not 9223372036854775808"),
    (lambda a: a.tasks(state="bogus"), "unknown state 'bogus' (known: pending, processing,"),
    (lambda a: a.tasks(workflow=5), f"workflow {NAME_LIMIT}, not 5"),  # type: ignore[arg-type]
    (lambda a: a.tasks(workflow="a\x00"), "workflow must not contain control characters"),
    (lambda a: a.tasks(workflow="\ud800"), f"workflow {NOT_UNICODE}"),
    # the operator: each of these would pause or cancel t-1 if it got through
    (lambda a: a.operate(5, ["t-1"]), "unknown action 5 (known: retry, pause,"),  # type: ignore[arg-type]
    (lambda a: a.operate("pause", "t-1"), "task_ids must be a list of task ids, not 't-1'"),
    (lambda a: a.operate("pause", ["t-1", 5]), f"task_id {NAME_LIMIT}, not 5"),  # type: ignore[list-item]
    (lambda a: a.operate("pause", ["t-1", "b\ud800"]), f"task_id {NOT_UNICODE}"),
    (lambda a: a.operate("pause", state="bogus"), "unknown state 'bogus'"),
    (lambda a: a.operate("pause", state="pending", limit=-1), f"limit {INT_RANGE}, not -1"),
    (lambda a: a.operate("pause", ["t-1"], reason="r" * 1001), REASON_LIMIT),
    (lambda a: a.operate("pause", ["t-1"], reason=5), f"{REASON_LIMIT}, not 5"),
    (lambda a: a.operate("pause", ["t-1"], by=""), f"by {NAME_LIMIT}, not ''"),
    (lambda a: a.operate("pause", ["t-1"], by="ana\nbob"), "by must not contain control"),
    (lambda a: a.operate("pause", ["t-1"], by="ana\u202e"), "by must not contain control"),
    (lambda a: a.operate("pause", ["t-1"], dry_run="no"), "dry_run must be True or False"),
    (lambda a: a.pause("t-1", reason=XFF), f"reason {NOT_UNICODE}: '\\udcff'"),
    (lambda a: a.cancel("t-1", compensate="no"), "compensate must be True or False, not 'no'"),  # type: ignore[arg-type]
    (lambda a: a.retry(5), f"task_id {NAME_LIMIT}, not 5"),  # type: ignore[arg-type]
    (lambda a: a.resume("\ud800"), f"task_id {NOT_UNICODE}"),
    # skip: the step number
    (lambda a: a.skip("t-1", 0), f"seq {INT_RANGE}, not 0"),
    (lambda a: a.skip("t-1", -1), f"seq {INT_RANGE}, not -1"),
    (lambda a: a.skip("t-1", "x"), f"seq {INT_RANGE}, not 'x'"),  # type: ignore[arg-type]
    (lambda a: a.skip("t-1", True), f"seq {INT_RANGE}, not True"),
    (lambda a: a.skip("t-1", 2**31), f"seq {INT_RANGE}, not 2147483648"),
]
"""Calls refused with ConfigurationError, and what its message says."""

UNSERIALISABLE: list[tuple[Call, str]] = [
    (lambda a: a.submit("process", nested(10_000)), f"the task input {NOT_JSON}: Recursion limit"),
    (lambda a: a.submit("process", {"note": "\ud800"}), f"the task input {NOT_JSON}: {NOT_UTF8}"),
    (lambda a: a.submit("process", {"\udcff": 1}), f"the task input {NOT_JSON}: {NOT_UTF8}"),
    (lambda a: a.submit("process", {"card": sw.Secret(float("nan"))}), "the task input holds NaN"),
    (lambda a: a.submit("process", {"card": sw.Secret(BIG)}), OVER_LIMIT),
    (lambda a: a.submit("process", [{"$secret": "x"}]), f"the task input {RESERVED}"),
    (lambda a: a.submit("process", {"pin": {"$secret": "7391", "x": 1}}), f"input {RESERVED}"),
    (lambda a: a.submit("process", {"$sealed": "k1:AAAA"}), f"the task input {RESERVED}"),
    (lambda a: a.skip("t-1", 1, nested(10_000)), f"the step result {NOT_JSON}: Recursion limit"),
    (lambda a: a.skip("t-1", 1, BIG), f"the step result is {len(BIG) + 2} bytes, {OVER_LIMIT}"),
    (lambda a: a.skip("t-1", 1, {"total": float("inf")}), "the step result holds NaN or an inf"),
    (lambda a: a.skip("t-1", 1, "\ud800"), f"the step result {NOT_JSON}: {NOT_UTF8}"),
    (lambda a: a.skip("t-1", 1, {"$secret": 1}), f"the step result {RESERVED}"),
    (lambda a: a.operate("skip", ["t-1"], seq=1, result=NAN, dry_run=True), "result holds NaN"),
]
"""Payloads refused with PayloadError, and what its message says."""

API_CASES = [(c, sw.ConfigurationError, m) for c, m in REFUSED] + [
    (c, sw.PayloadError, m) for c, m in UNSERIALISABLE
]


@pytest.mark.parametrize(("call", "error", "message"), API_CASES)
def test_the_app_refuses_hostile_input_before_writing_anything(
    seeded: str, seeded_app: sw.App, call: Call, error: type[Exception], message: str
) -> None:
    before = rows(seeded)
    with pytest.raises(error) as raised:
        call(seeded_app)
    text = str(raised.value)
    assert message in text, text
    assert "\n" not in text and len(text) < 400, text
    assert rows(seeded) == before


async def _noop(ctx: sw.Context, value: Any) -> Any:
    return value


def _app() -> sw.App:
    return sw.App("decl", store="sqlite:///never-opened.db")


WITHIN = "complete_within must be a timedelta or seconds, positive and at most 365 days"

DECLARATION_CASES: list[tuple[Callable[[], object], str]] = [
    (lambda: sw.App(5, store="sqlite:///x.db"), f"the App's name {NAME_LIMIT}, not 5"),  # type: ignore[arg-type]
    (lambda: sw.App("x", store="postgresql://ana:s3cret@[::1/db"), "'postgresql://ana:***@[::1"),
    (lambda: sw.App("x", store="postgresql://ana:s3cret@[::1/db"), "/db': Invalid IPv6 URL"),
    (lambda: sw.App("x", store="sqlite:///a\x00.db"), "it holds a NUL character"),
    (lambda: _app().agent(5), "invalid agent name 5"),  # type: ignore[arg-type]
    (lambda: _app().agent("pay", retry="fast"), "retry must be a stepwarden.Retry, not 'fast'"),  # type: ignore[arg-type]
    (lambda: _app().agent("pay").operation(5), "an operation must be a function, not 5"),  # type: ignore[call-overload]
    (lambda: _app().workflow(5), "workflow '5' must be an async function"),  # type: ignore[call-overload]
    (lambda: _app().workflow(_noop, name=5), f"the workflow's name {NAME_LIMIT}, not 5"),  # type: ignore[call-overload]
    (lambda: _app().workflow(_noop, name=""), f"the workflow's name {NAME_LIMIT}, not ''"),
    (lambda: _app().workflow(_noop, complete_within="30"), f"{WITHIN}, not '30'"),  # type: ignore[call-overload]
    (lambda: _app().workflow(_noop, complete_within=timedelta(0)), WITHIN),
    (lambda: _app().workflow(_noop, complete_within=timedelta(days=10**7)), WITHIN),
    (lambda: _app().workflow(_noop, max_failures="3"), f"max_failures {INT_RANGE}, not '3'"),  # type: ignore[call-overload]
    (lambda: _app().workflow(_noop, max_failures=2**40), f"max_failures {INT_RANGE}"),
    (lambda: _app().workflow(_noop, alert_after=2.5), "alert_after must be an integer from 2"),  # type: ignore[call-overload]
    (lambda: _app().add_alert_sink(5), "an alert sink needs a name and a send(alert) method"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("declare", "message"), DECLARATION_CASES)
def test_declarations_refuse_wrong_types_with_a_clear_error(
    declare: Callable[[], object], message: str
) -> None:
    with pytest.raises(sw.ConfigurationError) as raised:
        declare()
    assert message in str(raised.value), str(raised.value)
    assert "s3cret" not in str(raised.value)
    assert not Path("never-opened.db").exists()


async def test_a_step_deadline_past_what_a_store_holds_fails_its_task_only(store_url: str) -> None:
    """A step's complete_within is checked like the workflow's: a deadline in the year 29000
    would otherwise be refused by the store at every dispatch. The task fails with the reason;
    the other tasks run."""
    app = sw.App("far", store=store_url)
    desk = app.agent("desk")

    @desk.operation
    async def stamp(call: sw.Call, value: Any) -> Any:
        return value

    @app.workflow(complete_within=timedelta(seconds=30), on_failure="stop")
    async def far(ctx: sw.Context, days: int) -> Any:
        return await ctx.step(desk.stamp, days, complete_within=timedelta(days=days))

    try:
        async with running(app):
            await app.submit_async(far, 10**7, task_id="far")
            await app.submit_async(far, 1, task_id="near")
            with pytest.raises(sw.TaskFailed, match="at most 365 days"):
                await app.result_async("far", timeout=20)
            assert await app.result_async("near", timeout=20) == 1
        assert (await app.show_async("far")).steps == []
    finally:
        await app.aclose()


# -- the command line ------------------------------------------------------------------

STORE = "<store>"
"""Replaced by the seeded store's URL."""
ON = ("--app", APP, "--store", STORE)

SKIP = ("--store", STORE, "skip", "t-1", "--step")


def not_in_range(option: str, value: object, low: int = 1, high: int = 2**31 - 1) -> list[str]:
    return [f"'{option}'", f"{value} is not in the range {low}<=x<={high}"]


CLI_CASES: list[tuple[tuple[str, ...], int, list[str]]] = [
    # submit
    ((*ON, "submit", "process", "{}", "--task-id", LONG), 1, [f"task_id {NAME_LIMIT}, not 'xx"]),
    ((*ON, "submit", "process", "{}", "--task-id", "a\x1b[31m"), 1, [f"{CONTROL}: 'a\\x1b[31m'"]),
    ((*ON, "submit", "process", "{}", "--task-id", "a\u202e"), 1, [f"{CONTROL}: 'a\\u202e'"]),
    ((*ON, "submit", "process", "{}", "--task-id", "a\x9b"), 1, [f"{CONTROL}: 'a\\x9b'"]),
    ((*ON, "submit", "process", "{}", "--task-id", ".."), 1, ["task_id must not be '..'"]),
    ((*ON, "submit", "process", "{}", "--priority", str(2**31)), 2, ["2147483648 is not in"]),
    ((*ON, "submit", "process", nested_json(10_000)), 2, ["INPUT_JSON", "depth limit exceeded"]),
    ((*ON, "submit", "process", nested_json(300)), 1, [f"the task input {NOT_JSON}: Recursion"]),
    ((*ON, "submit", "process", DEEP_SECRET), 1, [f"the task input {DEEPER}"]),
    ((*ON, "submit", "process", '{"note": "\\ud800"}'), 2, ["INPUT_JSON", "not JSON"]),
    ((*ON, "submit", "process", "[1e999]"), 2, ["INPUT_JSON", "not JSON"]),
    ((*ON, "submit", "process", '{"card": {"$secret": NaN}}'), 2, ["INPUT_JSON", "not JSON"]),
    # tasks and show
    (("--store", STORE, "tasks", "--limit", "0"), 2, not_in_range("--limit", 0)),
    (("--store", STORE, "tasks", "--limit", str(2**63)), 2, not_in_range("--limit", 2**63)),
    (("--store", STORE, "tasks", "--state", "bogus"), 2, ["'--state'", "'bogus' is not one of"]),
    (("--store", STORE, "tasks", "--workflow", LONG), 1, [f"workflow {NAME_LIMIT}"]),
    (("--store", STORE, "show", ""), 1, [f"task_id {NAME_LIMIT}, not ''"]),
    (("--store", STORE, "show", "t\x00"), 1, [f"task_id {CONTROL}"]),
    # the operator's commands, each naming t-1 (pending: a pause or a cancel would apply)
    (("--store", STORE, "pause", "t-1", "x" * 201), 1, [f"task_id {NAME_LIMIT}"]),
    (("--store", STORE, "pause", "t-1", "--reason", "r" * 1001), 1, [REASON_LIMIT]),
    (("--store", STORE, "pause", "t-1", "--by", ""), 1, [f"by {NAME_LIMIT}, not ''"]),
    (("--store", STORE, "cancel", "t-1", "--by", "ana\tbob"), 1, [f"by {CONTROL}: 'ana\\tbob'"]),
    (("--store", STORE, "pause", "--state", "pending", "--limit", "-1"), 2, ["-1 is not in"]),
    (("--store", STORE, "cancel", "--state", "bogus"), 2, ["'--state'", "'bogus' is not one of"]),
    ((*SKIP, "0"), 2, not_in_range("--step", 0)),
    ((*SKIP, "-1"), 2, not_in_range("--step", -1)),
    ((*SKIP, "x"), 2, ["'--step'", "'x' is not a valid integer"]),
    ((*SKIP, str(2**31)), 2, not_in_range("--step", 2**31)),
    ((*SKIP, "1", "--result", "NaN"), 2, ["--result", "not JSON"]),
    ((*SKIP, "1", "--result", nested_json(10_000)), 2, ["--result", "depth limit exceeded"]),
    ((*SKIP, "1", "--result", nested_json(300)), 1, [f"the step result {NOT_JSON}: Recursion"]),
    ((*SKIP, "1", "--result", DEEP_SECRET), 1, [f"the step result {DEEPER}"]),
    ((*SKIP, "1", "--result", f'"{BIG}"'), 1, [f"the step result is {len(BIG) + 2} bytes"]),
    ((*SKIP, "1", "--reason", "\x00" * 1001), 1, [REASON_LIMIT]),
    # send
    (("--store", STORE, "send", "t-1", "go", DEEP_SECRET), 1, [f"the event's payload {DEEPER}"]),
    # the group's options
    (("--store", "postgresql://ana:s3cret@[::1/db", "tasks"), 1, ["'postgresql://ana:***@[::1"]),
    (("--app", ".cli_app:app", "--store", STORE, "submit", "x"), 2, ["invalid application"]),
    (("--log-level", "loud", "--store", STORE, "tasks"), 2, ["'loud' is not one of"]),
    ((*ON, "worker", "--concurrency", "0"), 2, ["'--concurrency'", "0 is not in the range x>=1"]),
]


@pytest.mark.parametrize(("args", "code", "fragments"), CLI_CASES)
def test_the_command_line_refuses_hostile_input_before_writing_anything(
    seeded: str, args: tuple[str, ...], code: int, fragments: list[str]
) -> None:
    before = rows(seeded)
    result = invoke(*(seeded if a == STORE else a for a in args))
    line = assert_refused(result, *fragments, exit_code=code)
    assert "s3cret" not in result.output
    assert len(line) < 400, line
    assert rows(seeded) == before


UNDECODABLE_CASES: list[tuple[tuple[str, ...], int, str]] = [
    ((*ON, "submit", "process", "{}", "--task-id", f"t{XFF}"), 1, f"{NOT_UNICODE}: 't\\udcff'"),
    ((*ON, "submit", "process", f'{{"note": "{XFF}"}}'), 2, f"not JSON: {NOT_UTF8}"),
    (("--store", STORE, "show", f"t{XFF}"), 1, f"task_id {NOT_UNICODE}"),
    (("--store", STORE, "tasks", "--workflow", XFF), 1, f"workflow {NOT_UNICODE}"),
    (("--store", STORE, "pause", "t-1", "--reason", f"late{XFF}"), 1, f"reason {NOT_UNICODE}"),
    (("--store", STORE, "cancel", "t-1", f"t{XFF}"), 1, f"task_id {NOT_UNICODE}"),
]
"""Arguments holding the byte 0xff, which is not UTF-8."""


@pytest.mark.parametrize(("args", "code", "fragment"), UNDECODABLE_CASES)
def test_an_argument_that_is_not_utf8_is_refused(
    seeded: str, args: tuple[str, ...], code: int, fragment: str
) -> None:
    before = rows(seeded)
    result = invoke(*(seeded if a == STORE else a for a in args))
    assert_refused(result, fragment, exit_code=code)
    assert rows(seeded) == before


def test_an_argument_that_is_not_utf8_is_refused_by_a_real_process(sqlite_url: str) -> None:
    """Started as a user starts it, the process gets the raw byte: one error line, no
    traceback, nothing written."""
    app = cli_app.build(sqlite_url)
    try:
        app.submit("process", {"n": 1}, task_id="t-1", reply_to="shop")
    finally:
        app.close()
    before = rows(sqlite_url)
    for args, code, fragment in [UNDECODABLE_CASES[i] for i in (0, 2, 4)]:
        done = run(*(sqlite_url if a == STORE else a for a in args))
        assert done.returncode == code, done.stderr
        assert fragment in error_line(done.stderr)
        assert done.stdout == ""
    assert rows(sqlite_url) == before
