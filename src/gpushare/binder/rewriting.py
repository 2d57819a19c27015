"""Rewriting a bound pod's annotations when the log moves it to other cards.

The node agent appends ``AllocationCorrected`` when the kubelet's pod-resources shows a
pod's containers on other cards than the log gave them; from then on the fold's shares
are the kubelet's. The binder replicas share one durable consumer on the log
(:mod:`.binding`), so exactly one of them handles each correction (a redelivery after a
failure or a crash may repeat it, with the same content). For every pod the event moves
(``also`` too) it writes one merge patch computed from the fold
(:func:`gpushare.core.annotations.moved_annotations`: the binding's builder on the moved
shares, the dialect keys from the names the pod asked, :mod:`.asking`), with the pod's
uid as precondition.

A moved pod the fold does not show bound yet waits (the message comes back later): its
Binding is in flight with the cards it was built with, and must land first. A pod gone or
replaced needs nothing. A failing API is retried on ``bind_attempts`` deliveries; what
is left after that, or was moved while no binder ran, is repaired by reconciliation
(:mod:`.reconciling`). Both write under one lock per pod, from the fold as it is when
they hold it, so this replica's writes to a pod never go back in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from datetime import datetime, timedelta
from typing import Literal

from gpushare.binder import metrics
from gpushare.binder.asking import AskedResources
from gpushare.binder.settings import BinderSettings
from gpushare.bus.follow import LogFollower
from gpushare.bus.nats_types import Msg
from gpushare.bus.sourcing import log_seq
from gpushare.core.annotations import asks_mgpu, moved_annotations
from gpushare.core.events import AllocationCorrected, AnyEvent
from gpushare.core.model import PodRef
from gpushare.core.ports import Clock
from gpushare.core.reconciliation import first_card_memory_mib
from gpushare.core.state import NodeState
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import ConflictError, KubeError, NotFound
from gpushare.kube.pods import patch_pod_annotations
from gpushare.telemetry.kubernetes import api_span

log = logging.getLogger(__name__)

Outcome = Literal["written", "gone", "unbound", "failed"]
Cause = Literal["moved", "reconciled"]


class _PodLock:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class AnnotationRewriter:
    def __init__(
        self,
        follower: LogFollower,
        kube: KubeClient,
        settings: BinderSettings,
        clock: Clock,
        asked: AskedResources,
    ) -> None:
        self._follower = follower
        self._kube = kube
        self._settings = settings
        self._clock = clock
        self._asked = asked
        self._locks: dict[str, _PodLock] = {}
        self._moved_at: dict[str, datetime] = {}
        """When this binder folded the latest move of each pod (by uid)."""
        follower.listen(self._on_event)

    def _on_event(self, _seq: int, event: AnyEvent, _node: NodeState) -> None:
        if isinstance(event, AllocationCorrected):
            now = self._clock.now()
            for corrected in event.corrected():
                self._moved_at[corrected.pod.uid] = now

    def moved_before_start(self) -> None:
        """Count every allocation the fold shows moved as moved now: a move folded while
        no binder ran is about to be rewritten by the shared consumer."""
        now = self._clock.now()
        for node in list(self._follower.state.nodes.values()):
            for uid, allocation in node.pods.items():
                if allocation.corrected:
                    self._moved_at.setdefault(uid, now)

    def settling(self) -> frozenset[str]:
        """Pods moved less than ``rewrite_grace_s`` ago: their rewrite may be in flight."""
        horizon = self._clock.now() - timedelta(seconds=self._settings.rewrite_grace_s)
        self._moved_at = {uid: at for uid, at in self._moved_at.items() if at > horizon}
        return frozenset(self._moved_at)

    @contextlib.asynccontextmanager
    async def lock(self, uid: str) -> AsyncIterator[None]:
        """Hold the pod's lock: one write to a pod at a time in this binder."""
        entry = self._locks.get(uid)
        if entry is None:
            entry = self._locks[uid] = _PodLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._locks[uid]

    async def patch(self, pod: PodRef, annotations: Mapping[str, str], cause: Cause) -> Outcome:
        """One merge patch of the pod's annotations, only if it is still this pod."""
        try:
            with api_span("PATCH", "pods", namespace=pod.namespace, name=pod.name, uid=pod.uid):
                await patch_pod_annotations(
                    self._kube, pod.namespace, pod.name, annotations, uid=pod.uid
                )
        except (NotFound, ConflictError) as error:
            log.info("not rewriting the annotations of %s: %s", pod.key, error.message)
            outcome: Outcome = "gone"
        except KubeError as error:
            log.warning("rewriting the annotations of %s failed: %s", pod.key, error.message)
            outcome = "failed"
        else:
            log.info("rewrote the annotations of %s (%s): %s", pod.key, cause, sorted(annotations))
            outcome = "written"
        metrics.ANNOTATION_REWRITES.labels(cause, outcome).inc()
        return outcome

    async def rewrite_moved(self, pod: PodRef, reservation_id: str) -> Outcome:
        """Make the pod's annotations name the cards its allocation has now."""
        async with self.lock(pod.uid):
            state = self._follower.state
            allocation = state.allocation(pod.uid)
            if allocation is None or allocation.reservation_id != reservation_id:
                return "gone"  # released or replaced since
            if not allocation.bound:
                return "unbound"
            try:
                asked = await self._asked.lookup(pod)
            except KubeError as error:
                log.warning("reading %s failed (%s); rewriting it later", pod.key, error)
                return "failed"
            node = state.node_of(pod.uid) or ""
            memory = first_card_memory_mib(state.node(node), allocation.shares)
            annotations = moved_annotations(
                allocation, node, memory, self._settings.memory_unit, mgpu=asks_mgpu(asked)
            )
            return await self.patch(pod, annotations, "moved")

    async def on_corrected(self, event: AllocationCorrected, msg: Msg) -> None:
        """Handle one ``AllocationCorrected`` of the shared consumer: ack it once every pod
        it moves is rewritten (or gone), else let it come back later."""
        if self._follower.applied_seq < log_seq(msg):
            log.info("correction %s is not folded yet; later", event.id)
            await msg.nak(delay=self._settings.retry_delay_s)
            return
        outcomes = [
            await self.rewrite_moved(moved.pod, moved.reservation_id) for moved in event.corrected()
        ]
        deliveries = msg.metadata.num_delivered
        if "unbound" in outcomes or (
            "failed" in outcomes and deliveries < self._settings.bind_attempts
        ):
            await msg.nak(delay=self._settings.retry_delay_s)
            return
        if "failed" in outcomes:
            log.warning(
                "giving up rewriting the annotations moved by %s after %d deliveries; "
                "reconciliation repairs them",
                event.id,
                deliveries,
            )
        await msg.ack()
