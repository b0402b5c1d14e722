"""Text from tasks reaches the terminal and the log as the text it is: an error holding a
newline cannot forge a log line, an ESC cannot drive the terminal; `show` pages a long
history newest first; an input can come from a file or standard input instead of the command
line; and `python -m stepwarden` is the command line."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

import stepwarden as sw
from tests.stores import app_store

from . import cli_app
from .conftest import FAST
from .helpers import APP, REPO, STEPWARDEN, assert_ok, assert_refused, invoke, process_env

FORGED = "1999-12-31 23:59:59,000 CRITICAL stepwarden: FORGED LOG LINE"
HOSTILE = f"boom\n{FORGED}\x1b[2J\u202egnp.exe\x85end"
"""An error message that, printed raw, would add a log line, clear the screen and reorder
the rest of the line."""
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")


def _raw(text: str) -> list[str]:
    """The characters of `text` that a terminal or a log reader would act on."""
    return [ch for ch in text if ch in "\x1b\u202e\x85" or ch == "\r"]


async def _fail_one(url: str, reason: str) -> None:
    app = cli_app.build(url)
    try:
        worker = sw.Worker(app, FAST)
        running = asyncio.create_task(worker.run())
        try:
            await app.submit_async("process", {"refuse": reason}, task_id="hostile")
            with pytest.raises(sw.TaskFailed):
                await app.result_async("hostile", timeout=20)
        finally:
            worker.stop.set()
            await asyncio.wait_for(running, 30)
    finally:
        await app.aclose()


def test_show_escapes_what_a_task_holds(migrated_url: str) -> None:
    asyncio.run(_fail_one(migrated_url, HOSTILE))
    out = assert_ok(invoke("--store", migrated_url, "show", "hostile"))
    assert _raw(out) == []
    assert not any(line.startswith("1999-12-31") for line in out.splitlines()), out
    assert "boom\\n1999-12-31 23:59:59,000 CRITICAL stepwarden: FORGED LOG LINE\\x1b[2J" in out
    assert "\\u202egnp.exe\\x85end" in out
    as_json = assert_ok(invoke("--store", migrated_url, "show", "hostile", "--json"))
    assert _raw(as_json) == []
    assert HOSTILE in orjson.loads(as_json)["error"]


def test_the_worker_log_has_one_line_per_record(tmp_path: Path) -> None:
    """A real worker process fails a task whose error holds a newline, an ESC and a bidi
    override: every line of its log is a record or an indented continuation of one (a
    traceback), and none of those characters is written raw."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert_ok(invoke("--store", url, "migrate"))
    value = orjson.dumps({"refuse": HOSTILE}).decode()
    assert_ok(invoke("--app", APP, "--store", url, "submit", "process", value, "--task-id=h"))
    proc = subprocess.Popen(
        [STEPWARDEN, "--app", APP, "--store", url, "worker", "--poll-interval", "0.05"],
        cwd=REPO,
        env=process_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            shown = orjson.loads(assert_ok(invoke("--store", url, "show", "h", "--json")))
            if shown["process_state"] == "error":
                break
            assert proc.poll() is None
            time.sleep(0.05)
        else:
            raise AssertionError("the task did not fail")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "FORGED LOG LINE" in err  # the error is logged...
    assert _raw(err) == []  # ...with nothing a terminal acts on
    for line in err.splitlines():
        assert RECORD.match(line) or line.startswith("    "), line
    assert not any(line.startswith("1999-12-31") for line in err.splitlines())


def test_show_prints_the_newest_event_of_a_long_history(migrated_url: str) -> None:
    """2,000 events, the last an operator's pause: `show` prints it first and says how to
    see the older ones; `--before` pages back."""

    async def fill() -> None:
        app = cli_app.build(migrated_url)
        try:
            await app.submit_async("process", {"n": 1}, task_id="long")
            store = await app_store(app)
            await store.record_events([("long", "note", {"n": n}) for n in range(1999)])
            await app.pause_async("long", reason="the newest")
        finally:
            await app.aclose()

    asyncio.run(fill())
    out = assert_ok(invoke("--store", migrated_url, "show", "long", "--events", "10"))
    history = out.split("history (newest first):\n", 1)[1].splitlines()
    assert "the newest" in history[0] and '"action":"pause"' in history[0], history[0]
    assert len(history) == 11
    older = re.fullmatch(r"  \.\.\. older events: stepwarden show long --before (\d+)", history[-1])
    assert older, history[-1]
    page = assert_ok(
        invoke("--store", migrated_url, "show", "long", "--events", "5", "--before", older[1])
    )
    first = page.split("history (newest first):\n", 1)[1].splitlines()[0]
    assert int(first.split()[0]) == int(older[1]) - 1, first
    as_json = orjson.loads(assert_ok(invoke("--store", migrated_url, "show", "long", "--json")))
    assert as_json["more_events"] is True
    assert as_json["events"][0]["detail"]["reason"] == "the newest"


def test_submit_reads_its_input_from_a_file_or_standard_input(
    migrated_url: str, tmp_path: Path
) -> None:
    on = ("--app", APP, "--store", migrated_url)
    secret = tmp_path / "input.json"
    secret.write_text('{"card": {"$secret": "4111"}, "n": 1}')
    assert_ok(invoke(*on, "submit", "process", "--input-file", str(secret), "--task-id", "f"))
    result = invoke(*on, "submit", "process", "--input-file", "-", "--task-id", "s", input="[2]")
    assert_ok(result)
    shown = orjson.loads(assert_ok(invoke("--store", migrated_url, "show", "f", "--json")))
    assert shown["input"] == {"card": "***", "n": 1}
    shown = orjson.loads(assert_ok(invoke("--store", migrated_url, "show", "s", "--json")))
    assert shown["input"] == [2]
    assert_refused(
        invoke(*on, "submit", "process", "{}", "--input-file", str(secret)),
        "INPUT_JSON or --input-file, not both",
        exit_code=2,
    )
    assert_refused(
        invoke(*on, "submit", "process", "--input-file", "-", input="{nope"),
        "--input-file",
        "not JSON",
        exit_code=2,
    )


def _python_m(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepwarden", *args],
        cwd=REPO,
        env=process_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_python_m_stepwarden_is_the_command_line(tmp_path: Path) -> None:
    done = _python_m("--store", f"sqlite:///{tmp_path / 'store.db'}", "migrate")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("schema version "), done.stdout
    helped = _python_m("worker", "--help")
    assert helped.returncode == 0 and "Usage: stepwarden worker" in helped.stdout
