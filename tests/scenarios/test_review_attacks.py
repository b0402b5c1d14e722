"""The attack review of the HTTP API and the agent protocol, run again against one real
`stepwarden dashboard` process (an open-file limit of 300, a tokens file of several clients, a
destinations file): each attack it reported ends with none of its effects.

- a burst of wrong tokens from the clients' own address locks none of them out, on any door;
- a sign-in a page of another site makes the browser send is refused;
- a `reply_to` naming a host the operator did not list is refused, and nothing connects there;
- a re-submit under another client's task id tells nothing of its stored secret;
- 300 slow connections keep a right request out for no longer than a slow one's deadline;
- a flood of 1 MB submits stores nothing;
- 1,500 agent registrations from one token keep its bound, and `/metrics` stays small.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import stepwarden as sw
from stepwarden import _tokens
from tests.cli.helpers import REPO, STEPWARDEN, process_env
from tests.httpapi.api_app import STORE_ENV

from ..support.relay import Listener

pytestmark = pytest.mark.slow

TOKEN = "dashboard-token-7f3c2e19a0"
WITHIN = 30.0
CLIENTS = {
    "orders": ("submit", "read"),
    "billing": ("submit", "read"),
    "desk": ("agent:desk",),
}


@contextlib.contextmanager
def served(store_url: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Path]]:
    """The dashboard of tests.httpapi.api_app, its open-file limit 300: its URL, each
    client's token, and its log."""
    made = {name: _tokens.new_client(name, scopes) for name, scopes in CLIENTS.items()}
    tokens = tmp_path / "api-tokens"
    tokens.write_text("\n".join(client.line() for _, client in made.values()) + "\n")
    tokens.chmod(0o600)
    destinations = tmp_path / "destinations"
    destinations.write_text("# NAME BROKER NAMES\nstatus redis://127.0.0.1:1 order-status\n")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))

    log = tmp_path / "dashboard.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [STEPWARDEN, "--app", "tests.httpapi.api_app:app", "dashboard", "--port", "0",
             "--api-tokens", str(tokens), "--destinations", str(destinations),
             "--header-timeout", "4", "--body-timeout", "4"],
            cwd=REPO,
            env=process_env({"STEPWARDEN_DASHBOARD_TOKEN": TOKEN, STORE_ENV: store_url}),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            preexec_fn=limit,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        assert "stepwarden dashboard of" in first, (first, log.read_text())
        url = first[first.index("http://") :].split()[0].rstrip("/")
        yield url, {name: token for name, (token, _) in made.items()}, log
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def until_answered(c: httpx.AsyncClient, what: str, path: str, token: str) -> None:
    deadline = time.monotonic() + WITHIN
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if (await c.get(path, headers=bearer(token))).status_code == 200:
                return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_the_review_s_attacks_end_with_none_of_their_effects(
    sqlite_url: str, tmp_path: Path
) -> None:
    app = sw.App("migrate", store=sqlite_url)
    await app.store()
    await app.aclose()
    store_file = Path(sqlite_url.removeprefix("sqlite:///"))
    with served(sqlite_url, tmp_path) as (url, tokens, log):
        port = httpx.URL(url).port
        assert port is not None
        limits = httpx.Limits(max_connections=100, keepalive_expiry=1.0)
        async with httpx.AsyncClient(base_url=url, timeout=WITHIN, limits=limits) as c:
            await until_answered(c, "the dashboard", "/api/overview", TOKEN)

            # 1. Bursts of wrong tokens at every door, from the clients' own address: a right
            # token is taken at each door all the same.
            for _ in range(15):
                await c.get("/api/v1/tasks/x", headers=bearer("sw_wrong"))
                await c.post("/api/v1/agents/desk/beat", json={}, headers=bearer("sw_wrong"))
                await c.post("/api/tasks/retry", json={}, headers=bearer("wrong-operator-token"))
                await c.post("/login", data={"token": "wrong-operator-token"})
            submitted = await c.post(
                "/api/v1/tasks",
                json={"workflow": "echo", "input": 1, "task_id": "after-burst"},
                headers=bearer(tokens["orders"]),
            )
            assert submitted.status_code == 201, submitted.text
            beat = {"instance": "desk/a", "operations": ["stamp"], "capacity": 1, "ttl": 30}
            answer = await c.post("/api/v1/agents/desk/beat", json=beat,
                                  headers=bearer(tokens["desk"]))  # fmt: skip
            assert answer.status_code == 204, answer.text
            assert (await c.get("/api/overview", headers=bearer(TOKEN))).status_code == 200
            signed_in = await c.post("/login", data={"token": TOKEN}, follow_redirects=False)
            assert signed_in.status_code == 303, signed_in.text

            # 2. A sign-in that a page of another site makes the browser send.
            cross = await c.post(
                "/login",
                data={"token": TOKEN},
                headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
                follow_redirects=False,
            )
            assert cross.status_code == 403 and "set-cookie" not in cross.headers

            # 3. reply_to naming brokers the operator did not list: refused, nothing stored,
            # nothing connects to them.
            listener = Listener()
            try:
                for scheme in ("redis", "nats", "amqp"):
                    reply_to = f"{scheme}://127.0.0.1:{listener.port}/payments-commands"
                    body = {"workflow": "echo", "input": 1, "task_id": f"to-{scheme}",
                            "reply_to": reply_to}  # fmt: skip
                    refused = await c.post("/api/v1/tasks", json=body,
                                           headers=bearer(tokens["orders"]))  # fmt: skip
                    assert refused.status_code == 422, refused.text
                    gone = await c.get(f"/api/v1/tasks/to-{scheme}",
                                       headers=bearer(tokens["orders"]))  # fmt: skip
                    assert gone.status_code == 404
            finally:
                listener.close()
            assert listener.accepted == 0

            # 4. The re-submit oracle: another client's re-submit under a taken id is answered
            # the same whether its guess of the stored secret is right or wrong.
            pin = {"workflow": "approval", "task_id": "acct-1",
                   "input": {"id": 1, "pin": {"$secret": "7391"}}}  # fmt: skip
            first = await c.post("/api/v1/tasks", json=pin, headers=bearer(tokens["billing"]))
            assert first.status_code == 201, first.text
            guesses = []
            for guess in ("7391", "0000"):
                body = {**pin, "input": {"id": 1, "pin": {"$secret": guess}}}
                got = await c.post("/api/v1/tasks", json=body, headers=bearer(tokens["orders"]))
                guesses.append((got.status_code, got.json()))
            assert guesses[0] == guesses[1] and guesses[0][0] == 409

            # 5. 300 slow connections (headers a byte short) under an open-file limit of 300:
            # a right request is served once a slow one's deadline (4 s) has passed at most.
            slow = []
            try:
                for _ in range(300):
                    with contextlib.suppress(OSError):
                        conn = socket.create_connection(("127.0.0.1", port), timeout=WITHIN)
                        conn.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-: ")
                        slow.append(conn)
                await until_answered(c, "a right request among slow ones", "/api/overview", TOKEN)
            finally:
                for conn in slow:
                    conn.close()

            # 6. A flood of 1 MB submits, 8 at once for 3 s: refused before anything is stored.
            before = sum(p.stat().st_size for p in store_file.parent.glob(store_file.name + "*"))
            big = {"workflow": "echo", "input": "x" * (1024 * 1024 - 64)}
            codes: list[int] = []

            async def flood() -> None:
                ends = time.monotonic() + 3
                while time.monotonic() < ends:
                    answer = await c.post("/api/v1/tasks", json=big,
                                          headers=bearer(tokens["orders"]))  # fmt: skip
                    codes.append(answer.status_code)

            await asyncio.gather(*(flood() for _ in range(8)))
            after = sum(p.stat().st_size for p in store_file.parent.glob(store_file.name + "*"))
            assert codes and set(codes) <= {413, 429}, sorted(set(codes))
            assert after - before < 1024 * 1024, (before, after)

            # 7. 1,500 registrations from one agent token: its bound (64 alive) holds, and
            # the metrics the registry shows stay small.
            async def register(n: int) -> int:
                body = {"instance": f"desk/i-{n}", "operations": ["stamp"], "capacity": 10,
                        "ttl": 60}  # fmt: skip
                answer = await c.post("/api/v1/agents/desk/beat", json=body,
                                      headers=bearer(tokens["desk"]))  # fmt: skip
                return answer.status_code

            registered: list[int] = []
            for batch in range(0, 1500, 50):  # 50 at once, within the server's backlog
                numbers = range(batch, batch + 50)
                registered += await asyncio.gather(*(register(n) for n in numbers))
            assert registered.count(204) <= 64 and set(registered) <= {204, 429}
            metrics = await c.get("/metrics", headers=bearer(TOKEN))
            assert metrics.status_code == 200 and len(metrics.content) < 200_000
    text = log.read_text()
    assert "Traceback" not in text and "Too many open files" not in text, text[-3000:]
