"""The fold, event by event: what each allocation event does to a node."""

from __future__ import annotations

import gc

import msgspec
import pytest

from gpushare.core import view as view_module
from gpushare.core.events import (
    AllocationEvent,
    BindFailed,
    ContainerAssigned,
    PodBound,
    PodReleased,
)
from gpushare.core.model import ContainerShare
from gpushare.core.placement import reserve
from gpushare.core.state import ClusterState, memory_by_card
from tests.unit.core.factories import T0, V100, inventory, later, make_card, pod_ref, request_of

CARDS = (make_card(0, node="n"), make_card(1, node="n"))


def reserved_state() -> ClusterState:
    state = ClusterState()
    state.apply(inventory("n", CARDS))
    event = reserve(
        state.node("n"), pod_ref("p"), request_of(3000, 1000), reservation_id="r1", at=T0
    )
    assert event is not None
    state.apply(event, 5)
    return state


def bound(reservation_id: str = "r1") -> PodBound:
    return PodBound(id="b", at=later(1), node="n", pod=pod_ref("p"), reservation_id=reservation_id)


def assigned(container: str = "c0", reservation_id: str = "r1") -> ContainerAssigned:
    return ContainerAssigned(
        id=f"a-{container}",
        at=later(2),
        node="n",
        pod=pod_ref("p"),
        reservation_id=reservation_id,
        container=container,
        card_uuids=("GPU-n-0",),
    )


def released(reservation_id: str = "r1") -> PodReleased:
    return PodReleased(
        id="x",
        at=later(3),
        node="n",
        pod=pod_ref("p"),
        reservation_id=reservation_id,
        reason="deleted",
    )


def bind_failed(reservation_id: str = "r1") -> BindFailed:
    return BindFailed(
        id="f",
        at=later(3),
        node="n",
        pod=pod_ref("p"),
        reservation_id=reservation_id,
        reason="404",
    )


def test_reservation_takes_memory_on_its_card() -> None:
    node = reserved_state().node("n")
    assert dict(node.used_mib) == {"GPU-n-0": 4000}
    assert dict(node.containers) == {"GPU-n-0": 2}
    assert node.max_free_mib == V100
    assert node.last_seq == 5
    allocation = node.pods["p"]
    assert allocation.reservation_id == "r1"
    assert allocation.reserved_seq == 5
    assert allocation.memory_mib == 4000
    assert not allocation.bound
    assert not allocation.fully_assigned


def test_bind_then_assign_every_container() -> None:
    state = reserved_state()
    state.apply(bound(), 6)
    state.apply(assigned("c0"), 7)
    allocation = state.node("n").pods["p"]
    assert allocation.bound
    assert allocation.bound_at == later(1)
    assert allocation.assigned == {"c0"}
    assert not allocation.fully_assigned
    state.apply(assigned("c1"), 8)
    assert state.node("n").pods["p"].fully_assigned
    assert dict(state.node("n").used_mib) == {"GPU-n-0": 4000}


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(released(), id="released"),
        pytest.param(bind_failed(), id="bind-failed"),
    ],
)
def test_release_frees_the_memory(event: AllocationEvent) -> None:
    state = reserved_state()
    state.apply(event, 6)
    node = state.node("n")
    assert dict(node.pods) == {}
    assert dict(node.used_mib) == {}
    assert node.last_seq == 6
    assert state.allocation("p") is None


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(bound("r0"), id="bound"),
        pytest.param(assigned("c0", "r0"), id="assigned"),
        pytest.param(released("r0"), id="released"),
        pytest.param(bind_failed("r0"), id="bind-failed"),
    ],
)
def test_events_for_another_reservation_change_nothing_but_the_sequence(
    event: AllocationEvent,
) -> None:
    state = reserved_state()
    before = state.node("n")
    after = state.apply(event, 6)
    assert after.last_seq == 6
    assert dict(after.pods) == dict(before.pods)
    assert dict(after.used_mib) == dict(before.used_mib)
    assert state.allocation("p") == before.pods["p"]


@pytest.mark.parametrize("seq", [pytest.param(5, id="same-seq"), pytest.param(2, id="older")])
def test_event_at_or_below_last_seq_is_skipped(seq: int) -> None:
    state = reserved_state()
    before = state.node("n")
    assert state.apply(released(), seq) is before


def test_inventory_update_keeps_allocations_and_recomputes_free() -> None:
    state = reserved_state()
    sick = (make_card(0, node="n", healthy=False, health_reason="XID 79"), CARDS[1])
    state.apply(inventory("n", sick, at=later(10)))
    node = state.node("n")
    assert dict(node.used_mib) == {"GPU-n-0": 4000}
    assert node.max_free_mib == V100
    state.apply(inventory("n", (make_card(0, node="n"),), at=later(20)))
    assert state.node("n").max_free_mib == V100 - 4000


