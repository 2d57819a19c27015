"""Which cards a pod's containers get on one node: depth-first search with pruning (seed 003).

Each level of the search is one app container of the pod; a step gives it the cards it
asks for (a combination of ``cards`` distinct cards that each still hold its share,
given what the earlier containers on this path took). A card that cannot hold the
share prunes the branch. Every leaf is a whole placement, scored by the policy; the
best leaf wins, and equal scores keep the first found, so the result is deterministic.

Pruning beyond feasibility: when the policy says cards in the same state are
interchangeable (``symmetric``), a combination whose cards are in the same states as one
already tried at this level is skipped, which makes a node of eight empty cards cost
one try, not eight. Links break that symmetry for a policy whose score reads them
(``links_matter``, seed 004): on a node whose links are known, a pod with a multi-card
container gets every combination tried; a single-card pod, or a node with no links,
keeps the shortcut. ``leaf_limit`` bounds the search on pathological pods.

Init containers run one at a time before the app containers, so each needs its share
free in the node's state *before* the pod, beside the native sidecars started before it
(they never stop); sidecars are searched like app containers. A card holds the larger of
its app and sidecar shares together and each init share with the sidecars before it
(``core.state.memory_by_card``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from itertools import combinations

import msgspec

from gpushare.core.events import PodReserved
from gpushare.core.model import ContainerShare, PodRef
from gpushare.core.peaks import peak_by_key
from gpushare.core.policies.base import Assignment, Policy, Score
from gpushare.core.policies.resource import BINPACK
from gpushare.core.requests import ContainerRequest, PodRequest
from gpushare.core.state import NodeState
from gpushare.core.view import CardView, NodeView

DEFAULT_MAX_CONTAINERS_PER_CARD = 16
"""Seed 003's MGPUMaxContainersPerCard (what the mGPU driver supports)."""
DEFAULT_LEAF_LIMIT = 2048


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """The chosen placement: per container, the card positions; and how good it is."""

    assignment: Assignment
    score: Score
    after: NodeView


def model_accepted(card: CardView, models: tuple[str, ...]) -> bool:
    """``models`` empty, or one of them is the card's model (or part of its product name)."""
    if not models:
        return True
    name = card.model.lower()
    return any(model == card.model or model.lower() in name for model in models)


