"""Filter and prioritize over the folded state: names in, verdicts and scores out.

This is the extender's hot path (kube-scheduler may send thousands of names per pod),
so the loop does one dict lookup per node, reads the fold's precomputed
``NodeState.max_free_mib`` for memory-only requests, and otherwise searches a node
(``core.fit.check_fit``) only when its folded state changed since the last pod of the
same shape, remembering the verdict and its reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import NamedTuple

import msgspec
import numpy as np

from gpushare.allocator.fit_index import FitIndex
from gpushare.core.fit import FitVerdict, check_fit, stale_cutoff
from gpushare.core.placement import DEFAULT_MAX_CONTAINERS_PER_CARD, plan_pod
from gpushare.core.policies import Policy
from gpushare.core.requests import PodRequest
from gpushare.core.state import ClusterState, NodeState
from gpushare.core.view import NodeView

INVALID_REQUEST = "invalid_request"
RESERVED_ELSEWHERE = "reserved_elsewhere"


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
    """Verdicts on fresh nodes, remembered while the node's folded state is unchanged.

    The fold replaces a ``NodeState`` whenever an event changes it, so
    ``rejection.node is node`` proves a remembered verdict still holds; for a fresh node
    ``check_fit`` depends on nothing else but the request's shape. Stale nodes are never
    remembered (their reason says for how long the reporter has been silent).
    """

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._size = 0
        self._by_shape: dict[tuple[object, ...], dict[str, Rejection]] = {}

    def table(self, request: PodRequest) -> dict[str, Rejection]:
        """The verdicts remembered for requests shaped like ``request``, by node name."""
        if self._size >= self.capacity:
            self._by_shape.clear()
            self._size = 0
        return self._by_shape.setdefault(request.shape, {})

    def remember(
        self,
        table: dict[str, Rejection],
        node: NodeState,
        request: PodRequest,
        now: datetime,
        max_per_card: int,
    ) -> Rejection:
        verdict = check_fit(node, request, now, max_per_card=max_per_card)
        rejection = Rejection(node, verdict)
        self._size += node.name not in table
        table[node.name] = rejection
        return rejection


def filter_nodes(
    state: ClusterState,
    names: Sequence[str],
    request: PodRequest,
    now: datetime,
    memo: RejectionMemo | None = None,
    *,
    max_per_card: int = DEFAULT_MAX_CONTAINERS_PER_CARD,
    index: FitIndex | None = None,
) -> NodeVerdicts:
    """Which of ``names`` can hold ``request`` now, and why the others cannot.

    Seeds 000/001's memory-only requests first go through ``index`` (every name at once,
    in arrays); the names it does not pass, and every other request, through the loop:
    one dict lookup per node, a staleness cutoff recomputed only when the heartbeat period
    changes (nodes share a handful), the fold's precomputed most-free card, and a search
    (``core.fit``) only for nodes whose state changed since the last pod of this shape.
    """
    memo = memo or RejectionMemo()
    if index is None or not request.memory_only:
        return _judge(state, names, request, now, memo=memo, max_per_card=max_per_card)
    fits = index.passing(state, names, request.memory_mib, max_per_card, now)
    if fits.all():
        return NodeVerdicts(passed=list(names))
    rest = np.flatnonzero(~fits)
    left = [names[at] for at in rest.tolist()]
    verdicts = _judge(state, left, request, now, memo=memo, max_per_card=max_per_card)
    if verdicts.passed:  # the exact checks passed some: keep the caller's order
        also = set(verdicts.passed)
        fits[rest[[name in also for name in left]]] = True
    verdicts.passed = [names[at] for at in np.flatnonzero(fits).tolist()]
    return verdicts


def _judge(
    state: ClusterState,
    names: Iterable[str],
    request: PodRequest,
    now: datetime,
    *,
    memo: RejectionMemo,
    max_per_card: int,
) -> NodeVerdicts:
    need = request.memory_mib if request.memory_only else -1
    get_node = state.nodes.get
    known = memo.table(request)
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
                if 0 <= need <= node.max_free_mib and node.busiest_card < max_per_card:
                    passed.append(name)
                    continue
                rejection = known.get(name)
                if rejection is None or rejection.node is not node:
                    rejection = memo.remember(known, node, request, now, max_per_card)
                if rejection.verdict.fits:
                    passed.append(name)
                else:
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


def only_the_holder(names: Iterable[str], holder: str, reservation_id: str) -> NodeVerdicts:
    """A pod that already holds a reservation not bound yet (kube-scheduler gave up on
    its bind while the binder was still at it, and tries again): only the node holding
    it passes, where bind waits for that reservation's binding. Anywhere else bind
    would refuse it while the reservation stands, pod after retried pod."""
    verdicts = NodeVerdicts()
    verdict = FitVerdict(
        fits=False,
        unresolvable=True,
        reason=f"the pod holds reservation {reservation_id} on node {holder}, not bound yet: "
        "it can go there only",
        kind=RESERVED_ELSEWHERE,
    )
    for name in names:
        if name == holder:
            verdicts.passed.append(name)
        else:
            verdicts.reject(name, verdict)
    return verdicts


class ShapeScores(NamedTuple):
    """One policy's scores for one request shape."""

    by_node: dict[str, float]
    """Values (``Score.node``) by node name, made on the folded state in :attr:`made_on`."""
    made_on: dict[str, NodeState]
    """The folded state each node's score was made on. Two dicts rather than one of
    (state, score) pairs: a pair is one more object for the garbage collector to walk,
    and 10,000 nodes scored for a few shapes made the allocator's young collections
    walk 100,000 of them (20-30 ms pauses, the tail of ``make bench``'s binds)."""
    by_view: dict[NodeView, float]
    """By what placement sees of a node: alike nodes (every empty node of a model, say)
    share one plan."""


