"""JSON encoding of payloads: the only serialisation stepwarden uses (never pickle).

A `Secret` is stored as `{"$secret": VALUE}`, or sealed, `{"$sealed": "ID:DATA"}`, where the
write names the record it goes to and the keyring that seals it (`Seal`: `stepwarden.sealing`).
Read back (`loads`), either is a `Secret` again; a sealed one opens when revealed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .errors import KeyringError, PayloadError
from .sealing import SEALED_KEY, Binding, Keyring, Sealed
from .secret import MASK, SECRET_KEY, Secret

MAX_PAYLOAD_BYTES = 1024 * 1024
"""The largest encoded payload accepted, so that one task cannot bloat the store."""
MAX_DEPTH = 254
"""The deepest nesting of arrays and objects accepted: as deep as orjson encodes."""


_STRICT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
"""Dates and dataclasses are refused rather than turned into something else."""
_RESERVED = (SECRET_KEY, SEALED_KEY)


@dataclass(frozen=True, slots=True)
class Seal:
    """Where a write's secrets go: the record (`at`), and the keyring that seals them there
    (None: stored plain, as `{"$secret": VALUE}`)."""

    keys: Keyring | None
    at: Binding


def dumps(value: Any, *, what: str = "payload", seal: Seal | None = None) -> str:
    """Encode `value` as JSON text, or raise PayloadError naming `what`. Only JSON's own
    values are accepted: NaN and infinities, dates and dataclasses are refused. Its secrets
    are sealed for `seal.at` where `seal` has a keyring, plain otherwise. One read sealed is
    kept as it is where it goes back to its own record under the keyring's current key (or
    where no record is named); elsewhere, or under an older key, it is sealed again for
    `seal.at` under the current key (which needs the keyring)."""
    try:
        data = orjson.dumps(value, option=_STRICT, default=_storing(seal))
    except (TypeError, orjson.JSONEncodeError) as exc:
        if isinstance(exc.__cause__, KeyringError):
            raise exc.__cause__ from None
        raise PayloadError(f"{what} is not JSON-serialisable: {exc}") from exc
    if b"null" in data and _has_non_finite(value):  # orjson writes NaN as null
        raise PayloadError(f"{what} holds NaN or an infinity, which JSON cannot represent")
    if (_MARK in data or _SEALED_MARK in data) and _has_reserved_key(value):
        raise PayloadError(
            f"{what} holds a dict with the reserved key {SECRET_KEY!r} or {SEALED_KEY!r}: "
            "wrap a secret value in stepwarden.Secret instead"
        )
    if len(data) > MAX_PAYLOAD_BYTES:
        raise PayloadError(f"{what} is {len(data)} bytes, over the limit of {MAX_PAYLOAD_BYTES}")
    return data.decode()


def plain(value: Any, *, what: str = "payload") -> str:
    """`value` as JSON text with its secrets as `{"$secret": VALUE}`, sealed ones opened
    (KeyringError without their key): what a digest is taken of, never stored."""
    try:
        return orjson.dumps(value, option=_STRICT, default=_revealed).decode()
    except (TypeError, orjson.JSONEncodeError) as exc:
        if isinstance(exc.__cause__, KeyringError):
            raise exc.__cause__ from None
        raise PayloadError(f"{what} is not JSON-serialisable: {exc}") from exc


def tags_text(tags: Mapping[str, str]) -> str:
    """A task's tags as stored: a JSON object of strings, its keys sorted."""
    return orjson.dumps(dict(tags), option=orjson.OPT_SORT_KEYS).decode()


def tags_of(stored: str | None) -> dict[str, str]:
    """A task's tags as stored (`tags_text`); none for a row read without them."""
    if stored is None:
        return {}
    return {str(k): str(v) for k, v in orjson.loads(stored).items()}


def holds_secret(text: str | bytes) -> bool:
    """Whether stored JSON text may hold a secret (plain or sealed): a cheap look at its
    text, that a value without one never passes."""
    data = text if isinstance(text, bytes) else text.encode()
    return _MARK in data or _SEALED_MARK in data


def _has_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return True
        if isinstance(v, Secret):
            if v.sealed is None:
                stack.append(v.reveal())
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return False


