"""Who may read and change things: the API token, and the UI's sessions with their CSRF
tokens.

Reads are open to whoever reaches the dashboard when it listens on a loopback address, but
for a request that came through a proxy, and need the token or a session otherwise
(`auth_reads`). A state-changing request is a POST
that carries either the API token (`Authorization: Bearer TOKEN`), or the session cookie the
sign-in page sets together with that session's CSRF token (`X-CSRF-Token` header, or a
`csrf_token` form field). The cookie alone is not enough: another site can make a browser
send it, but cannot read the CSRF token. A session ends SESSION_SECONDS after sign-in.

A right token is always taken: only wrong ones are counted, against the address they came
from (`client_address`), and an address that sends MAX_FAILURES wrong ones within a minute
has its next wrong ones answered 429 for a minute instead of 401. The sign-in and the API
token have a throttle each (`Guard`), as have the application API and the agent protocol
(`_app_api.ClientGuard`): wrong tokens sent to one do not refuse anything of another, and
none refuses a client that has its token. Guessing is not what this stops (a token is
random, and 192 or 256 bits long when stepwarden makes it): it keeps a client that sends a
stale token from being told so thousands of times a second.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import os
import secrets
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request

from .._files import PRIVATE, read_guarded
from ..errors import ConfigurationError

SESSION_COOKIE = "stepwarden_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
MAX_SESSIONS = 1000
"""Sessions kept in memory; the oldest is forgotten first (its user signs in again)."""
SESSION_SECONDS = 12 * 3600
"""How long a session lasts after sign-in (the cookie's Max-Age, and kept in memory)."""
MIN_TOKEN = 16
"""The shortest API token accepted, in characters."""
MAX_FAILURES = 10
"""Wrong tokens one address may send within FAILURE_WINDOW seconds before it is refused."""
FAILURE_WINDOW = 60.0
REFUSED_FOR = 60.0
"""Seconds an address that sent MAX_FAILURES wrong tokens has its wrong tokens answered 429
(its right ones are taken)."""
MAX_ADDRESSES = 10_000
"""Addresses remembered at once (in each of the throttle's tables); the one heard from least
recently is forgotten first."""
API_TOKEN = "api-token"
SESSION = "session"
"""How a request was authenticated: recorded beside the operator's `by`."""


def new_token() -> str:
    return secrets.token_urlsafe(24)


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The API token held in the file at `path`, its surrounding whitespace (a trailing
    newline) ignored. A file its group or others may read or write is refused: the token is
    a password, and such a file shares it."""
    return check_token(read_guarded(path, "the API token's file", PRIVATE).strip())


def state_directory() -> Path:
    """Where stepwarden keeps its user's files: $XDG_STATE_HOME/stepwarden, else
    ~/.local/state/stepwarden."""
    base = os.environ.get("XDG_STATE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state") / "stepwarden"


def write_new_token(directory: Path | None = None) -> tuple[str, Path]:
    """A new API token, written to a new file that only its owner may read or write (0600),
    in `directory` (default: `state_directory()`, made private if missing); the token and the
    file's path."""
    token = new_token()
    try:
        directory = directory or state_directory()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="dashboard-", suffix=".token", dir=directory)
        with os.fdopen(fd, "w") as file:
            file.write(f"{token}\n")
    except (OSError, RuntimeError) as exc:  # RuntimeError: no home directory
        raise ConfigurationError(f"cannot write a new API token to a file: {exc}") from exc
    return token, Path(name)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a request may change state; if not, the status to answer and why."""

    allowed: bool
    status: int = 200
    reason: str = ""
    identity: str | None = None
    """How the request was authenticated (API_TOKEN or SESSION), when it was."""
    retry_after: int = 0
    """With 429: seconds before the request's address may send a token again."""

    @property
    def headers(self) -> dict[str, str]:
        """The headers of the answer that refuses the request."""
        if self.status == 429:
            return {"Retry-After": str(self.retry_after)}
        return {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}


def check_token(token: str) -> str:
    if len(token) < MIN_TOKEN:
        raise ConfigurationError(
            f"the API token must be at least {MIN_TOKEN} characters long, not {len(token)}"
        )
    return token


PROXY_HEADERS = (
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
)
"""Headers a reverse proxy adds: a request carrying one came from elsewhere, whatever address
it reached the dashboard from."""


def through_proxy(request: Request) -> bool:
    """Whether the request came through a proxy (so from anywhere), by the headers it adds."""
    return any(name in request.headers for name in PROXY_HEADERS)


def client_address(request: Request) -> str:
    """Whom a request's wrong tokens count against: its client's address, an IPv6 address by
    its /64 network (which one machine may have whole). The address is the connection's
    peer, but for a peer the server was told to believe (`dashboard.config`
    forwarded_allow_ips), whose `X-Forwarded-For` names it."""
    host = request.client.host if request.client else ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass
