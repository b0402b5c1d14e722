"""Secrets sealed at rest, and the digest a re-submit is compared by.

**Sealing.** With a keyring of the operator's, every `Secret` in a payload is stored sealed:
`{"$sealed": "ID:DATA"}`, DATA the URL-safe base64 of a random 96-bit nonce and the AES-256-GCM
ciphertext of the secret's JSON value, under the key ID. The cipher authenticates the task and
the record that holds the value (`Binding`: the task's id and `input`, `result`, `step/SEQ` or
`event/EVENT_ID`) as associated data: a sealed value copied to another task or another record
does not open there. A value read from the store stays sealed (`Sealed`) until the code that
needs it reveals it (`Secret.reveal()`), in a process that holds the key; it is written back
where it came from as it is, and sealed again where it goes elsewhere (a workflow that hands
its input's secret to a step).

A keyring is text of lines `seal ID KEY` and `digest ID KEY` (KEY: 32 random bytes, URL-safe
base64; `#` starts a comment), from the file `STEPWARDEN_KEYRING` names (its owner's alone to
read: chmod 600) or from the variable `STEPWARDEN_KEYS` itself (lines, or entries separated by
`;`). The last `seal` key seals new writes; the others only open what they sealed, until
`stepwarden reseal` has moved every value to the newest. `stepwarden keys new` makes a key.

The store keeps, for each key that sealed something, a value sealed under it (`check`), never
the key: a keyring whose key of that id does not open it is the wrong one, refused at once.

**The digest.** A re-submit under a task's id is the same submission when its workflow, its
client and its input are the same. The input is compared by a digest of its canonical JSON
text (keys sorted, secrets as `{"$secret": VALUE}`), taken when the task is submitted, never by
reading the stored input back and revealing its secrets: an answer that said whether a guessed
value matched a stored secret would let a client guess it. With a keyring, the digest is keyed
(HMAC-SHA256 under its `digest` key, which no reseal changes); without one, the input's secrets
are stored plain and the digest is a plain SHA-256.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ._files import PRIVATE, read_guarded
from .errors import KeyringError

SEALED_KEY = "$sealed"
"""The reserved key of a sealed secret in stored JSON: {"$sealed": "ID:DATA"}."""
KEYRING_ENV = "STEPWARDEN_KEYRING"
"""The environment variable that names the keyring's file."""
KEYS_ENV = "STEPWARDEN_KEYS"
"""The environment variable that holds the keyring's text itself."""
KEY_BYTES = 32
NONCE_BYTES = 12
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
CHECK = b"stepwarden keyring check"
"""What the store's check of a key seals."""

DIGEST_PLAIN = "p"
"""The digest's kind without a key: SHA-256 (the input's secrets are stored plain then)."""
DIGEST_KEYED = "k"
"""The digest's kind with a keyring's digest key: HMAC-SHA256 (`k.ID:HEX`)."""


@dataclass(frozen=True, slots=True)
class Binding:
    """The record a sealed value belongs to: its task and the place in it. Sealed under one
    binding, a value opens under that binding only."""

    task_id: str
    record: str
    """`input`, `result`, `step/SEQ`, `event/EVENT_ID`, or a schedule's `input`."""

    @classmethod
    def input(cls, task_id: str) -> Binding:
        return cls(task_id, "input")

    @classmethod
    def result(cls, task_id: str) -> Binding:
        return cls(task_id, "result")

    @classmethod
    def step(cls, task_id: str, seq: int) -> Binding:
        return cls(task_id, f"step/{seq}")

    @classmethod
    def event(cls, task_id: str, event_id: str) -> Binding:
        return cls(task_id, f"event/{event_id}")

    @classmethod
    def schedule(cls, name: str) -> Binding:
        return cls(f"schedule:{name}", "input")

    def associated(self) -> bytes:
        """The associated data the cipher authenticates."""
        return b"stepwarden-seal\x00" + self.task_id.encode() + b"\x00" + self.record.encode()


