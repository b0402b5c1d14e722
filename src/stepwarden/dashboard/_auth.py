"""Who may change things: the API token, and the UI's sessions with their CSRF tokens.

Reads are open to whoever reaches the dashboard (it listens on 127.0.0.1 unless told
otherwise). A state-changing request is a POST that carries either the API token
(`Authorization: Bearer TOKEN`), or the session cookie the sign-in page sets together with
that session's CSRF token (`X-CSRF-Token` header, or a `csrf_token` form field). The cookie
alone is not enough: another site can make a browser send it, but cannot read the CSRF token.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field

from starlette.requests import Request

SESSION_COOKIE = "stepwarden_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
MAX_SESSIONS = 1000
"""Sessions kept in memory; the oldest is forgotten first (its user signs in again)."""


def new_token() -> str:
    return secrets.token_urlsafe(24)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a request may change state; if not, the status to answer and why."""

    allowed: bool
    status: int = 200
    reason: str = ""


@dataclass
class Guard:
    token: str
    sessions: dict[str, str] = field(default_factory=dict)
    """Session id -> its CSRF token."""

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token.encode())

    def sign_in(self) -> str:
        """A new session; its id goes in the cookie."""
        while len(self.sessions) >= MAX_SESSIONS:
            self.sessions.pop(next(iter(self.sessions)))
        session = new_token()
        self.sessions[session] = new_token()
        return session

    def sign_out(self, request: Request) -> None:
        self.sessions.pop(request.cookies.get(SESSION_COOKIE, ""), None)

    def csrf_for(self, request: Request) -> str | None:
        """The CSRF token of the request's session, or None when it has no valid session."""
        return self.sessions.get(request.cookies.get(SESSION_COOKIE, ""))

    def check(self, request: Request, form_csrf: str | None = None) -> Verdict:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if header:
            if scheme.lower() == "bearer" and self.token_matches(given.strip()):
                return Verdict(True)
            return Verdict(False, 401, "the API token is wrong")
        csrf = self.csrf_for(request)
        if csrf is None:
            return Verdict(False, 401, "an API token (Authorization: Bearer TOKEN) is needed")
        sent = request.headers.get(CSRF_HEADER) or form_csrf or ""
        if not hmac.compare_digest(sent.encode(), csrf.encode()):
            return Verdict(False, 403, "the CSRF token is missing or wrong")
        return Verdict(True)
