"""A lower bound on the unallocated GPU % that any placement policy can reach on one run.

The replay's metric (``protocol.Curve``) is, for the pods whose arrived demand rounds to
the level (100 %), the mean of the GPU allocated after each. Whatever a policy does, its
state after pod *i* is a set of the first *i* arrivals placed feasibly on the nodes, so
its allocation is at most OPT(i): the most GPU milli that any feasible placement of any
subset of those pods holds. ``unallocated_bound`` computes an upper bound on OPT(i) by a
linear relaxation, and reports ``100 − mean allocation`` with the same averaging as the
replay; no policy, online or offline, ends below it.

The relaxation (one LP, ``scipy.optimize.linprog`` with HiGHS):

* **Node groups.** Nodes alike in (model, cards, CPU, memory) form one group of N nodes
  (15 groups in the openb cluster); pods alike in (CPU, memory, cards, share, accepted
  models) form one type. x[t, g] ≥ 0 is the number of type-t pods on group g, allowed
  only where t accepts g's model (case-insensitive, as the replay) and one node of g can
  hold one pod of t (cards, CPU, memory). Σ_g x[t, g] ≤ the type's arrivals: a pod is
  placed once or not at all. CPU-only pods are left out: dropping them from any
  placement keeps it feasible and its GPU allocation the same.
* **Cards, exactly up to integrality.** Whole-card and k-card pods take whole cards; the
  cards are aggregated per group, which loses nothing because k and the cards per node
  are powers of two (a set of k-card pods whose cards fit in the group's total packs onto
  its nodes, largest first, with no card left over). Fractional pods are packed on the
  remaining cards by an *arc-flow* model (Valério de Carvalho): a card is a path from 0
  to 1000 milli whose arcs are the shares on it, so the shares on one card never sum
  past 1000 and a card's leftover serves only shares that fit in it. The arc-flow LP is as
  strong as the bin-packing configuration LP (Gilmore–Gomory); arcs are laid out in
  decreasing size order, which removes symmetric paths and no packing.
* **CPU and memory, per group, with per-node cuts.** Σ cpu·x ≤ N·CPU and likewise for
  memory, plus, for each node, inequalities from *dual-feasible functions* (Fekete &
  Schepers): for u among ``x ↦ [x > 1/(j+1)]/j`` and ``u_k(x) = x if (k+1)x ∈ ℤ else
  ⌊(k+1)x⌋/k``, any pods sharing one node have Σ u(cpu/CPU) ≤ 1, so Σ u(cpu/CPU)·x ≤ N.
  They keep the LP from splitting a big pod's CPU across nodes (e.g. at most one 11-core
  pod on a 16-core P100 node). The coupling of CPU and cards inside one node is the part
  still relaxed.

What is relaxed, so the bound may sit below what is reachable: integrality (pods and
card paths are fractional), the CPU/memory/card coupling within one node beyond the cuts,
and the protocol's own rules: a policy must place a pod that fits somewhere and never
moves or drops one, while OPT(i) chooses freely among the first *i* pods.

OPT(i) is solved at a few checkpoints in the level's window; in between, OPT(i) ≤ OPT(j)
for j ≥ i (more pods) and OPT(i) ≤ OPT(j) + the demand of pods j+1…i for j ≤ i (remove
them from a placement of the first i pods); also OPT(i) ≤ the arrived demand and the
capacity.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

import msgspec
import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from gpushare.tracebench.protocol import Curve
from gpushare.tracebench.trace import TraceNode, TracePod

MILLI = 1000
CUTS = 8
"""Dual-feasible-function cuts per resource: j, k = 1…CUTS."""

_Type = tuple[int, int, int, int, frozenset[str]]
"""(CPU milli, memory MiB, cards, share per card, accepted models, empty = any)."""


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """The relaxation solved for the first ``pods`` arrivals."""

    pods: int
    arrived_milli: int
    bound_milli: float
    """No placement of any subset of these pods allocates more GPU milli."""


class BoundResult(msgspec.Struct, frozen=True, kw_only=True):
    level: int
    capacity_milli: int
    unallocated: float | None
    """The lower bound on the unallocated GPU % at ``level`` % arrived (None: no pod near
    the level, as ``Curve.unallocated_at``)."""
    allocation: float | None
    """The matching upper bound on the GPU allocation ratio, %."""
    checkpoints: tuple[Checkpoint, ...]
    seconds: float


def _dff_cuts(size: int, capacity: int) -> list[Fraction]:
    """u(size/capacity) for the threshold and Fekete–Schepers functions, j, k = 1…CUTS."""
    values: list[Fraction] = []
    for j in range(1, CUTS + 1):
        values.append(Fraction(1, j) if (j + 1) * size > capacity else Fraction(0))
        scaled = (j + 1) * size
        if scaled % capacity == 0:
            values.append(Fraction(size, capacity))
        else:
            values.append(Fraction(scaled // capacity, j))
    return values


class _Model:
    """The LP for one cluster and one set of pod types; type counts are its right side."""

    def __init__(self, nodes: Sequence[TraceNode], types: Sequence[_Type]) -> None:
        self._rows: list[int] = []
        self._cols: list[int] = []
        self._vals: list[float] = []
        self._upper: list[float] = []
        self._gain: list[float] = []
        self.type_row = {kind: self._row(0.0) for kind in types}
        shares = [kind[3] for kind in types if kind[2] and kind[3] < MILLI]
        unit = math.gcd(MILLI, *shares)
        groups = Counter((n.model.lower(), n.gpus, n.cpu_milli, n.memory_mib) for n in nodes)
        for (model, cards, cpu, memory), count in sorted(groups.items()):
            eligible = [
                kind
                for kind in types
                if 0 < kind[2] <= cards
                and kind[0] <= cpu
                and kind[1] <= memory
                and (not kind[4] or model in kind[4])
            ]
            if not eligible:
                continue
            card_row = self._row(float(count * cards))
            cpu_row = self._row(float(count * cpu))
            mem_row = self._row(float(count * memory))
            cut_rows = [self._row(float(count)) for _ in range(4 * CUTS)]
            fractional: dict[int, list[int]] = {}
            for kind in eligible:
                kind_cpu, kind_mem, k, share, _ = kind
                x = self._column(float(k * share))
                self._put(self.type_row[kind], x, 1.0)
                self._put(cpu_row, x, float(kind_cpu))
                self._put(mem_row, x, float(kind_mem))
                cuts = _dff_cuts(kind_cpu, cpu) + _dff_cuts(kind_mem, memory)
                for at, value in zip(cut_rows, cuts, strict=True):
                    if value:
                        self._put(at, x, float(value))
                if share >= MILLI:
                    self._put(card_row, x, float(k))
                else:
                    fractional.setdefault(share // unit, []).append(x)
            if fractional:
                self._arc_flow(fractional, MILLI // unit, card_row)
        self.objective = -np.array(self._gain)
        self.upper = np.array(self._upper)
        self.matrix = coo_matrix(
            (self._vals, (self._rows, self._cols)), shape=(len(self._upper), len(self._gain))
        ).tocsr()

    def _row(self, upper: float) -> int:
        self._upper.append(upper)
        return len(self._upper) - 1

    def _column(self, gain: float) -> int:
        self._gain.append(gain)
        return len(self._gain) - 1

    def _put(self, row: int, column: int, value: float) -> None:
        self._rows.append(row)
        self._cols.append(column)
        self._vals.append(value)

    def _arc_flow(self, sizes: dict[int, list[int]], capacity: int, card_row: int) -> None:
        """Cards holding fractional pods as paths 0 → capacity, arcs in decreasing size."""
        reach = [False] * (capacity + 1)
        reach[0] = True
        node_rows: dict[int, int] = {}  # 0 < u < capacity: out(u) − in(u) ≤ 0

        def node_row(point: int) -> int:
            found = node_rows.get(point)
            if found is None:
                found = node_rows[point] = self._row(0.0)
            return found

        for size in sorted(sizes, reverse=True):
            slots = self._row(0.0)  # Σ pods of this size − Σ arcs of this size ≤ 0
            for x in sizes[size]:
                self._put(slots, x, 1.0)
            for start in range(capacity - size + 1):  # ascending: the same size repeats
                if not reach[start]:
                    continue
                arc = self._column(0.0)
                self._put(slots, arc, -1.0)
                # a path from 0 is one card; elsewhere an arc leaves what came in
                self._put(card_row if start == 0 else node_row(start), arc, 1.0)
                end = start + size
                reach[end] = True
                if end < capacity:
                    self._put(node_row(end), arc, -1.0)

    def solve(self, counts: Counter[_Type]) -> float:
        if not len(self.objective):
            return 0.0
        upper = self.upper.copy()
        for kind, at in self.type_row.items():
            upper[at] = counts.get(kind, 0)
        result = linprog(
            self.objective, A_ub=self.matrix, b_ub=upper, bounds=(0, None), method="highs"
        )
        if result.status != 0:
            raise RuntimeError(f"bound LP: {result.message}")
        # HiGHS's tolerance, then one milli of slack: the bound must not fall short.
        return float(-result.fun) * (1 + 1e-9) + 1.0


def _type(pod: TracePod) -> _Type:
    return (
        pod.cpu_milli,
        pod.memory_mib,
        pod.num_gpu,
        pod.gpu_milli,
        frozenset(m.lower() for m in pod.gpu_spec),
    )


def allocated_bound(nodes: Sequence[TraceNode], pods: Sequence[TracePod]) -> float:
    """An upper bound on the GPU milli any placement of any subset of ``pods`` holds."""
    counts = Counter(_type(pod) for pod in pods if pod.num_gpu)
    capacity = sum(n.gpus for n in nodes) * MILLI
    demand = sum(pod.gpu_request_milli for pod in pods)
    return min(float(capacity), float(demand), _Model(nodes, list(counts)).solve(counts))


def _window(curve: Curve, level: int) -> list[int]:
    """The pods ``Curve.allocation_at(level)`` averages over."""
    near: list[int] = []
    exact: list[int] = []
    for at, arrived in enumerate(curve.arrived):
        rounded = round(arrived * 100 / curve.capacity_milli)
        if rounded == level:
            exact.append(at)
        if level - 1 <= rounded <= level + 1:
            near.append(at)
    return exact or near


def unallocated_bound(
    nodes: Sequence[TraceNode],
    arrivals: Sequence[TracePod],
    *,
    level: int = 100,
    checkpoints: int = 3,
) -> BoundResult:
    """The unallocated GPU % at ``level`` % arrived that no placement of ``arrivals`` beats.

    ``arrivals`` is one run's order (``protocol.arrivals``); ``checkpoints`` (≥ 1) is how
    many prefixes in the level's window get their own LP.
    """
    started = time.perf_counter()
    capacity = sum(n.gpus for n in nodes) * MILLI
    arrived_curve = Curve(capacity_milli=capacity)
    arrived = 0
    for pod in arrivals:
        arrived += pod.gpu_request_milli
        arrived_curve.record(arrived, 0)
    window = _window(arrived_curve, level) if capacity else []
    if not window:
        return BoundResult(
            level=level,
            capacity_milli=capacity,
            unallocated=None,
            allocation=None,
            checkpoints=(),
            seconds=time.perf_counter() - started,
        )
    picks = sorted(
        {window[round(i * (len(window) - 1) / max(1, checkpoints - 1))] for i in range(checkpoints)}
        | {window[-1]}
    )
    prefix = arrivals[: picks[-1] + 1]
    types = list(Counter(_type(pod) for pod in prefix if pod.num_gpu))
    model = _Model(nodes, types)
    solved: list[Checkpoint] = []
    for at in picks:
        counts = Counter(_type(pod) for pod in arrivals[: at + 1] if pod.num_gpu)
        solved.append(
            Checkpoint(
                pods=at + 1,
                arrived_milli=arrived_curve.arrived[at],
                bound_milli=min(model.solve(counts), float(capacity)),
            )
        )
    curve = Curve(capacity_milli=capacity)
    for at in window:
        here = arrived_curve.arrived[at]
        best = float(min(here, capacity))
        for point in solved:
            if point.pods - 1 >= at:
                best = min(best, point.bound_milli)
            else:
                best = min(best, point.bound_milli + here - point.arrived_milli)
        curve.record(here, best)  # type: ignore[arg-type]
    allocation = curve.allocation_at(level)
    return BoundResult(
        level=level,
        capacity_milli=capacity,
        unallocated=None if allocation is None else 100.0 - allocation,
        allocation=allocation,
        checkpoints=tuple(solved),
        seconds=time.perf_counter() - started,
    )
