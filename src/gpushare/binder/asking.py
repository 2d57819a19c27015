"""What each GPU pod asked for, by name: the binder's only reason to look into pod specs.

The binding depends on the names a pod asked in (``vke.volcengine.com/*`` pods get
seed 003's annotations), and so does the node agent, which answers each container's
``Allocate`` on one of its resources; ``PodBound`` carries the names to it. The
reservation does not hold them, so the binder keeps them for every pod that asks a GPU
resource, from the pod list and watch it already follows for releasing
(:class:`~gpushare.binder.releasing.PodReleaser`), and reads a pod it has not seen
yet (just created, the watch a moment behind) from the API.
"""

from __future__ import annotations

import logging

from gpushare.binder.pod_index import PodIndex
from gpushare.core.annotations import asked_resources
from gpushare.core.model import PodRef
from gpushare.core.pods import Pod
from gpushare.kube.client import KubeClient
from gpushare.kube.pods import get_pod

log = logging.getLogger(__name__)

Asked = dict[str, tuple[str, ...]]
"""Container → the GPU resource names it asked."""


class AskedResources(PodIndex[Asked]):
    """GPU resource names per container, by pod UID, for pods that ask any."""

    def __init__(self, kube: KubeClient) -> None:
        super().__init__()
        self._kube = kube
        self.reads = 0
        """Pods read from the API because the watch had not shown them yet."""

    def value_of(self, pod: Pod) -> Asked | None:
        return asked_resources(pod) or None

    def known(self, uid: str) -> Asked | None:
        return self._by_uid.get(uid)

    async def lookup(self, pod: PodRef) -> Asked:
        """The names ``pod`` asked; reads the pod when not known yet (raises ``KubeError``).

        Empty when the pod is gone or was replaced: its binding will be refused anyway.
        """
        known = self._by_uid.get(pod.uid)
        if known is not None:
            return known
        self.reads += 1
        current = await get_pod(self._kube, pod.namespace, pod.name)
        if current is None or current.metadata.uid != pod.uid:
            return {}
        self.remember(current)
        return self._by_uid.get(pod.uid, {})
