"""Text that reaches a terminal, a log or a page as the text it is: characters that would
change how the text around them is shown are found here, refused in names (`_check`) and
escaped in the command line's output and the log (`EscapingFormatter`).

Such a character is a control character (C0, DEL, C1: a newline forges a log line, an ESC
starts a terminal escape sequence), a bidirectional control (it reorders what follows it) or
a line or paragraph separator.
"""

from __future__ import annotations

import logging
import re

_UNSAFE = (
    (0x00, 0x1F),  # C0 controls: a newline forges a log line, an ESC drives a terminal
    (0x7F, 0x9F),  # DEL and the C1 controls
    (0x061C, 0x061C),  # bidirectional marks, embeddings, overrides and isolates
    (0x200E, 0x200F),
    (0x202A, 0x202E),
    (0x2066, 0x2069),
    (0x2028, 0x2029),  # line and paragraph separators
)
_CLASS = "".join(f"\\u{lo:04x}" if lo == hi else f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in _UNSAFE)
_FIND = re.compile(f"[{_CLASS}]")
SAFE_PATTERN = f"^[^{_CLASS}]+$"
"""A regular expression (Python's and JSON Schema's dialect) of a non-empty text without an
unsafe character: what a name may be, for an API's document."""
TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,127}")
"""A tenant's name: a letter or digit, then up to 127 of these and `_.@:-` (every name of an
application API client is one: its tasks' default tenant); safe to show as it is."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

MAX_LOG_LINE = 8192
"""The longest message, or line of a traceback, the formatter writes, in characters."""


def first_unsafe(text: str) -> str | None:
    """The first character of `text` that would change how the text around it is shown."""
    found = _FIND.search(text)
    return None if found is None else found.group()


def _escaped(found: re.Match[str]) -> str:
    ch = found.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """`text` with every unsafe character written as an escape (`\\n`, `\\x1b`, `\\u202e`):
    one line, shown as it is."""
    return _FIND.sub(_escaped, text)


def escape_json(document: str) -> str:
    """A JSON document (whose strings have their C0 controls escaped, as orjson writes them)
    with every other unsafe character written as a `\\uXXXX` escape: the same value, shown
    as it is."""
    return _FIND.sub(_json_escaped, document)


def _json_escaped(found: re.Match[str]) -> str:
    ch = found.group()
    # C0 controls outside a string are JSON's own whitespace (an indented document's lines).
    return ch if ord(ch) < 0x20 else f"\\u{ord(ch):04x}"


def cut(text: str, limit: int, length: int | None = None) -> str:
    """`text`, or its start with a marker saying how long it was, when longer than `limit`;
    `text` may be the start of a text of `length` characters (its marker then says so)."""
    length = len(text) if length is None or length < len(text) else length
    if length <= limit:
        return text
    marker = f"... [cut: {length} characters in all]"
    return text[: max(0, limit - len(marker))] + marker


class EscapingFormatter(logging.Formatter):
    """A log formatter under which one record is one line that starts at the margin: the
    message's unsafe characters are escaped and a long message is cut; a traceback follows
    on lines of its own, each indented (so that no text inside it can pass for a record),
    escaped and cut the same way. The command line logs through it."""

    def format(self, record: logging.LogRecord) -> str:
        record.message = cut(escape(record.getMessage()), MAX_LOG_LINE)
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        extra = []
        if record.exc_info:
            extra.append(self.formatException(record.exc_info))
        elif record.exc_text:
            extra.append(record.exc_text)
        if record.stack_info:
            extra.append(self.formatStack(record.stack_info))
        for block in extra:
            for text in block.rstrip("\n").split("\n"):
                line += "\n    " + cut(escape(text), MAX_LOG_LINE)
        return line
