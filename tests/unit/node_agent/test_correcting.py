"""What the check appends: corrections to the kubelet's cards, discrepancies otherwise."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpushare.core.events import (
    AllocationCorrected,
    DiscrepancyFound,
    ForeignCardsHeld,
    ForeignHold,
    PodReserved,
)
from gpushare.core.model import ContainerShare
from gpushare.core.state import ClusterState, NodeState, fold_events
from gpushare.node_agent.correcting import (
    WAITING_FOR_THE_SWAP,
    corrections,
    foreign_held,
    foreign_overlaps,
    moved_shares,
)
from gpushare.node_agent.device_table import build_device_table
from gpushare.node_agent.reconciling import KubeletContainer, compare_with_log
from tests.unit.node_agent.builders import (
    T0,
    card,
    inventory,
    node_state,
    reserve,
    reserve_and_bind,
    share,
)

GPU0, GPU1, GPU2, GPU3 = card(0), card(1), card(2), card(3)
CARDS = {c.uuid: c for c in (GPU0, GPU1, GPU2, GPU3)}
TABLE = build_device_table(CARDS.values(), "GiB")


def placed(shares: Sequence[ContainerShare]) -> list[tuple[str, int, int, int]]:
    return [(s.container, s.card_index, s.memory_mib, s.core_percent) for s in shares]


@pytest.mark.parametrize(
    ("shares", "container", "kubelet", "expected"),
    [
        pytest.param(
            (share("a", GPU0, 1024, core=30), share("b", GPU0, 512)),
            "a",
            (GPU1.uuid,),
            [("a", 1, 1024, 30), ("b", 0, 512, 0)],
            id="one-card-to-another",
        ),
        pytest.param(
            (share("a", GPU0, 1000), share("a", GPU1, 1000)),
            "a",
            (GPU1.uuid, GPU2.uuid),
            [("a", 2, 1000, 0), ("a", 1, 1000, 0)],
            id="the-card-that-stays-stays",
        ),
        pytest.param(
            (share("i", GPU0, 256, init=True), share("a", GPU0, 1024)),
            "a",
            (GPU3.uuid,),
            [("i", 0, 256, 0), ("a", 3, 1024, 0)],
            id="init-containers-untouched",
        ),
    ],
)
def test_shares_move_card_for_card(
    shares: tuple[ContainerShare, ...],
    container: str,
    kubelet: tuple[str, ...],
    expected: list[tuple[str, int, int, int]],
) -> None:
    moved = moved_shares(shares, container, kubelet, CARDS)
    assert moved is not None
    assert placed(moved) == expected


@pytest.mark.parametrize(
    ("kubelet", "cards"),
    [
        pytest.param((GPU1.uuid, GPU2.uuid), CARDS, id="more-cards-than-given"),
        pytest.param((), CARDS, id="ids-of-no-known-card"),
        pytest.param((GPU1.uuid,), {GPU0.uuid: GPU0}, id="a-card-not-in-the-inventory"),
    ],
)
def test_moves_that_cannot_be_said(kubelet: tuple[str, ...], cards: dict[str, object]) -> None:
    assert moved_shares((share("a", GPU0, 1),), "a", kubelet, cards) is None  # type: ignore[arg-type]


def test_a_mismatch_becomes_one_correction_per_pod_with_a_stable_id() -> None:
    pod = reserve("p", share("a", GPU0, 1024), share("b", GPU1, 1024))
    node = node_state([inventory(*CARDS.values()), *reserve_and_bind(pod)])
    held = [
        KubeletContainer("ns", "p", "a", TABLE.ids_of(GPU2)[:1]),
        KubeletContainer("ns", "p", "b", TABLE.ids_of(GPU3)[:1]),
    ]
    found = compare_with_log(node, TABLE, held)
    (corrected,) = corrections(node, found, T0)
    assert isinstance(corrected, AllocationCorrected)
    assert placed(corrected.shares) == [("a", 2, 1024, 0), ("b", 3, 1024, 0)]
    assert (corrected.pod, corrected.reservation_id) == (pod.pod, pod.id)
    assert "container 'a'" in corrected.reason
    assert [e.id for e in corrections(node, found, T0)] == [corrected.id]


def swapped_pair() -> tuple[PodReserved, PodReserved, NodeState]:
    """Two 12 GiB pods, ``a`` on GPU0 and ``b`` on GPU1: the cards are too full for both
    on one, and the kubelet handed each the other's card."""
    first = reserve("a", share("main", GPU0, 12 * 1024))
    second = reserve("b", share("main", GPU1, 12 * 1024))
    node = node_state(
        [inventory(*CARDS.values()), *reserve_and_bind(first), *reserve_and_bind(second)]
    )
    return first, second, node