class _Search:
    """One depth-first search over one node; mutable scratch state lives only here."""

    def __init__(
        self,
        view: NodeView,
        request: PodRequest,
        policy: Policy,
        *,
        max_per_card: int,
        leaf_limit: int,
        first_only: bool,
    ) -> None:
        self.view = view
        self.request = request
        self.policy = policy
        self.max_per_card = max_per_card
        self.leaf_limit = leaf_limit
        self.first_only = first_only
        self.apps = [c for c in request.containers if not c.init]
        self.inits = [c for c in request.containers if c.init]
        self.sidecars_before = _sidecars_before(request)
        self.symmetric = policy.symmetric and not (
            policy.links_matter and view.affinity and any(c.cards > 1 for c in self.apps)
        )
        cards = view.cards
        self.eligible = [card.healthy and model_accepted(card, request.models) for card in cards]
        self.free_mib = [card.free_mib for card in cards]
        self.free_core = [card.free_core for card in cards]
        self.tenants = [card.containers for card in cards]
        self.taken_whole = [False] * len(cards)
        self.used_by_pod = [0] * len(cards)
        self.groups: dict[str, int] = {}
        self.path: list[tuple[int, ...]] = []
        self.leaves = 0
        self.best: Plan | None = None

    def fits(self, at: int, wanted: ContainerRequest) -> bool:
        card = self.view.cards[at]
        if not self.eligible[at] or self.taken_whole[at]:
            return False
        if self.tenants[at] + 1 > self.max_per_card:
            return False
        if wanted.exclusive:
            return card.untouched and self.used_by_pod[at] == 0
        return (
            self.free_mib[at] >= wanted.memory_on(card.memory_mib)
            and self.free_core[at] >= wanted.core_on()
        )

    def take(self, cards: tuple[int, ...], wanted: ContainerRequest, sign: int) -> None:
        for at in cards:
            card = self.view.cards[at]
            self.free_mib[at] -= sign * wanted.memory_on(card.memory_mib)
            self.free_core[at] -= sign * wanted.core_on()
            self.tenants[at] += sign
            self.used_by_pod[at] += sign
            if wanted.exclusive:
                self.taken_whole[at] = sign > 0

    def candidates(self, wanted: ContainerRequest) -> Iterator[tuple[int, ...]]:
        if wanted.group and wanted.group in self.groups:
            at = self.groups[wanted.group]
            if wanted.cards == 1 and self.fits(at, wanted):
                yield (at,)
            return
        fitting = [at for at in range(len(self.view.cards)) if self.fits(at, wanted)]
        seen: set[tuple[tuple[int, int, int, int, str, int], ...]] = set()
        for cards in combinations(fitting, wanted.cards):
            if self.symmetric:
                key = tuple(sorted(self.state_key(at) for at in cards))
                if key in seen:
                    continue
                seen.add(key)
            yield cards

    def state_key(self, at: int) -> tuple[int, int, int, int, str, int]:
        card = self.view.cards[at]
        return (
            card.memory_mib,
            self.free_mib[at],
            self.free_core[at],
            self.tenants[at],
            card.model,
            self.used_by_pod[at],
        )

    def run(self, level: int = 0) -> None:
        if self.leaves >= self.leaf_limit or (self.first_only and self.best is not None):
            return
        if level == len(self.apps):
            self.leaf()
            return
        wanted = self.apps[level]
        for cards in self.candidates(wanted):
            self.take(cards, wanted, +1)
            new_group = bool(wanted.group) and wanted.group not in self.groups
            if new_group:
                self.groups[wanted.group] = cards[0]
            self.path.append(cards)
            self.run(level + 1)
            self.path.pop()
            if new_group:
                del self.groups[wanted.group]
            self.take(cards, wanted, -1)
            if self.leaves >= self.leaf_limit or (self.first_only and self.best is not None):
                return

    def leaf(self) -> None:
        inits = self.place_inits()
        if inits is None:
            return
        self.leaves += 1
        assignment = self.order(tuple(self.path), inits)
        after = apply_assignment(self.view, self.request, assignment)
        score = self.policy.score(self.view, after, self.request, assignment)
        if self.best is None or score > self.best.score:
            self.best = Plan(assignment=assignment, score=score, after=after)

    def place_inits(self) -> list[tuple[int, ...]] | None:
        """Each init container on cards free before the pod, less what the sidecars
        started before it hold there (they run beside it), the pod's own cards first."""
        placed: list[tuple[int, ...]] = []
        tenants = list(self.tenants)  # init containers count against the cap too
        groups = dict(self.groups)
        for wanted, sidecars in zip(self.inits, self.sidecars_before, strict=True):
            cards = self.view.cards
            side_mib, side_core = self.held_by(sidecars)
            fitting = [
                at
                for at in range(len(cards))
                if self.eligible[at]
                and tenants[at] + 1 <= self.max_per_card
                and (
                    cards[at].untouched
                    if wanted.exclusive
                    else cards[at].free_mib - side_mib[at] >= wanted.memory_on(cards[at].memory_mib)
                    and cards[at].free_core - side_core[at] >= wanted.core_on()
                )
            ]
            if wanted.group and wanted.group in groups:
                fitting = [at for at in fitting if at == groups[wanted.group]]
            if wanted.exclusive:
                fitting = [at for at in fitting if self.used_by_pod[at] == 0]
            fitting.sort(key=lambda at: (self.used_by_pod[at] == 0, at))
            if len(fitting) < wanted.cards:
                return None
            chosen = tuple(sorted(fitting[: wanted.cards]))
            for at in chosen:
                tenants[at] += 1
            if wanted.group:
                groups.setdefault(wanted.group, chosen[0])
            placed.append(chosen)
        return placed

    def held_by(self, levels: tuple[int, ...]) -> tuple[list[int], list[int]]:
        """Memory and core per card that the app-level containers at ``levels`` (the
        sidecars an init container starts beside) take on this path."""
        mib = [0] * len(self.view.cards)
        core = [0] * len(self.view.cards)
        for level in levels:
            wanted = self.apps[level]
            for at in self.path[level]:
                mib[at] += wanted.memory_on(self.view.cards[at].memory_mib)
                core[at] += wanted.core_on()
        return mib, core

    def order(self, apps: tuple[tuple[int, ...], ...], inits: list[tuple[int, ...]]) -> Assignment:
        """Cards per container in the request's own container order."""
        app_cards, init_cards = iter(apps), iter(inits)
        return tuple(
            next(init_cards) if wanted.init else next(app_cards)
            for wanted in self.request.containers
        )


