"""kube-scheduler's DRA allocator as a policy: the first card that fits.

For a DRA claim, kube-scheduler's allocator takes the first device that fits, in slice
order (card index), and no scoring plugin looks at the cards. What gpushare can still
choose is the node: its extender's prioritize ranks nodes by what our policy makes of
the placement the scheduler *will* make there (:class:`FirstFitCards` with ``nodes``).
With no ``nodes`` it models the scheduler alone (least allocated first, as
``NodeResourcesFit``'s default), for the trace replay (``docs/dra.md``).
"""

from __future__ import annotations

import msgspec

from gpushare.core.policies.base import MAX_SCORE, Assignment, Policy, Score, clamp_score
from gpushare.core.policies.resource import node_utilization
from gpushare.core.requests import PodRequest
from gpushare.core.view import NodeView


class FirstFitCards(msgspec.Struct, frozen=True, kw_only=True):
    """kube-scheduler's DRA allocator: it takes the first device that fits, in slice order
    (card index), and no scoring plugin looks at the cards; the node is ranked by
    ``nodes`` (gpushare's prioritize, on the placement the scheduler will make) or, with
    none, least-allocated first (kube-scheduler's default ``NodeResourcesFit``)."""

    name: str
    nodes: Policy | None = None
    symmetric: bool = False
    links_matter: bool = False
    cpu_thresholds: tuple[int, ...] | None = ()

    def score(
        self, before: NodeView, after: NodeView, request: PodRequest, assignment: Assignment
    ) -> Score:
        positions = sorted(at for cards in assignment for at in cards)
        card = -float(sum(at * len(before.cards) ** i for i, at in enumerate(positions)))
        if self.nodes is not None:
            return Score(card=card, node=self.nodes.score(before, after, request, assignment).node)
        return Score(card=card, node=-node_utilization(after, 0.0))

    def node_score(self, node_value: float) -> int:
        if self.nodes is not None:
            return self.nodes.node_score(node_value)
        return clamp_score((1 + node_value) * MAX_SCORE)
