"""The application API's clients: each has a name, scopes, settings and a bearer token, of
which only the SHA-256 digest is kept, in a tokens file (`stepwarden dashboard --api-tokens
FILE`).

The file has one client a line, `NAME SCOPES SHA256 [SETTING=VALUE ...]`: the name, the
scopes separated by commas, the hex digest of the token, then the client's own settings, if
any. One line `defaults SETTING=VALUE ...` (no scopes, no digest; anywhere in the file) sets
them for every client that does not set them itself; a setting set nowhere has its built-in
default (`SETTINGS`). Blank lines and lines starting with `#` are skipped.
`stepwarden api-token NAME --scope submit --scope read --set submit_rate=5` makes a token
and its line.

    # NAME    SCOPES               SHA256(TOKEN)   SETTINGS
    defaults  submit_rate=20 unfinished=1000
    billing   submit,read,events   5f2b...e1       channels=billing.*,orders priority=0..5
    shipper   agent:shipping       9a0c...42       instances=8 capacity=50

The settings bound what a client may ask (`SETTINGS` names each, its value and its
default): the dashboard applies them (`dashboard/_quotas.py`). A server reads the file again
when it changes (`TokensFile`): a client removed, a token revoked or a setting changed takes
effect within about a second, without a restart.

A token is 32 random bytes (256 bits, URL-safe base64 after `sw_`): its digest alone
cannot be turned back into it, and a plain hash is enough to keep it (no salt, no slow
hash: there is nothing to guess). A request's token is found by comparing its digest with
every client's in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ._files import OWNERS_TO_WRITE, read_guarded
from ._text import TENANT_PATTERN
from .errors import ConfigurationError

T = TypeVar("T")
logger = logging.getLogger("stepwarden.tokens")

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
DEFAULTS = "defaults"
"""The first field of the line of every client's settings (`defaults SETTING=VALUE ...`)."""
CLIENT_MARK = "{client}"
"""In a channel of the `channels` setting, the client's own name."""
EVERY = "*"
"""A `destinations` setting of `*`: every destination the operator lists."""
RECHECK = 1.0
"""Seconds between two looks at the tokens file for a change (`TokensFile`)."""
MAX_INT = 2**31 - 1


# -- the settings ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Kind(Generic[T]):
    """How a setting's value is written: `read` turns the text into the value (ValueError
    saying what is wrong), `show` the value into the text."""

    read: Callable[[str], T]
    show: Callable[[T], str]
    form: str
    """What the value looks like, for the help."""