def test_older_inventory_is_ignored() -> None:
    state = ClusterState()
    state.apply(inventory("n", CARDS, at=later(10)))
    state.apply(inventory("n", CARDS[:1], at=later(5)))
    node = state.node("n")
    assert node.cards == CARDS
    assert node.inventory_at == later(10)


@pytest.mark.parametrize(
    ("shares", "expected"),
    [
        pytest.param(
            [("a", "G0", 1000, False), ("b", "G0", 2000, False)],
            {"G0": 3000},
            id="app-containers-add",
        ),
        pytest.param(
            [("i", "G0", 5000, True), ("j", "G0", 4000, True), ("a", "G0", 1000, False)],
            {"G0": 5000},
            id="largest-init-wins",
        ),
        pytest.param(
            [("i", "G0", 1000, True), ("a", "G0", 3000, False)], {"G0": 3000}, id="app-sum-wins"
        ),
        pytest.param(
            [("a", "G0", 1000, False), ("b", "G1", 2000, False)],
            {"G0": 1000, "G1": 2000},
            id="per-card",
        ),
        pytest.param([], {}, id="nothing"),
    ],
)
def test_memory_by_card(shares: list[tuple[str, str, int, bool]], expected: dict[str, int]) -> None:
    built = [
        ContainerShare(container=name, card_index=0, card_uuid=uuid, memory_mib=mib, init=init)
        for name, uuid, mib, init in shares
    ]
    assert memory_by_card(built) == expected


def two_node_state() -> ClusterState:
    """Pod ``p`` reserved on ``a`` (seq 1), then on ``b`` (seq 2), as a retried bind can do."""
    state = ClusterState()
    for name in ("a", "b"):
        state.apply(inventory(name, [make_card(0, node=name)]))
    for seq, name in enumerate(("a", "b"), start=1):
        event = reserve(
            state.node(name), pod_ref("p"), request_of(1000), reservation_id=f"r-{name}", at=T0
        )
        assert event is not None
        state.apply(event, seq)
    return state


def on(name: str, event: AllocationEvent) -> AllocationEvent:
    return msgspec.structs.replace(event, node=name, reservation_id=f"r-{name}")


def test_pod_held_on_two_nodes_stays_findable_after_one_release() -> None:
    state = two_node_state()
    state.apply(on("a", bound()), 3)  # the binding went to a
    assert state.allocation("p") == state.node("a").pods["p"]
    state.apply(on("a", released()), 4)
    assert state.allocation("p") == state.node("b").pods["p"]
    state.apply(on("b", bind_failed()), 5)
    assert state.allocation("p") is None
    assert state.pod_nodes == {}


def test_skipped_duplicate_does_not_move_the_pod_index() -> None:
    state = two_node_state()
    first = state.node("a").pods["p"]
    reservation = reserve(
        state.node("a"), pod_ref("p"), request_of(1000), reservation_id="r-a", at=T0
    )
    assert reservation is not None
    assert state.allocation("p") == state.node("b").pods["p"]
    before = state.node("a")
    assert state.apply(reservation, 1) is before  # redelivered at its old sequence
    assert state.pod_nodes == {"p": ("b", "a")}
    assert state.node("a").pods["p"] == first


def test_nodes_in_the_same_state_share_one_view_until_neither_holds_it() -> None:
    state = ClusterState()
    twin = (make_card(0, node="m"), make_card(1, node="m"))
    state.apply(inventory("n", CARDS))
    state.apply(inventory("m", twin))
    assert state.node("n").view is state.node("m").view
    event = reserve(
        state.node("n"), pod_ref("p"), request_of(3000, 1000), reservation_id="r1", at=T0
    )
    assert event is not None
    state.apply(event, 5)
    assert state.node("n").view != state.node("m").view
    assert state.node("n").view.cards[0].free_mib == V100 - 4000
    assert state.node("m").view.cards[0].free_mib == V100


def test_a_view_no_node_holds_is_forgotten() -> None:
    before = len(view_module._LIVE_VIEWS)
    state = ClusterState()
    state.apply(inventory("lonely", (make_card(0, node="lonely", memory_mib=12345),)))
    assert len(view_module._LIVE_VIEWS) == before + 1
    del state
    gc.collect()
    assert len(view_module._LIVE_VIEWS) == before


def test_the_garbage_collector_never_walks_what_a_pod_leaves_in_the_fold() -> None:
    """Folded state is frozen values (gc=False structs): a cluster's worth of pods held in
    the fold must not become young objects the collector walks (the pauses were the tail
    of bind latency). Only the node's mapping proxies and its shared view stay tracked."""
    state = reserved_state()
    state.apply(bound(), 6)
    node = state.node("n")
    (held,) = node.pods.values()
    gc.collect()  # tuples of untracked values are untracked on the collector's first look
    untracked = [node, held, held.pod, *held.shares, held.shares, node.cards, *node.cards]
    assert [value for value in untracked if gc.is_tracked(value)] == []
    assert not gc.is_tracked(dict(node.pods)), "a dict of allocations stays untracked"