class ListValues(NamedTuple):
    """The values of one call, by position in its list of names."""

    names: list[str]
    values: list[float]
    at: int
    """The change log's position when they were made."""
    policy: Policy
    positions: dict[str, int]
    """Position by name."""
    nodes: Mapping[str, NodeState]
    """The fold's map of nodes they were made on: one folded anew in bulk (at start)
    replaces it, unseen by the change log."""


class ChangeLog:
    """The names of the nodes the fold changed, in order: what tells a remembered list of
    values which of its nodes to value again (kube-scheduler sends the same names pod
    after pod, and one pod changes one node)."""

    LIMIT = 65_536
    """Names kept; past it the log starts over and every remembered list is redone."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._base = 0
        self.attached = False
        """Whether :meth:`listener` was handed out: until then nothing feeds the log."""

    def listener(self) -> Callable[[int, object, NodeState], None]:
        """The follower listener that feeds this log (lists are remembered from then)."""
        self.attached = True
        return self._changed

    def _changed(self, seq: int, event: object, node: NodeState) -> None:
        if len(self._names) >= self.LIMIT:
            self._base += len(self._names)
            self._names = []
        self._names.append(node.name)

    @property
    def position(self) -> int:
        return self._base + len(self._names)

    def since(self, position: int) -> list[str] | None:
        """The names changed after ``position``; None when the log no longer reaches it."""
        if position < self._base:
            return None
        return self._names[position - self._base :]


class ScoreMemo:
    """Scores on nodes, remembered while the node's folded state is unchanged.

    A score depends only on the node's placement view, the request's shape and the
    policy object (a workload-aware policy is a new object when its workload estimate
    moves), so ``entry.node is node`` proves a remembered score still holds, exactly as
    for :class:`RejectionMemo` (the fold invalidates a node by replacing its
    ``NodeState``), and nodes whose views are equal share a score.

    A policy replaced under the same name takes over node by node: its predecessor's
    tables are kept (one generation), and a call plans at most ``replan_budget`` nodes
    that still hold a valid score of the predecessor, answering the rest with that score
    until a later call gets to them. So a rebuilt workload estimate costs a few calls a
    little each instead of one call a plan of every node; a node that changed, or was
    never scored, is always planned with the current policy.
    """

    def __init__(self, capacity: int = 500_000, replan_budget: int = 32) -> None:
        self.capacity = capacity
        self.replan_budget = replan_budget
        self._size = 0
        self._policies: dict[str, Policy] = {}
        self._by_key: dict[tuple[str, tuple[object, ...]], ShapeScores] = {}
        self._previous: dict[tuple[str, tuple[object, ...]], ShapeScores] = {}
        self._lists: dict[tuple[str, tuple[object, ...]], ListValues] = {}
        self.changes = ChangeLog()
        """Fed by the fold (:meth:`ChangeLog.listener`): until then no list is
        remembered, since nothing would say which of its nodes changed."""

    def remembered(
        self,
        request: PodRequest,
        policy: Policy,
        names: list[str],
        nodes: Mapping[str, NodeState],
    ) -> tuple[ListValues, list[str]] | None:
        """The values of the last call on an equal list of names with this policy, and
        the names among them the fold changed since; None when there is none to go by."""
        if not self.changes.attached:
            return None
        last = self._lists.get((policy.name, request.shape))
        if last is None or last.policy is not policy or last.nodes is not nodes:
            return None
        changed = self.changes.since(last.at)
        if changed is None or last.names != names:
            return None
        positions = last.positions
        return last, [name for name in dict.fromkeys(changed) if name in positions]

    def keep(
        self,
        request: PodRequest,
        policy: Policy,
        names: list[str],
        values: list[float],
        nodes: Mapping[str, NodeState],
    ) -> None:
        """Remember a call's values (a copy: the caller may change its own)."""
        if self.changes.attached:
            positions = {name: at for at, name in enumerate(names)}
            self._lists[policy.name, request.shape] = ListValues(
                names, list(values), self.changes.position, policy, positions, nodes
            )

    def refreshed(
        self, request: PodRequest, last: ListValues, values: list[float] | None = None
    ) -> None:
        """``last`` as of now, with ``values`` (a copy) when some changed."""
        kept = last.values if values is None else list(values)
        self._lists[last.policy.name, request.shape] = last._replace(
            values=kept, at=self.changes.position
        )

    def table(self, request: PodRequest, policy: Policy) -> ShapeScores:
        """The scores remembered for ``policy`` and requests shaped like ``request``."""
        name = policy.name
        if self._policies.get(name) is not policy or self._size >= self.capacity:
            if self._size >= self.capacity:
                self._by_key.clear()
                self._previous.clear()
                self._lists.clear()
                self._size = 0
            else:
                self._retire(name)
            self._policies[name] = policy
        found = self._by_key.get((name, request.shape))
        if found is None:
            found = self._by_key[name, request.shape] = ShapeScores({}, {}, {})
        return found

    def previous(self, request: PodRequest, policy: Policy) -> ShapeScores | None:
        """The scores of the policy ``policy`` replaced, for this shape (None: none)."""
        return self._previous.get((policy.name, request.shape))

    def _retire(self, policy_name: str) -> None:
        for key in [key for key in self._previous if key[0] == policy_name]:
            table = self._previous.pop(key)
            self._size -= len(table.by_node) + len(table.by_view)
        for key in [key for key in self._by_key if key[0] == policy_name]:
            self._previous[key] = self._by_key.pop(key)

    def grew(self, count: int) -> None:
        self._size += count


