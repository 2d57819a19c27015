"""One replay: pods arrive in order, each placed by a core policy or failed.

The decision for one pod is exactly the extender's: every node that passes the filters
(host CPU and memory as kube-scheduler checks them, card model, the GPU shape) gets
the policy's best plan from ``core.placement.plan_pod``; the node with the best score
wins, ties going to a seeded node order (the simulator's random node-name prefix).

What makes it fast is sharing, never approximation: nodes whose cards are in the same
state (by position) and whose free CPU lies between the same of the policy's
``cpu_thresholds`` get the same plan, so one search serves them all, and a plan is kept
for the next pod of the same shape until its node changes. The filters run over all
nodes at once with numpy.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from gpushare.core.placement import apply_assignment, plan_pod
from gpushare.core.policies import Assignment, Policy
from gpushare.core.policies.fragmentation import MILLI, free_milli
from gpushare.core.policies.topology import fully_nvlinked
from gpushare.core.requests import PodRequest
from gpushare.core.view import CardView, NodeView
from gpushare.tracebench.protocol import Curve
from gpushare.tracebench.trace import CARD_MEMORY, TraceNode, TracePod

IntArray = npt.NDArray[np.int64]
Progress = Callable[[int, int], None]

_CPU_BITS = 18
"""Free CPU (≤ 128 cores = 128000 milli) fits in 18 bits of a composite key."""
_CACHE_LIMIT = 2_000_000


class ReplayResult(msgspec.Struct, kw_only=True):
    curve: Curve
    placed: int
    failed: int
    seconds: float
    searches: int
    linked_nodes_multi_card: int = 0
    """Pods with a multi-card container placed on a node whose links are known ..."""
    fully_nvlinked: int = 0
    """... and of those, the ones whose every multi-card container got NVLinked cards only."""

    @property
    def pods_per_second(self) -> float:
        total = self.placed + self.failed
        return total / self.seconds if self.seconds > 0 else float("inf")


def _card_view(index: int, model: str) -> CardView:
    return CardView(
        index=index, memory_mib=CARD_MEMORY, free_mib=CARD_MEMORY, free_core=100, model=model
    )


class Cluster:
    """The replayed cluster: per-node arrays for the filters, a card view per node."""

    def __init__(self, nodes: Sequence[TraceNode], tie_seed: int) -> None:
        self.nodes = nodes
        count = len(nodes)
        self.cpu_free: IntArray = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem_free: IntArray = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.views = [
            NodeView(
                cards=tuple(_card_view(i, n.model) for i in range(n.gpus)), affinity=n.affinity
            )
            for n in nodes
        ]
        self.max_share: IntArray = np.zeros(count, dtype=np.int64)
        self.whole_free: IntArray = np.zeros(count, dtype=np.int64)
        self.card_key: IntArray = np.zeros(count, dtype=np.int64)
        self._interned: dict[object, int] = {}
        for at in range(count):
            self._refresh(at)
        order = list(range(count))
        random.Random(tie_seed).shuffle(order)
        self.rank: IntArray = np.empty(count, dtype=np.int64)
        self.rank[np.array(order, dtype=np.int64)] = np.arange(count, dtype=np.int64)
        self._models = [n.model for n in nodes]
        self._model_masks: dict[tuple[str, ...], npt.NDArray[np.bool_]] = {}
        self.capacity_milli = sum(n.gpus for n in nodes) * MILLI

    def _refresh(self, at: int) -> None:
        view = self.views[at]
        cards = view.cards
        self.max_share[at] = max((free_milli(card) for card in cards), default=0)
        self.whole_free[at] = sum(1 for card in cards if card.untouched and card.healthy)
        state: object = (cards, view.affinity) if view.affinity else cards
        key = self._interned.get(state)
        if key is None:
            key = self._interned[state] = len(self._interned)
        self.card_key[at] = key

    def model_mask(self, models: tuple[str, ...]) -> npt.NDArray[np.bool_]:
        found = self._model_masks.get(models)
        if found is None:
            wanted = {m.lower() for m in models}
            found = np.array([m.lower() in wanted for m in self._models], dtype=np.bool_)
            self._model_masks[models] = found
        return found

    def feasible(self, pod: TracePod) -> IntArray:
        mask = (self.cpu_free >= pod.cpu_milli) & (self.mem_free >= pod.memory_mib)
        if pod.gpu_spec:
            mask &= self.model_mask(pod.gpu_spec)
        if pod.num_gpu and pod.gpu_milli < MILLI:
            mask &= self.max_share >= pod.gpu_milli
        elif pod.num_gpu:
            mask &= self.whole_free >= pod.num_gpu
        return np.flatnonzero(mask)

    def place(self, at: int, pod: TracePod, request: PodRequest, assignment: Assignment) -> None:
        self.views[at] = apply_assignment(self.views[at], request, assignment)
        self.cpu_free[at] -= pod.cpu_milli
        self.mem_free[at] -= pod.memory_mib
        self._refresh(at)


class _Memo:
    """One pod shape's plan per node, with the node key it was made for (-1: none)."""

    def __init__(self, shape: object, count: int) -> None:
        self.shape = shape
        self.known: IntArray = np.full(count, -1, dtype=np.int64)
        self.value: npt.NDArray[np.float64] = np.full(count, -np.inf)
        self.plans: list[Assignment | None] = [None] * count


