"""Binpack and spread, at card level and at node level (seed 003).

A card's utilization is ``w × core used + (1 − w) × memory used`` (fractions of the
card), ``w`` being the core weight (seed 003's MGPUWeightOfCore, 20 % by default; 0 for
a pod that asks no core, such as seeds 000/001's memory-only pods).
Card-level binpack prefers the cards that end up fullest, spread the emptiest; the
node level does the same with the mean utilization of all the node's healthy cards.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from gpushare.core.policies.base import MAX_SCORE, Assignment, Score, clamp_score
from gpushare.core.requests import PodRequest
from gpushare.core.view import FULL_CORE, CardView, NodeView

Mode = Literal["binpack", "spread"]
DEFAULT_CORE_WEIGHT = 0.2


def card_utilization(card: CardView, core_weight: float) -> float:
    core = (FULL_CORE - card.free_core) / FULL_CORE
    memory = (card.memory_mib - card.free_mib) / card.memory_mib if card.memory_mib else 1.0
    return core_weight * core + (1 - core_weight) * memory


def node_utilization(view: NodeView, core_weight: float) -> float:
    healthy = [card for card in view.cards if card.healthy]
    if not healthy:
        return 0.0
    return sum(card_utilization(card, core_weight) for card in healthy) / len(healthy)


def touched_cards(assignment: Assignment) -> list[int]:
    return sorted({position for cards in assignment for position in cards})


class ResourcePolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Binpack or spread, chosen separately for cards and for nodes."""

    name: str
    card_mode: Mode
    node_mode: Mode
    core_weight: float = DEFAULT_CORE_WEIGHT
    symmetric: bool = True
    links_matter: bool = False
    cpu_thresholds: tuple[int, ...] | None = ()

    def score(
        self, before: NodeView, after: NodeView, request: PodRequest, assignment: Assignment
    ) -> Score:
        weight = self.core_weight if any(c.core_on() for c in request.containers) else 0.0
        cards = touched_cards(assignment)
        used = [card_utilization(after.cards[at], weight) for at in cards]
        card_value = sum(used) / len(used) if used else 0.0
        node_value = node_utilization(after, weight)
        return Score(
            card=card_value if self.card_mode == "binpack" else -card_value,
            node=node_value if self.node_mode == "binpack" else -node_value,
        )

    def node_score(self, node_value: float) -> int:
        if self.node_mode == "binpack":
            return clamp_score(node_value * MAX_SCORE)
        return clamp_score((1 + node_value) * MAX_SCORE)


def resource_policies(core_weight: float = DEFAULT_CORE_WEIGHT) -> dict[str, ResourcePolicy]:
    """The four combinations, by name."""
    combos: dict[str, tuple[Mode, Mode]] = {
        "binpack": ("binpack", "binpack"),
        "spread": ("spread", "spread"),
        "binpack-cards-spread-nodes": ("binpack", "spread"),
        "spread-cards-binpack-nodes": ("spread", "binpack"),
    }
    return {
        name: ResourcePolicy(name=name, card_mode=card, node_mode=node, core_weight=core_weight)
        for name, (card, node) in combos.items()
    }


BINPACK = ResourcePolicy(name="binpack", card_mode="binpack", node_mode="binpack")
"""Seeds 000/001's policy: fill the fullest card that still holds the pod."""
