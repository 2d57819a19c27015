"""Which policy places a pod: the pod's ``gpushare.io/policy``, else the cluster's."""

from __future__ import annotations

from gpushare.allocator.settings import AllocatorSettings
from gpushare.core.policies import Policy, standard_policies
from gpushare.core.requests import PodRequest


class Placer:
    """The policies this allocator knows, and the limits every placement keeps."""

    def __init__(self, settings: AllocatorSettings) -> None:
        self.policies = standard_policies(settings.core_weight)
        self.default = self.policies[settings.policy]
        self.max_per_card = settings.max_containers_per_card

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.policies)

    def policy_for(self, request: PodRequest) -> Policy:
        return self.policies.get(request.policy, self.default) if request.policy else self.default
