"""Free TCP ports for the processes the lab and the test tiers start, chosen where the kernel never looks.

A port taken by binding port 0 comes from the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768–60999 by default), the same range every outgoing
connection and every other ``bind(0)`` draws from. Between the moment we pick a port and the moment
the process we start binds it, anything on the machine may be handed that port: stop 46's CI lost the
NIXL group of the realengine tier when a vLLM prefill's side-channel port (56197, picked by ``bind(0)``
seconds earlier) was already in use when its handshake listener bound it.

So ports are picked *below* the ephemeral range, where the kernel hands out nothing on its own: only
a process that names a port can hold one there. Each call walks forward from a per-process start (so
two test runs side by side rarely meet, and one process never hands out the same port twice while
others remain) and returns the first port that binds right now.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768
LOWEST = 20000
"""Below it sit the well-known ports of services a developer's machine may run (databases, brokers)."""
SPAN_FLOOR = 2000
"""If the ephemeral range starts so low that fewer ports than this sit under it, pick above it instead."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_LOW, 60999


def candidate_range(ephemeral: tuple[int, int] | None = None) -> range:
    """The ports ``free_port`` may hand out: under the ephemeral range, or above it when too little is left."""
    low, high = ephemeral or _ephemeral_range()
    if low - LOWEST >= SPAN_FLOOR:
        return range(LOWEST, low)
    return range(high + 1, 65536)


class _Walker:
    """One process's cursor through the candidate range, started at a random offset."""

    def __init__(self) -> None:
        self.ports = candidate_range()
        self._next = random.Random(os.getpid()).randrange(len(self.ports))

    def next_free(self, host: str) -> int:
        for _ in range(len(self.ports)):
            port = self.ports[self._next]
            self._next = (self._next + 1) % len(self.ports)
            if _binds(host, port):
                return port
        raise OSError(f"no free TCP port on {host} in {self.ports.start}-{self.ports.stop - 1}")


def _binds(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


_walkers: dict[int, _Walker] = {}
"""One walker per process id: a forked child starts its own walk."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, outside the kernel's ephemeral range (the caller binds it next)."""
    walker = _walkers.get(os.getpid()) or _walkers.setdefault(os.getpid(), _Walker())
    return walker.next_free(host)
