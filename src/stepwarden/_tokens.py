"""The application API's clients: each has a name, scopes and a bearer token, of which only
the SHA-256 digest is kept, in a tokens file (`stepwarden dashboard --api-tokens FILE`).

The file has one client a line, `NAME SCOPES SHA256`: the name, the scopes separated by
commas, and the hex digest of the token; blank lines and lines starting with `#` are
skipped. `stepwarden api-token NAME --scope submit --scope read` makes a token and its line.

    # NAME    SCOPES               SHA256(TOKEN)
    billing   submit,read,events   5f2b...e1

A token is 32 random bytes (256 bits, URL-safe base64 after `sw_`): its digest alone
cannot be turned back into it, and a plain hash is enough to keep it (no salt, no slow
hash: there is nothing to guess). A request's token is found by comparing its digest with
every client's in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import ConfigurationError

SCOPES = ("submit", "read", "events", "cancel")
"""What a client may do with the application API: submit tasks; read their status, result
and status messages; send them events; cancel them."""
AGENT_SCOPE = "agent:"
"""`agent:NAME`: the agent protocol's routes of the agent NAME (`/api/v1/agents/NAME/...`):
serving it over HTTP, from a process without a database connection."""
TOKEN_PREFIX = "sw_"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
"""A client's name: what an action of its records as who acted."""
DIGEST_PATTERN = re.compile(r"[0-9a-f]{64}")
MAX_CLIENTS = 10_000


@dataclass(frozen=True, slots=True)
class Client:
    """A client of the application API, as the tokens file names it."""

    name: str
    scopes: frozenset[str]
    digest: bytes
    """The SHA-256 digest of its token."""

    def line(self) -> str:
        """Its line in the tokens file."""
        return f"{self.name} {','.join(sorted(self.scopes))} {self.digest.hex()}"


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigurationError(
            f"a client's name is 1 to 64 letters, digits, '_', '.', '@' or '-', starting with "
            f"a letter or a digit: not {name!r}"
        )
    return name


def check_scopes(scopes: Iterable[str]) -> frozenset[str]:
    """The scopes given, each known (or `agent:NAME`), at least one."""
    found = frozenset(scopes)
    if not found:
        raise ConfigurationError(f"give a client at least one scope: {', '.join(SCOPES)}")
    for scope in found:
        if scope in SCOPES:
            continue
        if scope.startswith(AGENT_SCOPE) and NAME_PATTERN.fullmatch(scope[len(AGENT_SCOPE) :]):
            continue
        raise ConfigurationError(
            f"unknown scope {scope!r} (known: {', '.join(SCOPES)}, and agent:NAME)"
        )
    return found


def new_client(name: str, scopes: Iterable[str]) -> tuple[str, Client]:
    """A new token for the client `name` with `scopes`, and the client as its line in the
    tokens file records it (without the token)."""
    checked = check_name(name), check_scopes(scopes)
    token = new_token()
    return token, Client(*checked, digest(token))


def parse(text: str, where: str = "the tokens file") -> Clients:
    """The clients of a tokens file's text; ConfigurationError naming the line at fault."""
    clients: list[Client] = []
    names: set[str] = set()
    digests: set[bytes] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        at = f"{where}, line {number}"
        fields = line.split()
        if len(fields) != 3:
            raise ConfigurationError(
                f"{at}: expected NAME SCOPES SHA256 (scopes separated by commas), "
                f"not {len(fields)} field(s)"
            )
        name, scopes, hexdigest = fields
        try:
            check_name(name)
            found = check_scopes(s for s in scopes.split(",") if s)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{at}: {exc}") from None
        if not DIGEST_PATTERN.fullmatch(hexdigest):
            raise ConfigurationError(
                f"{at}: the token's SHA-256 digest is 64 lowercase hex digits, as "
                "`stepwarden api-token` prints it"
            )
        value = bytes.fromhex(hexdigest)
        if name in names:
            raise ConfigurationError(f"{at}: the client {name!r} is named twice")
        if value in digests:
            raise ConfigurationError(f"{at}: this token's digest is another client's too")
        names.add(name)
        digests.add(value)
        clients.append(Client(name, found, value))
        if len(clients) > MAX_CLIENTS:
            raise ConfigurationError(f"{where}: more than {MAX_CLIENTS} clients")
    return Clients(tuple(clients))


def read(path: str | os.PathLike[str]) -> Clients:
    """The clients of the tokens file at `path`. A file that others than its owner may write
    is refused: whoever can write it can add a client."""
    shown = os.fspath(path)
    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            if stat.S_ISREG(mode) and mode & 0o022:
                raise ConfigurationError(
                    f"{shown!r} may be written by others than its owner (mode "
                    f"{stat.S_IMODE(mode):o}): make it theirs alone to write, chmod 644 or 600"
                )
            text = file.read().decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read the API tokens file {shown!r}: {exc}") from exc
    return parse(text, repr(shown))


@dataclass(frozen=True, slots=True)
class Clients:
    """The clients a server knows."""

    clients: Sequence[Client] = ()

    def find(self, token: str) -> Client | None:
        """The client whose token this is, or None: the token's digest is compared with every
        client's in constant time (no early end that would time which one it resembles)."""
        given = digest(token)
        found = None
        for client in self.clients:
            if hmac.compare_digest(given, client.digest):
                found = client
        return found

    def __len__(self) -> int:
        return len(self.clients)
