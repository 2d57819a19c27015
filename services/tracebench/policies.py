"""The policies a replay can run, by name: every standard policy, and the workload-aware
ones built for the trace's own target workload (as FGD builds its typical pods)."""

from __future__ import annotations

from collections.abc import Sequence

from gpushare.core.policies import Policy, standard_policies
from gpushare.core.policies.fragmentation import (
    BestFitPolicy,
    FGDPolicy,
    FragmentationPolicy,
    Workload,
)
from gpushare.core.policies.workload import DEFAULT_POLICY
from gpushare.tracebench.trace import TracePod

WORKLOAD_POLICIES = ("fragmentation", "fgd", "bestfit")


def policy_names() -> tuple[str, ...]:
    return (*WORKLOAD_POLICIES, *sorted(set(standard_policies()) - set(WORKLOAD_POLICIES)))


def resolve(choice: str) -> tuple[str, ...]:
    """``all``, ``default`` (what a cluster gets out of the box) or one policy name."""
    if choice == "all":
        return policy_names()
    if choice == "default":
        return (DEFAULT_POLICY,)
    if choice not in policy_names():
        known = ", ".join(("default", "all", *policy_names()))
        raise ValueError(f"unknown policy {choice!r} (known: {known})")
    return (choice,)


def build(name: str, pods: Sequence[TracePod]) -> Policy:
    """``name`` ready to place this trace's pods (the workload is the whole pod list)."""
    if name == "bestfit":
        return BestFitPolicy()
    if name in ("fgd", "fragmentation"):
        workload = Workload.typical(pod.task_class for pod in pods)
        return FGDPolicy(workload) if name == "fgd" else FragmentationPolicy(workload)
    return standard_policies()[name]
