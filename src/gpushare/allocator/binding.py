"""The bind verb: reserve a card with compare-and-set, then wait for the binder's verdict.

No HTTP here. The flow for ``ExtenderBindingArgs``:

1. read the pod and the node through the
   :class:`~gpushare.core.ports.PodSource` and refuse a node the pod's own
   constraints exclude; the request reserved is the API pod's, never what filter or the
   caller said (:mod:`gpushare.allocator.pod_lookup`; without a source, the pod filter
   remembered);
2. if the pod already holds a live reservation on that node, do not reserve again;
3. otherwise decide on the folded node (``core.placement.reserve``: on the cards filter
   planned the pod on, while they still hold it, else by the policy) and append
   ``PodReserved`` expecting the node's ``last_seq``; if another writer got there
   first (:class:`AppendConflict`), catch up on that node and decide again;
4. answer only when the fold shows ``PodBound`` (success) or ``BindFailed`` /
   ``PodReleased`` (the reason) for that reservation, or the wait runs out.

Correctness across any number of allocator replicas rests on the compare-and-set alone:
a decision is only ever appended on top of the exact node history it was made from.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from gpushare.allocator.assumed import AssumedPlacements
from gpushare.allocator.metrics import AllocatorMetrics
from gpushare.allocator.outcomes import BOUND, BindAnswer, BindOutcome, OutcomeWaiters
from gpushare.allocator.placing import Placer
from gpushare.allocator.pod_cache import PodCache, RememberedPod
from gpushare.allocator.pod_lookup import PodLookup
from gpushare.allocator.settings import AllocatorSettings
from gpushare.allocator.wire import ExtenderBindingArgs, ExtenderBindingResult
from gpushare.bus.follow import LogFollower
from gpushare.core.errors import AppendConflict
from gpushare.core.events import PodReserved
from gpushare.core.fit import is_stale, why_unfit
from gpushare.core.placement import reserve
from gpushare.core.ports import AllocationLog, Clock, PodSource
from gpushare.core.state import NodeState, PodAllocation

log = logging.getLogger(__name__)


def reservation_id(uid: str, node: str, expected_seq: int) -> str:
    """The same decision gets the same id, so a retried append is deduplicated."""
    return f"reserve:{uid}:{node}:{expected_seq}"


class BindFlow:
    def __init__(
        self,
        follower: LogFollower,
        settings: AllocatorSettings,
        *,
        log: AllocationLog,
        pods: PodCache,
        metrics: AllocatorMetrics,
        clock: Clock,
        pod_source: PodSource | None = None,
        placer: Placer | None = None,
        assumed: AssumedPlacements | None = None,
    ) -> None:
        self._placer = placer or Placer(settings)
        self._assumed = assumed
        """Filter's plans (:mod:`.assumed`): a pod is reserved on the cards it was planned
        on while they still hold it (``None``: planned afresh at every bind)."""
        self._follower = follower
        self._settings = settings
        self._log = log
        self._metrics = metrics
        self._clock = clock
        self._lookup = PodLookup(pods, pod_source, settings.memory_unit)
        self._outcomes = OutcomeWaiters()
        follower.listen(self._outcomes.on_event)
        self._deciding: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        """A lock per node while any bind decides there (gone with its last holder)."""

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        """Never raises: every failure becomes the ``Error`` kube-scheduler reports."""
        try:
            answer = await self._bind(args)
        except Exception as error:
            log.exception("bind %s/%s on %s failed", args.pod_namespace, args.pod_name, args.node)
            answer = BindAnswer("error", f"gpushare allocator internal error: {error}")
        self._metrics.bind_outcomes.labels(answer.outcome).inc()
        log.info(
            "bind %s/%s (%s) on %s: %s %s",
            args.pod_namespace,
            args.pod_name,
            args.pod_uid,
            args.node,
            answer.outcome,
            answer.error,
            extra={"node": args.node, "pod": f"{args.pod_namespace}/{args.pod_name}"},
        )
        return ExtenderBindingResult(error=answer.error)

    async def _bind(self, args: ExtenderBindingArgs) -> BindAnswer:
        if not self._follower.ready.is_set():
            return BindAnswer("not_ready", "gpushare allocator is still replaying the log")
        found = await self._lookup.find(args)
        if isinstance(found, BindAnswer):
            return found
        return await self._reserve_and_wait(args.node, found)

    async def _reserve_and_wait(self, node_name: str, pod: RememberedPod) -> BindAnswer:
        async with self._deciding_on(node_name):
            reserved = await self._reserve(node_name, pod)
        if isinstance(reserved, BindAnswer):
            return reserved
        return await self._await_outcome(*reserved)

    def _deciding_on(self, node_name: str) -> asyncio.Lock:
        """This replica's decisions on one node, one at a time: binds that arrive together
        for one node (a packing policy sends pod after pod there) would otherwise decide
        on the same fold and all but one lose the compare-and-set, again and again."""
        lock = self._deciding.get(node_name)
        if lock is None:
            lock = self._deciding[node_name] = asyncio.Lock()
        return lock

    async def _reserve(
        self, node_name: str, pod: RememberedPod
    ) -> BindAnswer | tuple[str, asyncio.Future[BindOutcome]]:
        """The pod's reservation on the node, appended (or found there): its id and the
        future of its outcome; or the answer, when there is none to wait for."""
        for _ in range(self._settings.bind_attempts):
            state = self._follower.state
            node = state.node(node_name)
            existing = node.pods.get(pod.ref.uid)
            if existing is not None:
                if existing.bound:
                    return BOUND
                return existing.reservation_id, self._outcomes.expect(existing.reservation_id)
            elsewhere = state.allocation(pod.ref.uid)
            if elsewhere is not None:
                return self._refuse_elsewhere(elsewhere, state.node_of(pod.ref.uid) or "?")
            decision = self._decide(node, pod)
            if isinstance(decision, BindAnswer):
                return decision
            future = self._outcomes.expect(decision.id)
            try:
                seq = await self._log.append(decision, expected_last_seq=node.last_seq)
            except AppendConflict:
                self._outcomes.forget(decision.id, future)
                self._metrics.append_conflicts.inc()
                log.debug("lost the race on %s at seq %d; catching up", node_name, node.last_seq)
                await self._follower.catch_up(node_name)
                continue
            except BaseException:
                self._outcomes.forget(decision.id, future)
                raise
            # The compare-and-set held, so the decision is the node's next event: folded
            # now, the next decision on this node is made on it, before the live
            # subscription brings it back (and the fold then skips it by its sequence).
            self._follower.apply(seq, decision)
            return decision.id, future
        return BindAnswer(
            "conflicts_exhausted",
            f"node {node_name} changed under {self._settings.bind_attempts} decisions in a row "
            "(other pods are being placed there); try again",
        )

    def _decide(self, node: NodeState, pod: RememberedPod) -> PodReserved | BindAnswer:
        """The reservation for ``pod`` on the folded ``node``, or why there is none.

        At most one placement search per decision: none when the card filter planned the
        pod on still holds it, else the policy's own (``reserve``). A stale node is
        refused before any search; the reason a fresh node holds nothing is worded by
        ``why_unfit``, which does not search again.
        """
        now = self._clock.now()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("bind decision at %s: pod=%r node=%r", now.isoformat(), pod, node)
        max_per_card = self._placer.max_per_card
        planned = (
            None
            if self._assumed is None
            else self._assumed.planned(pod.ref.uid, node.name, self._clock.monotonic())
        )
        event = (
            None
            if is_stale(node, now)
            else reserve(
                node,
                pod.ref,
                pod.request,
                self._placer.policy_for(pod.request),
                reservation_id=reservation_id(pod.ref.uid, node.name, node.last_seq),
                at=now,
                max_per_card=max_per_card,
                pod_created_at=pod.created_at,
                reserved_by=self._settings.replica_id,
                planned=planned,
            )
        )
        if event is None:
            verdict = why_unfit(node, pod.request, now, max_per_card=max_per_card)
            reason = verdict.reason or f"no cards on {node.name} hold {pod.request.describe()}"
            return BindAnswer("no_fit", f"cannot reserve a GPU on {node.name}: {reason}")
        return event

    @staticmethod
    def _refuse_elsewhere(existing: PodAllocation, holder: str) -> BindAnswer:
        return BindAnswer(
            "reserved_elsewhere",
            f"pod already holds reservation {existing.reservation_id} on node {holder}; "
            "it must be bound or released before the pod can go to another node",
        )

    async def _await_outcome(
        self, reservation: str, future: asyncio.Future[BindOutcome]
    ) -> BindAnswer:
        wait = self._settings.bind_wait_seconds
        outcome = await self._outcomes.wait(reservation, future, wait)
        if outcome is None:
            return BindAnswer(
                "timeout",
                f"reservation {reservation} is in the log but was not bound within {wait:g}s "
                "(is the gpushare binder running?)",
            )
        if outcome.bound:
            return BOUND
        return BindAnswer("bind_failed", outcome.reason or "the binder could not bind the pod")

    def pending(self) -> int:
        """Binds waiting for the binder's verdict right now."""
        return len(self._outcomes)