def apply_assignment(view: NodeView, request: PodRequest, assignment: Assignment) -> NodeView:
    """The node as it would be with ``request`` placed as ``assignment`` says."""
    one_card = len(assignment) == len(request.containers) == 1 and len(assignment[0]) == 1
    if one_card and not request.containers[0].init:
        return _with_one_share(view, request, assignment[0][0])
    return _with_each_share(view, request, assignment)


def _sidecars_before(request: PodRequest) -> list[tuple[int, ...]]:
    """Per init container, the search levels (places among the app-level containers) of
    the sidecars started before it: the containers it runs beside (KEP-753)."""
    levels: list[int] = []
    before: list[tuple[int, ...]] = []
    level = 0
    for wanted in request.containers:
        if wanted.init:
            before.append(tuple(levels))
            continue
        if wanted.sidecar:
            levels.append(level)
        level += 1
    return before


def _with_each_share(view: NodeView, request: PodRequest, assignment: Assignment) -> NodeView:
    """:func:`apply_assignment` of any pod: per card, the pod's peak as the kubelet runs
    it (:func:`~gpushare.core.peaks.peak_by_key`): app containers and sidecars add up,
    each init container counts beside the sidecars started before it, the larger wins."""
    placed = [
        (at, wanted)
        for wanted, cards in zip(request.containers, assignment, strict=True)
        for at in cards
    ]
    mib = peak_by_key(
        (at, wanted.init, wanted.memory_on(view.cards[at].memory_mib)) for at, wanted in placed
    )
    core = peak_by_key((at, wanted.init, wanted.core_on()) for at, wanted in placed)
    tenants = Counter(at for at, _ in placed)
    after = list(view.cards)
    for at, count in tenants.items():
        card = after[at]
        after[at] = msgspec.structs.replace(
            card,
            free_mib=card.free_mib - mib[at],
            free_core=card.free_core - core[at],
            containers=card.containers + count,
        )
    return _with_cards(view, request, tuple(after))


def _with_one_share(view: NodeView, request: PodRequest, at: int) -> NodeView:
    """:func:`apply_assignment` of a pod whose one container takes the card at ``at``."""
    wanted = request.containers[0]
    card = view.cards[at]
    taken = msgspec.structs.replace(
        card,
        free_mib=card.free_mib - wanted.memory_on(card.memory_mib),
        free_core=card.free_core - wanted.core_on(),
        containers=card.containers + 1,
    )
    return _with_cards(view, request, (*view.cards[:at], taken, *view.cards[at + 1 :]))


def _with_cards(view: NodeView, request: PodRequest, cards: tuple[CardView, ...]) -> NodeView:
    """``view`` with its cards as the pod leaves them, and its host CPU and memory less
    the pod's, where the view keeps their account."""
    free_cpu = view.free_cpu_milli
    free_host = view.free_host_memory_mib
    return msgspec.structs.replace(
        view,
        cards=cards,
        free_cpu_milli=None if free_cpu is None else free_cpu - request.cpu_milli,
        free_host_memory_mib=None if free_host is None else free_host - request.host_memory_mib,
    )


