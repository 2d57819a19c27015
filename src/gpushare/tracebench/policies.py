"""The policies a replay can run, by name: every standard policy, and the workload-aware
ones built for the trace's own target workload (as FGD builds its typical pods)."""

from __future__ import annotations

from collections.abc import Sequence

from gpushare.core.policies import Policy, standard_policies
from gpushare.core.policies.first_fit import FirstFitCards
from gpushare.core.policies.fragmentation import Workload, model_capacity
from gpushare.core.policies.workload import DEFAULT_POLICY, WORKLOAD_POLICIES, workload_policy
from gpushare.packing import share_prices
from gpushare.tracebench.trace import TraceNode, TracePod

DRA_SCHEDULER = "dra-scheduler"
"""kube-scheduler alone on DRA claims: nodes by least allocation, the first card that fits."""
DRA_SCORED = "dra-scored"
"""DRA claims with gpushare scoring the nodes (the default policy, judging the card
kube-scheduler will take) and kube-scheduler still taking the first card that fits."""
DRA_MODELS = (DRA_SCHEDULER, DRA_SCORED)
"""Models of the DRA front door for the replay, not policies a cluster can run."""


def policy_names() -> tuple[str, ...]:
    """The workload-aware policies first (the default leading), then the rest."""
    aware = sorted(WORKLOAD_POLICIES, key=lambda name: (name != DEFAULT_POLICY, name))
    return (*aware, *sorted(set(standard_policies()) - WORKLOAD_POLICIES))


def resolve(choice: str) -> tuple[str, ...]:
    """``all``, ``default`` (what a cluster gets out of the box) or one policy name."""
    if choice == "all":
        return policy_names()
    if choice == "default":
        return (DEFAULT_POLICY,)
    if choice not in (*policy_names(), *DRA_MODELS):
        known = ", ".join(("default", "all", *policy_names(), *DRA_MODELS))
        raise ValueError(f"unknown policy {choice!r} (known: {known})")
    return (choice,)


def build(name: str, pods: Sequence[TracePod], nodes: Sequence[TraceNode] = ()) -> Policy:
    """``name`` ready to place this trace's pods on ``nodes`` (the workload is the whole
    pod list, and the cluster's capacity by card model)."""
    if name == DRA_SCHEDULER:
        return FirstFitCards(name=name)
    if name == DRA_SCORED:
        inner = build(DEFAULT_POLICY, pods, nodes)
        return FirstFitCards(name=name, nodes=inner, cpu_thresholds=inner.cpu_thresholds)
    if name in WORKLOAD_POLICIES:
        capacity = model_capacity(node.model for node in nodes for _ in range(node.gpus))
        workload = Workload.typical(
            (pod.task_class for pod in pods),
            capacity=capacity,
            cpu_capacity=sum(node.cpu_milli for node in nodes),
        )
        return workload_policy(name, workload, share_prices)
    return standard_policies()[name]
