"""Allocated and free memory and core of every card, read from the fold at scrape time.

Nothing is updated per event: :class:`CardGauges` walks the follower's current
:class:`~gpushare.core.state.ClusterState` when Prometheus asks, so the figures are
exactly the fold's (allocated: what the log reserved; free: what placement sees, with
cards held by other device plugins counted as wholly used).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushare.core.state import ClusterState

LABELS = ("node", "card", "uuid")
PREFIX = "gpushare_allocator_card"


class CardGauges(Collector):
    def __init__(self, state: Callable[[], ClusterState]) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            "memory": GaugeMetricFamily(
                f"{PREFIX}_memory_mib", "Memory of the card (MiB), as reported.", labels=LABELS
            ),
            "allocated_memory": GaugeMetricFamily(
                f"{PREFIX}_allocated_memory_mib",
                "Memory reserved on the card by the allocation log (MiB).",
                labels=LABELS,
            ),
            "free_memory": GaugeMetricFamily(
                f"{PREFIX}_free_memory_mib",
                "Memory placement can still give on the card (MiB).",
                labels=LABELS,
            ),
            "allocated_core": GaugeMetricFamily(
                f"{PREFIX}_allocated_core_percent",
                "Compute reserved on the card by the allocation log (percent of the card).",
                labels=LABELS,
            ),
            "free_core": GaugeMetricFamily(
                f"{PREFIX}_free_core_percent",
                "Compute placement can still give on the card (percent of the card).",
                labels=LABELS,
            ),
            "containers": GaugeMetricFamily(
                f"{PREFIX}_containers", "Containers placed on the card.", labels=LABELS
            ),
            "healthy": GaugeMetricFamily(
                f"{PREFIX}_healthy", "1 if the card is healthy, else 0.", labels=LABELS
            ),
        }
        for name, node in sorted(self._state().nodes.items()):
            for card, view in zip(node.cards, node.view.cards, strict=False):
                labels = [name, str(card.index), card.uuid]
                values = {
                    "memory": card.memory_mib,
                    "allocated_memory": node.used_mib.get(card.uuid, 0),
                    "free_memory": view.free_mib,
                    "allocated_core": node.used_core.get(card.uuid, 0),
                    "free_core": view.free_core,
                    "containers": view.containers,
                    "healthy": int(card.healthy),
                }
                for key, value in values.items():
                    families[key].add_metric(labels, value)
        yield from families.values()

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())