class _Planner:
    """Plans shared between alike nodes, and kept across pods of the same shape."""

    def __init__(self, cluster: Cluster, policy: Policy) -> None:
        self.cluster = cluster
        self.policy = policy
        thresholds = policy.cpu_thresholds
        self.thresholds = (
            None if thresholds is None else np.array(sorted(thresholds), dtype=np.int64)
        )
        self.cache: dict[object, dict[int, tuple[float, Assignment] | None]] = {}
        """Plans by pod shape, then by node key."""
        self.cached = 0
        self.searches = 0
        self._memos: dict[object, _Memo] = {}

    def memo(self, shape: object) -> _Memo:
        found = self._memos.get(shape)
        if found is None:
            found = self._memos[shape] = _Memo(shape, len(self.cluster.views))
        return found

    def keys(self, pod: TracePod, nodes: IntArray) -> IntArray:
        cluster = self.cluster
        cards = cluster.card_key[nodes]
        cpu = cluster.cpu_free[nodes]
        if self.thresholds is None:
            return (cards << _CPU_BITS) | cpu
        if len(self.thresholds) == 0:
            return cards
        levels = len(self.thresholds) + 1
        before = np.searchsorted(self.thresholds, cpu, side="right")
        after = np.searchsorted(self.thresholds, cpu - pod.cpu_milli, side="right")
        return (cards * levels + before) * levels + after

    def shape(self, pod: TracePod) -> object:
        cpu = pod.cpu_milli if self.thresholds is None else 0
        return (pod.num_gpu, pod.gpu_milli, pod.gpu_spec, cpu)

    def plan(
        self, shape: object, key: int, at: int, request: PodRequest
    ) -> tuple[float, Assignment] | None:
        table = self.cache.setdefault(shape, {})
        if key in table:
            return table[key]
        self.searches += 1
        cluster = self.cluster
        view = msgspec.structs.replace(cluster.views[at], free_cpu_milli=int(cluster.cpu_free[at]))
        plan = plan_pod(view, request, self.policy)
        found = None if plan is None else (plan.score.node, plan.assignment)
        if self.cached >= _CACHE_LIMIT:
            self.cache.clear()
            self.cached = 0
            table = self.cache[shape] = {}
        table[key] = found
        self.cached += 1
        return found


def replay(
    nodes: Sequence[TraceNode],
    arrivals: Sequence[TracePod],
    policy: Policy,
    *,
    tie_seed: int,
    progress: Progress | None = None,
) -> ReplayResult:
    """Place ``arrivals`` one by one on an empty cluster of ``nodes``."""
    cluster = Cluster(nodes, tie_seed)
    planner = _Planner(cluster, policy)
    curve = Curve(capacity_milli=cluster.capacity_milli)
    requests: dict[TracePod, PodRequest] = {}
    arrived = allocated = placed = failed = multi_linked = nvlinked = 0
    started = time.perf_counter()
    for number, pod in enumerate(arrivals, start=1):
        arrived += pod.gpu_request_milli
        request = requests.get(pod)
        if request is None:
            request = requests[pod] = msgspec.structs.replace(pod.request(), host_memory_mib=0)
        choice = _choose(cluster, planner, pod, request)
        if choice is None:
            failed += 1
        else:
            at, assignment = choice
            view = cluster.views[at]
            sets = [cards for cards in assignment if len(cards) > 1]
            if sets and view.affinity:
                multi_linked += 1
                nvlinked += all(fully_nvlinked(view, cards) for cards in sets)
            cluster.place(at, pod, request, assignment)
            allocated += pod.gpu_request_milli
            placed += 1
        curve.record(arrived, allocated)
        if progress is not None and number % 500 == 0:
            progress(number, len(arrivals))
    return ReplayResult(
        curve=curve,
        placed=placed,
        failed=failed,
        seconds=time.perf_counter() - started,
        searches=planner.searches,
        linked_nodes_multi_card=multi_linked,
        fully_nvlinked=nvlinked,
    )


def _choose(
    cluster: Cluster, planner: _Planner, pod: TracePod, request: PodRequest
) -> tuple[int, Assignment] | None:
    nodes = cluster.feasible(pod)
    if len(nodes) == 0:
        return None
    keys = planner.keys(pod, nodes)
    memo = planner.memo(planner.shape(pod))
    stale = memo.known[nodes] != keys
    if stale.any():
        _fill(planner, memo, nodes[stale], keys[stale], request)
    values = memo.value[nodes]
    best = values.max()
    if best == -np.inf:
        return None
    winners = nodes[values == best]
    at = int(winners[np.argmin(cluster.rank[winners])])
    assignment = memo.plans[at]
    assert assignment is not None
    return at, assignment


def _fill(
    planner: _Planner, memo: _Memo, nodes: IntArray, keys: IntArray, request: PodRequest
) -> None:
    """Plan (or find in the cache) each distinct key of ``nodes``; note it per node."""
    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    values = np.full(len(unique), -np.inf)
    plans: list[Assignment | None] = []
    for j, key in enumerate(unique.tolist()):
        found = planner.plan(memo.shape, key, int(nodes[first[j]]), request)
        if found is None:
            plans.append(None)
        else:
            values[j] = found[0]
            plans.append(found[1])
    memo.known[nodes] = keys
    memo.value[nodes] = values[inverse]
    for at, j in zip(nodes.tolist(), inverse.tolist(), strict=True):
        memo.plans[at] = plans[j]
