"""The seams the services depend on, declared as Protocols; adapters live outside the core."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Protocol

from gpushare.core.constraints import Node
from gpushare.core.events import AllocationEvent, AnyEvent
from gpushare.core.pods import Pod
from gpushare.core.state import Folded


class PodSource(Protocol):
    """What bind reads from the Kubernetes API: the pod it is asked about, and the node.

    The adapter is :class:`gpushare.kube.pod_source.KubernetesPodSource`.
    """

    async def read_pod(self, namespace: str, name: str, uid: str = "") -> Pod | None:
        """The pod as the API has it now, or ``None`` if it does not exist; ``uid``: the
        pod the caller means (a copy of another pod of that name is read afresh)."""
        ...

    async def read_node(self, name: str) -> Node | None:
        """The node as the API has it now, or ``None`` if it does not exist."""
        ...


class Clock(Protocol):
    """The only source of time the services read; tests pass one they move by hand.

    The adapter is :class:`gpushare.clock.SystemClock`; the fake, ``tests.fakes.FakeClock``.
    """

    def now(self) -> datetime:
        """Wall time, timezone-aware UTC: dates events, judges timeouts and staleness."""
        ...

    def monotonic(self) -> float:
        """Seconds that never go back (deadlines, heartbeat periods)."""
        ...


class AllocationLog(Protocol):
    """The allocation log as the services use it: appends with compare-and-set per node,
    and reads of one node's events in order.

    The adapter is :class:`gpushare.bus.log.AllocationLog` (JetStream); the fake,
    ``tests.fakes.MemoryLog``; ``tests/contracts/allocation_log.py`` holds both to one
    contract.
    """

    async def append(self, event: AllocationEvent, expected_last_seq: int | None = None) -> int:
        """Append ``event`` to its node; returns its sequence (the original one for a
        repeated ``event.id``). With ``expected_last_seq`` it is a compare-and-set on the
        node: :class:`~gpushare.core.errors.AppendConflict` if the node's last sequence
        differs."""
        ...

    def read_node(self, node: str, after_seq: int) -> AsyncIterator[tuple[int, AnyEvent]]:
        """``node``'s events after ``after_seq``, in order, as of now."""
        ...

    def read_node_folded(self, node: str, after_seq: int) -> AsyncIterator[tuple[int, Folded]]:
        """As :meth:`read_node`, with an ``Unfolded`` for each message the fold steps over
        (what a follower catching up on the node reads)."""
        ...

    async def last_seq(self) -> int:
        """The log's last sequence, all nodes together (0 when empty)."""
        ...