def test_half_a_swap_waits_rather_than_put_two_pods_on_one_card() -> None:
    first, _, node = swapped_pair()
    held = [KubeletContainer("ns", "a", "main", TABLE.ids_of(GPU1)[:12])]  # b not admitted yet

    events = corrections(node, compare_with_log(node, TABLE, held), T0)

    assert [type(e) for e in events] == [DiscrepancyFound]
    (waiting,) = events
    assert isinstance(waiting, DiscrepancyFound)
    assert (waiting.kind, waiting.reservation_id) == ("card_mismatch", first.id)
    assert WAITING_FOR_THE_SWAP in waiting.detail


def test_a_whole_swap_is_one_event_and_no_fold_holds_a_card_twice() -> None:
    first, second, node = swapped_pair()
    held = [
        KubeletContainer("ns", "a", "main", TABLE.ids_of(GPU1)[:12]),
        KubeletContainer("ns", "b", "main", TABLE.ids_of(GPU0)[:12]),
    ]

    (corrected,) = corrections(node, compare_with_log(node, TABLE, held), T0)

    assert isinstance(corrected, AllocationCorrected)
    moved = {c.reservation_id: placed(c.shares) for c in corrected.corrected()}
    assert moved == {first.id: [("main", 1, 12288, 0)], second.id: [("main", 0, 12288, 0)]}
    after = fold_events([(node.last_seq + 1, corrected)], ClusterState({node.name: node}))
    assert dict(after.node(node.name).used_mib) == dict(node.used_mib)
    assert {uid: placed(a.shares) for uid, a in after.node(node.name).pods.items()} == {
        "a": [("main", 1, 12288, 0)],
        "b": [("main", 0, 12288, 0)],
    }


def test_what_cannot_be_corrected_is_a_discrepancy_of_its_kind() -> None:
    pod = reserve("p", share("a", GPU0, 1024))
    node = node_state([inventory(*CARDS.values()), *reserve_and_bind(pod)])
    held = [
        KubeletContainer("ns", "p", "a", ("unknown-7",)),
        KubeletContainer("ns", "stranger", "c", TABLE.ids_of(GPU1)[:1]),
    ]
    events = corrections(node, compare_with_log(node, TABLE, held), T0)
    assert all(isinstance(e, DiscrepancyFound) for e in events)
    found = {e.kind: e for e in events if isinstance(e, DiscrepancyFound)}
    assert set(found) == {"card_mismatch", "unknown_to_log"}
    assert (found["card_mismatch"].pod, found["card_mismatch"].reservation_id) == (pod.pod, pod.id)
    assert found["unknown_to_log"].pod is None
    assert "ns/stranger container 'c'" in found["unknown_to_log"].detail
    assert found["card_mismatch"].reporter == "node-agent/n1"


def test_foreign_cards_are_asserted_only_when_they_change() -> None:
    node = node_state([inventory(*CARDS.values())])
    hold = ForeignHold(card_uuid=GPU0.uuid, resource="nvidia.com/gpu", pods=("ml/a",))
    assert foreign_held(node, (), T0) is None  # nothing held, nothing known: agree
    held = foreign_held(node, (hold,), T0)
    assert isinstance(held, ForeignCardsHeld)
    assert held.holds == (hold,)
    after = node_state([inventory(*CARDS.values()), held])
    assert foreign_held(after, (hold,), T0) is None
    freed = foreign_held(after, (), T0)
    assert freed is not None
    assert freed.holds == ()
    assert freed.id != held.id


def test_an_overlap_names_our_reservation() -> None:
    pod = reserve("p", share("a", GPU1, 1024))
    node = node_state([inventory(*CARDS.values()), *reserve_and_bind(pod)])
    hold = ForeignHold(card_uuid=GPU1.uuid, resource="nvidia.com/gpu", pods=("ml/x",))
    (overlap,) = foreign_overlaps(node, [hold], T0)
    assert (overlap.kind, overlap.pod, overlap.reservation_id) == (
        "foreign_overlap",
        pod.pod,
        pod.id,
    )
    assert "ml/x" in overlap.detail
    assert "ns/p" in overlap.detail
