"""The fold on arbitrary histories: any mix of the ten allocation events and inventories.

``test_properties`` drives the fold the way the services do (placement decides, events
follow a pod's life in order). Here the log is whatever a buggy or racing writer could
leave: events naming reservations that never were, releases before reservations, foreign
holds on unknown cards, corrections of released pods, several reservations of one pod on
several nodes, and all of it delivered with duplicates and out of order (a live
subscription racing a catch-up read). Whatever the log, the fold must not raise, the bulk
fold must equal the event-by-event one, a replay must give the same state, and a
reservation followed by its release must leave a node as it was.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NamedTuple

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.core.events import (
    AllocationCorrected,
    AnyEvent,
    BindFailed,
    ClaimAllocated,
    ClaimReleased,
    ClaimShare,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    ForeignHold,
    InventoryReported,
    PodBound,
    PodReleased,
    PodReserved,
)
from gpushare.core.model import Card, ClaimRef, ContainerShare, PodRef
from gpushare.core.state import ClusterState, NodeState, fold_events
from tests.unit.core.factories import T0

PROPERTIES = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

NODES = ("a", "b", "c.example")
PODS = ("p0", "p1", "p2")
RESERVATIONS = ("r0", "r1", "r2", "r3")
"""Small pools, so that events often name the same pod, node and reservation."""
CONTAINERS = ("c0", "c1", "init0")
RELEASE_REASONS = ("deleted", "terminated", "bind_timeout", "assign_timeout", "node_removed")
DISCREPANCIES = ("card_mismatch", "unknown_to_log", "missing_from_kubelet", "foreign_overlap")

Entry = tuple[int, AnyEvent]

moments = st.integers(min_value=0, max_value=600).map(lambda s: T0 + timedelta(seconds=s))
pod_refs = st.sampled_from(PODS).map(lambda uid: PodRef(namespace="ns", name=f"n-{uid}", uid=uid))


def card_uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def uuids_on(node: str) -> st.SearchStrategy[str]:
    """A card of the node (most often) or one no inventory ever reported."""
    return st.sampled_from([card_uuid(node, 0), card_uuid(node, 1), card_uuid(node, 2), "GPU-x"])


@st.composite
def shares(draw: st.DrawFn, node: str) -> tuple[ContainerShare, ...]:
    """Shares of any size (over a card's memory too: the fold only keeps the books)."""
    one = st.builds(
        ContainerShare,
        container=st.sampled_from(CONTAINERS),
        card_index=st.integers(0, 3),
        card_uuid=uuids_on(node),
        memory_mib=st.integers(0, 40_000),
        core_percent=st.integers(0, 100),
        init=st.booleans(),
    )
    return tuple(draw(st.lists(one, min_size=1, max_size=3)))


@st.composite
def inventories(draw: st.DrawFn, node: str) -> InventoryReported:
    count = draw(st.integers(0, 3))
    cards = tuple(
        Card(
            index=index,
            uuid=card_uuid(node, index),
            model="Tesla T4",
            memory_mib=draw(st.sampled_from([1024, 15360, 16276])),
            healthy=draw(st.booleans()),
        )
        for index in range(count)
    )
    return InventoryReported(
        id=f"inv-{node}-{draw(st.integers(0, 9))}",
        at=draw(moments),
        node=node,
        cards=cards,
        source="fixture",
        heartbeat_seconds=draw(st.sampled_from([5.0, 60.0])),
        front_door=draw(st.sampled_from(["extender", "dra"])),
    )


CLAIMS = ("k0", "k1")


@st.composite
def claim_shares(draw: st.DrawFn, node: str) -> tuple[ClaimShare, ...]:
    one = st.builds(
        ClaimShare,
        request=st.just("gpu"),
        device=st.sampled_from(["gpu-0", "gpu-1"]),
        card_index=st.integers(0, 3),
        card_uuid=uuids_on(node),
        memory_mib=st.integers(0, 40_000),
        core_percent=st.integers(0, 100),
    )
    return tuple(draw(st.lists(one, min_size=1, max_size=2)))


@st.composite
def claim_events(draw: st.DrawFn, node: str) -> AnyEvent:
    """A DRA claim allocated on ``node`` (its id from the reservation pool) or released."""
    uid = draw(st.sampled_from(CLAIMS))
    claim = ClaimRef(namespace="ns", name=f"claim-{uid}", uid=uid)
    allocation = draw(st.sampled_from(RESERVATIONS))
    if draw(st.booleans()):
        return ClaimAllocated(
            id=allocation,
            at=draw(moments),
            node=node,
            claim=claim,
            shares=draw(claim_shares(node)),
            pods=(draw(pod_refs),),
        )
    return ClaimReleased(
        id=_event_id(draw),
        at=draw(moments),
        node=node,
        claim=claim,
        allocation_id=allocation,
        reason="deleted",
    )


class About(NamedTuple):
    """The fields an event about one pod's reservation shares with every other."""

    id: str
    at: datetime
    node: str
    pod: PodRef
    reservation_id: str


def _about(draw: st.DrawFn, kind: int, about: About) -> AnyEvent:
    """An event of ``kind`` (1-7) about ``about``'s pod and reservation."""
    common: dict[str, Any] = about._asdict()
    if kind == 1:
        resources = draw(st.dictionaries(st.sampled_from(CONTAINERS), st.just(("x/gpu",))))
        return PodBound(**common, resources=dict(resources))
    if kind == 2:
        card = draw(uuids_on(about.node))
        return ContainerAssigned(
            **common, container=draw(st.sampled_from(CONTAINERS)), card_uuids=(card,)
        )
    if kind == 3:
        return PodReleased(**common, reason=draw(st.sampled_from(RELEASE_REASONS)))
    if kind == 4:
        return BindFailed(**common, reason="409")
    if kind == 5:
        return AllocationCorrected(**common, shares=draw(shares(about.node)), reason="kubelet")
    if kind == 6:
        return DiscrepancyFound(**common, kind=draw(st.sampled_from(DISCREPANCIES)), detail="?")
    holds = st.builds(
        ForeignHold, card_uuid=uuids_on(about.node), resource=st.just("nvidia.com/gpu")
    )
    held = tuple(draw(st.lists(holds, max_size=3)))
    return ForeignCardsHeld(id=about.id, at=about.at, node=about.node, holds=held)


def _event_id(draw: st.DrawFn) -> str:
    return f"e-{draw(st.integers(0, 10**6))}"


@st.composite
def events(draw: st.DrawFn) -> AnyEvent:
    """Any event of the log, on a few nodes, pods, cards and reservations."""
    node = draw(st.sampled_from(NODES))
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(inventories(node))
    if kind == 9:
        return draw(claim_events(node))
    pod = draw(pod_refs)
    reservation = draw(st.sampled_from(RESERVATIONS))
    if kind == 8:
        return PodReserved(
            id=reservation, at=draw(moments), node=node, pod=pod, shares=draw(shares(node))
        )
    return _about(draw, kind, About(_event_id(draw), draw(moments), node, pod, reservation))


@st.composite
def follow_up(draw: st.DrawFn, reserved: PodReserved) -> AnyEvent:
    """What may come after ``reserved``: its binding, assignments, correction, end."""
    about = About(_event_id(draw), draw(moments), reserved.node, reserved.pod, reserved.id)
    return _about(draw, draw(st.integers(1, 6)), about)


@st.composite
def deliveries(draw: st.DrawFn) -> list[Entry]:
    """A log (one sequence per event, as the stream numbers them) as a consumer may receive
    it: some events twice, some out of order. Half the events follow up a reservation
    already in the log; the others name whatever they like."""
    history: list[AnyEvent] = []
    for _ in range(draw(st.integers(0, 30))):
        reserved = [event for event in history if isinstance(event, PodReserved)]
        follow = draw(st.booleans())
        if reserved and follow:  # most pods' lives go on
            history.append(draw(follow_up(draw(st.sampled_from(reserved)))))
        else:
            history.append(draw(events()))
    log = list(enumerate(history, start=1))
    delivered = list(log)
    for _ in range(draw(st.integers(0, 6))):
        if not delivered:
            break
        at = draw(st.integers(0, len(delivered) - 1))
        again = draw(st.sampled_from(log))
        delivered.insert(at, again)  # a duplicate, or an older event arriving late
    return delivered


def apply_each(entries: list[Entry], state: ClusterState | None = None) -> ClusterState:
    state = state or ClusterState()
    for seq, event in entries:
        state.apply(event, seq)
    return state


def same(one: ClusterState, other: ClusterState) -> bool:
    return one.nodes == other.nodes and one.pod_nodes == other.pod_nodes


@pytest.mark.slow
@PROPERTIES
@given(entries=deliveries())
def test_any_history_folds_and_both_folds_agree(entries: list[Entry]) -> None:
    assert same(fold_events(entries), apply_each(entries))


@pytest.mark.slow
@PROPERTIES
@given(entries=deliveries())
def test_a_replay_gives_the_same_state(entries: list[Entry]) -> None:
    assert same(fold_events(entries), fold_events(list(entries)))
    assert same(apply_each(entries), apply_each(list(entries)))


@pytest.mark.slow
@PROPERTIES
@given(entries=deliveries(), cut=st.integers(min_value=0, max_value=40))
def test_resuming_from_a_folded_prefix_equals_one_fold(entries: list[Entry], cut: int) -> None:
    """How a service starts from a snapshot: fold the rest of the log onto it."""
    resumed = fold_events(entries[cut:], fold_events(entries[:cut]))
    assert same(resumed, fold_events(entries))


def without_seq(node: NodeState) -> NodeState:
    return msgspec.structs.replace(node, last_seq=0)


@pytest.mark.slow
@PROPERTIES
@given(
    entries=deliveries(),
    node=st.sampled_from(NODES),
    data=st.data(),
    ending=st.sampled_from(["released", "bind_failed", "bound_then_released", "claim"]),
    corrected=st.booleans(),
)
def test_a_reservation_then_its_release_restores_the_node(
    entries: list[Entry], node: str, data: st.DataObject, ending: str, corrected: bool
) -> None:
    state = apply_each(entries)
    before = state.node(node)
    pods_before = dict(state.pod_nodes)
    seq = max((seq for seq, _ in entries), default=0)
    probe = PodRef(namespace="ns", name="probe", uid="probe")
    at: datetime = T0 + timedelta(hours=1)
    common: dict[str, Any] = {"at": at, "node": node, "pod": probe, "reservation_id": "r-probe"}
    history: list[AnyEvent] = [
        PodReserved(id="r-probe", at=at, node=node, pod=probe, shares=data.draw(shares(node)))
    ]
    if ending == "claim":  # a DRA claim allocated, then released
        claim = ClaimRef(namespace="ns", name="probe-claim", uid="k-probe")
        history = [
            ClaimAllocated(
                id="a-probe", at=at, node=node, claim=claim, shares=data.draw(claim_shares(node))
            ),
            ClaimReleased(
                id="x", at=at, node=node, claim=claim, allocation_id="a-probe", reason="deleted"
            ),
        ]
    elif corrected:
        history.append(
            AllocationCorrected(id="c", **common, shares=data.draw(shares(node)), reason="k")
        )
    if ending == "bound_then_released":
        history.append(PodBound(id="b", **common))
    if ending == "bind_failed":
        history.append(BindFailed(id="f", **common, reason="404"))
    elif ending != "claim":
        history.append(PodReleased(id="x", **common, reason="deleted"))
    for offset, event in enumerate(history, start=1):
        state.apply(event, seq + offset)
    after = state.node(node)
    assert without_seq(after) == without_seq(before)
    assert after.last_seq == seq + len(history)
    assert state.pod_nodes == pods_before
    assert state.allocation("probe") is None
