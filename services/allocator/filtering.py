"""Filter and prioritize over the folded state: names in, verdicts and scores out.

This is the extender's hot path (kube-scheduler may send thousands of names per pod),
so the loop reads the fold's precomputed ``NodeState.max_free_mib`` with one dict
lookup per node, and only builds a reason (``core.fit.check_fit``) for rejected nodes,
remembering it for as long as the node's folded state stays the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

import msgspec

from gpushare.core.fit import FitVerdict, check_fit, stale_cutoff
from gpushare.core.placement import score_node
from gpushare.core.requests import PodRequest
from gpushare.core.state import ClusterState, NodeState

INVALID_REQUEST = "invalid_request"


class NodeVerdicts(msgspec.Struct, kw_only=True):
    """One filter call's answer, before it is written in extender/v1 terms."""

    passed: list[str] = msgspec.field(default_factory=list)
    failed: dict[str, str] = msgspec.field(default_factory=dict)
    """Does not fit now; preemption might help."""
    unresolvable: dict[str, str] = msgspec.field(default_factory=dict)
    """Cannot fit whatever is evicted (no inventory, stale, unhealthy, too small)."""
    kinds: dict[str, int] = msgspec.field(default_factory=dict)
    """How many nodes were rejected for each kind of reason (for the metrics)."""

    def reject(self, name: str, verdict: FitVerdict) -> None:
        target = self.unresolvable if verdict.unresolvable else self.failed
        target[name] = verdict.reason
        self.kinds[verdict.kind] = self.kinds.get(verdict.kind, 0) + 1


class Rejection(NamedTuple):
    node: NodeState
    """The folded state the verdict was made on."""
    verdict: FitVerdict


class RejectionMemo:
    """Rejections of fresh nodes, remembered while the node's folded state is unchanged.

    Building a reason costs far more than the fit test, and a busy cluster rejects most
    nodes for every pod. The fold replaces a ``NodeState`` whenever an event changes
    it, so ``rejection.node is node`` proves a remembered verdict still holds; for a
    fresh node ``check_fit`` depends on nothing else but the size asked. Stale nodes
    are never remembered (their reason says for how long the reporter has been silent).
    """

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._size = 0
        self._by_size: dict[int, dict[str, Rejection]] = {}

    def table(self, memory_mib: int) -> dict[str, Rejection]:
        """The rejections remembered for requests of ``memory_mib``, by node name."""
        if self._size >= self.capacity:
            self._by_size.clear()
            self._size = 0
        return self._by_size.setdefault(memory_mib, {})

    def remember(
        self, table: dict[str, Rejection], node: NodeState, request: PodRequest, now: datetime
    ) -> Rejection:
        verdict = check_fit(node, request, now)
        rejection = Rejection(node, verdict)
        self._size += node.name not in table
        table[node.name] = rejection
        return rejection


def filter_nodes(
    state: ClusterState,
    names: Iterable[str],
    request: PodRequest,
    now: datetime,
    memo: RejectionMemo | None = None,
) -> NodeVerdicts:
    """Which of ``names`` have one healthy card with ``request.memory_mib`` free now.

    The loop is the hot path: one dict lookup per node, a staleness cutoff recomputed
    only when the heartbeat period changes (nodes share a handful), and reasons only
    for rejected nodes, remembered while their folded state stays the same.
    """
    need = request.memory_mib
    get_node = state.nodes.get
    memo = memo or RejectionMemo()
    known = memo.table(need)
    verdicts = NodeVerdicts()
    passed = verdicts.passed
    heartbeat, cutoff = -1.0, now
    for name in names:
        node = get_node(name)
        if node is not None and node.inventory_at is not None:
            if node.heartbeat_seconds != heartbeat:
                heartbeat = node.heartbeat_seconds
                cutoff = stale_cutoff(now, heartbeat)
            if node.inventory_at >= cutoff:  # fresh
                if need <= node.max_free_mib:
                    passed.append(name)
                    continue
                rejection = known.get(name)
                if rejection is None or rejection.node is not node:
                    rejection = memo.remember(known, node, request, now)
                verdicts.reject(name, rejection.verdict)
                continue
        _judge_unfresh(verdicts, node or NodeState(name=name), request, now)
    return verdicts


def _judge_unfresh(
    verdicts: NodeVerdicts, node: NodeState, request: PodRequest, now: datetime
) -> None:
    """A node with no inventory or a stale one: ``check_fit`` says why (never memoized)."""
    verdict = check_fit(node, request, now)
    if verdict.fits:  # cannot happen for a stale or unknown node; kept for safety
        verdicts.passed.append(node.name)
    else:
        verdicts.reject(node.name, verdict)


def reject_all(names: Iterable[str], reason: str) -> NodeVerdicts:
    """Every node unresolvable for the same reason (an invalid request fits nowhere)."""
    verdicts = NodeVerdicts()
    verdict = FitVerdict(fits=False, unresolvable=True, reason=reason, kind=INVALID_REQUEST)
    for name in names:
        verdicts.reject(name, verdict)
    return verdicts


def score_nodes(state: ClusterState, names: Iterable[str], request: PodRequest) -> list[int]:
    """0..10 per name, in order: how full the card bind would pick ends up (binpack)."""
    if not request.wants_gpu:
        return [0 for _ in names]
    return [score_node(state.node(name), request) for name in names]
