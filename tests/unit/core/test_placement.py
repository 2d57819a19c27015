"""Binpack card choice, node scores and reservations (seed 000's worked bind example)."""

from __future__ import annotations

import pytest

from gpushare.core.model import ContainerShare
from gpushare.core.placement import MAX_SCORE, choose_card, reserve, score_node
from gpushare.core.state import ClusterState, NodeState
from tests.unit.core.factories import (
    T0,
    V100,
    inventory,
    make_card,
    node_with_usage,
    pod_ref,
    request_of,
)

# Seed 000, "2.2": free GPU0 12207, GPU1 8138, GPU2 4069, GPU3 16276; the pod asks 8138 MiB.
SEED_BIND_NODE = node_with_usage("N1", [(V100, 4069), (V100, 8138), (V100, 12207), (V100, 0)])


def test_seed_bind_example_chooses_least_free_card_that_fits() -> None:
    node = SEED_BIND_NODE
    assert [node.free_mib(card) for card in node.cards] == [12207, 8138, 4069, 16276]
    card = choose_card(node, request_of(8138))
    assert card is not None
    assert card.index == 1
    assert score_node(node, request_of(8138)) == MAX_SCORE  # GPU1 ends up exactly full


@pytest.mark.parametrize(
    ("need", "index"),
    [
        pytest.param(1, 2, id="tiny-goes-to-fullest-card"),
        pytest.param(4069, 2, id="exactly-the-fullest-free"),
        pytest.param(4070, 1, id="one-more-skips-GPU2"),
        pytest.param(8139, 0, id="needs-GPU0"),
        pytest.param(12208, 3, id="needs-the-empty-card"),
        pytest.param(V100, 3, id="whole-card"),
        pytest.param(V100 + 1, None, id="bigger-than-a-card"),
    ],
)
def test_choose_card_on_seed_node(need: int, index: int | None) -> None:
    card = choose_card(SEED_BIND_NODE, request_of(need))
    assert (card.index if card else None) == index


@pytest.mark.parametrize(
    ("node", "index"),
    [
        pytest.param(
            node_with_usage("n", [(V100, 8138), (V100, 8138), (V100, 8138)]),
            0,
            id="equal-free-lowest-index",
        ),
        pytest.param(
            node_with_usage("n", [(V100, 0), (V100, 8138), (V100, 8138)]),
            1,
            id="tie-among-the-fullest",
        ),
        pytest.param(
            node_with_usage("n", [(8000, 0), (V100, 8276)]),
            0,
            id="equal-free-different-sizes",
        ),
        pytest.param(
            node_with_usage("n", [(V100, 12000), (V100, 0)], unhealthy=(0,)),
            1,
            id="unhealthy-card-skipped",
        ),
    ],
)
def test_choose_card_ties_and_health(node: NodeState, index: int) -> None:
    card = choose_card(node, request_of(4000))
    assert card is not None
    assert card.index == index


def test_tie_goes_to_lowest_index_whatever_the_inventory_order() -> None:
    state = ClusterState()
    cards = [make_card(3, node="n"), make_card(1, node="n"), make_card(2, node="n")]
    state.apply(inventory("n", cards))
    card = choose_card(state.node("n"), request_of(100))
    assert card is not None
    assert card.index == 1


@pytest.mark.parametrize(
    ("node", "need", "score"),
    [
        pytest.param(node_with_usage("n", [(V100, 8138)]), 8138, 10, id="exactly-full"),
        pytest.param(node_with_usage("n", [(V100, 8138)]), 4069, 7, id="three-quarters"),
        pytest.param(node_with_usage("n", [(V100, 0)]), 4069, 2, id="a-quarter"),
        pytest.param(node_with_usage("n", [(V100, 0)]), 1, 0, id="nearly-empty"),
        pytest.param(node_with_usage("n", [(V100, 12207)]), 8138, 0, id="does-not-fit"),
        pytest.param(node_with_usage("n", [(V100, 0)], unhealthy=(0,)), 1, 0, id="unhealthy-only"),
        pytest.param(node_with_usage("n", []), 1, 0, id="no-cards"),
    ],
)
def test_score_node(node: NodeState, need: int, score: int) -> None:
    assert score_node(node, request_of(need)) == score


def test_score_is_higher_for_a_fuller_result_card() -> None:
    request = request_of(4069)
    nodes = [
        node_with_usage("empty", [(V100, 0)]),
        node_with_usage("quarter", [(V100, 4069)]),
        node_with_usage("half", [(V100, 8138)]),
        node_with_usage("three-quarters", [(V100, 12207)]),
    ]
    scores = [score_node(node, request) for node in nodes]
    assert scores == sorted(scores)
    assert len(set(scores)) == len(scores)
    assert scores[-1] == MAX_SCORE


def test_score_rates_the_card_bind_chooses() -> None:
    # Binpack picks GPU0 (least free); GPU1 would be a worse fit, so the score must be GPU0's.
    node = node_with_usage("n", [(40000, 35000), (8000, 2000)])
    request = request_of(4000)
    card = choose_card(node, request)
    assert card is not None
    assert card.index == 0
    assert score_node(node, request) == (35000 + 4000) * 10 // 40000 == 9


def test_reserve_plans_every_container_on_the_chosen_card() -> None:
    request = request_of(3000, 2000, init=[6000])
    event = reserve(
        SEED_BIND_NODE,
        pod_ref("p"),
        request,
        reservation_id="r-1",
        at=T0,
        pod_created_at=T0,
        reserved_by="allocator-0",
    )
    assert event is not None
    uuid = SEED_BIND_NODE.cards[1].uuid
    assert event.id == "r-1"
    assert event.node == "N1"
    assert event.pod == pod_ref("p")
    assert event.policy == "binpack"
    assert event.reserved_by == "allocator-0"
    assert event.pod_created_at == T0
    assert event.shares == (
        ContainerShare(container="init0", card_index=1, card_uuid=uuid, memory_mib=6000, init=True),
        ContainerShare(container="c0", card_index=1, card_uuid=uuid, memory_mib=3000),
        ContainerShare(container="c1", card_index=1, card_uuid=uuid, memory_mib=2000),
    )


def test_reserve_uses_the_init_peak_and_refuses_when_no_card_fits() -> None:
    peak = request_of(9000, init=[12208])
    event = reserve(SEED_BIND_NODE, pod_ref("p"), peak, reservation_id="r", at=T0)
    assert event is not None
    assert {share.card_index for share in event.shares} == {3}
    too_big = request_of(V100 + 1)
    assert reserve(SEED_BIND_NODE, pod_ref("p"), too_big, reservation_id="r", at=T0) is None
