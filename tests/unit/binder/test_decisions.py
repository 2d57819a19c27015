"""The binder's pure decisions: event ids, what still needs binding, what is overdue and
what a sweep does about it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.binder.decisions import (
    LOOK_UP,
    SWEEPER,
    Overdue,
    OverdueAction,
    Release,
    Sighting,
    bind_failed,
    fully_assigned,
    healthy_cards,
    needs_binding,
    overdue_action,
    overdue_allocations,
    overdue_found,
    pod_bound,
    still_open,
)
from gpushare.core.events import BindFailed, ContainerAssigned, InventoryReported, PodReserved
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.reconciliation import (
    ADOPTED_POLICY,
    RECONCILER,
    first_card_memory_mib,
    pod_released,
)
from gpushare.core.state import ClusterState, PodAllocation, fold_events
from tests.unit.node_agent import builders

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
    assert first_card_memory_mib(folded().node(NODE), reservation.shares) == 16000
    assert first_card_memory_mib(ClusterState().node(NODE), reservation.shares) == 0
    assert first_card_memory_mib(folded().node(NODE), ()) == 0


RUNNING = Sighting(present=True, node=NODE, phase="Running")
PENDING = Sighting(present=True, node=NODE, phase="Pending")
BEFORE_BINDING = Sighting(present=True, node="", phase="Pending")
GONE = Sighting(present=False)


def assigned(reservation: PodReserved, *containers: str) -> list[ContainerAssigned]:
    return [
        ContainerAssigned(
            id=f"a-{c}",
            at=AT,
            node=NODE,
            pod=reservation.pod,
            reservation_id=reservation.id,
            container=c,
            card_uuids=("GPU-0",),
        )
        for c in containers
    ]


@pytest.mark.parametrize(
    ("progress", "elapsed", "seen", "looked_up", "action"),
    [
        # never bound: the bind timeout alone decides, whatever is known of the pod
        pytest.param("reserved", 119, None, False, None, id="unbound-young"),
        pytest.param("reserved", 121, None, False, Release("bind_timeout"), id="unbound-old"),
        pytest.param("reserved", 121, RUNNING, False, Release("bind_timeout"), id="unbound-seen"),
        # bound, within the assign timeout: nothing, seen or not
        pytest.param("bound", 599, None, False, None, id="bound-young-unseen"),
        pytest.param("bound", 599, GONE, False, None, id="bound-young-gone"),
        # bound, past it: look first, then release only the gone or finished
        pytest.param("bound", 601, None, False, LOOK_UP, id="never-seen"),
        pytest.param("bound", 601, BEFORE_BINDING, False, LOOK_UP, id="seen-before-binding"),
        pytest.param(
            "bound",
            601,
            RUNNING,
            False,
            Overdue(waiting=("main", "side"), phase="Running"),
            id="running-kept",
        ),
        pytest.param(
            "half-assigned",
            601,
            PENDING,
            False,
            Overdue(waiting=("side",), phase="Pending"),
            id="pending-half-assigned-kept",
        ),
        pytest.param(
            "bound",
            601,
            Sighting(present=True, node=NODE, phase="Unknown"),
            False,
            Overdue(waiting=("main", "side"), phase="Unknown"),
            id="unknown-phase-kept",
        ),
        pytest.param(
            "bound",
            601,
            GONE,
            False,
            Release("deleted", "pod not found after the assign timeout"),
            id="gone",
        ),
        pytest.param(
            "bound",
            601,
            Sighting(present=True, node=NODE, phase="Succeeded"),
            False,
            Release("terminated", "Succeeded"),
            id="succeeded",
        ),
        pytest.param(
            "bound",
            601,
            Sighting(present=True, node=NODE, phase="Failed"),
            False,
            Release("terminated", "Failed"),
            id="failed",
        ),
        pytest.param(
            "bound",
            601,
            BEFORE_BINDING,
            True,
            Overdue(waiting=("main", "side"), phase="Pending"),
            id="read-but-unbound-kept",
        ),
        pytest.param(
            "bound",
            601,
            None,
            True,
            Release("deleted", "pod not found after the assign timeout"),
            id="read-and-gone",
        ),
        # fully assigned: never overdue
        pytest.param("assigned", 100_000, GONE, False, None, id="assigned"),
    ],
)
def test_overdue_action(
    progress: str,
    elapsed: int,
    seen: Sighting | None,
    looked_up: bool,
    action: OverdueAction,
) -> None:
    """A bound reservation is released only when its pod is gone or finished."""
    reservation = reserved(containers=("main", "side"))
    events: list[object] = [reservation]
    if progress != "reserved":
        events.append(pod_bound(reservation, AT))
    done = {"assigned": ("main", "side"), "half-assigned": ("main",)}.get(progress, ())
    events += assigned(reservation, *done)
    allocation = allocation_of(folded(*events))
    now = AT + timedelta(seconds=elapsed)
    decided = overdue_action(
        allocation, now, BIND_TIMEOUT, ASSIGN_TIMEOUT, seen, looked_up=looked_up
    )
    assert decided == action


def test_an_overdue_record_is_one_per_reservation() -> None:
    reservation = reserved(containers=("main", "side"))
    allocation = allocation_of(folded(reservation, pod_bound(reservation, AT)))
    overdue = Overdue(waiting=("main", "side"), phase="Running")
    first = overdue_found(NODE, allocation, overdue, AT, ASSIGN_TIMEOUT)
    later = overdue_found(
        NODE, allocation, Overdue(waiting=("side",), phase="Pending"), AT, ASSIGN_TIMEOUT
    )
    assert first.id == later.id == "discrepancy-assign_overdue-r-u1"
    assert (first.kind, first.pod, first.reservation_id, first.reporter) == (
        "assign_overdue",
        reservation.pod,
        reservation.id,
        SWEEPER,
    )
    assert "Running, containers waiting: main, side" in first.detail
    assert "600 s" in first.detail


def test_a_sweep_looks_at_what_is_not_fully_assigned_on_every_node() -> None:
    late, fine, done = reserved("late"), reserved("fine"), reserved("done")
    other_node = msgspec.structs.replace(reserved("far"), node="n2")
    state = folded(
        late,
        fine,
        pod_bound(fine, AT + timedelta(seconds=200)),
        done,
        pod_bound(done, AT),
        *assigned(done, "main"),
        other_node,
    )
    looked_at = sorted((node, a.pod.uid) for node, a in overdue_allocations(state))
    assert looked_at == [("n1", "fine"), ("n1", "late"), ("n2", "far")]
    assert [a.pod.uid for a in fully_assigned(state)] == ["done"]


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


@given(
    elapsed=st.integers(min_value=0, max_value=10**7),
    done=st.sets(st.sampled_from(("main", "side"))),
    phase=st.sampled_from(("Pending", "Running", "Unknown", "")),
    node=st.sampled_from((NODE, "")),
    looked_up=st.booleans(),
)
def test_a_bound_pod_that_exists_and_has_not_finished_is_never_released(
    elapsed: int, done: set[str], phase: str, node: str, looked_up: bool
) -> None:
    reservation = reserved(containers=("main", "side"))
    state = folded(reservation, pod_bound(reservation, AT), *assigned(reservation, *sorted(done)))
    seen = Sighting(present=True, node=node, phase=phase)
    now = AT + timedelta(seconds=elapsed)
    action = overdue_action(
        allocation_of(state), now, BIND_TIMEOUT, ASSIGN_TIMEOUT, seen, looked_up=looked_up
    )
    assert not isinstance(action, Release)


def test_a_sweep_looks_at_the_open_reservations_the_fold_still_holds() -> None:
    gpu = builders.card(0)
    done = builders.reserve("done", builders.share("c", gpu, 1024))
    waiting = builders.reserve("waiting", builders.share("c", gpu, 1024))
    unbound = builders.reserve("unbound", builders.share("c", gpu, 1024))
    events = [
        builders.inventory(gpu),
        *builders.reserve_and_bind(done),
        builders.assign(done, "c", gpu),
        *builders.reserve_and_bind(waiting),
        unbound,
    ]
    state = fold_events(list(enumerate(events)))
    reservations = {r.id: (builders.NODE, r.pod.uid) for r in (done, waiting, unbound)} | {
        "reserve-gone": (builders.NODE, "gone"),
        "reserve-old": (builders.NODE, "waiting"),
    }
    found = still_open(state, reservations)
    assert sorted(allocation.reservation_id for _, allocation in found) == [
        unbound.id,
        waiting.id,
    ]
