"""Card choice, node scores and reservations: seed 000's bind example, seed 003's shapes."""

from __future__ import annotations

import pytest

from gpushare.core.model import CardLink, ContainerShare
from gpushare.core.placement import can_place, placed_as, plan_pod, reserve, with_placed
from gpushare.core.policies import standard_policies
from gpushare.core.policies.base import MAX_SCORE, Assignment, Policy, Score
from gpushare.core.policies.fragmentation import FragmentationPolicy, Workload, request_class
from gpushare.core.policies.resource import BINPACK
from gpushare.core.policies.workload import DEFAULT_POLICY, workload_policy
from gpushare.core.requests import ContainerRequest, PodRequest
from gpushare.core.state import ClusterState, NodeState
from gpushare.core.view import CardView, NodeView, affinity_matrix
from gpushare.reporter.recording import load_recording
from gpushare.reporter.topology import links_from_records
from tests.unit.core.factories import (
    T0,
    V100,
    inventory,
    make_card,
    node_with_usage,
    pod_ref,
    request_of,
)
from tests.unit.reporter.fakes import DGX1_FIXTURE

POLICIES = standard_policies()
SPREAD = POLICIES["spread"]
TOPOLOGY = POLICIES["topology"]

# Seed 000, "2.2": free GPU0 12207, GPU1 8138, GPU2 4069, GPU3 16276; the pod asks 8138 MiB.
SEED_BIND_NODE = node_with_usage("N1", [(V100, 4069), (V100, 8138), (V100, 12207), (V100, 0)])


def chosen(node: NodeState | NodeView, request: PodRequest, policy: Policy = BINPACK) -> object:
    """Card indices per container of the best plan, or ``None``."""
    view = node.view if isinstance(node, NodeState) else node
    plan = plan_pod(view, request, policy)
    if plan is None:
        return None
    return [[view.cards[at].index for at in cards] for cards in plan.assignment]


def node_score(node: NodeState | NodeView, request: PodRequest, policy: Policy = BINPACK) -> int:
    view = node.view if isinstance(node, NodeState) else node
    plan = plan_pod(view, request, policy)
    return 0 if plan is None else policy.node_score(plan.score.node)


def share(container: str, **fields: object) -> ContainerRequest:
    return ContainerRequest(container=container, **fields)  # type: ignore[arg-type]


def pod(*containers: ContainerRequest, models: tuple[str, ...] = ()) -> PodRequest:
    return PodRequest(containers=containers, models=models)


def empty_view(*memory_mib: int, model: str = "V100") -> NodeView:
    return NodeView(
        cards=tuple(
            CardView(index=i, memory_mib=m, free_mib=m, free_core=100, model=model)
            for i, m in enumerate(memory_mib)
        )
    )


def test_seed_bind_example_chooses_least_free_card_that_fits() -> None:
    node = SEED_BIND_NODE
    assert [node.free_mib(card) for card in node.cards] == [12207, 8138, 4069, 16276]
    assert chosen(node, request_of(8138)) == [[1]]  # GPU1 ends up exactly full


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
def test_binpack_card_on_seed_node(need: int, index: int | None) -> None:
    assert chosen(SEED_BIND_NODE, request_of(need)) == (None if index is None else [[index]])


@pytest.mark.parametrize(
    ("need", "index"),
    [
        pytest.param(1, 3, id="tiny-goes-to-emptiest-card"),
        pytest.param(12208, 3, id="only-the-empty-card"),
    ],
)
def test_spread_card_on_seed_node(need: int, index: int) -> None:
    assert chosen(SEED_BIND_NODE, request_of(need), SPREAD) == [[index]]


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
            1,
            id="equal-free-the-fuller-card-by-fraction",
        ),
        pytest.param(
            node_with_usage("n", [(V100, 12000), (V100, 0)], unhealthy=(0,)),
            1,
            id="unhealthy-card-skipped",
        ),
    ],
)
def test_binpack_ties_and_health(node: NodeState, index: int) -> None:
    assert chosen(node, request_of(4000)) == [[index]]


