"""FGD's experimental protocol: arrival order, inflation, and the allocation metric.

Pods are sorted by name and shuffled with the seed; then pods drawn uniformly with
replacement from the original list are appended until the summed GPU request would
pass ``inflation`` × the cluster's GPUs (a list already past it loses pods drawn at
random instead). Nothing departs and a pod that fits nowhere
fails at once, never retried. After every pod the harness records the GPU requested by
every pod so far (failed ones included: the *arrived* demand) and the GPU allocated.
For each whole percent of arrived demand the allocation is the mean over the pods at
that level, or over those within ±1 % where none landed exactly there.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec

from gpushare.tracebench.trace import TracePod

LEVELS = ("95", "100", "130")
"""The arrived-demand levels every report shows (percent of the cluster's GPUs)."""


def arrivals(
    pods: Sequence[TracePod], seed: int, capacity_milli: int, inflation: float = 1.3
) -> list[TracePod]:
    """The seeded arrival order: the shuffled trace, then the inflation draws."""
    rng = random.Random(seed)
    ordered = sorted(pods, key=lambda pod: pod.name)
    rng.shuffle(ordered)
    target = inflation * capacity_milli
    total = sum(pod.gpu_request_milli for pod in ordered)
    while total > target and ordered:  # a trace already past the target is tuned down
        gone = ordered.pop(rng.randrange(len(ordered)))
        total -= gone.gpu_request_milli
    while pods:
        extra = pods[rng.randrange(len(pods))]
        if total + extra.gpu_request_milli > target:
            break
        ordered.append(extra)
        total += extra.gpu_request_milli
    return ordered


class Curve(msgspec.Struct, kw_only=True):
    """Per pod: arrived and allocated GPU, in milli-GPU."""

    capacity_milli: int
    arrived: list[int] = msgspec.field(default_factory=list)
    allocated: list[int] = msgspec.field(default_factory=list)

    def record(self, arrived_milli: int, allocated_milli: int) -> None:
        self.arrived.append(arrived_milli)
        self.allocated.append(allocated_milli)

    def allocation_at(self, level: int) -> float | None:
        """The mean GPU allocation ratio (%) over the pods at ``level`` % arrived."""
        ratios: dict[int, list[float]] = {}
        for arrived, allocated in zip(self.arrived, self.allocated, strict=True):
            at = round(arrived * 100 / self.capacity_milli)
            if level - 1 <= at <= level + 1:
                ratios.setdefault(at, []).append(allocated * 100 / self.capacity_milli)
        exact = ratios.get(level)
        if exact:
            return sum(exact) / len(exact)
        near = [ratio for values in ratios.values() for ratio in values]
        return sum(near) / len(near) if near else None

    def unallocated_at(self, level: int) -> float | None:
        allocation = self.allocation_at(level)
        return None if allocation is None else 100.0 - allocation
