"""Giving memory back: when a pod is gone or finished, or its reservation was never bound.

:class:`PodReleaser` has the reconciler list every pod and correct the log from that
list (:mod:`.reconciling`: allocations whose pod no longer exists or has finished are
released there, ``reconciled``/``terminated``), then watches pods from the list's
resourceVersion: a pod ``DELETED``, or reaching phase ``Succeeded``/``Failed``, releases
its allocation. After any gap (API error, expired watch) it lists and reconciles again,
so a missed event is only late, never lost.

:class:`OverdueSweeper` releases reservations never bound within ``bind_timeout``, by the
injected clock. A bound reservation is never released because a timer ran out: the
kubelet may hold its cards (a Running pod whose ``Allocate`` the log missed). A bound pod
not fully assigned within ``assign_timeout`` is looked at instead: gone or finished
(``Succeeded``/``Failed``), it is released; otherwise it is reported once
(``DiscrepancyFound(assign_overdue)``, a warning, ``gpushare_binder_assign_overdue``) and
keeps its reservation. What the sweep knows of the pod comes from the releaser's list and
watch (:mod:`.sighting`); a pod not seen since it was bound is read first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

from gpushare.binder import metrics
from gpushare.binder.appending import append_event
from gpushare.binder.asking import AskedResources
from gpushare.binder.decisions import (
    LookUp,
    Overdue,
    OverdueAction,
    Release,
    overdue_action,
    overdue_allocations,
    overdue_found,
    still_open,
)
from gpushare.binder.pod_index import PodIndex
from gpushare.binder.reconciling import Reconciler
from gpushare.binder.settings import BinderSettings
from gpushare.binder.sighting import PodSightings
from gpushare.binder.watched_pods import WatchedPods
from gpushare.bus.follow import LogFollower
from gpushare.core.events import AnyEvent, PodReserved, ReleaseReason
from gpushare.core.pods import TERMINAL_PHASES, Pod, phase_detail
from gpushare.core.ports import Clock
from gpushare.core.reconciliation import pod_released
from gpushare.core.state import NodeState, PodAllocation
from gpushare.kube.backoff import RelistBackoff
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import Expired, KubeError
from gpushare.kube.nodes import annotate_release
from gpushare.kube.watching import PodEvent, watch_pods
from gpushare.tasks import cancel_and_wait

log = logging.getLogger(__name__)


TELL_AGAIN_AFTER_S = 2.0
"""A node's release annotation is written once more this long after its last release."""


