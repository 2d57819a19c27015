"""The cluster's healthy GPU by card model, kept as the fold changes nodes.

The live workload estimate prices card models by the cluster's capacity
(``Workload.capacity``) and asks for it at each refresh. Counting every card of every node
there cost a scan of the whole fold per refresh (8,000 cards at 1,000 nodes, on a
filter's path); here each inventory event recounts only its node's cards.
"""

from __future__ import annotations

from collections import Counter

from gpushare.core.events import AnyEvent, InventoryReported
from gpushare.core.policies.fragmentation import MILLI
from gpushare.core.policies.workload import Capacity
from gpushare.core.state import ClusterState, NodeState


class CapacityByModel:
    """``capacity(state)`` equals ``cluster_capacity`` of every node's view, kept up to
    date by :meth:`changed` (a follower listener); nodes replaced wholesale (the bulk
    fold at start) are counted again whole."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeState] | None = None
        self._by_node: dict[str, Counter[str]] = {}
        self._total: Counter[str] = Counter()
        self._dirty: set[str] = set()

    def changed(self, _seq: int, event: AnyEvent, node: NodeState) -> None:
        if isinstance(event, InventoryReported):
            self._dirty.add(node.name)

    def capacity(self, state: ClusterState) -> Capacity:
        if state.nodes is not self._nodes:
            self._nodes = state.nodes
            self._by_node.clear()
            self._total.clear()
            self._dirty = set(state.nodes)
        for name in self._dirty:
            node = state.nodes.get(name)
            models = Counter(
                card.model for card in (node.view.cards if node else ()) if card.healthy
            )
            self._total.subtract(self._by_node.get(name, Counter()))
            self._total.update(models)
            self._by_node[name] = models
        self._dirty.clear()
        return tuple(
            (model, count * MILLI) for model, count in sorted(self._total.items()) if count > 0
        )
