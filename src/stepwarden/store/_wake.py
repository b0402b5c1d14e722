"""Wake-ups between the processes that share one SQLite file (they share a machine): each
process that listens binds a Unix datagram socket in a directory of the database's own, and
each commit sends its wake-ups (`Wakeups.due`) to every other socket there. Nothing waits on
a wake-up: a full or gone receiver is skipped, and a lost wake-up only costs the receiver a
poll interval. A socket left by a process that died refuses the datagram and is removed.
No failure to wake another process reaches the write that committed.

The directory is the user's own (mode 0700, owned by this process's user, not a symlink):
one found otherwise (made by another user first, say) is not used, and the processes poll.

The directory is `<database>-wake` beside the database, where every process that can open
the file finds it; when the socket paths would be too long for the system (`sun_path`, 108
bytes), one in the temporary directory named after the database's absolute path."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import socket
import stat
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

from ._flow import Wakeups

logger = logging.getLogger(__name__)

DATAGRAM_LIMIT = 32 * 1024
"""Bytes per datagram (Linux takes up to about 200 KiB; a wake-up is a few names)."""
SUN_PATH_MAX = 100
"""Longest socket path used (the system's limit is 108 bytes, with its terminating NUL)."""
SOCKET_SUFFIX = ".sock"


def wake_dir(database: str) -> Path:
    """The directory of the sockets of the processes listening on `database`."""
    path = Path(database).resolve()
    beside = path.with_name(path.name + "-wake")
    if len(str(beside)) + 1 + 32 + 1 + 10 + len(SOCKET_SUFFIX) <= SUN_PATH_MAX:
        return beside
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / f"stepwarden-wake-{digest}"


def _own_dir(path: Path) -> bool:
    """Whether `path` is a directory of this process's user that no one else may write in
    (or read: task ids go through it), and not a symlink to one elsewhere."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return _own_mode(found)


def _own_mode(found: os.stat_result) -> bool:
    return (
        stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid() and found.st_mode & 0o077 == 0
    )


def datagrams(wake: Wakeups) -> list[bytes]:
    """The wake-ups as datagrams of at most DATAGRAM_LIMIT bytes: `[channel, [payload...]]`;
    a payload too long for one on its own is left out (the receiver's poll finds it)."""
    out: list[bytes] = []
    for channel, payloads in wake.due:
        batch: list[str] = []
        size = 0
        for item in payloads:
            n = len(orjson.dumps(item)) + 1  # as written in the datagram, escapes and comma
            if n + len(channel) + 8 > DATAGRAM_LIMIT:
                continue
            if batch and size + n + len(channel) + 8 > DATAGRAM_LIMIT:
                out.append(orjson.dumps([channel, batch]))
                batch, size = [], 0
            batch.append(item)
            size += n
        if batch:
            out.append(orjson.dumps([channel, batch]))
    return out


class WakeChannel:
    """The sending half for every store on a file, the receiving half once `listen` binds."""

    def __init__(self, database: str) -> None:
        self.dir = wake_dir(database)
        self._sender: socket.socket | None = None
        self._receiver: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own: str | None = None
        self._peers_at: int | None = None
        """The folder's mtime (ns) when `_peer_paths` was read from it."""
        self._peer_paths: list[str] = []

    # -- sending --------------------------------------------------------------------------
    def send(self, wake: Wakeups) -> None:
        """Send `wake` to every other listening process now (never blocks, never raises)."""
        if not wake:
            return
        try:
            self._send(wake)
        except OSError as exc:  # the others poll: a wake-up is never worth a failed write
            logger.debug("wake-ups not sent: %s", exc)

    def _peers(self) -> list[str]:
        """The other processes' sockets: read from the folder when it changed (a socket
        made or removed changes its mtime), else those read last: one stat a send."""
        try:
            found = os.lstat(self.dir)
        except OSError:
            return []  # nobody listens yet
        if not _own_mode(found):
            return []  # not this user's own folder: the processes poll
        if found.st_mtime_ns != self._peers_at:
            self._peers_at = found.st_mtime_ns
            self._peer_paths = [
                e.path
                for e in os.scandir(self.dir)
                if e.name.endswith(SOCKET_SUFFIX)
                and e.path != self._own
                and stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode)
            ]
        return self._peer_paths

    def _send(self, wake: Wakeups) -> None:
        peers = self._peers()
        if not peers:
            return
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        sent = datagrams(wake)
        for peer in peers:
            for data in sent:
                try:
                    self._sender.sendto(data, peer)
                except (ConnectionRefusedError, FileNotFoundError):
                    with contextlib.suppress(OSError):
                        os.unlink(peer)  # its process is gone
                    break
                except OSError as exc:
                    # A receiver too busy to read (EAGAIN, ENOBUFS) polls all the same.
                    if exc.errno not in (errno.EAGAIN, errno.ENOBUFS, errno.EMSGSIZE):
                        logger.debug("wake-up to %s not sent: %s", peer, exc)
                    break

    # -- receiving ------------------------------------------------------------------------
    def listen(self, publish: Callable[[str, Sequence[str]], None]) -> None:
        """Bind this process's socket and hand each wake-up received to `publish` (in the
        running event loop)."""
        if self._receiver is not None:
            return
        self.dir.mkdir(mode=0o700, exist_ok=True)
        if not _own_dir(self.dir):
            raise PermissionError(
                f"{self.dir} is not a folder of this user's own (mode 0700, not a symlink)"
            )
        path = str(self.dir / f"{uuid.uuid4().hex}-{os.getpid()}{SOCKET_SUFFIX}")
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            receiver.setblocking(False)
            receiver.bind(path)
        except OSError:
            receiver.close()
            raise
        self._receiver, self._own = receiver, path

        def readable() -> None:
            while True:
                try:
                    data = receiver.recv(DATAGRAM_LIMIT + 1024)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError as exc:
                    logger.debug("wake-ups: %s", exc)
                    return
                try:
                    channel, payloads = orjson.loads(data)
                except (orjson.JSONDecodeError, ValueError, TypeError):
                    continue  # not ours: ignored
                if isinstance(channel, str) and isinstance(payloads, list):
                    publish(channel, [str(p) for p in payloads])

        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(receiver.fileno(), readable)

    def close(self) -> None:
        receiver, self._receiver = self._receiver, None
        if receiver is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(receiver.fileno())
            receiver.close()
        if self._own is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._own)
            self._own = None
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.close()
