"""Marking pods ``ALIYUN_COM_GPU_MEM_ASSIGNED=true`` once every container has its card.

The node-agent appends ``ContainerAssigned`` per container at kubelet admission; when
the fold shows all of a pod's containers assigned, the binder (the only API writer)
patches the annotation, with the pod's uid as a precondition. Tools such as
kubectl-inspect-gpushare read it.

The marker works from the events: the one that makes an allocation fully assigned puts
it in the marker's pending set, a release takes it out, and a patch that failed keeps it
there for the next sweep. At start every fully assigned allocation of the fold is
pending, except a pod whose watched copy (:mod:`.watched_pods`) already carries the mark.
Until 2026-11-29 the marker went through the whole fold at every such event: 46 ms for
33,000 allocations, back to back while pods were being admitted, on the binder's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gpushare.binder.decisions import fully_assigned
from gpushare.binder.settings import BinderSettings
from gpushare.binder.watched_pods import WatchedPods
from gpushare.bus.follow import LogFollower
from gpushare.core.annotations import ASSIGNED
from gpushare.core.events import AnyEvent, ContainerAssigned, PodReleased
from gpushare.core.state import NodeState, PodAllocation
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import ConflictError, KubeError, NotFound
from gpushare.kube.pods import patch_pod_annotations
from gpushare.telemetry.kubernetes import api_span

log = logging.getLogger(__name__)


class AssignedMarker:
    def __init__(
        self,
        follower: LogFollower,
        kube: KubeClient,
        settings: BinderSettings,
        *,
        watched: WatchedPods | None = None,
    ) -> None:
        self._follower = follower
        self._kube = kube
        self._settings = settings
        self._watched = watched
        self._pending: dict[str, PodAllocation] = {}
        """Fully assigned allocations whose pod is not marked yet, by reservation id."""
        self._marked: set[str] = set()
        """Reservation ids whose pod carries the mark (or is gone), until released."""
        self._wake = asyncio.Event()
        follower.listen(self._on_event)

    def _on_event(self, _seq: int, event: AnyEvent, node: NodeState) -> None:
        if isinstance(event, ContainerAssigned):
            allocation = node.pods.get(event.pod.uid)
            if allocation is not None and allocation.fully_assigned:
                self._add(allocation)
        elif isinstance(event, PodReleased):
            self._pending.pop(event.reservation_id, None)
            self._marked.discard(event.reservation_id)

    def _add(self, allocation: PodAllocation) -> None:
        if allocation.reservation_id not in self._marked:
            self._pending[allocation.reservation_id] = allocation
            self._wake.set()

    async def run(self) -> None:
        if self._watched is not None:
            await self._watched.wait_listed()  # a pod marked already is not patched again
        for allocation in list(fully_assigned(self._follower.state)):
            self._add(allocation)
        for reservation_id, allocation in list(self._pending.items()):
            if self._carries_mark(allocation):  # events replayed at start added it too
                del self._pending[reservation_id]
                self._marked.add(reservation_id)
        while True:
            self._wake.clear()
            await self.mark_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._settings.sweep_interval_s)

    def _carries_mark(self, allocation: PodAllocation) -> bool:
        """Whether the pod's watched copy carries the mark already."""
        seen = None if self._watched is None else self._watched.get(allocation.pod.uid)
        return seen is not None and seen.annotations.get(ASSIGNED) == "true"

    async def mark_all(self) -> None:
        """Patch every pending pod; what failed stays pending."""
        for reservation_id, allocation in list(self._pending.items()):
            if reservation_id in self._pending:  # not released meanwhile
                await self.mark(allocation)

    async def mark(self, allocation: PodAllocation) -> None:
        pod = allocation.pod
        try:
            with api_span("PATCH", "pods", namespace=pod.namespace, name=pod.name, uid=pod.uid):
                await patch_pod_annotations(
                    self._kube, pod.namespace, pod.name, {ASSIGNED: "true"}, uid=pod.uid
                )
        except (NotFound, ConflictError) as error:
            log.info("not marking %s assigned: %s", pod.key, error.message)
        except KubeError as error:
            log.warning("marking %s assigned failed (%s); will retry", pod.key, error.message)
            return
        else:
            log.info("marked %s assigned (%s)", pod.key, allocation.reservation_id)
        if self._pending.pop(allocation.reservation_id, None) is not None:
            self._marked.add(allocation.reservation_id)  # not if released meanwhile
