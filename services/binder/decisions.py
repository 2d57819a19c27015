"""What the binder decides, as pure functions of the fold, the clock and an API outcome.

Event ids derive from the reservation id alone, so a redelivered reservation (or a
second binder replica) appends the very same ``PodBound``, ``BindFailed`` or
``PodReleased``, which JetStream's duplicate window (and the fold's match on
``reservation_id``) turns into a no-op. ``bound_id``, ``released_id`` and ``pod_released``,
which the reconciler shares, live in :mod:`gpushare.core.reconciliation`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta

from gpushare.core.events import BindFailed, PodBound, PodReserved, ReleaseReason
from gpushare.core.reconciliation import ADOPTED_POLICY, RECONCILER, bound_id
from gpushare.core.state import ClusterState, NodeState, PodAllocation


def bind_failed_id(reservation_id: str) -> str:
    return f"{reservation_id}.bind-failed"


def pod_bound(
    reservation: PodReserved, at: datetime, resources: Mapping[str, tuple[str, ...]] | None = None
) -> PodBound:
    """``resources``: container → the GPU resource names it asked (for the node agent)."""
    return PodBound(
        id=bound_id(reservation.id),
        at=at,
        node=reservation.node,
        pod=reservation.pod,
        reservation_id=reservation.id,
        resources=dict(resources or {}),
    )


def bind_failed(reservation: PodReserved, at: datetime, reason: str) -> BindFailed:
    return BindFailed(
        id=bind_failed_id(reservation.id),
        at=at,
        node=reservation.node,
        pod=reservation.pod,
        reservation_id=reservation.id,
        reason=reason,
    )


def needs_binding(state: ClusterState, reservation: PodReserved) -> bool:
    """False once the fold shows the reservation bound, failed, released or replaced, and
    for an adoption: the reconciler made it for a pod already bound, and binds it itself."""
    if reservation.policy == ADOPTED_POLICY and reservation.reserved_by == RECONCILER:
        return False
    allocation = state.node(reservation.node).pods.get(reservation.pod.uid)
    return (
        allocation is not None
        and allocation.reservation_id == reservation.id
        and not allocation.bound
    )


def card_memory_mib(node: NodeState, reservation: PodReserved) -> int:
    """Total memory of the reservation's card (0 when the inventory does not list it)."""
    if not reservation.shares:
        return 0
    card = node.card(reservation.shares[0].card_uuid)
    return card.memory_mib if card is not None else 0


def overdue_reason(
    allocation: PodAllocation,
    now: datetime,
    bind_timeout: timedelta,
    assign_timeout: timedelta,
) -> ReleaseReason | None:
    """``bind_timeout`` for a reservation never bound in time; ``assign_timeout`` for a
    bound pod the device plugin never fully served in time; else None."""
    if not allocation.bound:
        return "bind_timeout" if now - allocation.reserved_at > bind_timeout else None
    if allocation.fully_assigned:
        return None
    bound_at = allocation.bound_at or allocation.reserved_at
    return "assign_timeout" if now - bound_at > assign_timeout else None


def overdue_allocations(
    state: ClusterState, now: datetime, bind_timeout: timedelta, assign_timeout: timedelta
) -> Iterator[tuple[str, PodAllocation, ReleaseReason]]:
    for node in list(state.nodes.values()):
        for allocation in node.pods.values():
            reason = overdue_reason(allocation, now, bind_timeout, assign_timeout)
            if reason is not None:
                yield node.name, allocation, reason


def fully_assigned(state: ClusterState) -> Iterator[PodAllocation]:
    """Allocations whose every container got its card: their pods get ``ASSIGNED=true``."""
    for node in list(state.nodes.values()):
        for allocation in node.pods.values():
            if allocation.bound and allocation.fully_assigned:
                yield allocation


def healthy_cards(node: NodeState) -> int:
    """What ``aliyun.com/gpu-count`` advertises: the cards a pod could be placed on."""
    return sum(1 for card in node.cards if card.healthy)