def test_tie_goes_to_lowest_index_whatever_the_inventory_order() -> None:
    state = ClusterState()
    cards = [make_card(3, node="n"), make_card(1, node="n"), make_card(2, node="n")]
    state.apply(inventory("n", cards))
    assert chosen(state.node("n"), request_of(100)) == [[1]]


@pytest.mark.parametrize(
    ("node", "need", "score"),
    [
        pytest.param(node_with_usage("n", [(V100, 8138)]), 8138, 10, id="exactly-full"),
        pytest.param(node_with_usage("n", [(V100, 8138)]), 4069, 8, id="three-quarters"),
        pytest.param(node_with_usage("n", [(V100, 0)]), 4069, 2, id="a-quarter"),
        pytest.param(node_with_usage("n", [(V100, 0)]), 1, 0, id="nearly-empty"),
        pytest.param(node_with_usage("n", [(V100, 12207)]), 8138, 0, id="does-not-fit"),
        pytest.param(node_with_usage("n", [(V100, 0)], unhealthy=(0,)), 1, 0, id="unhealthy-only"),
        pytest.param(node_with_usage("n", []), 1, 0, id="no-cards"),
        pytest.param(
            node_with_usage("n", [(V100, 8138), (V100, 0)]), 8138, 5, id="mean-over-the-node"
        ),
    ],
)
def test_binpack_node_score_is_the_node_utilization(node: NodeState, need: int, score: int) -> None:
    assert node_score(node, request_of(need)) == score


def test_binpack_ranks_fuller_nodes_higher_and_spread_the_reverse() -> None:
    request = request_of(4069)
    nodes = [
        node_with_usage("empty", [(V100, 0)]),
        node_with_usage("quarter", [(V100, 4069)]),
        node_with_usage("half", [(V100, 8138)]),
        node_with_usage("three-quarters", [(V100, 12207)]),
    ]
    packed = [node_score(node, request) for node in nodes]
    assert packed == sorted(packed)
    assert len(set(packed)) == len(packed)
    assert packed[-1] == MAX_SCORE
    spread = [node_score(node, request, SPREAD) for node in nodes]
    assert spread == sorted(spread, reverse=True)


# -- seed 003: several cards per container, several containers per pod --------------------


def test_seed_003_multiple_gpu_example_places_every_container() -> None:
    """``container-multiple-gpu: "2,1,3"`` on four empty cards: 2 × 50 %, a whole card, 3 × 33 %."""
    request = pod(
        share("c0", cards=2, core_percent=50, memory_mib=4000),
        share("c1", exclusive=True),
        share("c2", cards=3, core_percent=33, memory_mib=2000),
    )
    placed = chosen(empty_view(V100, V100, V100, V100), request)
    assert isinstance(placed, list)
    c0, c1, c2 = placed
    assert len(set(c0)) == 2
    assert len(set(c2)) == 3
    assert not set(c1) & (set(c0) | set(c2))  # the whole card is nobody else's
    # binpack stacks the shares: c0 and c2 overlap on two cards, so only four cards are used
    assert len(set(c0) | set(c1) | set(c2)) == 4
    assert set(c0) <= set(c2)


def test_dfs_backtracks_when_the_greedy_choice_blocks_a_later_container() -> None:
    # Card 0 has 60 % core free, card 1 is empty. Greedy binpack puts the 50 % container on
    # card 0 and cannot place the 70 % one; the search finds 70 % on card 1, 50 % on card 0.
    view = NodeView(
        cards=(
            CardView(index=0, memory_mib=V100, free_mib=V100, free_core=60, containers=1),
            CardView(index=1, memory_mib=V100, free_mib=V100, free_core=100),
        )
    )
    request = pod(share("small", core_percent=50), share("large", core_percent=70))
    assert chosen(view, request) == [[0], [1]]
    assert chosen(view, pod(share("a", core_percent=70), share("b", core_percent=70))) is None


