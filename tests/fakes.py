"""The in-memory fakes of the core's ports (:mod:`gpushare.core.ports`), in one place.

* :class:`FakeClock`: a :class:`~gpushare.core.ports.Clock` that moves only when told to;
* :class:`MemoryLog`: an :class:`~gpushare.core.ports.AllocationLog` that keeps the
  JetStream log's contract (``tests/contracts/allocation_log.py`` runs against both) and
  delivers each append to a real :class:`LogFollower` at once, as if its subscription were
  instantaneous;
* :func:`offline_follower`: a real follower fed by a :class:`MemoryLog`, no connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from gpushare.bus.follow import LogFollower
from gpushare.core.errors import AppendConflict
from gpushare.core.events import AllocationEvent, AnyEvent, InventoryReported
from gpushare.core.state import Folded

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class FakeClock:
    """A clock that moves only when told to: :meth:`advance` moves both clocks,
    :meth:`step_wall_clock` and :meth:`set` only the wall clock (NTP)."""

    def __init__(self, start: datetime = START) -> None:
        self._wall = start
        self._monotonic = 1000.0

    def now(self) -> datetime:
        return self._wall

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        self._wall += timedelta(seconds=seconds)
        self._monotonic += seconds

    def step_wall_clock(self, seconds: float) -> None:
        self._wall += timedelta(seconds=seconds)

    def set(self, at: datetime) -> None:
        self._wall = at


class MemoryLog:
    """The allocation log in a list. ``follower`` (if set) folds each append at once."""

    def __init__(self, follower: LogFollower | None = None) -> None:
        self.follower = follower
        self.entries: list[tuple[int, AllocationEvent]] = []
        self.before_append: list[AllocationEvent] = []
        """Events another writer appends (unseen by the follower) just before our next append."""

    def node_last_seq(self, node: str) -> int:
        return max((seq for seq, event in self.entries if event.node == node), default=0)

    def write(self, event: AllocationEvent, *, deliver: bool) -> int:
        seq = len(self.entries) + 1
        self.entries.append((seq, event))
        if deliver and self.follower is not None:  # as its live subscription does
            self.follower.apply(seq, event)
            self.follower.applied_seq = seq
        return seq

    async def append(self, event: AllocationEvent, expected_last_seq: int | None = None) -> int:
        while self.before_append:
            self.write(self.before_append.pop(0), deliver=False)
        last = self.node_last_seq(event.node)
        if expected_last_seq is not None and expected_last_seq != last:  # before the id,
            raise AppendConflict(f"wrong last sequence: {last}")  # as nats-server does
        for seq, logged in self.entries:
            if logged.id == event.id:
                return seq
        return self.write(event, deliver=True)

    async def read_node(self, node: str, after_seq: int) -> AsyncIterator[tuple[int, AnyEvent]]:
        for seq, event in list(self.entries):
            if event.node == node and seq > after_seq:
                yield seq, event

    async def read_node_folded(
        self, node: str, after_seq: int
    ) -> AsyncIterator[tuple[int, Folded]]:
        async for pair in self.read_node(node, after_seq):
            yield pair

    async def last_seq(self) -> int:
        return len(self.entries)

    def of_type(self, kind: type[Any]) -> list[Any]:
        return [event for _, event in self.entries if isinstance(event, kind)]


def offline_follower(events: Iterable[InventoryReported | AllocationEvent] = ()) -> LogFollower:
    """A real follower with no connection: events are fed to it by hand or by its
    :class:`MemoryLog` (:func:`memory_log`)."""
    log = MemoryLog()
    follower = LogFollower(None, log=log)
    log.follower = follower
    for event in events:
        if isinstance(event, InventoryReported):
            follower.apply(0, event)
        else:
            log.write(event, deliver=True)
    follower.ready.set()
    return follower


def memory_log(follower: LogFollower) -> MemoryLog:
    """The :class:`MemoryLog` an :func:`offline_follower` reads and appends through."""
    assert isinstance(follower.log, MemoryLog)
    return follower.log