def host_fits(view: NodeView, request: PodRequest) -> bool:
    """CPU and host memory, where this view keeps their account."""
    cpu_ok = view.free_cpu_milli is None or view.free_cpu_milli >= request.cpu_milli
    memory = view.free_host_memory_mib
    return cpu_ok and (memory is None or memory >= request.host_memory_mib)


def plan_pod(
    view: NodeView,
    request: PodRequest,
    policy: Policy,
    *,
    max_per_card: int = DEFAULT_MAX_CONTAINERS_PER_CARD,
    leaf_limit: int = DEFAULT_LEAF_LIMIT,
) -> Plan | None:
    """The policy's best placement of ``request`` on the node, or ``None`` if none fits."""
    if not host_fits(view, request):
        return None
    if _one_container_on_one_card(request):
        return _plan_one_card(view, request, policy, max_per_card, leaf_limit)
    search = _Search(
        view, request, policy, max_per_card=max_per_card, leaf_limit=leaf_limit, first_only=False
    )
    search.run()
    return search.best


def _one_container_on_one_card(request: PodRequest) -> bool:
    containers = request.containers
    return len(containers) == 1 and containers[0].cards == 1 and not containers[0].init


def _plan_one_card(
    view: NodeView, request: PodRequest, policy: Policy, max_per_card: int, leaf_limit: int
) -> Plan | None:
    """:class:`_Search`'s answer for the commonest pod, one container on one card, without
    its machinery: each card that holds the share is one leaf, tried in card order, cards
    in the same state once each (``symmetric``: links only matter for several cards)."""
    seen: set[tuple[int, int, int, int, str]] = set()
    best: Plan | None = None
    for at, card in enumerate(view.cards):
        if not _holds_one_share(card, request, max_per_card):
            continue
        if policy.symmetric:
            key = (card.memory_mib, card.free_mib, card.free_core, card.containers, card.model)
            if key in seen:
                continue
            seen.add(key)
        if leaf_limit <= 0:
            break
        leaf_limit -= 1
        assignment = ((at,),)
        after = apply_assignment(view, request, assignment)
        score = policy.score(view, after, request, assignment)
        if best is None or score > best.score:
            best = Plan(assignment=assignment, score=score, after=after)
    return best


def with_placed(
    view: NodeView,
    requests: Iterable[PodRequest],
    policy_for: Callable[[PodRequest], Policy],
    *,
    max_per_card: int = DEFAULT_MAX_CONTAINERS_PER_CARD,
    planned: Iterable[Assignment | None] = (),
) -> NodeView:
    """The node as it would be with each of ``requests`` placed in turn: on the cards
    ``planned`` for it (in the same order; ``None`` or missing: none) where they still
    hold it (:func:`placed_as`), else where its policy places it best; one that no
    longer fits is left out (bind would refuse it)."""
    plans = iter(planned)
    for request in requests:
        assignment = next(plans, None)
        kept = None if assignment is None else placed_as(view, request, assignment, max_per_card)
        if kept is not None:
            view = kept
            continue
        plan = plan_pod(view, request, policy_for(request), max_per_card=max_per_card)
        if plan is not None:
            view = plan.after
    return view


def placed_as(
    view: NodeView,
    request: PodRequest,
    assignment: Assignment,
    max_per_card: int = DEFAULT_MAX_CONTAINERS_PER_CARD,
) -> NodeView | None:
    """The node with ``request`` placed as ``assignment`` says (a plan made on another
    view of this node), or ``None`` when the pod does not fit there that way.

    Checked for the commonest pod, one container on one card, with the check
    :func:`_plan_one_card` makes of each card; any other pod is ``None``, to be planned
    afresh."""
    at = _planned_card(view, request, assignment, max_per_card)
    return None if at is None else _with_one_share(view, request, at)


