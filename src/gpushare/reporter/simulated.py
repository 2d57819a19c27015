"""Cards that exist only in this process: for ``gpushare up``, the demo, tests and chaos.

A simulated node is ``NAME=MIB[,MIB...]``: one number per card, so heterogeneous nodes
(``gpu-b=16276,16276,32510``) are as easy as uniform ones. UUIDs are derived from the node
name and card index, so every run, and every process, names the same card the same way.

``--topology`` joins the cards as a real board would (:data:`SIMULATED_TOPOLOGIES`), for
trying the allocator's topology policy without NVLinked hardware; ``--mps on`` reports an
MPS daemon (``auto`` finds none: simulated cards have no daemon).
"""

from __future__ import annotations

import uuid
from itertools import combinations
from typing import Literal

from gpushare.core.model import Card, CardLink
from gpushare.reporter.backends import InventorySource
from gpushare.reporter.health import HealthEvent, HealthMarks
from gpushare.reporter.mps import DEFAULT_MPS_MODE, MpsMode, decide_mps

SimulatedTopology = Literal["none", "nvlink-pairs", "nvswitch", "pcie"]
SIMULATED_TOPOLOGIES: tuple[SimulatedTopology, ...] = ("none", "nvlink-pairs", "nvswitch", "pcie")
"""``none``: no links reported (topology unknown, as before links existed);
``nvlink-pairs``: cards 2k and 2k+1 bridged by four NVLinks (``NV4``), other pairs across
sockets (``SYS``), as on NVLink-bridged PCIe cards; ``nvswitch``: every pair ``NV18``, as on
an HGX H100 board; ``pcie``: every pair through the host bridge (``PHB``)."""

PAIR_NVLINKS = 4
NVSWITCH_NVLINKS = 18

SIMULATED_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://gpushare.dev/simulated-gpu")
"""Fixed, so that simulated UUIDs never change between releases."""

DEFAULT_FAULT_REASON = "simulated fault"


def simulated_uuid(node: str, index: int) -> str:
    """``GPU-`` and a UUID5 of (node, index): NVML's form, stable and unique per card."""
    return f"GPU-{uuid.uuid5(SIMULATED_UUID_NAMESPACE, f'{node}/{index}')}"


def simulated_model(memory_mib: int) -> str:
    return f"gpushare-simulated-{memory_mib}MiB"


def simulated_cards(node: str, cards_mib: tuple[int, ...]) -> tuple[Card, ...]:
    return tuple(
        Card(
            index=index,
            uuid=simulated_uuid(node, index),
            model=simulated_model(memory_mib),
            memory_mib=memory_mib,
        )
        for index, memory_mib in enumerate(cards_mib)
    )


def simulated_link(a: int, b: int, topology: SimulatedTopology) -> CardLink | None:
    """How cards ``a < b`` are joined on a simulated board of that topology."""
    if topology == "nvswitch":
        return CardLink(a=a, b=b, path="NVLINK", nvlinks=NVSWITCH_NVLINKS)
    if topology == "pcie":
        return CardLink(a=a, b=b, path="PHB")
    if topology == "nvlink-pairs":
        if a // 2 == b // 2:
            return CardLink(a=a, b=b, path="NVLINK", nvlinks=PAIR_NVLINKS)
        return CardLink(a=a, b=b, path="SYS")
    return None


def simulated_links(count: int, topology: SimulatedTopology) -> tuple[CardLink, ...]:
    """One link per pair of ``count`` cards; none for topology ``none``."""
    links = (simulated_link(a, b, topology) for a, b in combinations(range(count), 2))
    return tuple(link for link in links if link is not None)


class SimulatedBackend:
    """A node with the given cards; :meth:`mark_unhealthy` and :meth:`mark_healthy` flip one."""

    def __init__(
        self,
        node: str,
        cards_mib: tuple[int, ...],
        *,
        topology: SimulatedTopology = "none",
        mps: MpsMode = DEFAULT_MPS_MODE,
    ) -> None:
        self.node = node
        self._cards = simulated_cards(node, cards_mib)
        self._links = simulated_links(len(cards_mib), topology)
        self._mps = decide_mps(mps, control_pipe=False)
        self._marks = HealthMarks()

    @property
    def source(self) -> InventorySource:
        return "simulated"

    def driver_version(self) -> str:
        return ""

    def read_links(self) -> tuple[CardLink, ...]:
        return self._links

    def mps_enabled(self) -> bool:
        return self._mps

    def read_cards(self) -> tuple[Card, ...]:
        return self._marks.apply(self._cards)

    def card_uuid(self, index: int) -> str:
        """The UUID of card ``index``; ``ValueError`` if the node has no such card."""
        if not 0 <= index < len(self._cards):
            raise ValueError(f"node {self.node} has no card {index} (it has {len(self._cards)})")
        return self._cards[index].uuid

    def mark_unhealthy(self, index: int, reason: str = DEFAULT_FAULT_REASON) -> None:
        """Take card ``index`` out of service, as an XID would; the reporter publishes at once."""
        uuid = self.card_uuid(index)
        self._marks.record(HealthEvent(card_uuid=uuid, healthy=False, reason=reason))

    def mark_healthy(self, index: int) -> None:
        """Put card ``index`` back in service."""
        self._marks.record(HealthEvent(card_uuid=self.card_uuid(index), healthy=True))

    def poll_health_events(self, timeout: float) -> list[HealthEvent]:
        return self._marks.wait_for_events(timeout)

    def close(self) -> None:
        self._marks.close()
