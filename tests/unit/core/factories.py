"""Builders for the core's tests: cards, nodes folded from real events, pods as JSON dicts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from gpushare.core.events import InventoryReported, PodReserved
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.requests import ALIYUN_GROUP, ContainerRequest, PodRequest
from gpushare.core.state import ClusterState, NodeState

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
HEARTBEAT_SECONDS = 10.0
V100 = 16276
"""Seeds 000/001: a 16 GiB card counts 16276 MiB."""


def make_card(
    index: int,
    memory_mib: int = V100,
    *,
    node: str = "n",
    healthy: bool = True,
    health_reason: str = "",
) -> Card:
    return Card(
        index=index,
        uuid=f"GPU-{node}-{index}",
        model="Tesla V100-SXM2-16GB",
        memory_mib=memory_mib,
        healthy=healthy,
        health_reason=health_reason,
    )


def inventory(node: str, cards: Sequence[Card], at: datetime = T0) -> InventoryReported:
    return InventoryReported(
        id=f"inventory-{node}-{at.isoformat()}",
        at=at,
        node=node,
        cards=tuple(cards),
        source="fixture",
        heartbeat_seconds=HEARTBEAT_SECONDS,
    )


def pod_ref(uid: str) -> PodRef:
    return PodRef(namespace="default", name=f"name-{uid}", uid=uid)


def request_of(*memory_mib: int, init: Sequence[int] = ()) -> PodRequest:
    """App containers ``c0, c1, ...`` and init containers ``init0, ...`` of these sizes."""
    app = [
        ContainerRequest(container=f"c{i}", memory_mib=m, group=ALIYUN_GROUP)
        for i, m in enumerate(memory_mib)
    ]
    inits = [
        ContainerRequest(container=f"init{i}", memory_mib=m, init=True, group=ALIYUN_GROUP)
        for i, m in enumerate(init)
    ]
    return PodRequest(containers=(*inits, *app))


def occupying(node: str, card: Card, memory_mib: int, uid: str) -> PodReserved:
    """A reservation that holds ``memory_mib`` on ``card`` (a pod already running there)."""
    return PodReserved(
        id=f"reserve-{uid}",
        at=T0,
        node=node,
        pod=pod_ref(uid),
        shares=(
            ContainerShare(
                container="main", card_index=card.index, card_uuid=card.uuid, memory_mib=memory_mib
            ),
        ),
    )


def node_with_usage(
    name: str, cards: Sequence[tuple[int, int]], *, unhealthy: Sequence[int] = ()
) -> NodeState:
    """A node folded from real events: ``cards`` is ``(memory_mib, used_mib)`` per card index."""
    state = ClusterState()
    built = [
        make_card(
            i,
            memory,
            node=name,
            healthy=i not in unhealthy,
            health_reason="XID 79" if i in unhealthy else "",
        )
        for i, (memory, _used) in enumerate(cards)
    ]
    state.apply(inventory(name, built))
    seq = 0
    for card, (_memory, used) in zip(built, cards, strict=True):
        if used:
            seq += 1
            state.apply(occupying(name, card, used, uid=f"{name}-existing-{card.index}"), seq)
    return state.node(name)


def gpu_container(
    name: str,
    *,
    request: Any = None,
    limit: Any = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Kubernetes container dict asking ``aliyun.com/gpu-mem`` as given (``None``: absent)."""
    resources: dict[str, Any] = {}
    if request is not None:
        resources["requests"] = {"aliyun.com/gpu-mem": request, **(extra or {})}
    if limit is not None:
        resources["limits"] = {"aliyun.com/gpu-mem": limit, **(extra or {})}
    if request is None and limit is None and extra:
        resources["limits"] = dict(extra)
    return {"name": name, "image": "cheyang/gpu-player:v2", "resources": resources}


def pod_dict(
    containers: Sequence[dict[str, Any]], init_containers: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers), "schedulerName": "default-scheduler"}
    if init_containers:
        spec["initContainers"] = list(init_containers)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "binpack-1",
            "namespace": "default",
            "uid": "9f0c1c7e-0000-4000-8000-000000000001",
            "creationTimestamp": "2026-01-01T12:00:00Z",
            "labels": {"app": "binpack-1"},
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)