def test_containers_per_card_cap() -> None:
    view = NodeView(
        cards=(CardView(index=0, memory_mib=V100, free_mib=V100, free_core=100, containers=15),)
    )
    one, two = (
        pod(share("a", memory_mib=10)),
        pod(share("a", memory_mib=10), share("b", memory_mib=10)),
    )
    assert plan_pod(view, one, BINPACK) is not None
    assert plan_pod(view, two, BINPACK) is None
    assert plan_pod(view, one, BINPACK, max_per_card=15) is None
    assert can_place(view, two, max_per_card=17)


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        pytest.param(pod(share("w", exclusive=True)), [[1]], id="whole-card-only-on-untouched"),
        pytest.param(pod(share("w", exclusive=True, cards=2)), None, id="two-whole-cards-no"),
        pytest.param(
            pod(share("r", memory_ratio=50, core_percent=50)), [[0]], id="ratio-against-the-card"
        ),
        pytest.param(pod(share("r", memory_ratio=80)), [[1]], id="ratio-too-big-for-card-0"),
        pytest.param(pod(share("m", memory_mib=1), models=("A100",)), [[1]], id="model-filter"),
        pytest.param(pod(share("m", memory_mib=1), models=("H100",)), None, id="no-such-model"),
    ],
)
def test_shapes_on_a_half_used_node(request_: PodRequest, expected: object) -> None:
    view = NodeView(
        cards=(
            CardView(
                index=0, memory_mib=40960, free_mib=20480, free_core=50, containers=1, model="V100"
            ),
            CardView(index=1, memory_mib=40960, free_mib=40960, free_core=100, model="A100-SXM4"),
        )
    )
    assert chosen(view, request_) == expected


def test_a_group_shares_one_card_and_init_containers_use_cards_free_before_the_pod() -> None:
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
    assert (event.id, event.node, event.pod) == ("r-1", "N1", pod_ref("p"))
    assert (event.policy, event.reserved_by, event.pod_created_at) == ("binpack", "allocator-0", T0)
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


def test_reserve_resolves_ratio_and_core_per_card() -> None:
    node = node_with_usage("n", [(40960, 0), (V100, 0)])
    request = pod(share("c", cards=2, memory_ratio=25, core_percent=30))
    event = reserve(node, pod_ref("p"), request, reservation_id="r", at=T0)
    assert event is not None
    assert [(s.card_index, s.memory_mib, s.core_percent) for s in event.shares] == [
        (0, 10240, 30),
        (1, 4069, 30),
    ]


def test_reserve_keeps_the_planned_card_while_it_holds_the_pod() -> None:
    """SEED_BIND_NODE frees 12207, 8138, 4069 and 16276: binpack puts 4000 MiB on card 2;
    planned on card 3, the pod stays there; planned on a card that cannot hold it now, it
    is planned afresh."""
    request = request_of(4000)

    def card_of(planned: Assignment | None) -> list[int]:
        event = reserve(
            SEED_BIND_NODE, pod_ref("p"), request, reservation_id="r", at=T0, planned=planned
        )
        assert event is not None
        return [share.card_index for share in event.shares]

    assert card_of(None) == [2]
    assert card_of(((3,),)) == [3]
    full = node_with_usage("N1", [(V100, 4069), (V100, V100), (V100, 0), (V100, 0)])
    event = reserve(full, pod_ref("p"), request, reservation_id="r", at=T0, planned=((1,),))
    assert event is not None
    assert [share.card_index for share in event.shares] == [0]  # binpack's, afresh


