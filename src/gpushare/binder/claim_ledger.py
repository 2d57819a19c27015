"""Recording kube-scheduler's DRA allocations in the allocation log.

kube-scheduler allocates a ResourceClaim of our DeviceClass on its own (it writes
``status.allocation``); the binder follows every claim (an informer) and makes the log
say the same: a ``ClaimAllocated`` for each claim allocated on our devices that the fold
does not hold (or holds differently: other shares, or other pods in its ``reservedFor``, as
pods join and leave a shared claim), a ``ClaimReleased`` for each claim the fold holds
that is gone or no longer allocated. The fold then counts the claims on their cards like
any reservation, ``audit``/``inspect``/``explain`` show them, and the node agent's DRA
plugin prepares them from the log.

Ids are derived from the claim and its allocation, so replicas appending the same fact
are deduplicated by the stream, and a restart appends nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gpushare.binder.appending import append_event
from gpushare.binder.settings import BinderSettings
from gpushare.bus.follow import LogFollower
from gpushare.core.dra_claims import claim_node, ledger_changes
from gpushare.core.events import ClaimAllocated, ClaimReleased
from gpushare.core.model import PodRef
from gpushare.core.ports import Clock
from gpushare.kube.client import KubeClient
from gpushare.kube.dra_objects import claim_informer, read_claim
from gpushare.kube.errors import KubeError, NotFound
from gpushare.telemetry.dra import claim_span

log = logging.getLogger(__name__)


class ClaimLedger:
    def __init__(
        self, follower: LogFollower, kube: KubeClient, settings: BinderSettings, clock: Clock
    ) -> None:
        self._follower = follower
        self._settings = settings
        self._clock = clock
        self._kube = kube
        self._wake = asyncio.Event()
        self.claims = claim_informer(kube, on_change=self._wake.set)
        self.appended = 0

    async def run(self) -> None:
        informer = asyncio.create_task(self.claims.run(), name="binder-claim-informer")
        try:
            await self.claims.wait_synced()
            while True:
                self._wake.clear()
                if self.claims.synced:
                    await self.record()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._settings.claim_recheck_s):
                        await self._wake.wait()
        finally:
            informer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await informer

    async def record(self) -> None:
        """Append what the log lacks of the claims' allocations."""
        changes = ledger_changes(self.claims.items(), self._follower.state, self._clock.now())
        for problem in changes.problems:
            log.warning("%s", problem)
        events = changes.events
        for event in events:
            if isinstance(event, ClaimReleased) and await self._still_allocated(event):
                continue
            pods = ", ".join(pod.key for pod in event.pods) or "no pod"
            log.info("%s %s on %s for %s", type(event).__name__, event.claim.key, event.node, pods)
            pod = self._traced_pod(event)
            shares = event.shares if isinstance(event, ClaimAllocated) else ()
            with claim_span(
                "allocated" if isinstance(event, ClaimAllocated) else "released",
                claim=event.claim.key,
                node=event.node,
                pod=(pod.namespace, pod.name, pod.uid) if pod else None,
                cards=tuple(share.card_uuid for share in shares),
                memory_mib=sum(share.memory_mib for share in shares),
            ):
                await append_event(self._follower.log, event)
            self.appended += 1
        for node in sorted({event.node for event in events}):
            await self._follower.catch_up(node)  # our own events folded before the next look

    def _traced_pod(self, event: ClaimAllocated | ClaimReleased) -> PodRef | None:
        """The pod whose trace the record's span joins: the first one the record adds to
        the claim (a pod that just joined a shared claim), else the first it names."""
        held = self._follower.state.node(event.node).claims.get(event.claim.uid)
        before = held.pods if held is not None and isinstance(event, ClaimAllocated) else ()
        joined = [pod for pod in event.pods if pod not in before]
        return joined[0] if joined else (event.pods[0] if event.pods else None)

    async def _still_allocated(self, release: ClaimReleased) -> bool:
        """Whether the API still has the claim allocated on the node: this replica's cache
        may lag another replica's, which recorded the allocation; a release is only
        appended once the API confirms it."""
        try:
            claim = await read_claim(self._kube, release.claim.namespace, release.claim.name)
        except NotFound:
            return False
        except KubeError as error:
            log.info("reading claim %s failed (%s); release deferred", release.claim.key, error)
            return True
        uid = str(claim.get("metadata", {}).get("uid", ""))
        return uid == release.claim.uid and claim_node(claim) == release.node
