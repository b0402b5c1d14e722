"""Checks of the values given to the App and the command line, made before anything is
written: each raises ConfigurationError naming the value it refuses.

Both stores must hold a value the same way or refuse it the same way: text must be valid
Unicode (a lone surrogate, which is what an undecodable byte of a command-line argument
becomes, cannot be stored at all), and integers must fit the stores' integer columns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, TypeAlias

from ._text import TENANT_PATTERN, first_unsafe
from .errors import ConfigurationError
from .states import TaskState

MAX_NAME = 200
"""The longest task id, channel name or operator name, in characters."""
MAX_REASON = 1000
"""The longest reason an operator may give, in characters."""
MAX_INT = 2**31 - 1
"""The largest priority, step number or limit: the stores' integer columns."""
MAX_BIGINT = 2**63 - 1
"""The largest event or outbox id: the stores' bigint columns."""
MAX_TAGS = 16
"""The most tags a task may have (those of its submit and those its workflow adds)."""
MAX_TAG_KEY = 64
"""The longest tag key, in characters: a letter or digit, then letters, digits, `_ . : / -`."""
MAX_TAG_VALUE = 256
"""The longest tag value, in characters (1 at least, without control characters)."""
TAG_KEY_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.:/-]*$"
"""What a tag key may be (Python's and JSON Schema's dialect)."""
TAG_KEY = re.compile(TAG_KEY_PATTERN)


def shown(value: Any, width: int = 60) -> str:
    """`value` as it is named in an error message: its repr, cut short when long."""
    text = repr(value)
    if len(text) <= width:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[: width - 3]}...{size}"


def _unicode(what: str, value: str) -> None:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"{what} is not valid Unicode text (an undecodable byte or a lone surrogate): "
            f"{shown(value)}"
        ) from None


def name(what: str, value: Any) -> str:
    """A task id, a channel, a workflow or an operator: 1 to MAX_NAME characters of valid
    Unicode, without control characters (C0, DEL, C1), bidirectional controls or line
    separators."""
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise ConfigurationError(
            f"{what} must be a string of 1 to {MAX_NAME} characters, not {shown(value)}"
        )
    bad = first_unsafe(value)
    if bad is not None:
        raise ConfigurationError(
            f"{what} must not contain control characters: {shown(value)} holds U+{ord(bad):04X} "
            "(bidirectional controls and line separators are refused too)"
        )
    _unicode(what, value)
    return value


def tenant(value: Any) -> str:
    """A tenant's name (`TENANT_PATTERN`)."""
    if not isinstance(value, str) or not TENANT_PATTERN.fullmatch(value):
        raise ConfigurationError(
            "tenant must be 1 to 128 letters, digits and _.@:- (starting with a letter or "
            f"digit), not {shown(value)}"
        )
    return value


def new_task_id(value: Any) -> str:
    """The id of a task to create: a name, and not `.` or `..`, which a path cannot name
    (a browser or an HTTP client resolves them away in the dashboard's links)."""
    name("task_id", value)
    if value in (".", ".."):
        raise ConfigurationError(f"task_id must not be {value!r}: a URL path cannot name it")
    return str(value)


def text(what: str, value: Any, *, limit: int = MAX_REASON) -> str | None:
    """Free text (a reason): None, or up to `limit` characters of valid Unicode."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise ConfigurationError(
            f"{what} must be a string of at most {limit} characters, not {shown(value)}"
        )
    _unicode(what, value)
    return value


def integer(what: str, value: Any, low: int, high: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(
            f"{what} must be an integer from {low} to {high}, not {shown(value)}"
        )
    return value


def flag(what: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{what} must be True or False, not {shown(value)}")
    return value


Duration: TypeAlias = timedelta | float
"""A duration as the Python API takes it everywhere: a `timedelta`, or a number of seconds."""


def seconds(what: str, value: Any, low: float = 0.0, high: float | None = None) -> float:
    """A duration (`Duration`: a timedelta, or a number of seconds, neither a bool nor NaN)
    as seconds, from `low` to `high`."""
    found = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(found, bool)
        or not isinstance(found, int | float)
        or math.isnan(found)
        or found < low
        or (high is not None and found > high)
    ):
        bound = f"at least {low:g}" if high is None else f"from {low:g} to {high:g}"
        raise ConfigurationError(
            f"{what} must be a timedelta or a number of seconds, {bound}, not {shown(value)}"
        )
    return float(found)


class Seconds:
    """A dataclass field of a duration (`Duration`): given as a timedelta or a number of
    seconds, at least `low`; read as seconds (a float). The options' dataclasses
    (`Retry`, `Backoff`, `Breaker`, `Limit`, `WorkerOptions`) take durations so."""

    def __init__(self, default: float, *, low: float = 0.0) -> None:
        self._default = default
        self._low = low
        self._slot = ""
        self._what = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}_seconds"
        self._what = f"{owner.__name__}.{name}"

    def __get__(self, obj: object | None, owner: Any = None) -> float:
        if obj is None:
            return self._default
        return getattr(obj, self._slot)  # type: ignore[no-any-return]

    def __set__(self, obj: object, value: Duration) -> None:
        object.__setattr__(obj, self._slot, seconds(self._what, value, self._low))

    def __repr__(self) -> str:
        return repr(self._default)


class OptionalSeconds:
    """`Seconds`, or None (no duration: what None means is the field's)."""

    def __init__(self, default: float | None, *, low: float = 0.0) -> None:
        self._default = default
        self._low = low
        self._slot = ""
        self._what = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}_seconds"
        self._what = f"{owner.__name__}.{name}"

    def __get__(self, obj: object | None, owner: Any = None) -> float | None:
        if obj is None:
            return self._default
        return getattr(obj, self._slot)  # type: ignore[no-any-return]

    def __set__(self, obj: object, value: Duration | None) -> None:
        found = None if value is None else seconds(self._what, value, self._low)
        object.__setattr__(obj, self._slot, found)

    def __repr__(self) -> str:
        return repr(self._default)


