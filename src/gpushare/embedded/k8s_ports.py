"""Free loopback ports below the ephemeral range, held until released.

Real Kubernetes components bind fixed ports given on their command line, some time after
the harness picks them. A port from the ephemeral range (``bind(0)``) could meanwhile be
taken by any outgoing connection (the apiserver's to etcd, say), so ports are picked
below it. Several clusters may start at once (``pytest -n 2``, two ``gpushare up``): each
picked port is also locked (``flock`` on a file named after it) until released, so no
two harnesses on this machine pick the same one; a lock dies with its process.
"""

from __future__ import annotations

import contextlib
import fcntl
import random
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

LOCK_DIR = Path(tempfile.gettempdir()) / "gpushare-k8s-ports"
LOWEST = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
ATTEMPTS = 2000


def highest_port() -> int:
    """One below the ephemeral range (32768 where it cannot be read)."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return max(LOWEST + 1000, min(low, 32768)) - 1


def port_free(port: int) -> bool:
    """Nothing is bound to 127.0.0.1:port (nor a connection in TIME_WAIT holds it)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class PortReservation:
    """Ports locked for this process; :meth:`release` (or exiting) frees them."""

    ports: list[int] = field(default_factory=list)
    _locks: list[BinaryIO] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for lock in self._locks:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
        self._locks.clear()
        self.ports.clear()

    def _try(self, port: int) -> bool:
        if port in self.ports:
            return False
        lock = (LOCK_DIR / str(port)).open("ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            return False
        if not port_free(port):
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
            return False
        self.ports.append(port)
        self._locks.append(lock)
        return True


def reserve_ports(count: int, rng: random.Random | None = None) -> PortReservation:
    """``count`` distinct free ports in ``[20000, ephemeral range)``, locked."""
    LOCK_DIR.mkdir(exist_ok=True)
    with contextlib.suppress(OSError):
        LOCK_DIR.chmod(0o1777)
    pick = rng or random.Random()
    reservation = PortReservation()
    high = highest_port()
    for _ in range(ATTEMPTS):
        if len(reservation.ports) == count:
            return reservation
        reservation._try(pick.randrange(LOWEST, high + 1))
    if len(reservation.ports) == count:
        return reservation
    reservation.release()
    raise RuntimeError(f"no {count} free ports between {LOWEST} and {high}")