NO_PLAN = float("-inf")
"""A node's value when no placement of the request fits it."""


def node_values(
    state: ClusterState,
    names: Iterable[str],
    request: PodRequest,
    policy: Policy,
    *,
    max_per_card: int = DEFAULT_MAX_CONTAINERS_PER_CARD,
    memo: ScoreMemo | None = None,
) -> list[float]:
    """Per name, in order: the policy's value (``Score.node``, higher is better) of the
    placement bind would make there; :data:`NO_PLAN` where none fits or the node is not
    in the fold.

    A list equal to the last one valued with this policy and shape (kube-scheduler sends
    the same names pod after pod) costs the nodes the fold changed since, when the memo
    is fed the fold's changes. Otherwise only nodes whose folded state changed since this
    shape was last valued are looked at again, and only views never valued before are
    planned; the rest is one dict lookup and an identity check per node."""
    memo = memo or ScoreMemo()
    listed = names if isinstance(names, list) else list(names)
    found = memo.remembered(request, policy, listed, state.nodes)
    if found is not None:
        last, changed = found
        if not changed:
            memo.refreshed(request, last)
            return list(last.values)
        values = list(last.values)
        fresh, deferred = _node_values(
            state, changed, request, policy, max_per_card=max_per_card, memo=memo
        )
        for name, value in zip(changed, fresh, strict=True):
            values[last.positions[name]] = value
        if not deferred:
            memo.refreshed(request, last, values)
        return values
    values, deferred = _node_values(
        state, listed, request, policy, max_per_card=max_per_card, memo=memo
    )
    if not deferred:  # a value deferred to a later call must be looked at again
        memo.keep(request, policy, listed, values, state.nodes)
    return values


