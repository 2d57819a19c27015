"""Whether each pod exists, where it is bound and its phase, as the binder last saw it.

The overdue sweep (:class:`~gpushare.binder.releasing.OverdueSweeper`) releases a bound
reservation only when its pod is gone or finished, so it must know the pod; it asks here.
The pod releaser feeds this from the list and watch it already follows
(:class:`~gpushare.binder.releasing.PodReleaser`); a pod not seen since it was bound (the
watch a moment behind, or never listed) is read with a GET, whose answer is kept too.
"""

from __future__ import annotations

from gpushare.binder.decisions import Sighting
from gpushare.binder.pod_index import PodIndex
from gpushare.core.model import PodRef
from gpushare.core.pods import Pod
from gpushare.kube.client import KubeClient
from gpushare.kube.pods import get_pod

GONE = Sighting(present=False)


def sighting_of(pod: Pod) -> Sighting:
    return Sighting(present=True, node=pod.spec.node_name or "", phase=pod.phase)


class PodSightings(PodIndex[Sighting]):
    """The last sighting of every pod, by uid."""

    def __init__(self, kube: KubeClient) -> None:
        super().__init__()
        self._kube = kube
        self.reads = 0
        """Pods read from the API because the list and watch had not shown them bound."""

    def value_of(self, pod: Pod) -> Sighting:
        return sighting_of(pod)

    def get(self, uid: str) -> Sighting | None:
        """The last sighting; None when the pod was never seen (or was deleted since)."""
        return self._by_uid.get(uid)

    async def read(self, pod: PodRef) -> Sighting:
        """The pod as the API has it now (raises ``KubeError``); a same-named successor
        is not this pod: gone."""
        self.reads += 1
        current = await get_pod(self._kube, pod.namespace, pod.name)
        if current is None or current.metadata.uid != pod.uid:
            self.forget(pod.uid)
            return GONE
        self.remember(current)
        return sighting_of(current)