class Releases:
    """Appends ``PodReleased`` for allocations the fold still holds, and tells
    kube-scheduler that the node has room again (its annotations change, so the pods the
    extender turned down are tried again).

    kube-scheduler may try them again before an allocator has folded the release (the
    annotation is written as soon as the log took it): turned down once more, they would
    wait for the next change of the node, minutes away. So the annotation is written
    again ``TELL_AGAIN_AFTER_S`` after the node's last release (one more write per node
    however many releases that time saw).
    """

    def __init__(
        self,
        follower: LogFollower,
        clock: Clock,
        kube: KubeClient | None = None,
        *,
        tell_again_after_s: float = TELL_AGAIN_AFTER_S,
    ) -> None:
        self._follower = follower
        self._clock = clock
        self._kube = kube
        """Where to tell kube-scheduler a node has room again (None: nobody to tell)."""
        self._tell_again_after_s = tell_again_after_s
        self._latest: dict[str, str] = {}
        """Node → its latest release's id, while a second telling is due."""
        self._again: set[asyncio.Task[None]] = set()

    async def release(
        self, allocation: PodAllocation, reason: ReleaseReason, detail: str = ""
    ) -> None:
        node = self._follower.state.node_of(allocation.pod.uid)
        if node is None:
            return  # released meanwhile
        event = pod_released(node, allocation, self._clock.now(), reason, detail)
        log.info("releasing %s on %s: %s %s", allocation.pod.key, node, reason, detail)
        await append_event(self._follower.log, event)
        if self._kube is None:
            return
        await self._tell(node, event.id)
        if node not in self._latest:
            task = asyncio.create_task(self._tell_again(node), name=f"release again {node}")
            self._again.add(task)
            task.add_done_callback(self._again.discard)
        self._latest[node] = event.id

    async def _tell(self, node: str, value: str) -> None:
        assert self._kube is not None
        try:
            await annotate_release(self._kube, node, value)
        except KubeError as error:  # the node gone, the API away: the next one tells
            log.info("could not annotate node %s after a release: %s", node, error)

    async def _tell_again(self, node: str) -> None:
        await asyncio.sleep(self._tell_again_after_s)
        await self._tell(node, f"{self._latest.pop(node)}/again")

    async def stop(self) -> None:
        """Drop the second tellings still due."""
        await cancel_and_wait(*self._again)
        self._latest.clear()


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
        sightings: PodSightings | None = None,
        watched: WatchedPods | None = None,
    ) -> None:
        self._follower = follower
        self._kube = kube
        self._settings = settings
        self._releases = releases
        self._reconciler = reconciler
        self._indexes: tuple[PodIndex[Any], ...] = tuple(
            index for index in (asked, sightings, watched) if index is not None
        )
        """Fed with every pod listed or watched: what each pod asked (the binding reads
        it), where it was last seen (the overdue sweep) and the pods a reconcile pass
        may correct (the periodic pass)."""
        self.synced = asyncio.Event()
        """Set after the first list has been reconciled (tests wait for it)."""

    async def run(self) -> None:
        """List, reconcile, watch; again after any gap, at once after a watch expired,
        after a wait that doubles with each failure in a row otherwise. Until cancelled."""
        backoff = RelistBackoff(self._settings.relist_delay_s)
        while True:
            try:
                await self.follow_once()
            except Expired:
                log.info("pod watch expired; listing again")
            except KubeError as error:
                wait = backoff.after_failure()
                log.warning("pod list/watch failed (%s); listing again in %.1f s", error, wait)
                await asyncio.sleep(wait)

    async def follow_once(self) -> None:
        pods = (await self._reconciler.reconcile()).pods
        for index in self._indexes:
            index.replace(pods.items)
        self.synced.set()
        events = watch_pods(
            self._kube, pods.resource_version, timeout_seconds=self._settings.watch_timeout_s
        )
        async with contextlib.aclosing(events):
            async for event in events:
                await self.on_event(event)

    async def on_event(self, event: PodEvent) -> None:
        for index in self._indexes:
            if event.type == "DELETED":
                index.forget(event.pod.metadata.uid)
            else:
                index.remember(event.pod)
        allocation = self._follower.state.allocation(event.pod.metadata.uid)
        if allocation is None:
            return
        if event.type == "DELETED":
            await self._release(allocation, "deleted")
        elif is_finished(event.pod):
            await self._release(allocation, "terminated", phase_detail(event.pod))

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
        self,
        follower: LogFollower,
        settings: BinderSettings,
        clock: Clock,
        releases: Releases,
        sightings: PodSightings,
    ) -> None:
        self._follower = follower
        self._settings = settings
        self._clock = clock
        self._releases = releases
        self._sightings = sightings
        self._reported: set[str] = set()
        """Reservation ids reported overdue by this binder (each once; forgotten when it is
        released or fully assigned)."""
        self.overdue: dict[str, Overdue] = {}
        """The last sweep's overdue pods, by reservation id: kept, reported."""
        self._open: dict[str, tuple[str, str]] = {}
        """Reservations a sweep looks at (reservation id → node, pod uid): each one the
        log makes, until a sweep finds it fully assigned or gone. Every sweep went
        through the whole fold before: 29 ms every 5 s at 33,000 allocations."""
        self._seeded = False
        follower.listen(self._on_event)

    def _on_event(self, _seq: int, event: AnyEvent, _node: NodeState) -> None:
        if isinstance(event, PodReserved):
            self._open[event.id] = (event.node, event.pod.uid)

    async def run(self) -> None:
        while True:
            await self.sweep()
            await asyncio.sleep(self._settings.sweep_interval_s)

    async def sweep(self) -> int:
        """Release what must be released now, report what is overdue; returns how many
        were released."""
        state = self._follower.state
        if not self._seeded:  # what the fold held before any event reached the listener
            self._seeded = True
            for node, allocation in overdue_allocations(state):
                self._open[allocation.reservation_id] = (node, allocation.pod.uid)
        released = 0
        overdue: dict[str, Overdue] = {}
        candidates = still_open(state, self._open)
        self._open = {a.reservation_id: (node, a.pod.uid) for node, a in candidates}
        for node, allocation in candidates:
            action = await self._decide(allocation)
            if isinstance(action, Release):
                released += await self._release(allocation, action)
            elif isinstance(action, Overdue):
                overdue[allocation.reservation_id] = action
                await self._report(node, allocation, action)
        self.overdue = overdue
        self._reported &= {allocation.reservation_id for _, allocation in candidates}
        metrics.ASSIGN_OVERDUE.set(len(overdue))
        return released

    async def _decide(self, allocation: PodAllocation) -> OverdueAction:
        bind_timeout = timedelta(seconds=self._settings.bind_timeout_s)
        assign_timeout = timedelta(seconds=self._settings.assign_timeout_s)
        now, uid = self._clock.now(), allocation.pod.uid
        seen = self._sightings.get(uid)
        action = overdue_action(allocation, now, bind_timeout, assign_timeout, seen)
        if not isinstance(action, LookUp):
            return action
        try:
            seen = await self._sightings.read(allocation.pod)
        except KubeError as error:
            log.warning("reading %s failed (%s); deciding later", allocation.pod.key, error)
            return None
        return overdue_action(allocation, now, bind_timeout, assign_timeout, seen, looked_up=True)

    async def _release(self, allocation: PodAllocation, action: Release) -> int:
        try:
            await self._releases.release(allocation, action.reason, action.detail)
        except Exception:
            log.exception("could not release overdue %s", allocation.pod.key)
            return 0
        return 1

    async def _report(self, node: str, allocation: PodAllocation, overdue: Overdue) -> None:
        if allocation.reservation_id in self._reported:
            return
        found = overdue_found(
            node,
            allocation,
            overdue,
            self._clock.now(),
            timedelta(seconds=self._settings.assign_timeout_s),
        )
        log.warning("%s on %s: %s", allocation.pod.key, node, found.detail)
        try:
            await append_event(self._follower.log, found)
        except Exception:
            log.exception("could not record %s as overdue", allocation.pod.key)
            return
        self._reported.add(allocation.reservation_id)
