"""JSON encoding of payloads: the only serialisation stepwarden uses (never pickle)."""

from __future__ import annotations

import math
from typing import Any

import orjson

from .errors import PayloadError
from .secret import MASK, SECRET_KEY, Secret

MAX_PAYLOAD_BYTES = 1024 * 1024
"""The largest encoded payload accepted, so that one task cannot bloat the store."""
MAX_DEPTH = 254
"""The deepest nesting of arrays and objects accepted: as deep as orjson encodes."""


_STRICT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
"""Dates and dataclasses are refused rather than turned into something else."""


def dumps(value: Any, *, what: str = "payload") -> str:
    """Encode `value` as JSON text, or raise PayloadError naming `what`. Only JSON's own
    values are accepted: NaN and infinities, dates and dataclasses are refused."""
    try:
        data = orjson.dumps(value, option=_STRICT, default=_store_secret)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise PayloadError(f"{what} is not JSON-serialisable: {exc}") from exc
    if b"null" in data and _has_non_finite(value):  # orjson writes NaN as null
        raise PayloadError(f"{what} holds NaN or an infinity, which JSON cannot represent")
    if _MARK.encode() in data and _has_reserved_key(value):  # it would load as a Secret
        raise PayloadError(
            f"{what} holds a dict whose only key is the reserved {SECRET_KEY!r}: "
            "wrap a secret value in stepwarden.Secret instead"
        )
    if len(data) > MAX_PAYLOAD_BYTES:
        raise PayloadError(f"{what} is {len(data)} bytes, over the limit of {MAX_PAYLOAD_BYTES}")
    return data.decode()


def _has_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return True
        if isinstance(v, Secret):
            stack.append(v.reveal())
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return False


def _has_reserved_key(value: Any) -> bool:
    """Whether `value` holds, outside a Secret, a dict that `loads` would take for one."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if len(v) == 1 and SECRET_KEY in v:
                return True
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return False


def _store_secret(obj: Any) -> Any:
    if isinstance(obj, Secret):
        return {SECRET_KEY: obj.reveal()}
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def _mask(obj: Any) -> Any:
    if isinstance(obj, Secret):
        return MASK
    return repr(obj)


def wire(value: Any) -> bytes:
    """JSON for a peer trusted with secrets (an agent served over HTTP: its operations need
    them): each Secret as `{"$secret": VALUE}`, as stored, so that the peer knows it for one
    (`revive`); datetimes as RFC 3339 text; no size limit beyond the values' own."""
    return orjson.dumps(value, default=_store_secret)


def display(value: Any, *, indent: bool = False) -> str:
    """JSON text to show a person: secrets masked, anything else that is not JSON shown as
    its repr. Never for storage."""
    option = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(value, default=_mask, option=option).decode()


_MARK = f'"{SECRET_KEY}"'


def loads(text: str | bytes | None, *, what: str = "payload") -> Any:
    """The value of JSON text, each `{"$secret": VALUE}` in it a Secret; PayloadError naming
    `what` when it holds a secret nested deeper than MAX_DEPTH (orjson.JSONDecodeError when
    it is not JSON)."""
    if text is None:
        return None
    value = orjson.loads(text)
    marked = _MARK.encode() in text if isinstance(text, bytes) else _MARK in text
    return revive(value, what=what) if marked else value


def revive(value: Any, *, what: str = "payload") -> Any:
    """A JSON value parsed elsewhere, with each `{"$secret": VALUE}` made a Secret again; a
    value nested deeper than MAX_DEPTH is refused (PayloadError naming `what`) rather than
    exhausting the interpreter's stack."""
    return _revive(value, what, 1)


def _revive(value: Any, what: str, depth: int) -> Any:
    if not isinstance(value, dict | list):
        return value
    if depth > MAX_DEPTH:
        raise PayloadError(f"{what} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, list):
        return [_revive(v, what, depth + 1) for v in value]
    if len(value) == 1 and SECRET_KEY in value:
        return Secret(value[SECRET_KEY])
    return {k: _revive(v, what, depth + 1) for k, v in value.items()}
