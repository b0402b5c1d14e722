"""Text that reaches a terminal, a log or a page as the text it is: characters that would
change how the text around them is shown are found here, refused in names (`_check`) and
escaped in the command line's output and the log (`EscapingFormatter`).

Such a character is a control character (C0, DEL, C1: a newline forges a log line, an ESC
starts a terminal escape sequence), a bidirectional control (it reorders what follows it) or
a line or paragraph separator.
"""

from __future__ import annotations

import logging

_BIDI = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
_SEPARATORS = frozenset("\u2028\u2029")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

MAX_LOG_LINE = 8192
"""The longest message, or line of a traceback, the formatter writes, in characters."""


def is_unsafe(ch: str) -> bool:
    code = ord(ch)
    return code < 32 or 127 <= code < 160 or ch in _BIDI or ch in _SEPARATORS


def first_unsafe(text: str) -> str | None:
    """The first character of `text` that would change how the text around it is shown."""
    for ch in text:
        if is_unsafe(ch):
            return ch
    return None


def _escaped(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """`text` with every unsafe character written as an escape (`\\n`, `\\x1b`, `\\u202e`):
    one line, shown as it is."""
    if first_unsafe(text) is None:
        return text
    return "".join(_escaped(ch) if is_unsafe(ch) else ch for ch in text)


def escape_json(document: str) -> str:
    """A JSON document (whose strings have their C0 controls escaped, as orjson writes them)
    with every other unsafe character written as a `\\uXXXX` escape: the same value, shown
    as it is."""
    if first_unsafe(document.replace("\n", "")) is None:
        return document
    return "".join(
        f"\\u{ord(ch):04x}" if ord(ch) >= 127 and is_unsafe(ch) else ch for ch in document
    )


def cut(text: str, limit: int) -> str:
    """`text`, or its start with a marker saying how long it was, when longer than `limit`."""
    if len(text) <= limit:
        return text
    marker = f"... [cut: {len(text)} characters in all]"
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