class Throttle:
    """Wrong tokens, counted per client address: MAX_FAILURES within a sliding
    FAILURE_WINDOW refuse the address for REFUSED_FOR seconds. Each table holds at most
    MAX_ADDRESSES, so that a sender that keeps changing its address cannot grow them."""

    clock: Callable[[], float] = time.monotonic
    failures: dict[str, deque[float]] = field(default_factory=dict)
    """Address -> the times of its latest wrong tokens, the address heard from last, last."""
    refused: dict[str, float] = field(default_factory=dict)
    """Address -> when its refusal ends."""

    def wait(self, address: str) -> float:
        """Seconds before `address` may send a token again (0: now)."""
        until = self.refused.get(address)
        if until is None:
            return 0.0
        left = until - self.clock()
        if left > 0:
            return left
        del self.refused[address]
        return 0.0

    def wrong(self, address: str, wrong: str, too_many: str) -> Verdict:
        """`address` sent a wrong token: 401 (`wrong` says why), counted; or, while the
        address is refused, 429 (`too many`: what it sent too many of)."""
        wait = math.ceil(self.wait(address))
        if wait > 0:
            reason = f"too many {too_many} from this address: try again in {wait} s"
            return Verdict(False, 429, reason, retry_after=wait)
        self.failed(address)
        return Verdict(False, 401, wrong)

    def failed(self, address: str) -> None:
        """`address` sent a wrong token."""
        now = self.clock()
        times = self.failures.pop(address, None) or deque(maxlen=MAX_FAILURES)
        times.append(now)
        if len(times) == MAX_FAILURES and now - times[0] <= FAILURE_WINDOW:
            _remember(self.refused, address, now + REFUSED_FOR)
        else:
            _remember(self.failures, address, times)


def _remember(table: dict[str, Any], key: str, value: Any) -> None:
    """Put `key` last in `table`, forgetting the first entries past MAX_ADDRESSES."""
    table.pop(key, None)
    while len(table) >= MAX_ADDRESSES:
        table.pop(next(iter(table)))
    table[key] = value


@dataclass
class Guard:
    token: str
    sessions: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Session id -> its CSRF token and when it ends (monotonic seconds)."""
    throttle: Throttle = field(default_factory=Throttle)
    """The wrong API tokens sent as `Authorization: Bearer`."""
    sign_ins: Throttle = field(default_factory=Throttle)
    """The wrong API tokens sent to sign in."""

    def __post_init__(self) -> None:
        check_token(self.token)

    def try_token(self, request: Request, given: str, *, signing_in: bool = False) -> Verdict:
        """The API token the request gives: right (taken, whatever came before from its
        address), or wrong: counted against its address in the bearer token's throttle, or
        the sign-in's, and 401, or 429 while that address is refused there."""
        if hmac.compare_digest(given.encode(), self.token.encode()):
            return Verdict(True, identity=API_TOKEN)
        throttle = self.sign_ins if signing_in else self.throttle
        return throttle.wrong(client_address(request), "the API token is wrong", "wrong API tokens")

    def sign_in(self) -> str:
        """A new session; its id goes in the cookie."""
        while len(self.sessions) >= MAX_SESSIONS:
            self.sessions.pop(next(iter(self.sessions)))
        session = new_token()
        self.sessions[session] = (new_token(), time.monotonic() + SESSION_SECONDS)
        return session

    def sign_out(self, request: Request) -> None:
        self.sessions.pop(request.cookies.get(SESSION_COOKIE, ""), None)

    def csrf_for(self, request: Request) -> str | None:
        """The CSRF token of the request's session, or None when it has no valid session."""
        session = request.cookies.get(SESSION_COOKIE, "")
        found = self.sessions.get(session)
        if found is None:
            return None
        csrf, ends = found
        if time.monotonic() >= ends:
            del self.sessions[session]
            return None
        return csrf

    def _bearer(self, request: Request) -> Verdict | None:
        header = request.headers.get("authorization", "")
        if not header:
            return None
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer":
            return self.try_token(request, given.strip())
        return Verdict(False, 401, "the API token is wrong")

    def check_read(self, request: Request) -> Verdict:
        """May the request read: the API token, or a signed-in session."""
        verdict = self._bearer(request)
        if verdict is not None:
            return verdict
        if self.csrf_for(request) is not None:
            return Verdict(True, identity=SESSION)
        return Verdict(False, 401, "sign in, or send the API token (Authorization: Bearer TOKEN)")

    def check(self, request: Request, form_csrf: str | None = None) -> Verdict:
        """May the request change state: the API token, or a session and its CSRF token."""
        verdict = self._bearer(request)
        if verdict is not None:
            return verdict
        csrf = self.csrf_for(request)
        if csrf is None:
            return Verdict(False, 401, "an API token (Authorization: Bearer TOKEN) is needed")
        sent = request.headers.get(CSRF_HEADER) or form_csrf or ""
        if not hmac.compare_digest(sent.encode(), csrf.encode()):
            return Verdict(False, 403, "the CSRF token is missing or wrong")
        return Verdict(True, identity=SESSION)
