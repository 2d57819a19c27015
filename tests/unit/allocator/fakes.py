"""In-memory stand-ins for our own bus seams, for the allocator's unit tests.

:class:`MemoryLog` keeps the allocation log's contract (compare-and-set per node,
idempotent ids, ``read_node``) and delivers appended events to a real
:class:`LogFollower` at once, as if its subscription were instantaneous.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any, cast

from nats.js import JetStreamContext

from gpushare.bus.follow import LogFollower
from gpushare.bus.log import AppendConflict
from gpushare.bus.subjects import node_of_allocation
from gpushare.core.constraints import Node, NodeMeta
from gpushare.core.events import AllocationEvent, AnyEvent, InventoryReported
from gpushare.core.pods import Pod, pod_from_dict


def offline_follower(events: Iterable[InventoryReported | AllocationEvent] = ()) -> LogFollower:
    """A real follower with no connection: events are fed to it by hand or by a MemoryLog."""
    follower = LogFollower(cast(JetStreamContext, None))
    log = MemoryLog(follower)
    follower.log = log  # type: ignore[assignment]  # catch_up reads through it
    for event in events:
        if isinstance(event, InventoryReported):
            follower.apply(0, event)
        else:
            log.write(event, deliver=True)
    follower.ready.set()
    return follower


class MemoryLog:
    def __init__(self, follower: LogFollower) -> None:
        self.follower = follower
        self.entries: list[tuple[int, AllocationEvent]] = []
        self.before_append: list[AllocationEvent] = []
        """Events another writer appends (unseen by the follower) just before our next append."""

    def last_seq(self, node: str) -> int:
        return max((seq for seq, event in self.entries if event.node == node), default=0)

    def write(self, event: AllocationEvent, *, deliver: bool) -> int:
        seq = len(self.entries) + 1
        self.entries.append((seq, event))
        if deliver:
            self.follower.apply(seq, event)
        return seq

    async def append(self, event: AllocationEvent, expected_last_seq: int | None = None) -> int:
        while self.before_append:
            self.write(self.before_append.pop(0), deliver=False)
        for seq, logged in self.entries:
            if logged.id == event.id:
                return seq
        if expected_last_seq is not None and expected_last_seq != self.last_seq(event.node):
            raise AppendConflict(f"wrong last sequence: {self.last_seq(event.node)}")
        return self.write(event, deliver=True)

    async def read_node(self, node: str, after_seq: int) -> AsyncIterator[tuple[int, AnyEvent]]:
        for seq, event in list(self.entries):
            if event.node == node and seq > after_seq:
                yield seq, event

    async def read_folded(
        self, subject: str, after_seq: int
    ) -> AsyncIterator[tuple[int, AnyEvent]]:
        """What the follower's catch-up reads (``subject`` is one node's, as it asks)."""
        async for pair in self.read_node(node_of_allocation(subject), after_seq):
            yield pair

    def of_type(self, kind: type[Any]) -> list[Any]:
        return [event for _, event in self.entries if isinstance(event, kind)]


class DictPodSource:
    """A PodSource over pods given as Kubernetes JSON dicts."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.reads = 0

    async def read_pod(self, namespace: str, name: str) -> Pod | None:
        self.reads += 1
        found = self.pods.get((namespace, name))
        return None if found is None else pod_from_dict(found)

    async def read_node(self, name: str) -> Node | None:
        """Every node exists, with no labels and no taints."""
        return Node(metadata=NodeMeta(name=name))
