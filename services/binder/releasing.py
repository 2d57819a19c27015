"""Giving memory back: when a pod is gone or finished, or its reservation is overdue.

:class:`PodReleaser` has the reconciler list every pod and correct the log from that
list (:mod:`.reconciling`: allocations whose pod no longer exists or has finished are
released there, ``reconciled``/``terminated``), then watches pods from the list's
resourceVersion: a pod ``DELETED``, or reaching phase ``Succeeded``/``Failed``, releases
its allocation. After any gap (API error, expired watch) it lists and reconciles again,
so a missed event is only late, never lost.

:class:`OverdueSweeper` releases reservations never bound within ``bind_timeout`` and
bound pods not fully assigned within ``assign_timeout``, by the injected clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from gpushare.binder.appending import append_event
from gpushare.binder.asking import AskedResources
from gpushare.binder.decisions import overdue_allocations
from gpushare.binder.reconciling import Reconciler
from gpushare.binder.settings import BinderSettings, Clock
from gpushare.bus.follow import LogFollower
from gpushare.core.events import ReleaseReason
from gpushare.core.pods import TERMINAL_PHASES, Pod
from gpushare.core.reconciliation import pod_released
from gpushare.core.state import PodAllocation
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import Expired, KubeError
from gpushare.kube.watching import PodEvent, watch_pods

log = logging.getLogger(__name__)


class Releases:
    """Appends ``PodReleased`` for allocations the fold still holds."""

    def __init__(self, follower: LogFollower, clock: Clock) -> None:
        self._follower = follower
        self._clock = clock

    async def release(
        self, allocation: PodAllocation, reason: ReleaseReason, detail: str = ""
    ) -> None:
        node = self._follower.state.node_of(allocation.pod.uid)
        if node is None:
            return  # released meanwhile
        event = pod_released(node, allocation, self._clock(), reason, detail)
        log.info("releasing %s on %s: %s %s", allocation.pod.key, node, reason, detail)
        await append_event(self._follower.log, event)


class PodReleaser:
    def __init__(
        self,
        follower: LogFollower,
        kube: KubeClient,
        settings: BinderSettings,
        releases: Releases,
        *,
        reconciler: Reconciler,
        asked: AskedResources | None = None,
    ) -> None:
        self._follower = follower
        self._kube = kube
        self._settings = settings
        self._releases = releases
        self._reconciler = reconciler
        self._asked = asked
        """Fed with every pod listed or watched (the binding reads it)."""
        self.synced = asyncio.Event()
        """Set after the first list has been reconciled (tests wait for it)."""

    async def run(self) -> None:
        """List, reconcile, watch; again after any gap. Until cancelled."""
        while True:
            try:
                await self.follow_once()
            except Expired:
                log.info("pod watch expired; listing again")
            except KubeError as error:
                log.warning("pod list/watch failed (%s); listing again soon", error)
                await asyncio.sleep(self._settings.relist_delay_s)

    async def follow_once(self) -> None:
        pods = (await self._reconciler.reconcile()).pods
        if self._asked is not None:
            self._asked.replace(pods.items)
        self.synced.set()
        events = watch_pods(
            self._kube, pods.resource_version, timeout_seconds=self._settings.watch_timeout_s
        )
        async with contextlib.aclosing(events):
            async for event in events:
                await self.on_event(event)

    async def on_event(self, event: PodEvent) -> None:
        if self._asked is not None:
            if event.type == "DELETED":
                self._asked.forget(event.pod.metadata.uid)
            else:
                self._asked.remember(event.pod)
        allocation = self._follower.state.allocation(event.pod.metadata.uid)
        if allocation is None:
            return
        if event.type == "DELETED":
            await self._release(allocation, "deleted")
        elif is_finished(event.pod):
            await self._release(allocation, "terminated", event.pod.phase)

    async def _release(
        self, allocation: PodAllocation, reason: ReleaseReason, detail: str = ""
    ) -> None:
        try:
            await self._releases.release(allocation, reason, detail)
        except Exception:
            log.exception("could not release %s", allocation.pod.key)


def is_finished(pod: Pod) -> bool:
    return pod.phase in TERMINAL_PHASES


class OverdueSweeper:
    def __init__(
        self, follower: LogFollower, settings: BinderSettings, clock: Clock, releases: Releases
    ) -> None:
        self._follower = follower
        self._settings = settings
        self._clock = clock
        self._releases = releases

    async def run(self) -> None:
        while True:
            await self.sweep()
            await asyncio.sleep(self._settings.sweep_interval_s)

    async def sweep(self) -> int:
        """Release every overdue allocation now; returns how many."""
        overdue = list(
            overdue_allocations(
                self._follower.state,
                self._clock(),
                timedelta(seconds=self._settings.bind_timeout_s),
                timedelta(seconds=self._settings.assign_timeout_s),
            )
        )
        for _, allocation, reason in overdue:
            try:
                await self._releases.release(allocation, reason)
            except Exception:
                log.exception("could not release overdue %s", allocation.pod.key)
        return len(overdue)