@pytest.mark.parametrize(
    ("view", "asked", "planned", "why"),
    [
        (empty_view(V100, V100), request_of(V100 + 1), ((1,),), "too large for the card"),
        (empty_view(V100), request_of(1000), ((1,),), "no such card"),
        (empty_view(V100), request_of(1000), ((0, 0),), "not one card"),
        (empty_view(V100), pod(share("a"), share("b")), ((0,), (0,)), "two containers"),
        (empty_view(V100), request_of(1000, init=[500]), ((0,), (0,)), "an init container"),
        (
            NodeView(cards=(CardView(index=0, memory_mib=V100, free_mib=V100, free_core=100,
                                     healthy=False),)),
            request_of(1000), ((0,),), "an unhealthy card",
        ),
        (
            NodeView(cards=(CardView(index=0, memory_mib=V100, free_mib=V100, free_core=100,
                                     containers=1),)),
            pod(share("a", exclusive=True)), ((0,),), "a whole card asked of a used one",
        ),
        (empty_view(V100, model="T4"), pod(share("a", memory_mib=1000), models=("A100",)),
         ((0,),), "a model the pod does not accept"),
    ],
)  # fmt: skip
def test_a_planned_card_that_cannot_hold_the_pod_is_not_kept(
    view: NodeView, asked: PodRequest, planned: Assignment, why: str
) -> None:
    assert placed_as(view, asked, planned) is None, why


def test_a_planned_card_that_holds_the_pod_is_the_card_it_takes() -> None:
    view = empty_view(V100, V100)
    request = request_of(4000)
    kept = placed_as(view, request, ((1,),))
    assert kept is not None
    assert [card.free_mib for card in kept.cards] == [V100, V100 - 4000]
    assert placed_as(view, request, ((1,),), max_per_card=0) is None  # no room for a tenant


def test_pods_placed_in_turn_keep_the_cards_planned_for_them_where_they_still_fit() -> None:
    view = SEED_BIND_NODE.view  # free 12207, 8138, 4069, 16276
    requests = [request_of(4000), request_of(8000), request_of(16276)]
    # 4000 planned on card 3 (binpack would take card 2), 8000 on card 2 (too small
    # now: planned afresh, binpack's card 1), 16276 without a plan (nowhere left)
    after = with_placed(view, requests, lambda _: BINPACK, planned=[((3,),), ((2,),)])
    assert [card.free_mib for card in after.cards] == [12207, 138, 4069, 12276]


# -- seed 004: NVLink first, balanced with load ----------------------------------------------


def nvlink_node(load: dict[int, int] | None = None) -> NodeView:
    """Four cards: 0-1 and 2-3 joined by NVLink (NV4), every other pair across the host."""
    links = [
        CardLink(a=a, b=b, path="NVLINK" if {a, b} in ({0, 1}, {2, 3}) else "SYS", nvlinks=4)
        for a in range(4)
        for b in range(a + 1, 4)
    ]
    cards = tuple(make_card(i) for i in range(4))
    used = load or {}
    return NodeView(
        cards=tuple(
            CardView(
                index=i,
                memory_mib=V100,
                free_mib=V100 - used.get(i, 0),
                free_core=100,
                containers=1 if used.get(i) else 0,
            )
            for i in range(4)
        ),
        affinity=affinity_matrix(cards, links),
    )


def dgx1_node(used: frozenset[int] = frozenset()) -> NodeView:
    """The synthetic DGX-1 fixture (hybrid cube-mesh), a small pod on each card in ``used``."""
    recording = load_recording(DGX1_FIXTURE)
    links = links_from_records(recording.devices, recording.topology)
    cards = tuple(make_card(device.index) for device in recording.devices)
    return NodeView(
        cards=tuple(
            CardView(
                index=card.index,
                memory_mib=V100,
                free_mib=V100 - (1000 if card.index in used else 0),
                free_core=100,
                containers=1 if card.index in used else 0,
            )
            for card in cards
        ),
        affinity=affinity_matrix(cards, links),
    )


def whole(cards: int) -> PodRequest:
    return pod(share("c", cards=cards, exclusive=True))


