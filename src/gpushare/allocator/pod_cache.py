"""Pods seen by filter, remembered for bind (which is told only names and a UID).

What filter was sent is whatever its caller claimed. With API access bind reserves what
the API pod asks and only compares it with this memory (a disagreement is logged); the
memory is bind's source only for an allocator without API access
(:mod:`gpushare.allocator.pod_lookup`)."""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime

import msgspec

from gpushare.core.model import PodRef
from gpushare.core.pods import Pod
from gpushare.core.requests import PodRequest


class RememberedPod(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What bind needs of a pod: who it is, what it asks, and when it was created."""

    ref: PodRef
    request: PodRequest
    created_at: datetime | None = None


def remembered(pod: Pod, request: PodRequest) -> RememberedPod:
    meta = pod.metadata
    return RememberedPod(
        ref=PodRef(namespace=meta.namespace, name=meta.name, uid=meta.uid),
        request=request,
        created_at=meta.creation_timestamp,
    )


class PodCache:
    """A bounded, least-recently-used map from pod UID to :class:`RememberedPod`.

    Bounded because filter sees every pending GPU pod, including ones that never
    reach bind; losing one costs nothing where bind reads the API anyway.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._pods: OrderedDict[str, RememberedPod] = OrderedDict()

    def remember(self, pod: RememberedPod) -> None:
        uid = pod.ref.uid
        if not uid:
            return
        self._pods[uid] = pod
        self._pods.move_to_end(uid)
        while len(self._pods) > self.capacity:
            self._pods.popitem(last=False)

    def get(self, uid: str) -> RememberedPod | None:
        pod = self._pods.get(uid)
        if pod is not None:
            self._pods.move_to_end(uid)
        return pod

    def __len__(self) -> int:
        return len(self._pods)
