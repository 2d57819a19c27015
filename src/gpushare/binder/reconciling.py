"""Reconciling the log with the Kubernetes API, at start and every ``--reconcile-interval``.

A pass snapshots the fold, *then* lists pods and nodes (every allocation in the snapshot
existed before the lists, so a pod they lack is gone), asks
:func:`gpushare.core.reconciliation.reconcile` what to correct, and appends it:

* an adoption's ``PodReserved`` with compare-and-set on its node (``expected_last_seq`` =
  the node's ``last_seq`` in the fold it was decided on). Lost the race: the node is read
  again and the pod decided again (bounded), then ``PodBound`` and any
  ``ContainerAssigned`` follow;
* releases as they are (their ids make a repeat harmless);
* annotation repairs: decided again on the newest fold (the node caught up first: the
  list may already show a rewrite newer than the snapshot), then one merge patch under
  the pod's lock of :mod:`.rewriting`; a repair that found a key naming something else
  also records it (not for a pod moved moments ago, whose rewrite may be in flight);
* a discrepancy once while it lasts, not every pass (a finding no pass makes any more is
  forgotten), and its id makes a second binder's identical finding a duplicate.

The pod releaser's list (at start and after every watch gap) is a pass too: it calls
:meth:`Reconciler.reconcile` and watches from the list it returns. The periodic pass
first decides over the pods that watch keeps (:mod:`.watched_pods`, :meth:`Reconciler.probe`)
and lists only when they show something to correct. A node list the API
refuses skips the node checks; a pod list it refuses fails the pass (``KubeError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Collection, Sequence
from dataclasses import dataclass
from datetime import timedelta

from gpushare.binder import metrics
from gpushare.binder.appending import append_event
from gpushare.binder.asking import AskedResources
from gpushare.binder.rewriting import AnnotationRewriter
from gpushare.binder.settings import BinderSettings
from gpushare.binder.watched_pods import WatchedPods
from gpushare.bus.follow import LogFollower
from gpushare.bus.nats_types import NatsError
from gpushare.core.errors import AppendConflict
from gpushare.core.events import AllocationEvent, DiscrepancyFound
from gpushare.core.fit import is_stale
from gpushare.core.model import PodRef
from gpushare.core.pods import Pod
from gpushare.core.ports import Clock
from gpushare.core.reconciliation import (
    Adoption,
    AnnotationRepair,
    Context,
    Corrections,
    annotation_repair,
    decide_pod,
    reconcile,
)
from gpushare.core.state import ClusterState, NodeState
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import KubeError
from gpushare.kube.nodes import list_node_names
from gpushare.kube.pods import PodList, list_pods

log = logging.getLogger(__name__)

ADOPT_ATTEMPTS = 5
"""Compare-and-set rounds for one adoption before the pass leaves it to the next."""


@dataclass(frozen=True)
class Pass:
    """One pass: the pod list it read (the releaser watches from it), what it appended and
    the pods whose annotations it patched."""

    pods: PodList
    appended: tuple[AllocationEvent, ...]
    repaired: tuple[PodRef, ...] = ()


async def decided(
    folded: dict[str, NodeState],
    pods: Sequence[Pod],
    nodes: Collection[str] | None,
    context: Context,
) -> tuple[ClusterState, Corrections]:
    """The fold's snapshot (``folded``: a copy of its node map) and what a pass over
    ``pods`` corrects in it, decided on a worker thread: 12-15 µs a pod, so 33,000 GPU
    pods held the binder's event loop, bindings included, for 0.5 s (``make bench-log``);
    on the thread the loop waits about two of the interpreter's switch intervals (11 ms)
    at most. The node states are frozen, and the snapshot and ``pods`` are the pass's own."""

    def decide() -> tuple[ClusterState, Corrections]:
        snapshot = ClusterState(folded)
        return snapshot, reconcile(snapshot, pods, nodes, context)

    return await asyncio.to_thread(decide)


