"""A node's ``Device`` custom resource (``gpushare.io/v1alpha1``), rendered from its fold.

One Device per node, named after it (seed 002's Device CRD, narrowed to GPUs): each card
as the reporter last saw it (model, memory, health) and what the allocation log holds on
it (memory, compute, pods). The binder writes it; ``kubectl get devices`` reads it.

Pure and deterministic: the same :class:`NodeState` always renders the same dict, so
every binder replica writes the same content and a write that changes nothing is
skipped. Nothing here depends on the clock: the inventory's time is left out, or every
heartbeat would rewrite every Device.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from gpushare.core.model import Card, PodRef
from gpushare.core.reconciliation import node_gone
from gpushare.core.state import NodeState, PodAllocation, core_by_card, memory_by_card

GROUP = "gpushare.io"
VERSION = "v1alpha1"
PLURAL = "devices"
KIND = "Device"
API_VERSION = f"{GROUP}/{VERSION}"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpushare-binder"

Phase = Literal["Reserved", "Bound", "Assigned", "Claimed"]


def pod_phase(allocation: PodAllocation) -> Phase:
    """Reserved by the allocator, bound by the binder, or handed its cards by the plugin."""
    if not allocation.bound:
        return "Reserved"
    return "Assigned" if allocation.fully_assigned else "Bound"


def _pods_on(card: Card, node: NodeState) -> list[dict[str, Any]]:
    entries = []
    for allocation in node.pods.values():
        containers = sorted(
            {share.container for share in allocation.shares if share.card_uuid == card.uuid}
        )
        if not containers:
            continue
        pod = allocation.pod
        entries.append(
            {
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
                "memoryMiB": memory_by_card(allocation.shares).get(card.uuid, 0),
                "corePercent": core_by_card(allocation.shares).get(card.uuid, 0),
                "containers": containers,
                "phase": pod_phase(allocation),
            }
        )
    entries.extend(_claims_on(card, node))
    return sorted(entries, key=lambda entry: (entry["namespace"], entry["name"], entry["uid"]))


def _claims_on(card: Card, node: NodeState) -> list[dict[str, Any]]:
    """DRA claims on ``card``: one entry per pod a claim is reserved for."""
    entries = []
    for held in node.claims.values():
        shares = [share for share in held.shares if share.card_uuid == card.uuid]
        if not shares:
            continue
        for pod in held.pods or (PodRef(namespace=held.claim.namespace, name="", uid=""),):
            entries.append(
                {
                    "namespace": pod.namespace,
                    "name": pod.name,
                    "uid": pod.uid,
                    "memoryMiB": sum(share.memory_mib for share in shares),
                    "corePercent": sum(share.core_percent for share in shares),
                    "containers": sorted({share.request for share in shares}),
                    "phase": "Claimed",
                    "claim": held.claim.key,
                }
            )
    return entries


def _foreign_on(card: Card, node: NodeState) -> list[dict[str, Any]]:
    holds = [hold for hold in node.foreign if hold.card_uuid == card.uuid]
    return [
        {"resource": hold.resource, "pods": sorted(hold.pods)}
        for hold in sorted(holds, key=lambda hold: hold.resource)
    ]


def render_card(card: Card, node: NodeState) -> dict[str, Any]:
    """One entry of ``status.cards``."""
    allocated = node.used_mib.get(card.uuid, 0)
    entry: dict[str, Any] = {
        "index": card.index,
        "uuid": card.uuid,
        "model": card.model,
        "memoryMiB": card.memory_mib,
        "allocatedMiB": allocated,
        "freeMiB": card.memory_mib - allocated,
        "coreAllocated": node.used_core.get(card.uuid, 0),
        "containers": node.containers.get(card.uuid, 0),
        "healthy": card.healthy,
        "pods": _pods_on(card, node),
    }
    if card.health_reason:
        entry["healthReason"] = card.health_reason
    foreign = _foreign_on(card, node)
    if foreign:
        entry["foreign"] = foreign
    return entry


def _models(cards: tuple[Card, ...]) -> str:
    return ", ".join(dict.fromkeys(card.model for card in cards))


def render_status(node: NodeState, driver_version: str = "") -> dict[str, Any]:
    """``status`` of the node's Device: a summary for the printer columns, then each card."""
    cards = tuple(sorted(node.cards, key=lambda card: card.index))
    healthy = sum(1 for card in cards if card.healthy)
    status: dict[str, Any] = {
        "cardCount": len(cards),
        "model": _models(cards),
        "memoryMiB": sum(card.memory_mib for card in cards),
        "allocatedMiB": sum(node.used_mib.get(card.uuid, 0) for card in cards),
        "healthy": f"{healthy}/{len(cards)}",
        "podCount": len(node.pods),
        "mps": node.mps,
        "lastSeq": node.last_seq,
        "cards": [render_card(card, node) for card in cards],
    }
    if driver_version:
        status["driverVersion"] = driver_version
    return status


def render_device(node: NodeState, driver_version: str = "") -> dict[str, Any]:
    """The whole Device object (create with it, then write its status)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": node.name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {"nodeName": node.name},
        "status": render_status(node, driver_version),
    }


def devices_to_delete(
    existing: Iterable[str],
    nodes: Mapping[str, NodeState],
    api_nodes: Collection[str] | None,
    now: datetime,
) -> list[str]:
    """The Devices (by name) whose node is gone: never reported, or no longer in the API
    and silent (``api_nodes`` None: unknown, so only the never-reported ones)."""
    doomed = []
    for name in existing:
        node = nodes.get(name)
        if node is None or node.inventory_at is None or node_gone(node, api_nodes, now):
            doomed.append(name)
    return sorted(doomed)
