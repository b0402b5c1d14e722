"""The operator's files that hold what gives power (a token, a keyring, the clients and their
scopes, the destinations allowed, the brokers' credentials): read only where their mode keeps
them their owner's."""

from __future__ import annotations

import os
import stat

from .errors import ConfigurationError

PRIVATE = 0o077
"""Neither its group nor others may read or write it: it holds a secret."""
OWNERS_TO_WRITE = 0o022
"""Neither its group nor others may write it: whoever may write it gives power."""


def read_guarded(
    path: str | os.PathLike[str],
    what: str,
    refused: int,
    error: type[ConfigurationError] = ConfigurationError,
) -> str:
    """The text of the file at `path` (`what` names it in an error); `error` when its mode
    lets its group or others do what `refused` says (PRIVATE, OWNERS_TO_WRITE), or when it
    cannot be read. The mode is read from the file opened, not from its path."""
    shown = os.fspath(path)
    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            if stat.S_ISREG(mode) and mode & refused:
                done, fix = (
                    ("read or written", "make it private, chmod 600")
                    if refused & 0o044
                    else ("written", "make it theirs alone to write, chmod 644 or 600")
                )
                raise error(
                    f"{what} {shown!r} may be {done} by others than its owner (mode "
                    f"{stat.S_IMODE(mode):o}): {fix}"
                )
            return file.read().decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {shown!r}: {exc}") from None