class Reconciler:
    def __init__(
        self,
        follower: LogFollower,
        kube: KubeClient,
        settings: BinderSettings,
        clock: Clock,
        *,
        rewriter: AnnotationRewriter | None = None,
        watched: WatchedPods | None = None,
    ) -> None:
        self._follower = follower
        self._watched = watched
        """The pods a pass may correct, from the releaser's list and watch: checked
        first by the periodic pass (:meth:`probe`); without them every pass lists."""
        self._kube = kube
        self._settings = settings
        self._clock = clock
        self._rewriter = rewriter or AnnotationRewriter(
            follower, kube, settings, clock, AskedResources(kube)
        )
        self._lock = asyncio.Lock()
        self._recorded: set[str] = set()
        """Ids of the discrepancies this binder appended, while they last."""
        self._found: set[str] = set()
        """Ids of the discrepancies the pass in progress found."""
        self._repaired: list[PodRef] = []
        self.passes = 0
        self.probes = 0

    async def run(self) -> None:
        """A pass every ``reconcile_interval_s`` (the first one comes with the pod list):
        over the watched pods, then over a new pod list when they show work."""
        interval = self._settings.reconcile_interval_s
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                if await self.probe():
                    await self.reconcile()
            except KubeError as error:
                log.warning("reconciling: listing failed (%s); next pass later", error)

    async def probe(self) -> bool:
        """Whether a pass must list the pods: the watched pods, against the fold, call
        for a correction (or a discrepancy not recorded yet). Without an index of watched
        pods, always; before the releaser's first list (a pass itself), never.

        Nodes are listed only when one of the fold's reporters is silent: a node counts
        as gone only then (``node_gone``); a pod bound to a node never reported is then
        taken for an adoption, and the pass that follows decides it with the node list.
        A probe corrects nothing itself: the watch may be a moment behind the fold (a pod
        just bound, its annotations not seen yet), and a pass corrects only from a list
        read after its snapshot. A recorded discrepancy the probe no longer finds is
        forgotten, as after a pass, so that it is recorded again if it comes back."""
        watched = self._watched
        if watched is None:
            return True
        if not watched.listed:
            return False  # the releaser's first list is a pass of its own, on its way
        async with self._lock:
            folded = dict(self._follower.state.nodes)
            context = self._context()
            silent = any(is_stale(node, context.now) for node in folded.values())
            nodes = await self._node_names() if silent else None
            _, corrections = await decided(folded, watched.pods(), nodes, context)
            metrics.RECONCILE_PROBES.inc()
            self.probes += 1
            found = {discrepancy.id for discrepancy in corrections.discrepancies}
            if corrections.adoptions or corrections.releases or corrections.repairs:
                return True
            if found - self._recorded:
                return True
            metrics.set_reconcile_findings(finding_kinds(corrections))
            self._recorded &= found
            return False

    async def reconcile(self) -> Pass:
        """One whole pass; raises ``KubeError`` when the pods cannot be listed."""
        async with self._lock:
            folded = dict(self._follower.state.nodes)
            pods = await list_pods(self._kube)
            nodes = await self._node_names()
            context = self._context()
            snapshot, corrections = await decided(folded, pods.items, nodes, context)
            metrics.RECONCILE_PASSES.inc()
            metrics.set_reconcile_findings(finding_kinds(corrections))
            self._found, self._repaired = set(), []
            appended = await self._apply(corrections, snapshot, pods.items, nodes)
            self._recorded &= self._found  # what no longer lasts is recorded again if it recurs
            self.passes += 1
            if appended:
                log.info("reconciling: %d corrections appended", len(appended))
            return Pass(pods, tuple(appended), tuple(self._repaired))

    def _context(self) -> Context:
        return Context(
            now=self._clock.now(),
            bind_timeout=timedelta(seconds=self._settings.bind_timeout_s),
            memory_unit=self._settings.memory_unit,
            settling=self._rewriter.settling(),
        )

    async def _node_names(self) -> frozenset[str] | None:
        try:
            return await list_node_names(self._kube)
        except KubeError as error:
            log.warning("reconciling: cannot list nodes (%s); node checks skipped", error)
            return None

    async def _apply(
        self,
        corrections: Corrections,
        snapshot: ClusterState,
        pods: tuple[Pod, ...],
        nodes: Collection[str] | None,
    ) -> list[AllocationEvent]:
        by_uid = {pod.metadata.uid: pod for pod in pods}
        appended: list[AllocationEvent] = []
        for adoption in corrections.adoptions:
            expected = snapshot.node(adoption.reserved.node).last_seq
            pod = by_uid[adoption.reserved.pod.uid]
            appended += await self._guarded(self._adopt(adoption, expected, pod, nodes))
        for release in corrections.releases:
            log.info("reconciling: releasing %s (%s)", release.pod.key, release.reason)
            appended += await self._guarded(self._append(release))
        for repair in corrections.repairs:
            appended += await self._guarded(self._repair(repair, by_uid[repair.pod.uid]))
        for found in corrections.discrepancies:
            appended += await self._guarded(self._record(found))
        for node in sorted({event.node for event in appended}):
            with contextlib.suppress(NatsError, TimeoutError):
                await self._follower.catch_up(node)  # the next pass decides on them
        return appended

    async def _adopt(
        self, adoption: Adoption, expected: int, pod: Pod, nodes: Collection[str] | None
    ) -> list[AllocationEvent]:
        """Append the adoption with compare-and-set; on a lost race, decide again."""
        log_ = self._follower.log
        for _ in range(ADOPT_ATTEMPTS):
            try:
                await log_.append(adoption.reserved, expected_last_seq=expected)
            except AppendConflict:
                metrics.APPEND_CONFLICTS.inc()
                name = adoption.reserved.node
                await self._follower.catch_up(name)
                decided = decide_pod(self._follower.state, pod, nodes, self._context())
                if isinstance(decided, DiscrepancyFound):
                    return await self._record(decided)
                if not isinstance(decided, Adoption):
                    return []  # adopted meanwhile: the next pass compares its annotations
                adoption, expected = decided, self._follower.state.node(name).last_seq
                continue
            for event in adoption.events[1:]:
                await append_event(log_, event)
            log.info("reconciling: adopted %s on %s", pod_key(pod), adoption.reserved.node)
            return list(adoption.events)
        log.warning("reconciling: %s kept changing; adopting it next pass", pod_key(pod))
        return []

    async def _append(self, event: AllocationEvent) -> list[AllocationEvent]:
        await append_event(self._follower.log, event)
        return [event]

    async def _repair(self, decided: AnnotationRepair, pod: Pod) -> list[AllocationEvent]:
        """Patch the pod's annotations to its allocation in the newest fold (the pass's
        snapshot may be older than what a rewrite already wrote); record a disagreement."""
        uid, name = decided.pod.uid, decided.node
        async with self._rewriter.lock(uid):
            with contextlib.suppress(NatsError, TimeoutError):
                await self._follower.catch_up(name)
            state = self._follower.state
            live = state.allocation(uid)
            if live is None or not live.bound or state.node_of(uid) != name:
                return []
            repair = annotation_repair(pod, state.node(name), live, self._context())
            if repair is None:
                return []  # written meanwhile
            outcome = await self._rewriter.patch(decided.pod, repair.patch, "reconciled")
        if outcome == "written":
            self._repaired.append(decided.pod)
        return [] if repair.found is None else await self._record(repair.found)

    async def _record(self, found: DiscrepancyFound) -> list[AllocationEvent]:
        self._found.add(found.id)
        if found.id in self._recorded:
            return []
        log.error("reconciling: %s: %s: %s", found.kind, found.pod and found.pod.key, found.detail)
        await append_event(self._follower.log, found)
        self._recorded.add(found.id)
        return [found]

    @staticmethod
    async def _guarded(work: Awaitable[list[AllocationEvent]]) -> list[AllocationEvent]:
        """One correction; NATS away is logged and the correction left to the next pass."""
        try:
            return await work
        except (NatsError, TimeoutError) as error:
            log.warning("reconciling: appending failed (%s); the next pass retries", error)
            return []


def finding_kinds(corrections: Corrections) -> dict[str, int]:
    """How many of each kind a pass found (for the metrics)."""
    kinds = {
        "adoption": len(corrections.adoptions),
        "release": len(corrections.releases),
        "annotation_repair": len(corrections.repairs),
    }
    found = [repair.found for repair in corrections.repairs if repair.found is not None]
    for finding in (*corrections.discrepancies, *found):
        kinds[finding.kind] = kinds.get(finding.kind, 0) + 1
    return kinds


def pod_key(pod: Pod) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"