@dataclass(frozen=True, slots=True)
class Keyring:
    """The operator's keys: `seal` keys by id (the last one seals new writes) and `digest`
    keys by id (the last one keys new digests). Its repr shows the ids only."""

    seal_keys: Mapping[str, bytes]
    current: str
    digest_keys: Mapping[str, bytes]
    digest_current: str

    def __repr__(self) -> str:
        return f"Keyring(seal={list(self.seal_keys)}, current={self.current!r})"

    # -- reading one ----------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, where: str = "the keyring") -> Keyring:
        """The keyring of `text`; KeyringError naming the line at fault (never a key)."""
        seal: dict[str, bytes] = {}
        digest: dict[str, bytes] = {}
        order: dict[str, list[str]] = {"seal": [], "digest": []}
        lines = (line.split("#", 1)[0] for line in text.splitlines())
        entries = [e.strip() for line in lines for e in line.split(";")]
        for number, entry in enumerate(entries, 1):
            if not entry:
                continue
            fields = entry.split()
            if len(fields) != 3 or fields[0] not in order:
                raise KeyringError(
                    f"{where}, entry {number}: expected `seal ID KEY` or `digest ID KEY`"
                )
            kind, key_id, encoded = fields
            if not ID_PATTERN.fullmatch(key_id):
                raise KeyringError(
                    f"{where}, entry {number}: a key's id is 1 to 32 letters, digits, '_', "
                    f"'.' or '-', starting with a letter or a digit"
                )
            table = seal if kind == "seal" else digest
            if key_id in table:
                raise KeyringError(f"{where}, entry {number}: the {kind} key {key_id!r} twice")
            table[key_id] = _key(encoded, f"{where}, entry {number}")
            order[kind].append(key_id)
        if not seal or not digest:
            raise KeyringError(
                f"{where} needs at least one `seal` key and one `digest` key "
                "(`stepwarden keys new` makes a keyring)"
            )
        return cls(seal, order["seal"][-1], digest, order["digest"][-1])

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Keyring:
        """The keyring in the file at `path`, which only its owner may read or write."""
        text = read_guarded(path, "the keyring", PRIVATE, KeyringError)
        return cls.parse(text, f"the keyring {os.fspath(path)!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Keyring | None:
        """The keyring the environment gives (`STEPWARDEN_KEYRING`, a file; or
        `STEPWARDEN_KEYS`, the text itself), or None when it gives none."""
        env = os.environ if environ is None else environ
        path, text = env.get(KEYRING_ENV, ""), env.get(KEYS_ENV, "")
        if path and text:
            raise KeyringError(f"give the keyring by {KEYRING_ENV} or by {KEYS_ENV}, not both")
        if path:
            return cls.from_file(path)
        if text:
            return cls.parse(text, f"${KEYS_ENV}")
        return None

    # -- sealing --------------------------------------------------------------------------
    def seal(self, plain: bytes, at: Binding) -> str:
        """`plain` sealed under the current key, bound to `at`: `ID:DATA`."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = AESGCM(self.seal_keys[self.current]).encrypt(nonce, plain, at.associated())
        return f"{self.current}:{base64.urlsafe_b64encode(nonce + sealed).decode().rstrip('=')}"

    def open(self, blob: str, at: Binding) -> bytes:
        """What `blob` seals, if it was sealed bound to `at` under a key of this keyring;
        KeyringError otherwise (a key it lacks, a wrong key, another record, a blob altered)."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key_id, _, data = blob.partition(":")
        key = self.seal_keys.get(key_id)
        if key is None:
            raise KeyringError(
                f"a value of {at.task_id!r} is sealed under the key {key_id!r}, which the "
                f"keyring lacks (it has {', '.join(self.seal_keys)})"
            )
        try:
            raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
            return AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], at.associated())
        except (InvalidTag, ValueError, binascii.Error):
            raise KeyringError(
                f"a sealed value of {at.task_id!r} ({at.record}) does not open under the key "
                f"{key_id!r}: a wrong key, or a value moved from another record or altered"
            ) from None

    def check(self, key_id: str | None = None) -> str:
        """The store's check of a key (the current one by default): a known text sealed
        under it."""
        ring = (
            self
            if key_id is None
            else Keyring(self.seal_keys, key_id, self.digest_keys, self.digest_current)
        )
        return ring.seal(CHECK, Binding("", f"key/{ring.current}"))

    def verify(self, key_id: str, check: str) -> None:
        """KeyringError when the store's `check` of `key_id` does not open under this
        keyring's key of that id (a keyring without that id is not asked)."""
        if key_id not in self.seal_keys:
            return
        try:
            opened = self.open(check, Binding("", f"key/{key_id}"))
        except KeyringError:
            opened = b""
        if not hmac.compare_digest(opened, CHECK):
            raise KeyringError(
                f"the keyring's key {key_id!r} is not the one this store's values were sealed "
                "under: a wrong key"
            )


