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


class TopologyPolicy(msgspec.Struct, frozen=True, kw_only=True):
    name: str = "topology"
    load_weight: float = 0.5
    core_weight: float = DEFAULT_CORE_WEIGHT
    symmetric: bool = False
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
