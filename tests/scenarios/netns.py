"""A network of the test's own, to cut a process off from its database while it runs.

A network namespace joined to this one by a veth pair, with an address on each end in a
/30 picked at random among 10.200.0.0/16 (so that tests of other checkouts on this machine
pick others): a process started inside it (`prefix`, `ip netns exec`) reaches a server
listening on `host_ip`. `cut` sets the host's end of the link down: packets between the two
are lost as in a partition of the network, no connection is reset, and the process runs on;
`heal` sets it up again. The namespace and its links are removed whatever happens (needs
root, as the scenario tests have)."""

from __future__ import annotations

import contextlib
import random
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Namespace:
    name: str
    host_link: str
    host_ip: str
    inner_ip: str

    @property
    def prefix(self) -> tuple[str, ...]:
        """The command that runs the rest of a command line inside the namespace."""
        return ("ip", "netns", "exec", self.name)

    @property
    def inner_address(self) -> str:
        """The namespace's end, as pg_hba.conf names a client's address."""
        return f"{self.inner_ip}/32"

    def cut(self) -> None:
        _ip("link", "set", self.host_link, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_link, "up")


@contextlib.contextmanager
def namespace() -> Iterator[Namespace]:
    """A namespace of its own, linked to this one; removed afterwards, with its link."""
    tag = uuid.uuid4().hex[:8]
    name, host_link, inner_link = f"sw{tag}", f"swh{tag}", f"swn{tag}"
    base = random.randrange(0, 1 << 14) * 4  # a /30 in 10.200.0.0/16
    third, fourth = base >> 8, base & 0xFF
    host_ip, inner_ip = f"10.200.{third}.{fourth + 1}", f"10.200.{third}.{fourth + 2}"
    ns = Namespace(name, host_link, host_ip, inner_ip)
    try:
        _ip("netns", "add", name)
        _ip("link", "add", host_link, "type", "veth", "peer", "name", inner_link)
        _ip("link", "set", inner_link, "netns", name)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_link)
        _ip("link", "set", host_link, "up")
        inside = ("netns", "exec", name, "ip")
        _ip(*inside, "addr", "add", f"{inner_ip}/30", "dev", inner_link)
        _ip(*inside, "link", "set", inner_link, "up")
        _ip(*inside, "link", "set", "lo", "up")
        yield ns
    finally:
        # Deleting one end of a veth pair deletes the other; the namespace goes with what is
        # left in it (a process still inside keeps it until it exits: the cluster reaps them).
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", host_link)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", name)