def timeout(value: Any) -> float | None:
    """Seconds to wait: None (no limit) or a duration (`Duration`), at least 0."""
    return None if value is None else seconds("timeout", value)


def state(value: Any) -> TaskState | None:
    if value is None:
        return None
    try:
        return TaskState(value)
    except ValueError:
        known = ", ".join(s.value for s in TaskState)
        raise ConfigurationError(f"unknown state {shown(value)} (known: {known})") from None


def task_ids(value: Any) -> list[str]:
    """A list of task ids (a string alone is not a list of its characters)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigurationError(f"task_ids must be a list of task ids, not {shown(value)}")
    return [name("task_id", v) for v in value]


def tag(key: Any, value: Any) -> tuple[str, str]:
    """One tag of a task: a key of 1 to MAX_TAG_KEY characters (`TAG_KEY`: no `=`, so that
    `--tag KEY=VALUE` reads it back), a value of 1 to MAX_TAG_VALUE characters of valid
    Unicode without control characters."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_TAG_KEY or not TAG_KEY.fullmatch(key):
        raise ConfigurationError(
            f"a tag key must be 1 to {MAX_TAG_KEY} characters: a letter or digit, then "
            f"letters, digits and _ . : / -, not {shown(key)}"
        )
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TAG_VALUE:
        raise ConfigurationError(
            f"tag {key!r}: its value must be a string of 1 to {MAX_TAG_VALUE} characters, "
            f"not {shown(value)}"
        )
    bad = first_unsafe(value)
    if bad is not None:
        raise ConfigurationError(
            f"tag {key!r}: its value must not contain control characters: {shown(value)} "
            f"holds U+{ord(bad):04X}"
        )
    _unicode(f"tag {key!r}", value)
    return key, value


def tags(value: Any) -> dict[str, str]:
    """A task's tags: a mapping of at most MAX_TAGS tags (`tag`)."""
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"tags must be a mapping of keys to values, not {shown(value)}")
    if len(value) > MAX_TAGS:
        raise ConfigurationError(f"a task has at most {MAX_TAGS} tags, not {len(value)}")
    return dict(tag(k, v) for k, v in value.items())


def tag_texts(texts: Iterable[str]) -> dict[str, str]:
    """The tags written `KEY=VALUE` (split at the first `=`), each key once (`tags`): the
    command line's `--tag`, the dashboard's `tag` parameter."""
    found: dict[str, str] = {}
    for text in texts:
        key, eq, value = text.partition("=")
        if not eq:
            raise ConfigurationError(f"a tag is written KEY=VALUE, not {shown(text)}")
        if key in found:
            raise ConfigurationError(f"tag {shown(key)} is given twice")
        found[key] = value
    return tags(found)


def tag_filter(texts: Iterable[str]) -> dict[str, str] | None:
    """The tags a filter asks for, written `KEY=VALUE` (each checked as `tag_texts` does),
    a key given twice with one value taken once; None when a key is given two values (no
    task has both)."""
    values: dict[str, set[str]] = {}
    for text in texts:
        key, eq, value = text.partition("=")
        if not eq:
            raise ConfigurationError(f"a tag is written KEY=VALUE, not {shown(text)}")
        tag(key, value)
        values.setdefault(key, set()).add(value)
    if any(len(v) > 1 for v in values.values()):
        return None
    return tags({k: v.pop() for k, v in values.items()})
