"""A real worker whose alert webhook is slow or hostile: SIGTERM still ends it within its
drain timeout; a webhook's URL, read from standard input, appears nowhere in its log; and a
receiver answering gzip bombs costs the worker kilobytes per delivery, not what the bomb
decodes to."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from tests.receivers import gzip_bomb, hostile, in_thread, trickling_in_thread

from .helpers import APP, REPO, STEPWARDEN, assert_ok, invoke, process_env

DRAIN = 5.0
SECRETS = ("pa55word", "T0KEN-SECRET", "ana:", "token=", "/hook")
BOMB = 256 * 1024 * 1024
"""What each answer of the hostile receiver decodes to."""


def _worker(url: str, *options: str, stdin: IO[str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            STEPWARDEN, "--app", APP, "--store", url, "worker",
            "--poll-interval", "0.05", "--supervisor-interval", "0.2",
            "--drain-timeout", str(DRAIN), *options,
        ],
        cwd=REPO,
        env=process_env(),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def _until(what: str, proc: subprocess.Popen[str], done: Callable[[], object]) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[str]) -> tuple[float, str]:
    """SIGTERM, then the seconds the worker took to end and its log."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=DRAIN + 30)
    return time.monotonic() - sent, err


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory so far, in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_sigterm_ends_a_worker_whose_alert_delivery_trickles(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert_ok(invoke("--store", url, "migrate"))
    with trickling_in_thread(every=2.0) as hook:
        hooks = tmp_path / "hooks"
        hooks.write_text(f"# the on-call's hook\n\n{hook.url(secret=True)}\n")
        with hooks.open() as stdin:
            proc = _worker(url, "--alert-webhook-file", "-", stdin=stdin)
        try:
            value = '{"refuse": "card declined"}'
            assert_ok(invoke("--app", APP, "--store", url, "submit", "process", value))
            _until("the alert never reached the webhook", proc, lambda: hook.requests)
            assert hook.open_connections == 1  # the delivery trickles
            took, err = _stop(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert took < DRAIN + 5, (took, err)
    assert b"token=T0KEN-SECRET" in hook.requests[0]  # the URL was used as given...
    for secret in SECRETS:  # ...and logged nowhere
        assert secret not in err, (secret, err)


def test_a_worker_whose_webhook_answers_gzip_bombs_stays_small_and_stops_at_once(
    tmp_path: Path,
) -> None:
    """Each answer is a few hundred bytes that decode, gzipped twice, to 256 MiB, with a
    status of 500: the alert is tried again and again. After two of them the worker's peak
    memory is still under 150 MiB, and SIGTERM ends it within its drain timeout."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert_ok(invoke("--store", url, "migrate"))
    bomb = gzip_bomb(BOMB, layers=2)
    with in_thread(lambda: hostile(bomb, status=500, encoding="gzip, gzip")) as hook:
        proc = _worker(url, "--alert-webhook", hook.url())
        try:
            value = '{"refuse": "card declined"}'
            assert_ok(invoke("--app", APP, "--store", url, "submit", "process", value))
            _until("the alert was not tried again", proc, lambda: len(hook.requests) >= 3)
            peak = _peak_rss(proc.pid)
            took, err = _stop(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert peak < 150 * 1024 * 1024, f"the worker's peak memory: {peak / 2**20:.0f} MiB"
    assert took < DRAIN, (took, err)
    assert "answered 500" in err
    assert b"accept-encoding: identity" in hook.requests[0].lower()
