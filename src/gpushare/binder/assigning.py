"""Marking pods ``ALIYUN_COM_GPU_MEM_ASSIGNED=true`` once every container has its card.

The node-agent appends ``ContainerAssigned`` per container at kubelet admission; when
the fold shows all of a pod's containers assigned, the binder (the only API writer)
patches the annotation, with the pod's uid as a precondition. Tools such as
kubectl-inspect-gpushare read it. The fold is rescanned every sweep, so a patch that
failed for a moment, or a restart, only delays the mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gpushare.binder.decisions import fully_assigned
from gpushare.binder.settings import BinderSettings
from gpushare.bus.follow import LogFollower
from gpushare.core.annotations import ASSIGNED
from gpushare.core.events import AnyEvent, ContainerAssigned
from gpushare.core.state import NodeState, PodAllocation
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import ConflictError, KubeError, NotFound
from gpushare.kube.pods import patch_pod_annotations
from gpushare.telemetry.kubernetes import api_span

log = logging.getLogger(__name__)


class AssignedMarker:
    def __init__(self, follower: LogFollower, kube: KubeClient, settings: BinderSettings) -> None:
        self._follower = follower
        self._kube = kube
        self._settings = settings
        self._marked: set[str] = set()
        """Reservation ids whose pod carries the mark (or is gone)."""
        self._wake = asyncio.Event()
        follower.listen(self._on_event)

    def _on_event(self, _seq: int, event: AnyEvent, node: NodeState) -> None:
        if isinstance(event, ContainerAssigned):
            allocation = node.pods.get(event.pod.uid)
            if allocation is not None and allocation.fully_assigned:
                self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            await self.mark_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._settings.sweep_interval_s)

    async def mark_all(self) -> None:
        live: set[str] = set()
        for allocation in list(fully_assigned(self._follower.state)):
            live.add(allocation.reservation_id)
            if allocation.reservation_id not in self._marked:
                await self.mark(allocation)
        self._marked &= live  # forget released reservations

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
        self._marked.add(allocation.reservation_id)
