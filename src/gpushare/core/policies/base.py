"""The contract every placement policy keeps.

A policy judges one candidate placement of a whole pod on one node: it sees the node
before and after, and says how good the outcome is, as two numbers (higher is better):

* ``card``: how good the choice of cards is *within* the node (bind picks the best);
* ``node``: how good this node is compared with others (prioritize reports it, scaled).

The planner (``core.placement``) enumerates placements and keeps the best; the same
policy object serves the extender, bind and the trace replay.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from gpushare.core.requests import PodRequest
from gpushare.core.view import NodeView

Assignment = tuple[tuple[int, ...], ...]
"""Per container of the request, the positions (in ``NodeView.cards``) of its cards."""

MAX_SCORE = 10
"""kube-scheduler's MaxExtenderPriority; it multiplies by weight and does not clamp."""


class Score(NamedTuple):
    card: float
    node: float


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def symmetric(self) -> bool:
        """Cards in the same state are interchangeable, links between them aside."""
        ...

    @property
    def links_matter(self) -> bool:
        """The score depends on how a multi-card container's cards are linked (NVLink,
        PCIe): on a node whose links are known, the search then tries every combination
        for a pod with such a container, not one per multiset of card states."""
        ...

    @property
    def cpu_thresholds(self) -> tuple[int, ...] | None:
        """The free-CPU levels the score depends on: ``()`` none, ``None`` the exact value.

        A replay shares one placement between nodes whose cards are alike and whose free
        CPU, before and after the pod, falls between the same levels.
        """
        ...

    def score(
        self, before: NodeView, after: NodeView, request: PodRequest, assignment: Assignment
    ) -> Score: ...

    def node_score(self, node_value: float) -> int:
        """``Score.node`` of the best placement on a node, as kube-scheduler's 0..10."""
        ...


def clamp_score(value: float) -> int:
    return max(0, min(MAX_SCORE, round(value)))
