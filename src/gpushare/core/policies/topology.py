"""Topology (seed 004): a container on several cards gets the best-connected set, balanced
against load.

For each multi-card container the value of its card set is the mean pairwise affinity
(NVLink beats one PCIe switch, beats the host bridge, beats crossing sockets; see
``core.view.PATH_AFFINITY``), normalised to 0..1, minus ``load_weight`` times the mean
load the set already carries (seed 004 balances affinity with load rather than chasing
one). Single-card containers are placed by card-level binpack, and nodes are ranked by
the value of what they can offer, then by binpack, so a pod that needs NVLink goes to
a node that still has an NVLinked set free.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

import msgspec

from gpushare.core.policies.base import MAX_SCORE, Assignment, Score, clamp_score
from gpushare.core.policies.resource import DEFAULT_CORE_WEIGHT, card_utilization, touched_cards
from gpushare.core.requests import PodRequest
from gpushare.core.view import PATH_AFFINITY, NodeView

BEST_AFFINITY = PATH_AFFINITY["NVLINK"] + 18 * 6
"""A pair of cards joined by 18 NVLink lanes (NVSwitch systems), the most there is."""


def set_affinity(view: NodeView, cards: tuple[int, ...]) -> float:
    """Mean pairwise affinity of ``cards`` (positions), 0..1; 1 for a single card."""
    if len(cards) < 2:
        return 1.0
    if not view.affinity:
        return 0.0
    pairs = list(combinations(cards, 2))
    total = sum(view.affinity[a][b] for a, b in pairs)
    return min(1.0, total / (len(pairs) * BEST_AFFINITY))


@lru_cache(maxsize=1024)
def _strongest(affinity: tuple[tuple[int, ...], ...]) -> int:
    return max((value for row in affinity for value in row), default=0)


def set_linkage(view: NodeView, cards: tuple[int, ...]) -> float:
    """How well ``cards`` are joined next to what the node offers, 0..1: their mean
    pairwise affinity over the node's best pair's (1: every pair as well linked as the
    best pair, as on an NVSwitch node or a DGX-1 quad); 1 for a single card, 0 where
    the node's links are unknown."""
    if len(cards) < 2:
        return 1.0
    strongest = _strongest(view.affinity) if view.affinity else 0
    if not strongest:
        return 0.0
    pairs = list(combinations(cards, 2))
    return sum(view.affinity[a][b] for a, b in pairs) / (len(pairs) * strongest)


def fully_nvlinked(view: NodeView, cards: tuple[int, ...]) -> bool:
    """Every pair of ``cards`` joined by NVLink (always so for one card)."""
    if len(cards) < 2:
        return True
    if not view.affinity:
        return False
    return all(view.affinity[a][b] >= PATH_AFFINITY["NVLINK"] for a, b in combinations(cards, 2))


class TopologyPolicy(msgspec.Struct, frozen=True, kw_only=True):
    name: str = "topology"
    load_weight: float = 0.5
    core_weight: float = DEFAULT_CORE_WEIGHT
    symmetric: bool = True
    links_matter: bool = True
    cpu_thresholds: tuple[int, ...] | None = ()

    def score(
        self, before: NodeView, after: NodeView, request: PodRequest, assignment: Assignment
    ) -> Score:
        sets = [cards for cards in assignment if len(cards) > 1]
        packed = [
            card_utilization(after.cards[at], self.core_weight) for at in touched_cards(assignment)
        ]
        binpack = sum(packed) / len(packed) if packed else 0.0
        if not sets:
            return Score(card=binpack, node=binpack)
        value = 0.0
        for cards in sets:
            load = sum(card_utilization(before.cards[at], self.core_weight) for at in cards) / len(
                cards
            )
            value += set_affinity(before, cards) - self.load_weight * load
        value /= len(sets)
        # binpack only breaks ties between equally good sets
        return Score(card=value + binpack / 1000, node=value + binpack / 1000)

    def node_score(self, node_value: float) -> int:
        return clamp_score((node_value + self.load_weight) / (1 + self.load_weight) * MAX_SCORE)
