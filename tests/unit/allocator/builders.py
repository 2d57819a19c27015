"""Builders for the allocator's tests: cards, folded nodes, pods and extender bodies as JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpushare.core.events import AllocationEvent, InventoryReported, PodReserved
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.state import ClusterState

V100 = 16276
"""Seeds 000/001: a 16 GiB card counts 16276 MiB."""
HEARTBEAT_SECONDS = 3600.0
"""Long enough that no test's inventory goes stale while it runs."""
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kube-scheduler"


def now() -> datetime:
    return datetime.now(UTC)


def card(node: str, index: int, memory_mib: int = V100, *, healthy: bool = True) -> Card:
    return Card(
        index=index,
        uuid=f"GPU-{node}-{index}",
        model="Tesla V100-SXM2-16GB",
        memory_mib=memory_mib,
        healthy=healthy,
        health_reason="" if healthy else "XID 79",
    )


def inventory(node: str, cards: Sequence[Card], at: datetime | None = None) -> InventoryReported:
    at = at or now()
    return InventoryReported(
        id=f"inventory-{node}-{at.isoformat()}",
        at=at,
        node=node,
        cards=tuple(cards),
        source="fixture",
        heartbeat_seconds=HEARTBEAT_SECONDS,
    )


def occupant(node: str, on: Card, memory_mib: int, name: str) -> PodReserved:
    """A pod already holding ``memory_mib`` of ``on``: how tests make a card used."""
    return PodReserved(
        id=f"reserve-{name}",
        at=now(),
        node=node,
        pod=PodRef(namespace="occupants", name=name, uid=f"uid-{name}"),
        shares=(
            ContainerShare(
                container="main", card_index=on.index, card_uuid=on.uuid, memory_mib=memory_mib
            ),
        ),
    )


def node_events(node: str, used_per_card: Sequence[int], total: int = V100) -> list[Any]:
    """Inventory of ``len(used_per_card)`` cards, then occupants using that much of each."""
    cards = [card(node, index, total) for index in range(len(used_per_card))]
    events: list[Any] = [inventory(node, cards)]
    for each, used in zip(cards, used_per_card, strict=True):
        if used:
            events.append(occupant(node, each, used, f"{node}-gpu{each.index}-occupant"))
    return events


def fold(events: Iterable[InventoryReported | AllocationEvent]) -> ClusterState:
    state = ClusterState()
    seq = 0
    for event in events:
        if isinstance(event, InventoryReported):
            state.apply(event)
        else:
            seq += 1
            state.apply(event, seq)
    return state


def seed_000_filter_cluster() -> list[Any]:
    """Seed 000's filter example: 3 nodes × 2 cards of 16276 MiB, a pod asking 8138.

    N1 uses 16276 and 12207 (4069 free on one card), N2 uses 12207 on each card
    (4069 free on each), N3 has 8138 free on GPU0 and its GPU1 full.
    """
    return [
        *node_events("N1", [V100, 12207]),
        *node_events("N2", [12207, 12207]),
        *node_events("N3", [8138, V100]),
    ]


def seed_000_bind_node() -> list[Any]:
    """Seed 000's bind example: 4 cards with 12207, 8138, 4069 and 16276 MiB free."""
    return node_events("N1", [V100 - 12207, V100 - 8138, V100 - 4069, 0])


def gpu_pod(
    name: str,
    *memory: int | str,
    uid: str | None = None,
    namespace: str = "default",
    init: Sequence[int] = (),
) -> dict[str, Any]:
    """A pod as kube-scheduler sends it; one container per ``memory`` (none: no GPU)."""

    def container(prefix: str, index: int, amount: int | str) -> dict[str, Any]:
        quantity = {"aliyun.com/gpu-mem": str(amount)}
        return {
            "name": f"{prefix}{index}",
            "image": "example.invalid/cuda:none",
            "resources": {"limits": quantity, "requests": dict(quantity)},
        }

    containers = [container("main", i, amount) for i, amount in enumerate(memory)]
    spec: dict[str, Any] = {"containers": containers or [{"name": "main", "image": "x"}]}
    if init:
        spec["initContainers"] = [container("init", i, amount) for i, amount in enumerate(init)]
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "creationTimestamp": "2026-11-22T04:24:39Z",
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def names_args(pod: dict[str, Any], names: Sequence[str]) -> bytes:
    """ExtenderArgs as kube-scheduler sends them with nodeCacheCapable: true."""
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": list(names)}).encode()


def node_json(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": {}}


def nodes_args(pod: dict[str, Any], names: Sequence[str]) -> bytes:
    """ExtenderArgs as kube-scheduler sends them with nodeCacheCapable: false."""
    nodes = {"metadata": {}, "items": [node_json(name) for name in names]}
    return json.dumps({"Pod": pod, "Nodes": nodes, "NodeNames": None}).encode()


def binding_args(pod: dict[str, Any], node: str) -> bytes:
    meta = pod["metadata"]
    return json.dumps(
        {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
    ).encode()


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def first_chosen(accepted: dict[str, Any]) -> dict[str, Any]:
    """A recorded filter answer (every node that fit passed) as the allocator answers it
    by default (``--choose-in-filter``): only the node the policy places the pod best on,
    here the first of the two equal empty nodes of the recorded calls."""
    chosen = dict(accepted)
    if chosen.get("NodeNames") is not None:
        chosen["NodeNames"] = chosen["NodeNames"][:1]
    if chosen.get("Nodes") is not None:
        chosen["Nodes"] = {**chosen["Nodes"], "items": chosen["Nodes"]["items"][:1]}
    return chosen


def fixture_names(suffix: str) -> list[str]:
    return sorted(path.name for path in FIXTURES.glob(f"*{suffix}"))