def _planned_card(
    view: NodeView, request: PodRequest, assignment: Assignment, max_per_card: int
) -> int | None:
    """The card :func:`placed_as` would place ``request`` on, without placing it."""
    if not (_one_container_on_one_card(request) and len(assignment) == 1):
        return None
    (cards,) = assignment
    if len(cards) != 1 or not 0 <= cards[0] < len(view.cards) or not host_fits(view, request):
        return None
    at = cards[0]
    return at if _holds_one_share(view.cards[at], request, max_per_card) else None


def _holds_one_share(card: CardView, request: PodRequest, max_per_card: int) -> bool:
    """Whether ``card`` can take the one container of a one-card ``request``."""
    wanted = request.containers[0]
    if not card.healthy or card.containers + 1 > max_per_card:
        return False
    if wanted.exclusive:
        if not card.untouched:
            return False
    elif card.free_mib < wanted.memory_on(card.memory_mib) or card.free_core < wanted.core_on():
        return False
    return model_accepted(card, request.models)


def can_place(
    view: NodeView, request: PodRequest, *, max_per_card: int = DEFAULT_MAX_CONTAINERS_PER_CARD
) -> bool:
    """Whether any placement fits (stops at the first)."""
    if not host_fits(view, request):
        return False
    search = _Search(
        view, request, _FIRST_FIT, max_per_card=max_per_card, leaf_limit=1, first_only=True
    )
    search.run()
    return search.best is not None


class _FirstFit(msgspec.Struct, frozen=True):
    name: str = "first-fit"
    symmetric: bool = True
    links_matter: bool = False
    cpu_thresholds: tuple[int, ...] | None = ()

    def score(
        self, before: NodeView, after: NodeView, request: PodRequest, assignment: Assignment
    ) -> Score:
        return Score(0.0, 0.0)

    def node_score(self, node_value: float) -> int:
        return 0


_FIRST_FIT = _FirstFit()


def plan_shares(
    node: NodeState, request: PodRequest, assignment: Assignment
) -> tuple[ContainerShare, ...]:
    """The per-card shares a plan gives each container, resolved against the real cards."""
    shares: list[ContainerShare] = []
    for wanted, positions in zip(request.containers, assignment, strict=True):
        for at in positions:
            card = node.cards[at]
            shares.append(
                ContainerShare(
                    container=wanted.container,
                    card_index=card.index,
                    card_uuid=card.uuid,
                    memory_mib=wanted.memory_on(card.memory_mib),
                    core_percent=wanted.core_on(),
                    init=wanted.init,
                    sidecar=wanted.sidecar,
                )
            )
    return tuple(shares)


def reserve(
    node: NodeState,
    pod: PodRef,
    request: PodRequest,
    policy: Policy = BINPACK,
    *,
    reservation_id: str,
    at: datetime,
    max_per_card: int = DEFAULT_MAX_CONTAINERS_PER_CARD,
    pod_created_at: datetime | None = None,
    reserved_by: str = "",
    planned: Assignment | None = None,
) -> PodReserved | None:
    """The reservation to append for ``pod`` on ``node``, or ``None`` if nothing fits (or
    the node's cards are handed out through DRA, not by us).

    ``planned``: the cards the pod was planned on when it was filtered, with the pods
    bound to the node before it placed where they were planned too. Kept where they still
    hold it, so that the pods filtered after it, judged with it there, find the cards
    they were judged on whatever the order their binds come in; otherwise the policy
    plans afresh."""
    if node.front_door != "extender":
        return None
    if planned is not None and _planned_card(node.view, request, planned, max_per_card) is not None:
        assignment = planned
    else:
        plan = plan_pod(node.view, request, policy, max_per_card=max_per_card)
        if plan is None:
            return None
        assignment = plan.assignment
    return PodReserved(
        id=reservation_id,
        at=at,
        node=node.name,
        pod=pod,
        shares=plan_shares(node, request, assignment),
        pod_created_at=pod_created_at,
        policy=policy.name,
        reserved_by=reserved_by,
    )
