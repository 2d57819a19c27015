"""Placement policies: every way gpushare can choose cards and rank nodes, by name."""

from __future__ import annotations

from gpushare.core.policies.base import MAX_SCORE, Assignment, Policy, Score
from gpushare.core.policies.resource import DEFAULT_CORE_WEIGHT, ResourcePolicy, resource_policies
from gpushare.core.policies.topology import TopologyPolicy

__all__ = [
    "DEFAULT_CORE_WEIGHT",
    "MAX_SCORE",
    "Assignment",
    "Policy",
    "ResourcePolicy",
    "Score",
    "TopologyPolicy",
    "policy_names",
    "standard_policies",
]


def standard_policies(core_weight: float = DEFAULT_CORE_WEIGHT) -> dict[str, Policy]:
    """The policies that need no knowledge of the workload, by name."""
    policies: dict[str, Policy] = dict(resource_policies(core_weight))
    policies["topology"] = TopologyPolicy(core_weight=core_weight)
    return policies


def policy_names() -> frozenset[str]:
    """Every policy a cluster or a pod may name (the workload-aware ones included)."""
    from gpushare.core.policies.workload import WORKLOAD_POLICIES

    return frozenset(standard_policies()) | WORKLOAD_POLICIES
