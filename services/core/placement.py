"""Which card a pod gets (binpack), and how much a node is worth to kube-scheduler.

Binpack (seeds 000/001): among the healthy cards with enough free memory, the one with
the least free memory; ties go to the lowest index. ``score_node`` scores a node by how
full that very card ends up, so prioritize and bind agree on the choice.
"""

from __future__ import annotations

from datetime import datetime

from gpushare.core.events import PodReserved
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.requests import PodRequest
from gpushare.core.state import NodeState

MAX_SCORE = 10
"""kube-scheduler's MaxExtenderPriority; it multiplies by weight × 10 and does not clamp."""

BINPACK = "binpack"


def choose_card(node: NodeState, request: PodRequest) -> Card | None:
    """The healthy card with the least free memory that still holds the whole pod."""
    need = request.memory_mib
    best: Card | None = None
    best_free = 0
    for card in node.cards:
        if not card.healthy:
            continue
        free = node.free_mib(card)
        if free < need:
            continue
        if best is None or (free, card.index) < (best_free, best.index):
            best, best_free = card, free
    return best


def score_node(node: NodeState, request: PodRequest) -> int:
    """0..10: how full the chosen card would be after placing the pod (10 = exactly full)."""
    card = choose_card(node, request)
    if card is None or card.memory_mib <= 0:
        return 0
    used_after = card.memory_mib - node.free_mib(card) + request.memory_mib
    return min(MAX_SCORE, (used_after * MAX_SCORE) // card.memory_mib)


def plan_shares(card: Card, request: PodRequest) -> tuple[ContainerShare, ...]:
    return tuple(
        ContainerShare(
            container=wanted.container,
            card_index=card.index,
            card_uuid=card.uuid,
            memory_mib=wanted.memory_mib,
            init=wanted.init,
        )
        for wanted in request.containers
    )


def reserve(
    node: NodeState,
    pod: PodRef,
    request: PodRequest,
    *,
    reservation_id: str,
    at: datetime,
    pod_created_at: datetime | None = None,
    reserved_by: str = "",
) -> PodReserved | None:
    """The reservation to append for ``pod`` on ``node``, or ``None`` if no card fits."""
    card = choose_card(node, request)
    if card is None:
        return None
    return PodReserved(
        id=reservation_id,
        at=at,
        node=node.name,
        pod=pod,
        shares=plan_shares(card, request),
        pod_created_at=pod_created_at,
        policy=BINPACK,
        reserved_by=reserved_by,
    )
