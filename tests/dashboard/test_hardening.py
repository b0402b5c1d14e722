"""The dashboard under attack: a foreign Host refused on every address it may be bound to,
reads that need the token off loopback and through a proxy, request bodies refused before
they are read, actions refused before their body is parsed, payloads too deep refused, the
session cookie's lifetime, answers never cached, short tokens refused, the token read from a
private file, wrong tokens throttled per address, a long history paged newest first, task
ids a browser would resolve away still reachable, and no dependency with a known flaw."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest
from packaging.requirements import Requirement
from starlette.requests import Request

import stepwarden as sw
from stepwarden.dashboard import create_app
from stepwarden.dashboard._auth import MAX_ADDRESSES, Throttle, client_address
from stepwarden.records import Submission
from tests.cli.helpers import REPO, STEPWARDEN, assert_refused, invoke, process_env
from tests.stores import app_store

from .conftest import TOKEN, Served, run_async

FOREIGN = {"Host": "rebound.example"}
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@contextlib.contextmanager
def dashboard(
    store_url: str,
    *args: str,
    token: tuple[str, ...] = ("--token", TOKEN),
    env: dict[str, str] | None = None,
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A real `stepwarden dashboard` process on a free port; it and the port it listens on."""
    proc = subprocess.Popen(
        [STEPWARDEN, "--store", store_url, "dashboard", "--port", "0", *token, *args],
        cwd=REPO,
        env=process_env(env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "stepwarden dashboard of" in line, (line, proc.stderr and proc.stderr.read())
        port = line.rstrip().rstrip("/").rsplit(":", 1)[-1]
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _get(address: str, port: str, path: str, **kwargs: Any) -> httpx.Response:
    host = f"[{address}]" if ":" in address else address
    deadline = time.monotonic() + 20
    while True:
        try:
            return httpx.get(f"http://{host}:{port}{path}", timeout=10, **kwargs)
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


BINDS = [("127.0.0.1", "127.0.0.1"), ("127.0.0.2", "127.0.0.2"), ("0.0.0.0", "127.0.0.1")]
if _ipv6():
    BINDS += [("::1", "::1"), ("::", "::1")]


@pytest.mark.parametrize(("bind", "reach"), BINDS)
def test_a_foreign_host_is_refused_on_every_bind(
    sqlite_migrated: str, bind: str, reach: str
) -> None:
    with dashboard(sqlite_migrated, "--host", bind, "--allowed-host", "ops.example") as (_, port):
        refused = _get(reach, port, "/api/overview", headers={**FOREIGN, **BEARER})
        assert refused.status_code == 421, refused.text
        assert "rebound.example" in refused.json()["error"]
        for host in ("localhost", f"ops.example:{port}", reach if ":" not in reach else "[::1]"):
            ok = _get(reach, port, "/api/overview", headers={"Host": host, **BEARER})
            assert ok.status_code == 200, (host, ok.text)


def test_reads_need_the_token_off_loopback(sqlite_migrated: str) -> None:
    with dashboard(sqlite_migrated, "--host", "0.0.0.0") as (_, port):
        for path in ("/api/overview", "/api/tasks", "/metrics"):
            assert _get("127.0.0.1", port, path).status_code == 401, path
            assert _get("127.0.0.1", port, path, headers=BEARER).status_code == 200, path
        page = _get("127.0.0.1", port, "/tasks?state=error")
        assert page.status_code == 303
        assert page.headers["location"] == "/login?next=%2Ftasks%3Fstate%3Derror"
        assert _get("127.0.0.1", port, "/login").status_code == 200
        assert _get("127.0.0.1", port, "/openapi.json").status_code == 200
    with dashboard(sqlite_migrated, "--host", "0.0.0.0", "--no-auth-reads") as (_, port):
        assert _get("127.0.0.1", port, "/api/overview").status_code == 200
    with dashboard(sqlite_migrated, "--host", "127.0.0.2") as (_, port):  # loopback: open
        assert _get("127.0.0.2", port, "/api/overview").status_code == 200
    with dashboard(sqlite_migrated, "--auth-reads") as (_, port):  # loopback, asked for
        assert _get("127.0.0.1", port, "/api/overview").status_code == 401


def test_on_loopback_a_request_through_a_proxy_is_read_as_a_remote_one(
    sqlite_migrated: str,
) -> None:
    """A reverse proxy on this machine reaches the dashboard from loopback: the headers it
    adds mark its requests as remote, whose reads need the token."""
    proxied = [{"X-Forwarded-For": "203.0.113.9"}, {"Forwarded": "for=203.0.113.9"}]
    with dashboard(sqlite_migrated) as (_, port):
        assert _get("127.0.0.1", port, "/api/overview").status_code == 200
        for headers in proxied:
            for path in ("/api/overview", "/api/alerts", "/metrics"):
                answer = _get("127.0.0.1", port, path, headers=headers)
                assert answer.status_code == 401, (headers, path, answer.text)
                assert _get("127.0.0.1", port, path, headers={**headers, **BEARER}).is_success
            page = _get("127.0.0.1", port, "/alerts", headers=headers)
            assert (page.status_code, page.headers["location"]) == (303, "/login?next=%2Falerts")
    with dashboard(sqlite_migrated, "--no-auth-reads") as (_, port):  # open, as asked
        assert _get("127.0.0.1", port, "/api/overview", headers=proxied[0]).status_code == 200


WRONG = {"Authorization": "Bearer wrong-token-0123456789"}


def _burst(port: str, forwarded_for: str) -> None:
    """Ten wrong bearer tokens, each saying it comes from `forwarded_for`."""
    for _ in range(10):
        headers = {"X-Forwarded-For": forwarded_for, **WRONG}
        answer = _get("127.0.0.1", port, "/api/tasks", headers=headers)
        assert answer.status_code == 401, answer.text


def test_forwarded_addresses_are_believed_only_from_the_proxies_named(
    sqlite_migrated: str,
) -> None:
    """A process that reaches the dashboard can say it is any address in X-Forwarded-For:
    unless its peer is a proxy the operator named (--forwarded-allow-ips,
    STEPWARDEN_FORWARDED_ALLOW_IPS), its wrong tokens count against its peer's address all
    the same (it cannot lock another address out, nor get round its own count by naming
    another each time), and X-Forwarded-Proto does not make the session cookie Secure."""

    def as_(address: str, headers: dict[str, str]) -> dict[str, str]:
        return {"X-Forwarded-For": address, **headers}

    with dashboard(sqlite_migrated) as (_, port):
        _burst(port, "203.0.113.9")
        for address in ("203.0.113.9", "203.0.113.10", "198.51.100.1"):
            answer = _get("127.0.0.1", port, "/api/tasks", headers=as_(address, WRONG))
            assert answer.status_code == 429, (address, answer.text)  # 127.0.0.1's count
        assert _get("127.0.0.1", port, "/api/tasks", headers=as_("203.0.113.9", BEARER)).is_success
        signed_in = httpx.post(
            f"http://127.0.0.1:{port}/login",
            data={"token": TOKEN},
            headers={"X-Forwarded-Proto": "https"},
            timeout=10,
        )
        assert signed_in.status_code == 303
        assert "secure" not in signed_in.headers["set-cookie"].lower()
    with dashboard(sqlite_migrated, env={"STEPWARDEN_FORWARDED_ALLOW_IPS": "127.0.0.1"}) as (
        _,
        port,
    ):
        _burst(port, "203.0.113.9")
        refused = _get("127.0.0.1", port, "/api/tasks", headers=as_("203.0.113.9", WRONG))
        assert refused.status_code == 429
        for address in ("203.0.113.10", "127.0.0.1"):  # another client of the proxy; the proxy
            answer = _get("127.0.0.1", port, "/api/tasks", headers=as_(address, WRONG))
            assert answer.status_code == 401, (address, answer.text)
        assert _get("127.0.0.1", port, "/api/tasks", headers=as_("203.0.113.9", BEARER)).is_success
        signed_in = httpx.post(
            f"http://127.0.0.1:{port}/login",
            data={"token": TOKEN},
            headers={"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.20"},
            timeout=10,
        )
        assert signed_in.status_code == 303
        assert "secure" in signed_in.headers["set-cookie"].lower()
    dash = ("--store", sqlite_migrated, "dashboard", "--port", "0", "--token", TOKEN)
    refused_option = invoke(*dash, "--forwarded-allow-ips", "127.0.0.1,proxy.example")
    message = assert_refused(refused_option, exit_code=2)
    assert "--forwarded-allow-ips" in message and "'proxy.example'" in message, message


def test_a_sign_in_a_page_of_another_site_sends_is_refused_and_not_counted(
    sqlite_migrated: str,
) -> None:
    """A page of another site can make a browser post the sign-in form (to sign it in as it
    likes, or to spend that address's wrong tokens): the browser says so in Sec-Fetch-Site or
    Origin, and such a POST is refused (403) before its token is looked at, as every other
    POST of the dashboard is; a program, which sends neither header, signs in as before, and
    the application API's clients are not concerned."""
    cross_site = [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1"},
        {"Origin": "https://elsewhere.example"},
        {"Origin": "null"},
    ]
    with dashboard(sqlite_migrated) as (_, port):
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=10) as web:
            assert web.get("/login").status_code == 200
            for headers in cross_site * 5:
                answer = web.post("/login", data={"token": "wrong"}, headers=headers)
                assert answer.status_code == 403, (headers, answer.text)
                answer = web.post("/login", data={"token": TOKEN}, headers=headers)
                assert answer.status_code == 403 and "set-cookie" not in answer.headers
            for path in ("/logout", "/api/actions", "/api/tasks/t-1/pause"):
                answer = web.post(path, json={}, headers={**cross_site[0], **BEARER})
                assert answer.status_code == 403, (path, answer.text)
            # None of the 40 was counted: the first wrong sign-in from here is a 401.
            same = {"Sec-Fetch-Site": "same-origin", "Origin": url}
            assert web.post("/login", data={"token": "wrong"}, headers=same).status_code == 401
            for headers in (same, {}):  # a browser of this site; a program
                signed_in = web.post("/login", data={"token": TOKEN}, headers=headers)
                assert signed_in.status_code == 303, signed_in.text
            # The application API answers its clients whatever they send (no client here).
            api = web.post("/api/v1/tasks", json={}, headers={**cross_site[0], **WRONG})
            assert api.status_code == 401, api.text


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _raw_post(port: str, path: str, head: str, body: bytes | None) -> bytes:
    """Send a request by hand (headers, then `body` in 1 MiB pieces, or none at all); the
    first bytes of the answer."""
    with socket.create_connection(("127.0.0.1", int(port)), timeout=20) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode())
        if body is not None:
            with contextlib.suppress(OSError):  # the server may close before all is sent
                for _ in range(300):
                    conn.sendall(body)
        return conn.recv(200)


