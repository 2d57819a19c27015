"""What the binder decides, as pure functions of the fold, the clock, what it saw of a pod
and an API outcome.

Event ids derive from the reservation id alone, so a redelivered reservation (or a
second binder replica) appends the very same ``PodBound``, ``BindFailed`` or
``PodReleased``, which JetStream's duplicate window (and the fold's match on
``reservation_id``) turns into a no-op. ``bound_id``, ``released_id`` and ``pod_released``,
which the reconciler shares, live in :mod:`gpushare.core.reconciliation`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpushare.core.events import BindFailed, DiscrepancyFound, PodBound, PodReserved, ReleaseReason
from gpushare.core.pods import TERMINAL_PHASES
from gpushare.core.reconciliation import ADOPTED_POLICY, RECONCILER, bound_id
from gpushare.core.state import ClusterState, NodeState, PodAllocation

SWEEPER = "sweeper"
"""``DiscrepancyFound.reporter`` of the binder's overdue sweep."""


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


@dataclass(frozen=True)
class Sighting:
    """A pod as the binder last saw it (its list, watch, or a GET)."""

    present: bool
    """False: the API has no pod of this uid."""
    node: str = ""
    """``spec.nodeName``: empty when seen before it was bound."""
    phase: str = "Pending"


@dataclass(frozen=True)
class Release:
    reason: ReleaseReason
    detail: str = ""


@dataclass(frozen=True)
class Overdue:
    """Bound, existing, not finished, not fully assigned past the assign timeout: reported,
    never released (the kubelet may hold its cards)."""

    waiting: tuple[str, ...]
    """The containers not assigned yet."""
    phase: str


class LookUp:
    """Past the assign timeout, but the pod was not seen since it was bound: read it first."""


LOOK_UP = LookUp()
OverdueAction = Release | Overdue | LookUp | None


def overdue_action(
    allocation: PodAllocation,
    now: datetime,
    bind_timeout: timedelta,
    assign_timeout: timedelta,
    seen: Sighting | None,
    *,
    looked_up: bool = False,
) -> OverdueAction:
    """What a sweep does with an allocation. A reservation never bound within
    ``bind_timeout`` is released (``bind_timeout``); a bound one is released only when its
    pod is gone or finished, whatever the clock says. Past ``assign_timeout`` a bound pod
    not fully assigned is looked up (``seen`` None, or seen only before its binding, and
    not ``looked_up`` already), released if gone or finished, else reported as overdue."""
    if not allocation.bound:
        overdue = now - allocation.reserved_at > bind_timeout
        return Release("bind_timeout") if overdue else None
    if allocation.fully_assigned:
        return None
    bound_at = allocation.bound_at or allocation.reserved_at
    if now - bound_at <= assign_timeout:
        return None
    if not looked_up and (seen is None or (seen.present and not seen.node)):
        return LOOK_UP
    if seen is None or not seen.present:
        return Release("deleted", "pod not found after the assign timeout")
    if seen.phase in TERMINAL_PHASES:
        return Release("terminated", seen.phase)
    waiting = tuple(
        dict.fromkeys(
            share.container
            for share in allocation.shares
            if share.container not in allocation.assigned
        )
    )
    return Overdue(waiting=waiting, phase=seen.phase)


def overdue_found(
    node: str, allocation: PodAllocation, overdue: Overdue, at: datetime, assign_timeout: timedelta
) -> DiscrepancyFound:
    """The record of an overdue pod: one per reservation (its id says which)."""
    seconds = int(assign_timeout.total_seconds())
    return DiscrepancyFound(
        id=f"discrepancy-assign_overdue-{allocation.reservation_id}",
        at=at,
        node=node,
        kind="assign_overdue",
        detail=(
            f"bound but not fully assigned within the assign timeout ({seconds} s): the pod is "
            f"{overdue.phase}, containers waiting: {', '.join(overdue.waiting)}; the "
            "reservation is kept until the pod is gone or finished"
        ),
        pod=allocation.pod,
        reservation_id=allocation.reservation_id,
        reporter=SWEEPER,
    )


def overdue_allocations(state: ClusterState) -> Iterator[tuple[str, PodAllocation]]:
    """Every allocation a sweep looks at: not fully assigned yet."""
    for node in list(state.nodes.values()):
        for allocation in node.pods.values():
            if not (allocation.bound and allocation.fully_assigned):
                yield node.name, allocation


def still_open(
    state: ClusterState, reservations: Mapping[str, tuple[str, str]]
) -> list[tuple[str, PodAllocation]]:
    """The allocations of ``reservations`` (reservation id → its node and pod uid) that a
    sweep looks at: still held by the fold under that reservation, not fully assigned."""
    found = []
    for reservation_id, (name, uid) in reservations.items():
        allocation = state.node(name).pods.get(uid)
        if allocation is None or allocation.reservation_id != reservation_id:
            continue
        if not (allocation.bound and allocation.fully_assigned):
            found.append((name, allocation))
    return found


def fully_assigned(state: ClusterState) -> Iterator[PodAllocation]:
    """Allocations whose every container got its card: their pods get ``ASSIGNED=true``."""
    for node in list(state.nodes.values()):
        for allocation in node.pods.values():
            if allocation.bound and allocation.fully_assigned:
                yield allocation


def healthy_cards(node: NodeState) -> int:
    """What ``aliyun.com/gpu-count`` advertises: the cards a pod could be placed on."""
    return sum(1 for card in node.cards if card.healthy)
