"""Events and folded node states for the node agent's unit tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from gpushare.core.events import (
    AnyEvent,
    ContainerAssigned,
    InventoryReported,
    PodBound,
    PodReserved,
)
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.state import NodeState, fold_events

NODE = "n1"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def card(index: int, mib: int = 16384, healthy: bool = True) -> Card:
    return Card(
        index=index,
        uuid=f"GPU-{index:x}{index:x}a1b2c3-0000-4000-8000-00000000000{index}",
        model="T4",
        memory_mib=mib,
        healthy=healthy,
        health_reason="" if healthy else "XID 79",
    )


def inventory(*cards: Card, node: str = NODE) -> InventoryReported:
    return InventoryReported(
        id=f"inv-{node}", at=T0, node=node, cards=cards, source="fixture", heartbeat_seconds=5
    )


def share(name: str, on: Card, mib: int, init: bool = False, core: int = 0) -> ContainerShare:
    return ContainerShare(
        container=name,
        card_index=on.index,
        card_uuid=on.uuid,
        memory_mib=mib,
        init=init,
        core_percent=core,
    )


def reserve(
    uid: str,
    *shares: ContainerShare,
    created: datetime | None = None,
    node: str = NODE,
) -> PodReserved:
    return PodReserved(
        id=f"reserve-{uid}",
        at=T0,
        node=node,
        pod=PodRef(namespace="ns", name=uid, uid=uid),
        shares=shares,
        pod_created_at=created,
    )


def bind(reservation: PodReserved, asked: Mapping[str, tuple[str, ...]] | None = None) -> PodBound:
    """``asked``: container → the resource names it asked (``PodBound.resources``)."""
    return PodBound(
        id=f"bound-{reservation.pod.uid}",
        at=T0,
        node=reservation.node,
        pod=reservation.pod,
        reservation_id=reservation.id,
        resources=dict(asked or {}),
    )


def assign(reservation: PodReserved, container: str, *on: Card) -> ContainerAssigned:
    return ContainerAssigned(
        id=f"assigned-{reservation.id}-{container}",
        at=T0,
        node=reservation.node,
        pod=reservation.pod,
        reservation_id=reservation.id,
        container=container,
        card_uuids=tuple(card.uuid for card in on),
    )


def reserve_and_bind(
    reservation: PodReserved, asked: Mapping[str, tuple[str, ...]] | None = None
) -> list[AnyEvent]:
    return [reservation, bind(reservation, asked)]


def node_state(events: Sequence[AnyEvent], node: str = NODE) -> NodeState:
    """Fold ``events`` with stream sequences 1, 2, ... (inventory events take 0)."""
    numbered: list[tuple[int, AnyEvent]] = []
    seq = 0
    for event in events:
        if isinstance(event, InventoryReported):
            numbered.append((0, event))
        else:
            seq += 1
            numbered.append((seq, event))
    return fold_events(numbered).node(node)
