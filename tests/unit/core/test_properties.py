"""Invariants of the fold, fit and placement, over random clusters and event sequences.

Every allocation goes through the real path: ``placement.reserve`` on the current fold
decides, the event is applied with ``ClusterState.apply`` at the next stream sequence,
and a plain-dict model of the live reservations is kept beside it to compare against.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from gpushare.core.events import (
    AnyEvent,
    BindFailed,
    ContainerAssigned,
    InventoryReported,
    PodBound,
    PodReleased,
    PodReserved,
)
from gpushare.core.fit import check_fit
from gpushare.core.model import Card
from gpushare.core.placement import (
    DEFAULT_MAX_CONTAINERS_PER_CARD,
    _Search,
    _with_each_share,
    apply_assignment,
    can_place,
    plan_pod,
    reserve,
)
from gpushare.core.policies import MAX_SCORE, Assignment, Policy, standard_policies
from gpushare.core.requests import ContainerRequest, PodRequest
from gpushare.core.state import (
    ClusterState,
    NodeState,
    core_by_card,
    fold_events,
    memory_by_card,
)
from gpushare.core.view import FULL_CORE, NodeView
from tests.unit.core.factories import T0, inventory, pod_ref, request_of
from tests.unit.core.strategies import (
    card_lists,
    container_requests,
    folded_nodes,
    gpu_requests,
)

POLICIES = standard_policies()

CI = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
POD_UIDS = tuple(f"pod-{i}" for i in range(8))
"""A small pool, so that pods come back, and a pod can hold reservations on two nodes."""


@dataclass
class Live:
    """The model's record of one live reservation."""

    event: PodReserved
    bound: bool = False
    assigned: set[str] = field(default_factory=set)


def healthy_max_free(node: NodeState) -> int:
    return max(
        (card.memory_mib - node.used_mib.get(card.uuid, 0) for card in node.cards if card.healthy),
        default=0,
    )


def node_view(node: NodeState) -> tuple[object, ...]:
    """Everything about a node except ``last_seq``."""
    return (
        node.cards,
        node.inventory_at,
        dict(node.pods),
        dict(node.used_mib),
        dict(node.used_core),
        dict(node.containers),
        node.max_free_mib,
        node.view,
    )


