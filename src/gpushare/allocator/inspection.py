"""What the allocator's fold believes, per node and card, for ``GET .../inspect``.

Shaped like seed 000's ``kubectl inspect gpushare``: every card with its total, used
and free memory and the pods holding it, plus where each pod's reservation stands.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpushare.core.fit import is_stale
from gpushare.core.model import Card
from gpushare.core.state import ClusterState, NodeState, PodAllocation, memory_by_card


def _pod_entry(allocation: PodAllocation, mib: int) -> dict[str, Any]:
    return {
        "namespace": allocation.pod.namespace,
        "name": allocation.pod.name,
        "uid": allocation.pod.uid,
        "mib": mib,
        "reservation_id": allocation.reservation_id,
        "state": _pod_state(allocation),
        "reserved_at": allocation.reserved_at,
        "reserved_seq": allocation.reserved_seq,
    }


def _pod_state(allocation: PodAllocation) -> str:
    if not allocation.bound:
        return "reserved"
    return "assigned" if allocation.fully_assigned else "bound"


def _card_entry(node: NodeState, card: Card) -> dict[str, Any]:
    pods = []
    for allocation in node.pods.values():
        mib = memory_by_card(allocation.shares).get(card.uuid)
        if mib is not None:
            pods.append(_pod_entry(allocation, mib))
    return {
        "index": card.index,
        "uuid": card.uuid,
        "model": card.model,
        "total_mib": card.memory_mib,
        "used_mib": node.used_mib.get(card.uuid, 0),
        "free_mib": node.free_mib(card),
        "healthy": card.healthy,
        "health_reason": card.health_reason,
        "containers": node.containers.get(card.uuid, 0),
        "pods": sorted(pods, key=lambda pod: int(pod["reserved_seq"])),
    }


def inspect_node(node: NodeState, now: datetime) -> dict[str, Any]:
    cards = [_card_entry(node, card) for card in sorted(node.cards, key=lambda c: c.index)]
    return {
        "name": node.name,
        "cards": cards,
        "total_mib": sum(card.memory_mib for card in node.cards),
        "used_mib": sum(node.used_mib.values()),
        "max_free_mib": node.max_free_mib,
        "inventory_at": node.inventory_at,
        "heartbeat_seconds": node.heartbeat_seconds,
        "stale": is_stale(node, now),
        "last_seq": node.last_seq,
        "pods": len(node.pods),
    }


def inspect_cluster(state: ClusterState, now: datetime) -> dict[str, Any]:
    nodes = [inspect_node(state.nodes[name], now) for name in sorted(state.nodes)]
    return {"nodes": nodes}
