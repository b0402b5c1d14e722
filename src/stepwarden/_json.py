"""JSON encoding of payloads: the only serialisation stepwarden uses (never pickle)."""

from __future__ import annotations

from typing import Any

import orjson

from .errors import PayloadError

MAX_PAYLOAD_BYTES = 1024 * 1024
"""The largest encoded payload accepted, so that one task cannot bloat the store."""


def dumps(value: Any, *, what: str = "payload") -> str:
    """Encode `value` as JSON text, or raise PayloadError naming `what`."""
    try:
        data = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise PayloadError(f"{what} is not JSON-serialisable: {exc}") from exc
    if len(data) > MAX_PAYLOAD_BYTES:
        raise PayloadError(f"{what} is {len(data)} bytes, over the limit of {MAX_PAYLOAD_BYTES}")
    return data.decode()


def loads(text: str | bytes | None) -> Any:
    if text is None:
        return None
    return orjson.loads(text)