SMALL_PAIR = pod(share("c", cards=2, memory_mib=1000))
HALF_PAIR = pod(share("c", cards=2, core_percent=50, memory_ratio=50))


def fragmentation_for(request: PodRequest) -> FragmentationPolicy:
    """The default as a cluster runs it before it has seen a pod: the pod is the workload."""
    policy = workload_policy(DEFAULT_POLICY, Workload(classes=(request_class(request),)))
    assert isinstance(policy, FragmentationPolicy)
    return policy


def seed_004_policy(name: str, request: PodRequest) -> Policy:
    return TOPOLOGY if name == "topology" else fragmentation_for(request)


@pytest.mark.parametrize("policy", ["topology", "fragmentation"])
@pytest.mark.parametrize(
    ("view", "wanted", "expected"),
    [
        pytest.param(nvlink_node({1: 2000}), whole(2), [[2, 3]], id="card-1-used:2-3-not-0-2"),
        pytest.param(nvlink_node({0: 2000}), whole(2), [[2, 3]], id="card-0-used:2-3-not-1-2"),
        pytest.param(nvlink_node({2: 2000}), SMALL_PAIR, [[0, 1]], id="share:idle-nvlink-pair"),
        pytest.param(
            dgx1_node(frozenset({0, 1, 2})), whole(4), [[4, 5, 6, 7]], id="dgx1:quad-not-3-4-5-6"
        ),
        pytest.param(dgx1_node(frozenset({0})), whole(4), [[4, 5, 6, 7]], id="dgx1:free-quad"),
        pytest.param(dgx1_node(), whole(4), [[0, 1, 2, 3]], id="dgx1:empty-first-quad"),
        pytest.param(dgx1_node(), whole(2), [[0, 3]], id="dgx1:nv2-beats-nv1"),
        pytest.param(dgx1_node(frozenset({0})), whole(2), [[1, 2]], id="dgx1:first-free-nv2"),
        pytest.param(
            dgx1_node(frozenset({4, 5, 6, 7})), whole(3), [[0, 2, 3]], id="dgx1:three-of-a-quad"
        ),
    ],
)
def test_seed_004_multi_card_containers_get_nvlinked_cards(
    policy: str, view: NodeView, wanted: PodRequest, expected: list[list[int]]
) -> None:
    assert chosen(view, wanted, seed_004_policy(policy, wanted)) == expected


@pytest.mark.parametrize(
    ("view", "wanted", "by_policy"),
    [
        # binpack would take the loaded card 2 and one more; both take an idle NVLink pair
        pytest.param(
            nvlink_node({2: 2000}),
            SMALL_PAIR,
            {"binpack": [[0, 2]], "topology": [[0, 1]], "fragmentation": [[0, 1]]},
            id="idle-pair",
        ),
        # both pairs NVLinked and loaded: topology the lighter pair, fragmentation packs
        pytest.param(
            nvlink_node({1: 2000, 2: 1000}),
            SMALL_PAIR,
            {"topology": [[2, 3]], "fragmentation": [[0, 1]]},
            id="both-pairs-loaded",
        ),
        # the 0-1 pair nearly full: topology the idle 2-3 pair, fragmentation best fit
        pytest.param(
            nvlink_node({0: 14000, 1: 14000}),
            SMALL_PAIR,
            {"topology": [[2, 3]], "fragmentation": [[0, 1]]},
            id="pair-nearly-full",
        ),
        # halves on cards 1 and 2 would strand both (FGD: 31 points), a linked pair
        # strands one (40), two idle cards across the host none (50): the link loses
        pytest.param(
            nvlink_node({1: 2000, 2: 2000}),
            HALF_PAIR,
            {"topology": [[0, 1]], "fragmentation": [[0, 3]]},
            id="fragmentation-outweighs-a-link",
        ),
    ],
)
def test_seed_004_affinity_is_balanced_against_load_or_fragmentation(
    view: NodeView, wanted: PodRequest, by_policy: dict[str, list[list[int]]]
) -> None:
    policies = {
        "binpack": BINPACK,
        "topology": TOPOLOGY,
        "fragmentation": fragmentation_for(wanted),
    }
    assert {name: chosen(view, wanted, policies[name]) for name in by_policy} == by_policy