def test_a_300_mb_sign_in_is_refused_before_it_is_read(sqlite_migrated: str) -> None:
    with dashboard(sqlite_migrated) as (proc, port):
        assert _get("127.0.0.1", port, "/login").status_code == 200
        before = _peak_rss_kb(proc.pid)
        form = "Content-Type: application/x-www-form-urlencoded\r\n"
        # Declared: refused on its Content-Length, before a byte of the body is sent.
        answer = _raw_post(port, "/login", form + "Content-Length: 300000000\r\n", None)
        assert answer.startswith(b"HTTP/1.1 413"), answer
        # Streamed without a length: refused once 64 KiB have arrived.
        chunked = form + "Transfer-Encoding: chunked\r\n"
        piece = b"100000\r\n" + b"t" * 0x100000 + b"\r\n"
        answer = _raw_post(port, "/login", chunked, piece)
        assert answer.startswith(b"HTTP/1.1 413"), answer
        for path in ("/logout", "/api/actions"):
            answer = _raw_post(port, path, form + "Content-Length: 300000000\r\n", None)
            assert answer.startswith(b"HTTP/1.1 413"), (path, answer)
        assert _peak_rss_kb(proc.pid) - before < 50_000  # KiB: nothing like 300 MB was held


async def _asgi(store_url: str, path: str, method: str = "GET", **kwargs: Any) -> httpx.Response:
    app = sw.App("asgi", store=store_url)
    try:
        transport = httpx.ASGITransport(app=create_app(app, token=TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="https://127.0.0.1") as c:
            return await c.request(method, path, **kwargs)
    finally:
        await app.aclose()


def test_the_session_cookie_expires_and_is_secure_over_https(sqlite_migrated: str) -> None:
    signed_in = run_async(_asgi(sqlite_migrated, "/login", "POST", data={"token": TOKEN}))
    assert signed_in.status_code == 303
    cookie = signed_in.headers["set-cookie"].lower()
    for attribute in ("max-age=43200", "httponly", "samesite=strict", "secure"):
        assert attribute in cookie, cookie
    api = run_async(_asgi(sqlite_migrated, "/api/overview"))
    assert api.headers["cache-control"] == "no-store"


def test_a_short_token_is_refused(sqlite_migrated: str) -> None:
    with pytest.raises(sw.ConfigurationError, match="at least 16 characters"):
        create_app(sw.App("x", store=sqlite_migrated), token="short")
    done = subprocess.run(
        [STEPWARDEN, "--store", sqlite_migrated, "dashboard", "--port", "0", "--token", "2short"],
        cwd=REPO,
        env=process_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "at least 16 characters" in done.stderr, done.stderr


def test_history_pages_and_odd_ids_on_the_dashboard(served: Served) -> None:
    """A task with 250 events: the API and the page show the newest first, 100 at a time,
    and say when older ones exist. A task named `.` (stored by an earlier version) is linked
    with %2E, which reaches it."""

    async def setup() -> None:
        store = sw.App("setup", store=served.store_url)
        try:
            s = await app_store(store)
            await s.record_events([("order-1", "note", {"n": n}) for n in range(250)])
            await s.submit(
                [
                    Submission(
                        task_id=".",
                        workflow="process",
                        input="{}",
                        priority=0,
                        complete_within=60.0,
                        max_failures=3,
                        on_failure="stop",
                    )
                ]
            )
        finally:
            await store.aclose()

    run_async(setup())
    first = served.get("/api/tasks/order-1").json()
    assert len(first["events"]) == 100 and first["more_events"] is True
    assert first["events"][0]["id"] > first["events"][-1]["id"]
    assert first["events"][0]["detail"] == {"n": 249}
    older = served.get(f"/api/tasks/order-1?events_before={first['events_before']}").json()
    assert older["events"][0]["id"] == first["events"][-1]["id"] - 1
    page = served.get("/tasks/order-1").text
    assert f'href="?events_before={first["events_before"]}"' in page
    assert served.get("/api/tasks/order-1?events_before=0").status_code == 400
    tasks = served.get("/tasks?search=.&limit=1000").text
    assert 'href="/tasks/%2E"' in tasks
    assert served.get("/tasks/%2E").status_code == 200
    assert served.get("/api/tasks/%2E").json()["task"]["task_id"] == "."


@pytest.fixture
def sqlite_migrated(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"

    async def migrate() -> None:
        app = sw.App("migrate", store=url)
        await app_store(app)
        await app.aclose()

    asyncio.run(migrate())
    return url


def test_a_payload_nested_too_deep_is_refused_with_400(sqlite_migrated: str) -> None:
    """A secret 500 levels deep is read by any JSON parser but no payload may be so deep: a
    send or a skip carrying one is refused (400) with the limit, not failed (500)."""
    deep: Any = {"$secret": 1}
    for _ in range(500):
        deep = [deep]
    for path, body in (
        ("/api/tasks/t-1/send", {"name": "go", "payload": deep}),
        ("/api/tasks/t-1/skip", {"seq": 1, "result": deep}),
    ):
        answer = run_async(_asgi(sqlite_migrated, path, "POST", json=body, headers=BEARER))
        assert answer.status_code == 400, (path, answer.text)
        assert "nested deeper than 254 levels" in answer.json()["error"], path


def test_an_action_is_refused_before_its_body_is_parsed(sqlite_migrated: str) -> None:
    """Without the token (or with a session but no CSRF token) an action is refused 401 (403)
    whatever its body holds: a caller learns nothing of what the API would make of it."""
    broken = {"content": b'{"name": ', "headers": {"Content-Type": "application/json"}}
    for path in ("/api/tasks/t-1/send", "/api/tasks/t-1/skip", "/api/actions"):
        answer = run_async(_asgi(sqlite_migrated, path, "POST", **broken))
        assert answer.status_code == 401, (path, answer.text)
        assert answer.headers["www-authenticate"] == "Bearer"
        assert "API token" in answer.json()["error"]

    async def signed_in_without_csrf() -> httpx.Response:
        app = sw.App("asgi", store=sqlite_migrated)
        try:
            transport = httpx.ASGITransport(app=create_app(app, token=TOKEN))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
                await c.post("/login", data={"token": TOKEN})
                return await c.post("/api/tasks/t-1/send", **broken)  # type: ignore[arg-type]
        finally:
            await app.aclose()

    answer = run_async(signed_in_without_csrf())
    assert answer.status_code == 403, answer.text


def test_the_token_is_read_from_a_file_only_its_owner_may_read(
    sqlite_migrated: str, tmp_path: Path
) -> None:
    """--token-file keeps the token out of the process list; a file that others may read is
    refused, as is an empty one, or a token given twice."""
    private = tmp_path / "token"
    private.write_text(f"{TOKEN}\n")
    private.chmod(0o600)
    with dashboard(sqlite_migrated, "--auth-reads", token=("--token-file", str(private))) as (
        proc,
        port,
    ):
        assert _get("127.0.0.1", port, "/api/overview").status_code == 401
        assert _get("127.0.0.1", port, "/api/overview", headers=BEARER).status_code == 200
        assert TOKEN not in Path(f"/proc/{proc.pid}/cmdline").read_text()
    shared = tmp_path / "shared"
    shared.write_text(TOKEN)
    shared.chmod(0o640)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    # Each command is given a port already taken: one that took its token would stop there
    # ("cannot listen on", exit 1), before serving, rather than serve this test forever.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        dash = ("--store", sqlite_migrated, "dashboard", "--port", str(taken.getsockname()[1]))
        line = assert_refused(invoke(*dash, "--token-file", str(shared)), exit_code=2)
        assert "--token-file:" in line and "mode 640" in line and "chmod 600" in line, line
        line = assert_refused(invoke(*dash, "--token-file", str(empty)), exit_code=2)
        assert "--token-file:" in line and "at least 16 characters long, not 0" in line, line
        env = {"STEPWARDEN_DASHBOARD_TOKEN": TOKEN}
        twice = invoke(*dash, "--token-file", str(private), env=env)
        assert "give the API token once" in assert_refused(twice, exit_code=2)
        # A token given as an option is taken, with a warning that the process list shows it.
        given = invoke(*dash, "--token", TOKEN)
    assert "cannot listen on" in assert_refused(given, exit_code=1)
    assert "warning: --token shows in the process list" in given.stderr


def test_a_right_token_is_always_taken_and_each_door_counts_its_wrong_ones(
    sqlite_migrated: str,
) -> None:
    """Ten wrong tokens from one address (as bearer tokens, or to sign in) have its next wrong
    ones answered 429 with Retry-After; its right token is taken all the same, and the
    sign-in and the bearer token count apart; other addresses are not affected."""
    dry_run = {"action": "cancel", "task_ids": ["t-1"], "dry_run": True}
    wrong = {"Authorization": "Bearer wrong-token-0123456789"}

    async def go() -> None:
        app = sw.App("asgi", store=sqlite_migrated)
        web = create_app(app, token=TOKEN)

        def client(address: str) -> httpx.AsyncClient:
            transport = httpx.ASGITransport(app=web, client=(address, 40000))
            return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")

        try:
            async with client("198.51.100.7") as guesser, client("198.51.100.8") as other:
                for _ in range(10):
                    answer = await guesser.post("/api/actions", json=dry_run, headers=wrong)
                    assert answer.status_code == 401, answer.text
                refused = await guesser.post("/api/actions", json=dry_run, headers=wrong)
                assert refused.status_code == 429, refused.text
                assert 0 < int(refused.headers["retry-after"]) <= 60
                assert "too many wrong API tokens" in refused.json()["error"]
                allowed = await guesser.post("/api/actions", json=dry_run, headers=BEARER)
                assert allowed.status_code == 200, allowed.text
                signing_in = await guesser.post("/login", data={"token": TOKEN})
                assert signing_in.status_code == 303  # the sign-in's own count is untouched
                assert "stepwarden_session" in signing_in.cookies
                answer = await other.post("/api/actions", json=dry_run, headers=wrong)
                assert answer.status_code == 401
            async with client("198.51.100.9") as guesser:  # wrong sign-ins count apart
                for _ in range(10):
                    answer = await guesser.post("/login", data={"token": "wrong"})
                    assert answer.status_code == 401
                answer = await guesser.post("/login", data={"token": "wrong"})
                assert answer.status_code == 429 and "retry-after" in answer.headers
                answer = await guesser.post("/login", data={"token": TOKEN})
                assert answer.status_code == 303, answer.text
                answer = await guesser.post("/api/actions", json=dry_run, headers=wrong)
                assert answer.status_code == 401
        finally:
            await app.aclose()

    run_async(go())


def test_the_throttle_slides_ends_and_stays_bounded() -> None:
    now = [1000.0]
    throttle = Throttle(clock=lambda: now[0])
    for _ in range(9):
        throttle.failed("a")
    now[0] += 61  # nine wrong tokens a minute ago, then one: ten, but not within a minute
    throttle.failed("a")
    assert throttle.wait("a") == 0
    for _ in range(9):
        throttle.failed("a")
    assert throttle.wait("a") == 60  # ten within the last minute
    now[0] += 59.5
    assert throttle.wait("a") == 0.5
    now[0] += 0.5
    assert throttle.wait("a") == 0  # a minute later, free again, its count started anew
    throttle.failed("a")
    assert throttle.wait("a") == 0
    # An attacker rotating addresses grows neither table past its bound.
    for n in range(MAX_ADDRESSES + 5000):
        address = f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"
        for _ in range(10 if n % 2 else 1):
            throttle.failed(address)
    assert len(throttle.failures) <= MAX_ADDRESSES
    assert len(throttle.refused) <= MAX_ADDRESSES


def test_an_ipv6_client_is_counted_by_its_64_network() -> None:
    def address(host: str) -> str:
        return client_address(Request({"type": "http", "client": (host, 1), "headers": []}))

    assert (
        address("2001:db8:1:2:aaaa::1") == address("2001:db8:1:2:bbbb::2") == ("2001:db8:1:2::/64")
    )
    assert address("2001:db8:1:3::1") != address("2001:db8:1:2::1")
    assert address("::ffff:192.0.2.1") == address("192.0.2.1") == "192.0.2.1"


KNOWN_FLAWS = {
    # (where the requirement is, the package): (the last flawed release, the first fixed one)
    ("dependencies", "orjson"): ("3.11.5", "3.11.6"),  # CVE-2025-67221: unbounded recursion
    # CVE-2026-48710, CVE-2026-48818, CVE-2026-54282, CVE-2026-54283 (and 0.49.0's quadratic
    # Range header, CVE-2025-62727, before them)
    ("dashboard", "starlette"): ("1.3.0", "1.3.1"),
    ("dashboard", "fastapi"): ("0.132.1", "0.133.0"),  # the first to admit Starlette 1.x
    ("dashboard", "h11"): ("0.15.0", "0.16.0"),  # CVE-2025-43859: request smuggling
    ("dashboard", "uvicorn"): ("0.30.6", "0.31.0"),  # networks in forwarded_allow_ips
    ("dashboard", "jinja2"): ("3.1.5", "3.1.6"),  # CVE-2025-27516: the sandbox escaped
    ("examples", "django"): ("5.2.18", "5.2.19"),  # each 5.2 release fixes security issues
    ("examples", "aiohttp"): ("3.14.2", "3.14.3"),  # CVE-2026-47265 and follow-ups
    ("examples", "tqdm"): ("4.66.2", "4.66.3"),  # CVE-2024-34062: its arguments evaluated
    ("dev", "pytest"): ("9.0.2", "9.0.3"),  # CVE-2025-71176: a shared temporary directory
    ("build-system", "setuptools"): ("78.1.0", "78.1.1"),  # CVE-2024-6345, CVE-2025-47273
    ("build-system", "wheel"): ("0.46.1", "0.46.2"),  # CVE-2026-24049: a path traversal
}


def test_no_floor_admits_a_release_with_a_known_flaw() -> None:
    """Each requirement that a published advisory concerns excludes the flawed releases and
    admits the first fixed one; the installed release qualifies (but the build's, which is
    not installed here)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    where = {
        "dependencies": project["dependencies"],
        "build-system": pyproject["build-system"]["requires"],
        **project["optional-dependencies"],
    }
    for (place, name), (last_flawed, first_fixed) in KNOWN_FLAWS.items():
        [wanted] = [
            r.specifier for spec in where[place] if (r := Requirement(spec)).name.lower() == name
        ]
        assert last_flawed not in wanted and first_fixed in wanted, (place, name, wanted)
        if place != "build-system":
            assert metadata.version(name) in wanted, (place, name)