def _node_values(
    state: ClusterState,
    names: Iterable[str],
    request: PodRequest,
    policy: Policy,
    *,
    max_per_card: int,
    memo: ScoreMemo,
) -> tuple[list[float], bool]:
    """The values, and whether any is a predecessor policy's, deferred to a later call
    by the replan budget."""
    by_node, made_on, by_view = memo.table(request, policy)
    previous = memo.previous(request, policy)
    budget = memo.replan_budget
    get_node = state.nodes.get
    values = []
    added = deferred = 0
    for name in names:
        node = get_node(name)
        if node is None:  # no inventory: no cards to place on (filter refused it)
            values.append(NO_PLAN)
            continue
        if made_on.get(name) is node:
            values.append(by_node[name])
            continue
        value = by_view.get(node.view)
        if value is None and previous is not None:
            if budget <= 0 and previous.made_on.get(name) is node:
                values.append(previous.by_node[name])  # until a later call replans it
                deferred += 1
                continue
            budget -= 1
        if value is None:
            plan = plan_pod(node.view, request, policy, max_per_card=max_per_card)
            value = by_view[node.view] = NO_PLAN if plan is None else plan.score.node
            added += 1
        added += name not in by_node
        by_node[name] = value
        made_on[name] = node
        values.append(value)
    memo.grew(added)
    return values, deferred > 0


def kube_scores(values: Iterable[float], policy: Policy) -> list[int]:
    """:func:`node_values` as kube-scheduler's 0..10 (0 where nothing fits)."""
    scale: dict[float, int] = {NO_PLAN: 0}
    scores = []
    for value in values:
        score = scale.get(value)
        if score is None:
            score = scale[value] = policy.node_score(value)
        scores.append(score)
    return scores


def score_nodes(
    state: ClusterState,
    names: Iterable[str],
    request: PodRequest,
    policy: Policy,
    *,
    max_per_card: int = DEFAULT_MAX_CONTAINERS_PER_CARD,
    memo: ScoreMemo | None = None,
) -> list[int]:
    """0..10 per name, in order: the policy's value of the placement bind would make there."""
    if not request.wants_gpu:
        return [0 for _ in names]
    values = node_values(state, names, request, policy, max_per_card=max_per_card, memo=memo)
    return kube_scores(values, policy)


def best_at(values: Sequence[float]) -> int | None:
    """The position of the highest value, the first of equals (kube-scheduler's order,
    which it rotates from pod to pod); None when no node has a placement."""
    best = max(values, default=NO_PLAN)
    return None if best == NO_PLAN else values.index(best)


def ranked_first(values: Sequence[float], limit: int) -> list[int]:
    """The positions of the ``limit`` highest values (every one when there are fewer), in
    their order; which of equals at the cut is kept is not defined."""
    if len(values) <= limit:
        return list(range(len(values)))
    array = np.fromiter(values, dtype=float, count=len(values))
    kept: list[int] = np.argpartition(-array, limit - 1)[:limit].tolist()
    return sorted(kept)