def _key(encoded: str, where: str) -> bytes:
    try:
        key = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (ValueError, binascii.Error):
        key = b""
    if len(key) != KEY_BYTES:
        raise KeyringError(f"{where}: a key is {KEY_BYTES} bytes in URL-safe base64")
    return key


def new_key() -> str:
    """A new key, as a keyring line holds it (URL-safe base64 of 32 random bytes)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).decode().rstrip("=")


def new_keyring() -> str:
    """The text of a new keyring: a digest key and a seal key."""
    return (
        "# stepwarden keyring: the last `seal` key seals new writes; keep this file private\n"
        f"digest d1 {new_key()}\n"
        f"seal k1 {new_key()}\n"
    )


def rotated(text: str, where: str = "the keyring") -> tuple[str, str]:
    """A keyring's text with a new seal key after its others (it seals new writes from now
    on), and the new key's id (`k` and the next number)."""
    ring = Keyring.parse(text, where)
    numbers = [int(k[1:]) for k in ring.seal_keys if re.fullmatch(r"k\d+", k)]
    key_id = f"k{max(numbers, default=0) + 1}"
    while key_id in ring.seal_keys:
        key_id += "x"
    return f"{text.rstrip()}\nseal {key_id} {new_key()}\n", key_id


class Sealed:
    """A secret's value as the store holds it, not yet opened: its sealed text, the record
    it belongs to, and the keyring of the process that read it (None: it holds no key)."""

    __slots__ = ("at", "blob", "keys")

    def __init__(self, blob: str, at: Binding | None, keys: Keyring | None) -> None:
        self.blob = blob
        self.at = at
        self.keys = keys

    @property
    def key_id(self) -> str:
        """The id of the key it is sealed under."""
        return self.blob.partition(":")[0]

    def open(self) -> Any:
        """The secret's JSON value; KeyringError when this process cannot open it."""
        if self.keys is None:
            raise KeyringError(
                "this secret is sealed, and this process holds no keyring to open it (give "
                f"it the keyring: {KEYRING_ENV} or {KEYS_ENV})"
            )
        if self.at is None:
            raise KeyringError("this sealed secret was read without the record it belongs to")
        return orjson.loads(self.keys.open(self.blob, self.at))

    def __repr__(self) -> str:
        return "Sealed('***')"


# -- the digest -------------------------------------------------------------------------------


def canonical(text: str | bytes) -> bytes:
    """JSON text with its objects' keys sorted, without spaces: equal for equal values,
    however each store orders an object's keys."""
    return orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS)


def input_digest(text: str | bytes, keys: Keyring | None = None) -> str:
    """The digest of a task's input (its JSON text, secrets as `{"$secret": VALUE}`): its
    kind and the hex digest, `KIND:HEX`; keyed (HMAC-SHA256 under the keyring's digest key)
    when a keyring is given."""
    data = canonical(text)
    if keys is None:
        return f"{DIGEST_PLAIN}:{hashlib.sha256(data).hexdigest()}"
    key = keys.digest_keys[keys.digest_current]
    return f"{DIGEST_KEYED}.{keys.digest_current}:{hmac.new(key, data, hashlib.sha256).hexdigest()}"


def same_digest(stored: str | None, text: str | bytes, keys: Keyring | None = None) -> bool:
    """Whether `text` has the `stored` digest, in constant time. A keyed digest needs its key
    (without it, False: a comparison that cannot be made is not a match)."""
    if stored is None:
        return False
    kind, _, _ = stored.partition(":")
    data = canonical(text)
    if kind == DIGEST_PLAIN:
        mine = f"{DIGEST_PLAIN}:{hashlib.sha256(data).hexdigest()}"
    elif kind.startswith(DIGEST_KEYED + ".") and keys is not None:
        key_id = kind[len(DIGEST_KEYED) + 1 :]
        key = keys.digest_keys.get(key_id)
        if key is None:
            return False
        mine = f"{kind}:{hmac.new(key, data, hashlib.sha256).hexdigest()}"
    else:
        return False
    return hmac.compare_digest(mine.encode(), stored.encode())
