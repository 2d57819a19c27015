"""What the allocator's fold believes, per node and card, for ``GET .../inspect``.

The shape is the Aliyun extender's (seed 000's ``kubectl inspect gpushare`` and its
users' scripts read it; AliyunContainerService/gpushare-scheduler-extender
``pkg/scheduler/gpushare-inspect.go``), for ``/inspect`` and ``/inspect/{node}`` alike::

    {"nodes": [{"name", "totalGPU", "usedGPU",
                "devs": [{"id", "totalGPU", "usedGPU",
                          "pods": [{"name", "namespace", "usedGPU"}]}]}],
     "error": "..."}            # only when there is one

``totalGPU`` / ``usedGPU`` are in the cluster's memory unit (``aliyun.com/gpu-mem``'s:
MiB, or GiB with ``--memory-unit GiB``), whole units rounded down as the device plugin
counts them; ``id`` is the card's index. Every key of gpushare's own sits beside them
(MiB amounts, uuid, health, reservation state, staleness, DRA claims with state ``dra``
and their ``claim``...), so a client that reads
only Aliyun's keys sees Aliyun's answer.

A node gpushare has no inventory or allocation for answers 404 with
``{"nodes": [], "error": "node \\"NAME\\" not found"}``: Aliyun's extender means to answer
its ``Result`` with the lister's ``node "NAME" not found`` error, but then builds a node
from the missing one, panics, and the connection is dropped without an answer.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpushare.core.fit import is_stale
from gpushare.core.model import Card, PodRef
from gpushare.core.requests import to_units
from gpushare.core.state import (
    ClaimAllocation,
    ClusterState,
    NodeState,
    PodAllocation,
    memory_by_card,
)


def _pod_entry(allocation: PodAllocation, card: Card, mib: int, memory_unit: str) -> dict[str, Any]:
    return {
        "name": allocation.pod.name,
        "namespace": allocation.pod.namespace,
        "usedGPU": to_units(mib, memory_unit),
        "uid": allocation.pod.uid,
        "mib": mib,
        "reservation_id": allocation.reservation_id,
        "state": _pod_state(allocation),
        "reserved_at": allocation.reserved_at,
        "reserved_seq": allocation.reserved_seq,
        "containers": [
            {
                "name": share.container,
                "role": share.role,
                "mib": share.memory_mib,
                "core_percent": share.core_percent,
            }
            for share in allocation.shares
            if share.card_uuid == card.uuid
        ],
    }


def _claim_entries(held: ClaimAllocation, card: Card, memory_unit: str) -> list[dict[str, Any]]:
    """A DRA claim's share of ``card``: one entry per pod it is reserved for (or one for
    the claim itself while it names none)."""
    mib = sum(share.memory_mib for share in held.shares if share.card_uuid == card.uuid)
    if not mib:
        return []
    pods = held.pods or (PodRef(namespace=held.claim.namespace, name="", uid=""),)
    return [
        {
            "name": pod.name,
            "namespace": pod.namespace,
            "usedGPU": to_units(mib, memory_unit),
            "uid": pod.uid,
            "mib": mib,
            "reservation_id": held.allocation_id,
            "state": "dra",
            "claim": held.claim.key,
            "reserved_at": held.allocated_at,
            "reserved_seq": held.allocated_seq,
        }
        for pod in pods
    ]


def _pod_state(allocation: PodAllocation) -> str:
    if not allocation.bound:
        return "reserved"
    return "assigned" if allocation.fully_assigned else "bound"


def _dev_entry(node: NodeState, card: Card, memory_unit: str) -> dict[str, Any]:
    pods = []
    for allocation in node.pods.values():
        mib = memory_by_card(allocation.shares).get(card.uuid)
        if mib is not None:
            pods.append(_pod_entry(allocation, card, mib, memory_unit))
    for held in node.claims.values():
        pods.extend(_claim_entries(held, card, memory_unit))
    used_mib = node.used_mib.get(card.uuid, 0)
    return {
        "id": card.index,
        "totalGPU": to_units(card.memory_mib, memory_unit),
        "usedGPU": to_units(used_mib, memory_unit),
        "pods": sorted(pods, key=lambda pod: int(pod["reserved_seq"])),
        "index": card.index,
        "uuid": card.uuid,
        "model": card.model,
        "total_mib": card.memory_mib,
        "used_mib": used_mib,
        "free_mib": node.free_mib(card),
        "healthy": card.healthy,
        "health_reason": card.health_reason,
        "containers": node.containers.get(card.uuid, 0),
    }


def inspect_node(node: NodeState, now: datetime, memory_unit: str = "MiB") -> dict[str, Any]:
    """One entry of ``nodes``: Aliyun's node keys, then gpushare's."""
    devs = [_dev_entry(node, card, memory_unit) for card in sorted(node.cards, key=_index)]
    return {
        "name": node.name,
        "totalGPU": sum(dev["totalGPU"] for dev in devs),
        "usedGPU": sum(dev["usedGPU"] for dev in devs),
        "devs": devs,
        "total_mib": sum(card.memory_mib for card in node.cards),
        "used_mib": sum(node.used_mib.values()),
        "max_free_mib": node.max_free_mib,
        "inventory_at": node.inventory_at,
        "heartbeat_seconds": node.heartbeat_seconds,
        "stale": is_stale(node, now),
        "last_seq": node.last_seq,
        "pod_count": len(node.pods),
        "claim_count": len(node.claims),
        "front_door": node.front_door,
    }


def _index(card: Card) -> int:
    return card.index


def inspect_cluster(state: ClusterState, now: datetime, memory_unit: str = "MiB") -> dict[str, Any]:
    """``GET /inspect``: every node the fold knows."""
    nodes = [inspect_node(state.nodes[name], now, memory_unit) for name in sorted(state.nodes)]
    return {"nodes": nodes}


def inspect_one(
    state: ClusterState, name: str, now: datetime, memory_unit: str = "MiB"
) -> dict[str, Any] | None:
    """``GET /inspect/{name}``: the same document holding that node, or ``None`` if the
    fold does not know it."""
    node = state.nodes.get(name)
    if node is None:
        return None
    return {"nodes": [inspect_node(node, now, memory_unit)]}


def unknown_node(name: str) -> dict[str, Any]:
    """The 404 body for a node gpushare does not know, in the same shape."""
    return {"nodes": [], "error": f'node "{name}" not found'}