def _has_reserved_key(value: Any) -> bool:
    """Whether `value` holds, outside a Secret, a dict with a reserved key."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if any(k in v for k in _RESERVED):
                return True
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return False


def _storing(seal: Seal | None) -> Any:
    def store(obj: Any) -> Any:
        if not isinstance(obj, Secret):
            raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")
        held = obj.sealed
        if held is not None and (
            seal is None  # no record named: kept as it is
            or (held.at == seal.at and (seal.keys is None or held.key_id == seal.keys.current))
        ):
            return {SEALED_KEY: held.blob}  # back where it came from, under the current key
        if seal is None or seal.keys is None:
            if held is not None:
                raise KeyringError(
                    f"a sealed secret of {held.at.task_id if held.at else 'a task'!r} cannot "
                    "be stored elsewhere by a process without a keyring"
                )
            return {SECRET_KEY: obj.reveal()}
        return {SEALED_KEY: seal.keys.seal(orjson.dumps(obj.reveal(), option=_STRICT), seal.at)}

    return store


def _revealed(obj: Any) -> Any:
    if isinstance(obj, Secret):
        return {SECRET_KEY: obj.reveal()}
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def _mask(obj: Any) -> Any:
    if isinstance(obj, Secret):
        return MASK
    return repr(obj)


def wire(value: Any) -> bytes:
    """JSON for a peer trusted with secrets (an agent served over HTTP: its operations need
    them): each Secret as `{"$secret": VALUE}`, opened where sealed, so that the peer knows it
    for one (`revive`); datetimes as RFC 3339 text; no size limit beyond the values' own."""
    try:
        return orjson.dumps(value, default=_revealed)
    except TypeError as exc:
        if isinstance(exc.__cause__, KeyringError):
            raise exc.__cause__ from None
        raise


def display(value: Any, *, indent: bool = False) -> str:
    """JSON text to show a person: secrets masked, anything else that is not JSON shown as
    its repr. Never for storage."""
    option = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(value, default=_mask, option=option).decode()


_MARK = f'"{SECRET_KEY}"'.encode()
_SEALED_MARK = f'"{SEALED_KEY}"'.encode()


def loads(
    text: str | bytes | None,
    *,
    what: str = "payload",
    at: Binding | None = None,
    keys: Keyring | None = None,
) -> Any:
    """The value of JSON text as stored, each `{"$secret": VALUE}` in it a Secret, and each
    `{"$sealed": ...}` a Secret that opens when revealed (with `keys`, as bound to the record
    `at`); PayloadError naming `what` when it holds a secret nested deeper than MAX_DEPTH
    (orjson.JSONDecodeError when it is not JSON)."""
    if text is None:
        return None
    value = orjson.loads(text)
    if holds_secret(text):
        return _revive(value, what, 1, _Stored(at, keys))
    return value


def revive(value: Any, *, what: str = "payload") -> Any:
    """A JSON value from outside (a request's body), with each `{"$secret": VALUE}` made a
    Secret; a value nested deeper than MAX_DEPTH is refused (PayloadError naming `what`)
    rather than exhausting the interpreter's stack, and so is an object with a reserved key
    that is not a secret (`{"$secret": ..., "other": ...}`, or any `{"$sealed": ...}`)."""
    return _revive(value, what, 1, None)


@dataclass(frozen=True, slots=True)
class _Stored:
    at: Binding | None
    keys: Keyring | None


def _revive(value: Any, what: str, depth: int, stored: _Stored | None) -> Any:
    if not isinstance(value, dict | list):
        return value
    if depth > MAX_DEPTH:
        raise PayloadError(f"{what} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, list):
        return [_revive(v, what, depth + 1, stored) for v in value]
    if len(value) == 1 and SECRET_KEY in value:
        return Secret(value[SECRET_KEY])
    if stored is not None and len(value) == 1 and isinstance(value.get(SEALED_KEY), str):
        return Secret(Sealed(value[SEALED_KEY], stored.at, stored.keys))
    if stored is None and any(k in value for k in _RESERVED):
        reserved = next(k for k in _RESERVED if k in value)
        raise PayloadError(
            f"{what} holds an object with the reserved key {reserved!r}"
            + (
                " beside other keys: a secret is an object of that key alone"
                if reserved == SECRET_KEY
                else ": a sealed value is the store's own"
            )
        )
    return {k: _revive(v, what, depth + 1, stored) for k, v in value.items()}
