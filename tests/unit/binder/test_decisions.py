"""The binder's pure decisions: event ids, what still needs binding, what is overdue."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from gpushare.binder.decisions import (
    bind_failed,
    card_memory_mib,
    fully_assigned,
    healthy_cards,
    needs_binding,
    overdue_allocations,
    overdue_reason,
    pod_bound,
)
from gpushare.core.events import BindFailed, ContainerAssigned, InventoryReported, PodReserved
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.reconciliation import ADOPTED_POLICY, RECONCILER, pod_released
from gpushare.core.state import ClusterState, PodAllocation

AT = datetime(2026, 1, 1, tzinfo=UTC)
NODE = "n1"
CARD = Card(index=0, uuid="GPU-0", model="T4", memory_mib=16000)
BIND_TIMEOUT = timedelta(seconds=120)
ASSIGN_TIMEOUT = timedelta(seconds=600)


def reserved(uid: str = "u1", containers: tuple[str, ...] = ("main",)) -> PodReserved:
    return PodReserved(
        id=f"r-{uid}",
        at=AT,
        node=NODE,
        pod=PodRef(namespace="ns", name=uid, uid=uid),
        shares=tuple(
            ContainerShare(container=c, card_index=0, card_uuid="GPU-0", memory_mib=1000)
            for c in containers
        ),
    )


def folded(*events: object) -> ClusterState:
    state = ClusterState()
    state.apply(
        InventoryReported(
            id="inv", at=AT, node=NODE, cards=(CARD,), source="fixture", heartbeat_seconds=5
        )
    )
    for seq, event in enumerate(events, start=1):
        state.apply(event, seq)  # type: ignore[arg-type]
    return state


def allocation_of(state: ClusterState, uid: str = "u1") -> PodAllocation:
    allocation = state.allocation(uid)
    assert allocation is not None
    return allocation


def test_event_ids_derive_from_the_reservation_only() -> None:
    reservation = reserved()
    later = AT + timedelta(hours=1)
    assert pod_bound(reservation, AT).id == pod_bound(reservation, later).id == "r-u1.bound"
    assert bind_failed(reservation, AT, "a").id == bind_failed(reservation, later, "b").id
    allocation = allocation_of(folded(reservation))
    first = pod_released(NODE, allocation, AT, "deleted")
    second = pod_released(NODE, allocation, later, "bind_timeout")
    assert first.id == second.id == "r-u1.released"
    assert (first.reservation_id, first.pod) == (reservation.id, reservation.pod)


def test_needs_binding_until_the_fold_concludes() -> None:
    reservation = reserved()
    assert not needs_binding(ClusterState(), reservation)  # not folded (or already void)
    assert needs_binding(folded(reservation), reservation)
    assert not needs_binding(folded(reservation, pod_bound(reservation, AT)), reservation)
    failed = BindFailed(
        id="f", at=AT, node=NODE, pod=reservation.pod, reservation_id=reservation.id, reason="x"
    )
    assert not needs_binding(folded(reservation, failed), reservation)


def test_an_adoption_is_never_bound_again() -> None:
    """The reconciler adopts pods the API already has bound, and appends their PodBound."""
    adoption = msgspec.structs.replace(reserved(), policy=ADOPTED_POLICY, reserved_by=RECONCILER)
    assert not needs_binding(folded(adoption), adoption)
    chosen_by_hand = msgspec.structs.replace(reserved(), policy=ADOPTED_POLICY)
    assert needs_binding(folded(chosen_by_hand), chosen_by_hand)


def test_card_memory_comes_from_the_inventory() -> None:
    reservation = reserved()
    assert card_memory_mib(folded().node(NODE), reservation) == 16000
    assert card_memory_mib(ClusterState().node(NODE), reservation) == 0


@pytest.mark.parametrize(
    ("bound", "assigned", "elapsed", "reason"),
    [
        (False, (), 119, None),
        (False, (), 121, "bind_timeout"),
        (True, (), 599, None),
        (True, (), 601, "assign_timeout"),
        (True, ("main",), 601, "assign_timeout"),
        (True, ("main", "side"), 100_000, None),
    ],
)
def test_overdue_reason(
    bound: bool, assigned: tuple[str, ...], elapsed: int, reason: str | None
) -> None:
    reservation = reserved(containers=("main", "side"))
    events: list[object] = [reservation]
    if bound:
        events.append(pod_bound(reservation, AT))
    events += [
        ContainerAssigned(
            id=f"a-{c}",
            at=AT,
            node=NODE,
            pod=reservation.pod,
            reservation_id=reservation.id,
            container=c,
            card_uuids=("GPU-0",),
        )
        for c in assigned
    ]
    allocation = allocation_of(folded(*events))
    now = AT + timedelta(seconds=elapsed)
    assert overdue_reason(allocation, now, BIND_TIMEOUT, ASSIGN_TIMEOUT) == reason


def test_overdue_and_fully_assigned_scan_every_node() -> None:
    late, fine = reserved("late"), reserved("fine")
    state = folded(late, fine, pod_bound(fine, AT + timedelta(seconds=200)))
    now = AT + timedelta(seconds=300)
    overdue = list(overdue_allocations(state, now, BIND_TIMEOUT, ASSIGN_TIMEOUT))
    assert [(node, a.pod.uid, reason) for node, a, reason in overdue] == [
        (NODE, "late", "bind_timeout")
    ]
    assert list(fully_assigned(state)) == []


def test_healthy_cards_count() -> None:
    broken = Card(index=1, uuid="GPU-1", model="T4", memory_mib=16000, healthy=False)
    state = ClusterState()
    state.apply(
        InventoryReported(
            id="i", at=AT, node=NODE, cards=(CARD, broken), source="fixture", heartbeat_seconds=5
        )
    )
    assert healthy_cards(state.node(NODE)) == 1
    assert healthy_cards(state.node("unknown")) == 0


def test_pod_bound_carries_the_names_each_container_asked() -> None:
    reservation = reserved(containers=("main", "side"))
    asked = {"main": ("gpushare.io/gpu-core", "gpushare.io/gpu-memory-ratio")}
    assert pod_bound(reservation, AT, asked).resources == asked
    assert pod_bound(reservation, AT).resources == {}  # unknown: the node agent assumes gpu-mem
