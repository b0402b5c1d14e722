"""A real worker whose alert webhook trickles its answer: SIGTERM still ends it within its
drain timeout, and the webhook's URL, read from standard input, appears nowhere in its
log."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from tests.receivers import trickling_in_thread

from .helpers import APP, REPO, STEPWARDEN, assert_ok, invoke, process_env

DRAIN = 5.0
SECRETS = ("pa55word", "T0KEN-SECRET", "ana:", "token=", "/hook")


def test_sigterm_ends_a_worker_whose_alert_delivery_trickles(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert_ok(invoke("--store", url, "migrate"))
    with trickling_in_thread(every=2.0) as hook:
        hooks = tmp_path / "hooks"
        hooks.write_text(f"# the on-call's hook\n\n{hook.url(secret=True)}\n")
        with hooks.open() as stdin:
            proc = subprocess.Popen(
                [
                    STEPWARDEN, "--app", APP, "--store", url, "worker",
                    "--poll-interval", "0.05", "--supervisor-interval", "0.2",
                    "--drain-timeout", str(DRAIN), "--alert-webhook-file", "-",
                ],
                cwd=REPO,
                env=process_env(),
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        try:
            value = '{"refuse": "card declined"}'
            assert_ok(invoke("--app", APP, "--store", url, "submit", "process", value))
            deadline = time.monotonic() + 30
            while not hook.requests:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the alert never reached the webhook"
                time.sleep(0.05)
            assert hook.open_connections == 1  # the delivery trickles
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=DRAIN + 30)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert took < DRAIN + 5, (took, err)
    assert b"token=T0KEN-SECRET" in hook.requests[0]  # the URL was used as given...
    for secret in SECRETS:  # ...and logged nowhere
        assert secret not in err, (secret, err)
