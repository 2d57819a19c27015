"""Filter and prioritize over a folded state: seed 000's worked example and every reason."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.allocator.filtering import (
    NO_PLAN,
    RejectionMemo,
    ScoreMemo,
    best_at,
    filter_nodes,
    kube_scores,
    node_values,
    ranked_first,
    reject_all,
    score_nodes,
)
from gpushare.allocator.fit_index import FitIndex
from gpushare.core.events import InventoryReported, PodReleased, PodReserved
from gpushare.core.fit import is_stale, stale_cutoff
from gpushare.core.placement import plan_pod
from gpushare.core.policies import Assignment, Policy, Score
from gpushare.core.policies.resource import BINPACK
from gpushare.core.requests import ALIYUN_GROUP, ContainerRequest, PodRequest
from gpushare.core.state import ClusterState
from gpushare.core.view import NodeView
from tests.unit.allocator.builders import (
    HEARTBEAT_SECONDS,
    V100,
    card,
    fold,
    inventory,
    node_events,
    now,
    occupant,
    seed_000_filter_cluster,
)


def asks(memory_mib: int) -> PodRequest:
    return PodRequest(
        containers=(ContainerRequest(container="main", memory_mib=memory_mib, group=ALIYUN_GROUP),)
    )


def test_seed_000_filter_example() -> None:
    state = fold(seed_000_filter_cluster())
    verdicts = filter_nodes(state, ["N1", "N2", "N3"], asks(8138), now())
    assert verdicts.passed == ["N3"]
    assert set(verdicts.failed) == {"N1", "N2"}
    assert verdicts.unresolvable == {}
    assert "the most free on any card is 4069 MiB" in verdicts.failed["N2"]
    assert "needs 8138 MiB" in verdicts.failed["N1"]
    assert verdicts.kinds == {"insufficient_free_memory": 2}


def test_a_request_bigger_than_any_card_is_unresolvable_everywhere() -> None:
    state = fold(seed_000_filter_cluster())
    verdicts = filter_nodes(state, ["N1", "N2", "N3"], asks(V100 + 1), now())
    assert verdicts.passed == []
    assert verdicts.failed == {}
    assert set(verdicts.unresolvable) == {"N1", "N2", "N3"}
    for reason in verdicts.unresolvable.values():
        assert f"largest {V100} MiB" in reason
    assert verdicts.kinds == {"larger_than_any_card": 3}


def test_unknown_stale_and_unhealthy_nodes_are_unresolvable() -> None:
    long_ago = now() - timedelta(seconds=10 * HEARTBEAT_SECONDS)
    state = fold(
        [
            inventory("stale", [card("stale", 0)], at=long_ago),
            inventory("sick", [card("sick", 0, healthy=False)]),
            *node_events("ok", [0]),
        ]
    )
    verdicts = filter_nodes(state, ["ghost", "stale", "sick", "ok"], asks(1024), now())
    assert verdicts.passed == ["ok"]
    assert set(verdicts.unresolvable) == {"ghost", "stale", "sick"}
    assert "no GPU inventory" in verdicts.unresolvable["ghost"]
    assert "stale" in verdicts.unresolvable["stale"]
    assert "XID 79" in verdicts.unresolvable["sick"]
    assert verdicts.kinds == {"no_inventory": 1, "stale_inventory": 1, "no_healthy_gpu": 1}


def test_every_name_gets_an_answer_in_order() -> None:
    names = [f"n{i}" for i in range(50)]
    state = fold([event for name in names[::2] for event in node_events(name, [0])])
    verdicts = filter_nodes(state, names, asks(1), now())
    assert verdicts.passed == names[::2]
    assert set(verdicts.unresolvable) == set(names[1::2])


def test_reject_all_names_every_node_with_the_reason() -> None:
    verdicts = reject_all(["a", "b"], "invalid aliyun.com/gpu-mem request: quantity: bad")
    assert verdicts.passed == []
    assert verdicts.unresolvable == {
        "a": "invalid aliyun.com/gpu-mem request: quantity: bad",
        "b": "invalid aliyun.com/gpu-mem request: quantity: bad",
    }
    assert verdicts.kinds == {"invalid_request": 2}


def test_scores_follow_binpack_and_stay_in_range() -> None:
    state = fold(seed_000_filter_cluster())
    scores = score_nodes(state, ["N1", "N2", "N3", "ghost"], asks(4069), BINPACK)
    # Node-level binpack: how full the node's cards end up on average. N1 ends with both
    # cards full; N2 with one full and one at 75 %; N3 (8138 + 4069 on GPU0, GPU1 full)
    # at 87.5 %, rounded to 9 too; a node with no inventory scores 0.
    assert scores == [10, 9, 9, 0]
    assert score_nodes(state, ["N1"], PodRequest(containers=()), BINPACK) == [0]


@pytest.mark.parametrize("offset", [-1.0, -0.000001, 0.0, 0.000001, 1.0, 100.0])
def test_stale_cutoff_agrees_with_core_is_stale(offset: float) -> None:
    at = now()
    node = fold([inventory("n", [card("n", 0)], at=at)]).node("n")
    later = at + timedelta(seconds=3 * HEARTBEAT_SECONDS + offset)
    fresh = node.inventory_at is not None and node.inventory_at >= stale_cutoff(
        later, node.heartbeat_seconds
    )
    assert fresh is not is_stale(node, later)


def test_nodes_with_different_heartbeats_are_each_judged_by_their_own() -> None:
    at = now() - timedelta(seconds=100)

    def reported(node: str, heartbeat_seconds: float) -> InventoryReported:
        event = inventory(node, [card(node, 0)], at=at)
        return msgspec.structs.replace(event, heartbeat_seconds=heartbeat_seconds)

    # 100 s of silence is stale for a 10 s heartbeat (30 s) but not for a 60 s one (180 s).
    state = fold([reported("slow", 60), reported("fast", 10), reported("slow2", 60)])
    verdicts = filter_nodes(state, ["slow", "fast", "slow2"], asks(1), now())
    assert verdicts.passed == ["slow", "slow2"]
    assert "stale" in verdicts.unresolvable["fast"]


def test_remembered_rejections_follow_the_folded_state() -> None:
    events = node_events("n1", [12207])
    state = fold(events)
    memo = RejectionMemo()
    first = filter_nodes(state, ["n1"], asks(8138), now(), memo)
    again = filter_nodes(state, ["n1"], asks(8138), now(), memo)
    assert again.failed == first.failed
    assert "4069 MiB" in first.failed["n1"]
    # A release changes the node: the remembered rejection no longer applies.
    [occupied] = [event for event in events if isinstance(event, PodReserved)]
    state.apply(
        PodReleased(
            id="release",
            at=now(),
            node="n1",
            pod=occupied.pod,
            reservation_id=occupied.id,
            reason="deleted",
        ),
        seq=99,
    )
    assert filter_nodes(state, ["n1"], asks(8138), now(), memo).passed == ["n1"]


def test_a_remembered_rejection_gives_way_to_staleness() -> None:
    state = fold(node_events("n1", [12207]))
    memo = RejectionMemo()
    filter_nodes(state, ["n1"], asks(8138), now(), memo)
    much_later = now() + timedelta(seconds=10 * HEARTBEAT_SECONDS)
    verdicts = filter_nodes(state, ["n1"], asks(8138), much_later, memo)
    assert "stale" in verdicts.unresolvable["n1"]
    assert verdicts.failed == {}


def test_the_memo_is_bounded() -> None:
    state = fold(node_events("n1", [12207]))
    memo = RejectionMemo(capacity=2)
    for size in range(15000, 15010):
        filter_nodes(state, ["n1"], asks(size), now(), memo)
    assert sum(len(memo.table(asks(size))) for size in range(15000, 15010)) <= 2


class CountingPolicy:
    """A policy that counts the placements it is asked to score."""

    def __init__(self, policy: Policy, name: str = "counting") -> None:
        self.policy = policy
        self.name = name
        self.symmetric = policy.symmetric
        self.links_matter = policy.links_matter
        self.cpu_thresholds = policy.cpu_thresholds
        self.scored = 0

    def score(
        self, before: NodeView, after: NodeView, request: PodRequest, assignment: Assignment
    ) -> Score:
        self.scored += 1
        return self.policy.score(before, after, request, assignment)

    def node_score(self, node_value: float) -> int:
        return self.policy.node_score(node_value)


def release_first(state: ClusterState, events: list[Any], seq: int) -> None:
    occupied = next(event for event in events if isinstance(event, PodReserved))
    state.apply(
        PodReleased(
            id=f"release-{seq}",
            at=now(),
            node=occupied.node,
            pod=occupied.pod,
            reservation_id=occupied.id,
            reason="deleted",
        ),
        seq=seq,
    )


def test_remembered_scores_are_planned_again_only_where_the_fold_changed_the_node() -> None:
    n1, n2 = node_events("n1", [12207, 0]), node_events("n2", [4069, 4069])
    state = fold([*n1, *n2])
    policy, memo = CountingPolicy(BINPACK), ScoreMemo()
    first = score_nodes(state, ["n1", "n2"], asks(4069), policy, memo=memo)
    planned = policy.scored
    assert planned > 0
    assert score_nodes(state, ["n1", "n2"], asks(4069), policy, memo=memo) == first
    assert policy.scored == planned, "nothing changed: every score remembered"

    release_first(state, n1, seq=99)
    policy.scored = 0
    after = score_nodes(state, ["n1", "n2"], asks(4069), policy, memo=memo)
    fresh = CountingPolicy(BINPACK)
    assert after == score_nodes(state, ["n1", "n2"], asks(4069), fresh)
    assert 0 < policy.scored < fresh.scored, "only n1 was planned again"
    assert after[0] < first[0], "n1 emptied: binpack likes it less"


def test_a_replaced_policy_or_another_shape_is_scored_afresh() -> None:
    state = fold(node_events("n1", [4069]))
    memo = ScoreMemo()
    old = CountingPolicy(BINPACK)
    score_nodes(state, ["n1"], asks(4069), old, memo=memo)
    new = CountingPolicy(BINPACK)  # the same name: a rebuilt workload-aware policy
    score_nodes(state, ["n1"], asks(4069), new, memo=memo)
    assert new.scored > 0
    scored = new.scored
    score_nodes(state, ["n1"], asks(8138), new, memo=memo)
    assert new.scored > scored


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.integers(1, 4)), max_size=12))
def test_memoised_scores_equal_fresh_ones_whatever_the_fold_did(
    reservations: list[tuple[str, int]],
) -> None:
    events: list[Any] = [inventory(n, [card(n, 0), card(n, 1)]) for n in ("n1", "n2", "n3")]
    state = fold(events)
    memo = ScoreMemo()
    names = ["n1", "n2", "n3", "ghost"]
    for seq, (name, quarters) in enumerate(reservations, start=1):
        on = card(name, seq % 2)
        if state.node(name).used_mib.get(on.uuid, 0) + quarters * 4069 <= V100:
            state.apply(occupant(name, on, quarters * 4069, f"pod-{seq}"), seq)
        for size in (4069, 8138):
            remembered = score_nodes(state, names, asks(size), BINPACK, memo=memo)
            assert remembered == score_nodes(state, names, asks(size), BINPACK)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.integers(1, 4)), max_size=12),
    st.permutations(["n1", "n2", "n3", "ghost"]),
)
def test_the_node_chosen_is_where_the_policy_places_best_and_prioritize_agrees(
    reservations: list[tuple[str, int]], names: list[str]
) -> None:
    """filter's choice (``--choose-in-filter``) is the first node of the highest value,
    that value is what a fresh search on the node gives, and prioritize's 0..10 ranks no
    node above it: choosing in filter and prioritizing agree, only finer."""
    state = fold([inventory(n, [card(n, 0), card(n, 1)]) for n in ("n1", "n2", "n3")])
    memo = ScoreMemo()
    for seq, (name, quarters) in enumerate(reservations, start=1):
        on = card(name, seq % 2)
        if state.node(name).used_mib.get(on.uuid, 0) + quarters * 4069 <= V100:
            state.apply(occupant(name, on, quarters * 4069, f"pod-{seq}"), seq)
        request = asks(8138)
        values = node_values(state, names, request, BINPACK, memo=memo)
        fresh = [
            NO_PLAN if n not in state.nodes or (p := plan_pod(state.nodes[n].view, request,
            BINPACK)) is None else p.score.node
            for n in names
        ]  # fmt: skip
        assert values == fresh
        at = best_at(values)
        scores = kube_scores(values, BINPACK)
        assert scores == score_nodes(state, names, request, BINPACK)
        if at is None:
            assert set(values) == {NO_PLAN}
            continue
        assert all(value < values[at] for value in values[:at])
        assert all(value <= values[at] for value in values[at:])
        assert scores[at] == max(scores)


@given(st.lists(st.floats(allow_nan=False, width=16), max_size=30), st.integers(1, 10))
def test_ranked_first_keeps_the_highest_values_in_their_order(
    values: list[float], limit: int
) -> None:
    kept = ranked_first(values, limit)
    assert kept == sorted(kept)
    assert len(kept) == min(limit, len(values))
    left_out = [values[at] for at in range(len(values)) if at not in kept]
    assert all(values[at] >= out for at in kept for out in left_out)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.integers(1, 4)), max_size=12))
def test_a_remembered_list_of_values_equals_fresh_ones_whatever_the_fold_did(
    reservations: list[tuple[str, int]],
) -> None:
    """kube-scheduler's same list of names, pod after pod: the memo fed the fold's changes
    values again only the nodes that changed, and answers what a fresh valuation does."""
    state = fold([inventory(n, [card(n, 0), card(n, 1)]) for n in ("n1", "n2", "n3")])
    memo = ScoreMemo()
    changed = memo.changes.listener()
    names = ["n1", "n2", "n3", "ghost"]
    planner = CountingPolicy(BINPACK)
    for seq, (name, quarters) in enumerate(reservations, start=1):
        on = card(name, seq % 2)
        if state.node(name).used_mib.get(on.uuid, 0) + quarters * 4069 <= V100:
            event = occupant(name, on, quarters * 4069, f"pod-{seq}")
            changed(seq, event, state.apply(event, seq))
        for size in (4069, 8138):
            asked = list(names)  # equal, not the same list
            remembered = node_values(state, asked, asks(size), planner, memo=memo)
            assert remembered == node_values(state, asked, asks(size), BINPACK)
            before = planner.scored
            assert node_values(state, asked, asks(size), planner, memo=memo) == remembered
            assert planner.scored == before, "nothing changed: nothing planned again"
    moved = fold([inventory(n, [card(n, 0), card(n, 1)]) for n in ("n1", "n2", "n3")])
    fresh = node_values(moved, names, asks(4069), BINPACK)
    assert node_values(moved, names, asks(4069), planner, memo=memo) == fresh


def test_alike_nodes_share_one_plan() -> None:
    """Nodes whose placement views are equal (here: two empty ones) are planned once."""
    state = fold([*node_events("a", [0, 0]), *node_events("b", [0, 0]), *node_events("c", [0])])
    one = CountingPolicy(BINPACK)
    score_nodes(state, ["a"], asks(4069), one, memo=ScoreMemo())
    both = CountingPolicy(BINPACK)
    scores = score_nodes(state, ["a", "b", "c"], asks(4069), both, memo=ScoreMemo())
    single = CountingPolicy(BINPACK)
    score_nodes(state, ["c"], asks(4069), single, memo=ScoreMemo())
    assert both.scored == one.scored + single.scored
    assert scores[0] == scores[1]


def test_a_rebuilt_policy_takes_over_node_by_node_within_the_replan_budget() -> None:
    events = {n: node_events(n, used) for n, used in (("a", [4069]), ("b", [8138]), ("c", [0]))}
    state = fold([event for node in events.values() for event in node])
    memo = ScoreMemo(replan_budget=1)
    names = ["a", "b", "c"]
    old = CountingPolicy(BINPACK)
    before = score_nodes(state, names, asks(4069), old, memo=memo)
    new = CountingPolicy(BINPACK)  # the same name: the estimate was rebuilt
    assert score_nodes(state, names, asks(4069), new, memo=memo) == before
    planned = new.scored
    score_nodes(state, names, asks(4069), new, memo=memo)
    assert new.scored > planned, "the next call replans the next node"
    for _ in range(3):
        score_nodes(state, names, asks(4069), new, memo=memo)
    settled = new.scored
    assert score_nodes(state, names, asks(4069), new, memo=memo) == before
    assert new.scored == settled, "every node now holds the new policy's score"

    # A node the fold changed is planned at once, whatever the budget.
    release_first(state, events["b"], seq=99)
    memo = ScoreMemo(replan_budget=0)
    score_nodes(state, names, asks(4069), CountingPolicy(BINPACK), memo=memo)
    release_first(state, events["a"], seq=100)
    newest = CountingPolicy(BINPACK)
    fresh = score_nodes(state, names, asks(4069), BINPACK)
    assert score_nodes(state, names, asks(4069), newest, memo=memo)[0] == fresh[0]
    assert newest.scored > 0


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["n1", "n2", "n3", "n4"]),
            st.integers(0, 1),
            st.integers(1, 4),
            st.booleans(),
        ),
        max_size=14,
    ),
    st.sampled_from([1, 2, 16]),
    st.sampled_from([0, 2, 10]),
)
def test_the_fit_index_answers_as_the_node_by_node_checks(
    steps: list[tuple[str, int, int, bool]], cap: int, silent_heartbeats: int
) -> None:
    """Seeds 000/001's requests through the index or node by node: the same verdicts, in
    the caller's order, as the fold moves on (reservations, stale inventories)."""
    start = now()
    state = fold([inventory(n, [card(n, 0), card(n, 1)], at=start) for n in ("n1", "n2")])
    index = FitIndex(capacity=1)  # grows as it goes
    names = ["n4", "n1", "ghost", "n2", "n3"]
    later = start + timedelta(seconds=silent_heartbeats * HEARTBEAT_SECONDS)
    for seq, (name, at, quarters, report) in enumerate(steps, start=1):
        if report:
            event: Any = inventory(name, [card(name, 0), card(name, 1)], at=start)
        else:
            on = card(name, at)
            if (
                not state.nodes.get(name)
                or state.node(name).used_mib.get(on.uuid, 0) + (quarters * 4069) > V100
            ):
                continue
            event = occupant(name, on, quarters * 4069, f"pod-{seq}")
        node = state.apply(event, seq)
        index.changed(seq, event, node)
        for size in (4069, 8138, 16276):
            for moment in (start, later):
                exact = filter_nodes(state, names, asks(size), moment, max_per_card=cap)
                fast = filter_nodes(state, names, asks(size), moment, max_per_card=cap, index=index)
                assert fast.passed == exact.passed
                assert fast.failed == exact.failed
                assert fast.unresolvable == exact.unresolvable


def test_the_fit_index_reads_a_repeated_list_of_names_against_the_fold_of_now() -> None:
    """kube-scheduler sends the same names pod after pod, and the index reuses their
    rows; a fold whose nodes were replaced wholesale (a snapshot) numbers them anew."""
    start = now()
    index = FitIndex()
    names = ["a", "b"]
    first = fold([inventory(n, [card(n, 0)], at=start) for n in names])
    assert index.passing(first, list(names), 4069, 16, start).tolist() == [True, True]
    assert index.passing(first, list(names), 4069, 16, start).tolist() == [True, True]
    others = fold([inventory(n, [card(n, 0)], at=start) for n in ("c", "d")])
    assert index.passing(others, list(names), 4069, 16, start).tolist() == [False, False]