def test_a_heavier_link_weight_trades_fragmentation_for_nvlink() -> None:
    policy = fragmentation_for(HALF_PAIR)
    policy.link_weight = 20.0
    assert chosen(nvlink_node({1: 2000, 2: 2000}), HALF_PAIR, policy) == [[0, 1]]


class CountingPolicy:
    """A policy's answers, counting the leaves the search scores."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name = policy.name
        self.symmetric = policy.symmetric
        self.links_matter = policy.links_matter
        self.cpu_thresholds = policy.cpu_thresholds
        self.leaves = 0

    def score(
        self, before: NodeView, after: NodeView, request: PodRequest, assignment: Assignment
    ) -> Score:
        self.leaves += 1
        return self.policy.score(before, after, request, assignment)

    def node_score(self, node_value: float) -> int:
        return self.policy.node_score(node_value)


@pytest.mark.parametrize(
    ("view", "wanted", "policy", "leaves"),
    [
        pytest.param(dgx1_node(), whole(2), "fragmentation", 28, id="linked-multi-card:all"),
        pytest.param(dgx1_node(), whole(4), "topology", 70, id="topology:all"),
        pytest.param(dgx1_node(), whole(1), "fragmentation", 1, id="single-card:shortcut"),
        pytest.param(empty_view(*[V100] * 8), whole(2), "fragmentation", 1, id="no-links"),
        pytest.param(empty_view(*[V100] * 8), whole(4), "topology", 1, id="topology:no-links"),
        pytest.param(dgx1_node(), whole(2), "fgd", 1, id="links-do-not-matter"),
    ],
)
def test_the_symmetric_shortcut_holds_unless_links_matter(
    view: NodeView, wanted: PodRequest, policy: str, leaves: int
) -> None:
    workload = Workload(classes=(request_class(wanted),))
    named = TOPOLOGY if policy == "topology" else workload_policy(policy, workload)
    counting = CountingPolicy(named)
    assert plan_pod(view, wanted, counting) is not None
    assert counting.leaves == leaves


def test_topology_ranks_a_node_with_a_free_nvlink_pair_higher() -> None:
    request = pod(share("c", cards=2, memory_mib=1000))
    linked = nvlink_node()
    broken = nvlink_node({1: V100 - 10, 3: V100 - 10})  # only cross-host pairs still fit
    assert node_score(linked, request, TOPOLOGY) > node_score(broken, request, TOPOLOGY)


def test_every_policy_agrees_on_feasibility() -> None:
    request = pod(share("a", cards=2, core_percent=50), share("b", exclusive=True))
    for view in (nvlink_node(), nvlink_node({0: 1, 1: 1, 2: 1}), empty_view(V100, V100)):
        outcomes = {
            name: plan_pod(view, request, policy) is not None for name, policy in POLICIES.items()
        }
        assert len(set(outcomes.values())) == 1, outcomes
        assert can_place(view, request) is next(iter(outcomes.values()))


def test_pods_placed_in_turn_take_their_best_cards_and_one_that_no_longer_fits_is_left_out() -> (
    None
):
    view = SEED_BIND_NODE.view  # free 12207, 8138, 4069, 16276
    requests = [request_of(8138), request_of(12207), request_of(16276), request_of(16276)]
    after = with_placed(view, requests, lambda _: BINPACK)
    step = view
    for request in requests[:3]:  # the fourth finds no card of 16276 free left
        plan = plan_pod(step, request, BINPACK)
        assert plan is not None
        step = plan.after
    assert after == step
    assert [card.free_mib for card in after.cards] == [0, 0, 4069, 0]
    assert with_placed(view, [], lambda _: BINPACK) is view