def with_duplicates(log: list[tuple[int, AnyEvent]]) -> Iterator[tuple[int, AnyEvent]]:
    """The log as a racing subscription and catch-up read might deliver it."""
    for i, entry in enumerate(log):
        yield entry
        yield entry  # delivered twice in a row
        yield log[i // 2]  # an older event again, at its old sequence
    yield from log[: len(log) // 2]  # an old stretch once more, as a restarted catch-up reads it


class AllocationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ClusterState()
        self.log: list[tuple[int, AnyEvent]] = []
        self.seq = 0
        self.now = T0
        self.ids = itertools.count(1)
        self.model: dict[str, dict[str, Live]] = {}

    # -- plumbing --------------------------------------------------------------------------

    def tick(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now

    def emit(self, event: AnyEvent) -> NodeState:
        if isinstance(event, InventoryReported):
            seq = 0  # as the follower applies the inventory stream
        else:
            self.seq += 1
            seq = self.seq
        self.log.append((seq, event))
        return self.state.apply(event, seq)

    def live_pairs(self) -> list[tuple[str, str]]:
        return sorted((name, uid) for name, pods in self.model.items() for uid in pods)

    def has_live(self) -> bool:
        return bool(self.live_pairs())

    def pick_node(self, data: st.DataObject) -> NodeState:
        return self.state.node(data.draw(st.sampled_from(sorted(self.model)), label="node"))

    def pick_live(self, data: st.DataObject) -> tuple[str, str, Live]:
        name, uid = data.draw(st.sampled_from(self.live_pairs()), label="live")
        return name, uid, self.model[name][uid]

    def reserve_on(self, node: NodeState, uid: str, request: PodRequest) -> PodReserved | None:
        """Decide as the allocator does, and check the decision against fit."""
        policy = POLICIES[sorted(POLICIES)[self.seq % len(POLICIES)]]
        event = reserve(
            node,
            pod_ref(uid),
            request,
            policy,
            reservation_id=f"r-{next(self.ids)}",
            at=self.tick(),
        )
        verdict = check_fit(node, request, node.inventory_at or self.now)
        assert verdict.fits is (event is not None), verdict
        if event is None:
            return None
        assert {share.container for share in event.shares} == {
            wanted.container for wanted in request.containers
        }
        for share in event.shares:
            card = node.card(share.card_uuid)
            assert card is not None
            assert card.healthy
        return event

    # -- rules -----------------------------------------------------------------------------

    @initialize(
        cluster=st.integers(min_value=1, max_value=4).flatmap(
            lambda n: st.tuples(*(card_lists(f"node-{i}") for i in range(n)))
        )
    )
    def report_inventory(self, cluster: tuple[tuple[Card, ...], ...]) -> None:
        for i, cards in enumerate(cluster):
            name = f"node-{i}"
            self.model[name] = {}
            self.emit(inventory(name, cards, at=self.tick()))

    @rule(data=st.data(), uid=st.sampled_from(POD_UIDS), request=gpu_requests())
    def reserve_pod(self, data: st.DataObject, uid: str, request: PodRequest) -> None:
        node = self.pick_node(data)
        if uid in node.pods:
            return  # the allocator never reserves a pod twice on one node
        event = self.reserve_on(node, uid, request)
        if event is not None:
            self.emit(event)
            self.model[node.name][uid] = Live(event=event)

    @precondition(has_live)
    @rule(data=st.data())
    def bind(self, data: st.DataObject) -> None:
        name, uid, live = self.pick_live(data)
        self.emit(
            PodBound(
                id=f"b-{next(self.ids)}",
                at=self.tick(),
                node=name,
                pod=pod_ref(uid),
                reservation_id=live.event.id,
            )
        )
        live.bound = True

    @precondition(has_live)
    @rule(data=st.data())
    def assign(self, data: st.DataObject) -> None:
        name, uid, live = self.pick_live(data)
        share = data.draw(st.sampled_from(live.event.shares), label="share")
        self.emit(
            ContainerAssigned(
                id=f"a-{next(self.ids)}",
                at=self.tick(),
                node=name,
                pod=pod_ref(uid),
                reservation_id=live.event.id,
                container=share.container,
                card_uuids=(share.card_uuid,),
            )
        )
        live.assigned.add(share.container)

    @precondition(has_live)
    @rule(data=st.data(), failed=st.booleans())
    def release(self, data: st.DataObject, failed: bool) -> None:
        name, uid, live = self.pick_live(data)
        common = {
            "id": f"x-{next(self.ids)}",
            "at": self.tick(),
            "node": name,
            "pod": pod_ref(uid),
            "reservation_id": live.event.id,
        }
        if failed:
            self.emit(BindFailed(**common, reason="409: bound to another node"))
        else:
            self.emit(PodReleased(**common, reason="deleted"))
        del self.model[name][uid]

    @rule(data=st.data(), uid=st.sampled_from(POD_UIDS), kind=st.integers(0, 3))
    def event_for_another_reservation(self, data: st.DataObject, uid: str, kind: int) -> None:
        """Late or foreign events: they name a reservation this node does not hold."""
        node = self.pick_node(data)
        common = {
            "id": f"s-{next(self.ids)}",
            "at": self.tick(),
            "node": node.name,
            "pod": pod_ref(uid),
            "reservation_id": "r-0",  # never issued
        }
        events: list[AnyEvent] = [
            PodBound(**common),
            ContainerAssigned(**common, container="c0", card_uuids=()),
            PodReleased(**common, reason="bind_timeout"),
            BindFailed(**common, reason="404"),
        ]
        before = node_view(node)
        after = self.emit(events[kind])
        assert node_view(after) == before

    @rule(data=st.data())
    def flip_health(self, data: st.DataObject) -> None:
        """A new inventory with one card's health toggled (memory sizes stay)."""
        node = self.pick_node(data)
        flip = data.draw(st.sampled_from(node.cards), label="card")
        cards = tuple(
            Card(
                index=card.index,
                uuid=card.uuid,
                model=card.model,
                memory_mib=card.memory_mib,
                healthy=not card.healthy,
                health_reason="" if card.healthy is False else "XID 48",
            )
            if card is flip
            else card
            for card in node.cards
        )
        self.emit(inventory(node.name, cards, at=self.tick()))

    @rule(
        data=st.data(),
        request=gpu_requests(),
        ending=st.sampled_from(["released", "bind-failed", "bound-released", "assigned-released"]),
    )
    def reserve_then_roll_back(self, data: st.DataObject, request: PodRequest, ending: str) -> None:
        node = self.pick_node(data)
        uid = f"probe-{next(self.ids)}"
        event = self.reserve_on(node, uid, request)
        if event is None:
            return
        before = node_view(node)
        self.emit(event)
        common = {"at": self.tick(), "node": node.name, "pod": pod_ref(uid)}
        if ending.startswith(("bound", "assigned")):
            self.emit(PodBound(id=f"b-{uid}", reservation_id=event.id, **common))
        if ending.startswith("assigned"):
            share = event.shares[0]
            self.emit(
                ContainerAssigned(
                    id=f"a-{uid}",
                    reservation_id=event.id,
                    container=share.container,
                    card_uuids=(share.card_uuid,),
                    **common,
                )
            )
        if ending == "bind-failed":
            after = self.emit(
                BindFailed(id=f"f-{uid}", reservation_id=event.id, reason="404", **common)
            )
        else:
            after = self.emit(
                PodReleased(id=f"x-{uid}", reservation_id=event.id, reason="deleted", **common)
            )
        assert node_view(after) == before
        assert after.last_seq == self.seq
        assert self.state.allocation(uid) is None

    @rule(data=st.data(), extra=st.integers(min_value=1, max_value=4096))
    def oversized_pod_is_never_reserved(self, data: st.DataObject, extra: int) -> None:
        node = self.pick_node(data)
        request = request_of(max(card.memory_mib for card in node.cards) + extra)
        assert reserve(node, pod_ref("huge"), request, reservation_id="r", at=self.now) is None
        verdict = check_fit(node, request, node.inventory_at or self.now)
        assert not verdict.fits
        assert verdict.unresolvable

    @rule(data=st.data(), request=gpu_requests())
    def fit_score_and_choice_agree(self, data: st.DataObject, request: PodRequest) -> None:
        node = self.pick_node(data)
        fits = check_fit(node, request, node.inventory_at or self.now).fits
        for policy in POLICIES.values():
            plan = plan_pod(node.view, request, policy)
            assert (plan is not None) is fits, policy.name
            if plan is not None:
                assert 0 <= policy.node_score(plan.score.node) <= MAX_SCORE

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def no_card_is_oversubscribed(self) -> None:
        for node in self.state.nodes.values():
            for card in node.cards:
                assert node.used_mib.get(card.uuid, 0) <= card.memory_mib, (node.name, card)
                assert node.used_core.get(card.uuid, 0) <= FULL_CORE, (node.name, card)
                assert node.containers.get(card.uuid, 0) <= DEFAULT_MAX_CONTAINERS_PER_CARD
                assert node.free_mib(card) >= 0

    @invariant()
    def bookkeeping_matches_the_live_reservations(self) -> None:
        for name, lives in self.model.items():
            node = self.state.node(name)
            assert set(node.pods) == set(lives)
            used: dict[str, int] = {}
            core: dict[str, int] = {}
            containers: dict[str, int] = {}
            for uid, live in lives.items():
                allocation = node.pods[uid]
                assert allocation.reservation_id == live.event.id
                assert allocation.shares == live.event.shares
                assert allocation.bound is live.bound
                assert allocation.assigned == live.assigned
                for uuid, mib in memory_by_card(live.event.shares).items():
                    used[uuid] = used.get(uuid, 0) + mib
                for uuid, percent in core_by_card(live.event.shares).items():
                    core[uuid] = core.get(uuid, 0) + percent
                for share in live.event.shares:
                    containers[share.card_uuid] = containers.get(share.card_uuid, 0) + 1
            assert dict(node.used_mib) == used
            assert dict(node.used_core) == core
            assert dict(node.containers) == containers
            assert node.max_free_mib == healthy_max_free(node)
            assert node.last_seq <= self.seq

    @invariant()
    def allocation_index_names_a_live_holder(self) -> None:
        for uid in POD_UIDS:
            holders = [name for name, lives in self.model.items() if uid in lives]
            found = self.state.allocation(uid)
            if not holders:
                assert found is None
            else:
                assert found in [self.state.node(name).pods[uid] for name in holders]

    def teardown(self) -> None:
        once, twice = fold_events(self.log), fold_events(self.log)
        assert once.nodes == twice.nodes == self.state.nodes
        assert once.pod_nodes == twice.pod_nodes == self.state.pod_nodes
        replayed = fold_events(with_duplicates(self.log))
        assert replayed.nodes == self.state.nodes
        assert replayed.pod_nodes == self.state.pod_nodes


AllocationMachine.TestCase.settings = settings(CI, stateful_step_count=40)
TestAllocationLog = pytest.mark.slow(AllocationMachine.TestCase)


# -- the same properties on single nodes, shrinking to small examples ----------------------


def placements(view: NodeView, request: PodRequest) -> Iterator[Assignment]:
    """Every assignment of distinct cards per container, feasible or not (brute force)."""
    positions = range(len(view.cards))
    choices: Sequence[Sequence[tuple[int, ...]]] = [
        list(itertools.combinations(positions, wanted.cards)) for wanted in request.containers
    ]
    yield from itertools.product(*choices)


def running_together(
    request: PodRequest, assignment: Assignment
) -> list[list[tuple[ContainerRequest, tuple[int, ...]]]]:
    """The moments of the pod's life as the kubelet runs it (KEP-753): each init container
    beside the native sidecars started before it, then every sidecar beside the apps."""
    started: list[tuple[ContainerRequest, tuple[int, ...]]] = []
    moments = []
    for wanted, cards in zip(request.containers, assignment, strict=True):
        if wanted.init:
            moments.append([*started, (wanted, cards)])
        else:
            started.append((wanted, cards))
    return [*moments, started]


def pod_peaks(
    view: NodeView, request: PodRequest, assignment: Assignment
) -> tuple[dict[int, int], dict[int, int]]:
    """Per card, the most memory and core the pod holds at any one moment of its life."""
    peak_mib: dict[int, int] = {}
    peak_core: dict[int, int] = {}
    for moment in running_together(request, assignment):
        mib: dict[int, int] = {}
        core: dict[int, int] = {}
        for wanted, cards in moment:
            for at in cards:
                mib[at] = mib.get(at, 0) + wanted.memory_on(view.cards[at].memory_mib)
                core[at] = core.get(at, 0) + wanted.core_on()
        for at, held in mib.items():
            peak_mib[at] = max(peak_mib.get(at, 0), held)
            peak_core[at] = max(peak_core.get(at, 0), core[at])
    return peak_mib, peak_core


def feasible(view: NodeView, request: PodRequest, assignment: Assignment) -> bool:
    """The rules, restated independently of the search: the node after must hold together."""
    groups: dict[str, tuple[int, ...]] = {}
    whole: set[int] = set()
    app_cards: list[int] = []
    for wanted, cards in zip(request.containers, assignment, strict=True):
        for at in cards:
            card = view.cards[at]
            if not card.healthy:
                return False
            if wanted.exclusive and not card.untouched:
                return False
        if wanted.group and groups.setdefault(wanted.group, cards) != cards:
            return False
        if wanted.exclusive and not wanted.init:
            whole.update(cards)
        if not wanted.init:
            app_cards.extend(cards)
    if any(app_cards.count(at) > 1 for at in whole):
        return False  # a whole card given to one container is nobody else's in the pod
    peak_mib, peak_core = pod_peaks(view, request, assignment)
    if any(
        view.cards[at].free_mib < peak_mib.get(at, 0)
        or view.cards[at].free_core < peak_core.get(at, 0)
        for at in range(len(view.cards))
    ):
        return False
    after = apply_assignment(view, request, assignment)
    return all(
        card.free_mib >= 0
        and card.free_core >= 0
        and card.containers <= DEFAULT_MAX_CONTAINERS_PER_CARD
        for card in after.cards
    )


def small_requests() -> st.SearchStrategy[PodRequest]:
    return gpu_requests().filter(
        lambda r: len(r.containers) <= 2 and all(c.cards <= 2 for c in r.containers)
    )


@pytest.mark.slow
@CI
@given(
    node=folded_nodes(gpu_requests()),
    request=small_requests(),
    name=st.sampled_from(sorted(POLICIES)),
)
def test_the_search_finds_the_best_feasible_placement(
    node: NodeState, request: PodRequest, name: str
) -> None:
    """Pruning loses nothing: brute force over every assignment finds no better score."""
    policy: Policy = POLICIES[name]
    view = node.view
    plan = plan_pod(view, request, policy)
    best = None
    for assignment in placements(view, request):
        if not feasible(view, request, assignment):
            continue
        score = policy.score(view, apply_assignment(view, request, assignment), request, assignment)
        if best is None or score > best:
            best = score
    if any(wanted.init for wanted in request.containers):
        # inits go on the pod's own cards first; the brute force may score other inits higher
        assert (plan is None) is (best is None) or plan is None
        return
    assert (plan is None) is (best is None)
    if plan is not None and best is not None:
        assert plan.score == pytest.approx(best)
        assert feasible(view, request, plan.assignment)


@pytest.mark.slow
@CI
@given(node=folded_nodes(gpu_requests()), request=gpu_requests())
def test_the_same_inputs_give_the_same_placement(node: NodeState, request: PodRequest) -> None:
    for policy in POLICIES.values():
        first = plan_pod(node.view, request, policy)
        again = plan_pod(
            msgspec.json.decode(msgspec.json.encode(node.view), type=NodeView), request, policy
        )
        assert first == again


@CI
@given(node=folded_nodes(gpu_requests()), extra=st.integers(min_value=1, max_value=100_000))
def test_pod_larger_than_every_card_is_never_reserved(node: NodeState, extra: int) -> None:
    request = request_of(max(card.memory_mib for card in node.cards) + extra)
    assert not can_place(node.view, request)
    assert reserve(node, pod_ref("huge"), request, reservation_id="r", at=T0) is None
    verdict = check_fit(node, request, T0)
    assert (verdict.fits, verdict.unresolvable) == (False, True)


@pytest.mark.slow
@CI
@given(node=folded_nodes(gpu_requests()), request=gpu_requests())
def test_a_plan_never_oversubscribes(node: NodeState, request: PodRequest) -> None:
    for policy in POLICIES.values():
        plan = plan_pod(node.view, request, policy)
        if plan is None:
            continue
        assert feasible(node.view, request, plan.assignment)
        for card in plan.after.cards:
            assert 0 <= card.free_mib <= card.memory_mib
            assert 0 <= card.free_core <= FULL_CORE
        # the count is honest: what the pod takes is its peak, no more, no less
        peak_mib, peak_core = pod_peaks(node.view, request, plan.assignment)
        for at, (before, after) in enumerate(zip(node.view.cards, plan.after.cards, strict=True)):
            assert before.free_mib - after.free_mib == peak_mib.get(at, 0)
            assert before.free_core - after.free_core == peak_core.get(at, 0)


@CI
@given(node=folded_nodes(gpu_requests()), request=gpu_requests(), failed=st.booleans())
def test_reserve_then_release_restores_the_node(
    node: NodeState, request: PodRequest, failed: bool
) -> None:
    state = ClusterState({node.name: node})
    event = reserve(node, pod_ref("probe"), request, reservation_id="r-probe", at=T0)
    if event is None:
        return
    reserved = state.apply(event, node.last_seq + 1)
    added = sum(memory_by_card(event.shares).values())
    assert sum(reserved.used_mib.values()) == sum(node.used_mib.values()) + added
    common = {"id": "x", "at": T0, "node": node.name, "pod": pod_ref("probe")}
    undo: AnyEvent = (
        BindFailed(**common, reservation_id="r-probe", reason="404")
        if failed
        else PodReleased(**common, reservation_id="r-probe", reason="deleted")
    )
    after = state.apply(undo, node.last_seq + 2)
    assert node_view(after) == node_view(node)
    assert after.last_seq == node.last_seq + 2


def one_card_requests() -> st.SearchStrategy[PodRequest]:
    """A pod of one app container on one card, in any shape the dialects produce."""
    return container_requests("c0").map(
        lambda wanted: PodRequest(containers=(msgspec.structs.replace(wanted, cards=1),))
    )


@CI
@given(
    node=folded_nodes(gpu_requests()),
    request=one_card_requests(),
    name=st.sampled_from(sorted(POLICIES)),
    max_per_card=st.integers(min_value=1, max_value=DEFAULT_MAX_CONTAINERS_PER_CARD),
)
def test_the_one_card_shortcut_plans_what_the_search_plans(
    node: NodeState, request: PodRequest, name: str, max_per_card: int
) -> None:
    """Same placement, same score, same tie broken the same way, as the general search."""
    policy: Policy = POLICIES[name]
    search = _Search(
        node.view, request, policy, max_per_card=max_per_card, leaf_limit=2048, first_only=False
    )
    search.run()
    assert plan_pod(node.view, request, policy, max_per_card=max_per_card) == search.best


@CI
@given(node=folded_nodes(gpu_requests()), request=one_card_requests(), data=st.data())
def test_one_share_changes_the_node_as_the_general_rule_does(
    node: NodeState, request: PodRequest, data: st.DataObject
) -> None:
    assume(node.view.cards)
    at = data.draw(st.integers(0, len(node.view.cards) - 1))
    assignment = ((at,),)
    assert apply_assignment(node.view, request, assignment) == _with_each_share(
        node.view, request, assignment
    )
