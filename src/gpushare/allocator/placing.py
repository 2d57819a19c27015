"""Which policy places a pod: the pod's ``gpushare.io/policy``, else the cluster's."""

from __future__ import annotations

from collections.abc import Callable

from gpushare.allocator.settings import AllocatorSettings
from gpushare.core.policies import Policy, policy_names, standard_policies
from gpushare.core.policies.workload import WORKLOAD_POLICIES, Capacity, WorkloadEstimate
from gpushare.core.requests import PodRequest
from gpushare.packing import share_prices


class Placer:
    """The policies this allocator knows, and the limits every placement keeps."""

    def __init__(
        self, settings: AllocatorSettings, capacity: Callable[[], Capacity] | None = None
    ) -> None:
        self.policies = standard_policies(settings.core_weight)
        self.default = settings.policy
        self.max_per_card = settings.max_containers_per_card
        self.workload = WorkloadEstimate(capacity=capacity, prices=share_prices)
        self.names = policy_names()

    def observe(self, request: PodRequest) -> None:
        """A pod asked to be placed: it is evidence of the workload to come."""
        self.workload.observe(request)

    def policy_for(self, request: PodRequest) -> Policy:
        name = request.policy if request.policy in self.names else self.default
        if name in WORKLOAD_POLICIES:
            return self.workload.policy(name, request)
        return self.policies[name]