def _count(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_INT:
        raise ValueError(f"expected a whole number from 0 to {MAX_INT}, not {text!r}")
    return int(text)


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= MAX_INT:
        raise ValueError(f"expected a number above 0, not {text!r}")
    return value


def _range(text: str) -> tuple[int, int]:
    low, dots, high = text.partition("..")
    try:
        found = int(low), int(high)
    except ValueError:
        found = (1, 0)
    if not dots or not -MAX_INT - 1 <= found[0] <= found[1] <= MAX_INT:
        raise ValueError(f"expected LOW..HIGH, whole numbers with LOW <= HIGH, not {text!r}")
    return found


def _list(item: Callable[[str], str]) -> Callable[[str], tuple[str, ...]]:
    def read(text: str) -> tuple[str, ...]:
        return tuple(item(x) for x in text.split(",") if x) if text else ()

    return read


def _channel(text: str) -> str:
    """A channel's name, or the start of names when it ends with `*`; `{client}` in it
    stands for the client's name."""
    if "*" in text[:-1] or "://" in text or not text.isprintable() or len(text) > 200:
        raise ValueError(
            f"expected channel names, each a name or the start of names followed by '*' "
            f"({CLIENT_MARK} for the client's name), not {text!r}"
        )
    return text


def _entry(text: str) -> str:
    if text != EVERY and not NAME_PATTERN.fullmatch(text):
        raise ValueError(
            f"expected the names of entries of the destinations file (or {EVERY}: every "
            f"one), not {text!r}"
        )
    return text


def _tenant(text: str) -> str:
    if text != EVERY and not TENANT_PATTERN.fullmatch(text):
        raise ValueError(f"expected tenants' names (or {EVERY}: every tenant), not {text!r}")
    return text


def _workflow(text: str) -> str:
    if text != EVERY and (not text.isprintable() or "," in text or len(text) > 200):
        raise ValueError(f"expected workflows' names (or {EVERY}: every workflow), not {text!r}")
    return text


def _joined(values: tuple[str, ...]) -> str:
    return ",".join(values)


COUNT = Kind(_count, str, "N")
RATE = Kind(_rate, lambda v: f"{v:g}", "N")
RANGE = Kind(_range, lambda v: f"{v[0]}..{v[1]}", "LOW..HIGH")
CHANNELS = Kind(_list(_channel), _joined, "NAME,PREFIX*,...")
ENTRIES = Kind(_list(_entry), _joined, "ENTRY,...")
TENANTS = Kind(_list(_tenant), _joined, "TENANT,...")
WORKFLOWS = Kind(_list(_workflow), _joined, "WORKFLOW,...")


@dataclass(frozen=True, slots=True)
class Setting(Generic[T]):
    """A setting of the tokens file: its name, its built-in default, how it is written, and
    what it bounds."""

    name: str
    default: T
    kind: Kind[T]
    means: str

    def read(self, text: str) -> T:
        return self.kind.read(text)

    def show(self, value: T) -> str:
        return self.kind.show(value)


SETTINGS: dict[str, Setting[Any]] = {}
"""Every setting, by name, in the order of the help."""


def _setting(name: str, default: T, kind: Kind[T], means: str) -> Setting[T]:
    SETTINGS[name] = made = Setting(name, default, kind, means)
    return made


SUBMIT_RATE = _setting("submit_rate", 50.0, RATE, "submits a second (a burst of as many)")
SUBMIT_BYTES = _setting("submit_bytes", 1024 * 1024, COUNT, "bytes of task input a second")
INPUT_BYTES = _setting("input_bytes", 256 * 1024, COUNT, "bytes of one task's input (JSON)")
UNFINISHED = _setting("unfinished", 10_000, COUNT, "tasks submitted and not yet finished")
PRIORITY = _setting("priority", (-10, 10), RANGE, "the priorities a submit may ask for")
REPLY_CHANNELS = _setting(
    "channels", (CLIENT_MARK, CLIENT_MARK + ".*"), CHANNELS, "channels reply_to may name"
)
DESTINATIONS = _setting("destinations", (), ENTRIES, "destinations-file entries reply_to may name")
INSTANCES = _setting("instances", 64, COUNT, "alive agent registrations")
CAPACITY = _setting("capacity", 1000, COUNT, "the capacity of one agent instance")
TTL = _setting("ttl", 300, COUNT, "seconds an agent instance may live without a beat")
POLLS = _setting("polls", 100, COUNT, "long polls at once (results, agents' claims)")
STREAMS = _setting("streams", 100, COUNT, "streams at once (status messages, wake-ups)")
GRANT_TENANTS = _setting(
    "tenants",
    (),
    TENANTS,
    "tenants besides its own whose tasks it may submit and see (* every one)",
)
GRANT_WORKFLOWS = _setting(
    "workflows", (), WORKFLOWS, "workflows whose tasks it may see, of any tenant (* every one)"
)


def settings_help() -> str:
    """Every setting, its value's form, what it bounds and its default, for the help."""
    return "; ".join(
        f"{s.name}={s.kind.form} ({s.means}; default {s.show(s.default) or 'none'})"
        for s in SETTINGS.values()
    )


Given = tuple[tuple[str, Any], ...]
"""Settings as a line gives them: (name, value), in the order of `SETTINGS`."""


def read_settings(fields: Iterable[str]) -> Given:
    """`SETTING=VALUE` fields as values; ConfigurationError naming the setting at fault."""
    found: dict[str, Any] = {}
    for number, field in enumerate(fields, 1):
        key, equals, text = field.partition("=")
        if not equals:
            raise ConfigurationError(f"setting {number} is not SETTING=VALUE")
        setting = SETTINGS.get(key)
        if setting is None:
            raise ConfigurationError(f"unknown setting {key[:40]!r} (known: {', '.join(SETTINGS)})")
        if key in found:
            raise ConfigurationError(f"the setting {key} is given twice")
        try:
            found[key] = setting.read(text)
        except ValueError as exc:
            raise ConfigurationError(f"the setting {key}: {exc}") from None
    return tuple((name, found[name]) for name in SETTINGS if name in found)


def _shown(given: Given) -> str:
    return "".join(f" {name}={SETTINGS[name].show(value)}" for name, value in given)


# -- clients ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Client:
    """A client of the application API, as the tokens file names it."""

    name: str
    scopes: frozenset[str]
    digest: bytes
    """The SHA-256 digest of its token."""
    own: Given = ()
    """The settings of its line."""
    defaults: Given = ()
    """The settings of the file's `defaults` line."""

    def line(self) -> str:
        """Its line in the tokens file."""
        return f"{self.name} {','.join(sorted(self.scopes))} {self.digest.hex()}{_shown(self.own)}"

    def setting(self, setting: Setting[T]) -> T:
        """The value of `setting` for this client: its own, else the file's default, else
        the built-in default."""
        for given in (self.own, self.defaults):
            for name, value in given:
                if name == setting.name:
                    return value  # type: ignore[no-any-return]
        return setting.default

    def may_name_channel(self, channel: str) -> bool:
        """Whether the `channels` setting gives this client the plain channel `channel`."""
        for pattern in self.setting(REPLY_CHANNELS):
            pattern = pattern.replace(CLIENT_MARK, self.name)
            if pattern.endswith("*"):
                if channel.startswith(pattern[:-1]):
                    return True
            elif channel == pattern:
                return True
        return False

    def may_submit_as(self, tenant: str) -> bool:
        """Whether the client may submit a task of `tenant`: its own name, or one its
        `tenants` setting grants."""
        granted = self.setting(GRANT_TENANTS)
        return tenant == self.name or tenant in granted or EVERY in granted

    def may_see(self, tenant: str | None, workflow: str) -> bool:
        """Whether the client may read, follow, send events to and cancel a task of
        `tenant` (None: a task of no tenant) and `workflow`: one of the tenants it may
        submit as, or of a workflow its `workflows` setting grants. The application API
        answers any other task as one that does not exist."""
        if tenant is not None and self.may_submit_as(tenant):
            return True
        granted = self.setting(GRANT_WORKFLOWS)
        return workflow in granted or EVERY in granted

    def destination_entries(self) -> tuple[str, ...] | None:
        """The entries of the destinations file the client may name; None: every one."""
        entries = self.setting(DESTINATIONS)
        return None if EVERY in entries else entries


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
    if name == DEFAULTS:
        raise ConfigurationError(f"{DEFAULTS!r} names the line of every client's settings")
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


def new_client(
    name: str, scopes: Iterable[str], settings: Iterable[str] = ()
) -> tuple[str, Client]:
    """A new token for the client `name` with `scopes` and `settings` (`SETTING=VALUE`
    each), and the client as its line in the tokens file records it (without the token)."""
    checked = check_name(name), check_scopes(scopes)
    own = read_settings(settings)
    token = new_token()
    return token, Client(*checked, digest(token), own)


def parse(
    text: str, where: str = "the tokens file", destinations: Collection[str] | None = None
) -> Clients:
    """The clients of a tokens file's text; ConfigurationError naming the line at fault (and
    the setting). With `destinations` (the entries of the destinations file), a client given
    another entry is refused."""
    lines: list[tuple[str, Client]] = []
    names: set[str] = set()
    digests: set[bytes] = set()
    defaults: tuple[str, Given] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        at = f"{where}, line {number}"
        fields = line.split()
        try:
            if fields[0] == DEFAULTS and all("=" in f for f in fields[1:]):
                if defaults is not None:
                    raise ConfigurationError(f"a second {DEFAULTS} line ({defaults[0]} is one)")
                defaults = (f"line {number}", read_settings(fields[1:]))
                continue
            if len(fields) < 3 or any("=" in f for f in fields[:3]):
                raise ConfigurationError(
                    "expected NAME SCOPES SHA256 (scopes separated by commas), then "
                    f"SETTING=VALUE fields, or a line '{DEFAULTS} SETTING=VALUE ...'"
                )
            name, scopes, hexdigest, *given = fields
            check_name(name)
            found = check_scopes(s for s in scopes.split(",") if s)
            if not DIGEST_PATTERN.fullmatch(hexdigest):
                raise ConfigurationError(
                    "the token's SHA-256 digest is 64 lowercase hex digits, as "
                    "`stepwarden api-token` prints it"
                )
            own = read_settings(given)
            value = bytes.fromhex(hexdigest)
            if name in names:
                raise ConfigurationError(f"the client {name!r} is named twice")
            if value in digests:
                raise ConfigurationError("this token's digest is another client's too")
        except ConfigurationError as exc:
            raise ConfigurationError(f"{at}: {exc}") from None
        names.add(name)
        digests.add(value)
        lines.append((at, Client(name, found, value, own)))
        if len(lines) > MAX_CLIENTS:
            raise ConfigurationError(f"{where}: more than {MAX_CLIENTS} clients")
    common = () if defaults is None else defaults[1]
    clients = [Client(c.name, c.scopes, c.digest, c.own, common) for _, c in lines]
    if destinations is not None:
        places = [f"{where}, {defaults[0]}"] if defaults is not None else []
        _known(destinations, [(p, common) for p in places] + [(a, c.own) for a, c in lines])
    return Clients(tuple(clients))


def _known(destinations: Collection[str], given: Sequence[tuple[str, Given]]) -> None:
    for at, settings in given:
        for name, value in settings:
            if name != DESTINATIONS.name:
                continue
            unknown = [e for e in value if e != EVERY and e not in destinations]
            if unknown:
                raise ConfigurationError(
                    f"{at}: the setting {name}: the destinations file has no entry "
                    f"{unknown[0]!r} (its entries: {', '.join(sorted(destinations)) or 'none'})"
                )


def read(path: str | os.PathLike[str], destinations: Collection[str] | None = None) -> Clients:
    """The clients of the tokens file at `path`. A file that others than its owner may write
    is refused: whoever can write it can add a client."""
    text = read_guarded(path, "the API tokens file", OWNERS_TO_WRITE)
    return parse(text, repr(os.fspath(path)), destinations)


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


class TokensFile:
    """The tokens file at `path`, read at once (ConfigurationError when it is wrong), then
    again when it changes: `clients()` looks at the file at most once every RECHECK seconds.
    A file that became wrong (or unreadable, or gone) keeps the clients last read, and its
    error is logged once for each change. A file changed within the last two seconds is read
    again at the next look whatever its stamp says: two writes within one tick of the file
    system's clock leave the same time."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        destinations: Collection[str] | None = None,
        every: float = RECHECK,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = os.fspath(path)
        self.destinations = destinations
        self.every = every
        self.clock = clock
        self._stamp = self._look()
        self._current = read(self.path, destinations)
        self._looked = clock()
        self._failed: str | None = None
        """The error last logged, until the file is read right again."""

    def _look(self) -> tuple[int, ...] | None:
        """What changes when the file does (None: it cannot be seen); a file written in the
        last two seconds gives a stamp of its own each time."""
        try:
            s = os.stat(self.path)
        except OSError:
            return None
        fresh = time.time() - s.st_mtime < 2.0
        return (s.st_ino, s.st_dev, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_mode) + (
            (time.monotonic_ns(),) if fresh else ()
        )

    def clients(self) -> Clients:
        """The clients, the file read again if it changed since it was last looked at."""
        now = self.clock()
        if now - self._looked < self.every:
            return self._current
        self._looked = now
        stamp = self._look()
        if stamp == self._stamp:
            return self._current
        self._stamp = stamp
        try:
            found = read(self.path, self.destinations)
        except ConfigurationError as exc:
            if str(exc) != self._failed:
                self._failed = str(exc)
                kept = len(self._current)
                logger.error("%s: the %d client(s) read before are kept", exc, kept)
            return self._current
        self._failed = None
        if found != self._current:
            self._current = found
            logger.info("%s read again: %d client(s)", self.path, len(found))
        return self._current
