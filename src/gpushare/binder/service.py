"""The binder, assembled: one fold of the log and the loops that act on it.

:class:`Binder` takes its connections (JetStream, Kubernetes) and a clock from its
caller, so ``__main__`` and the tests build it the same way. Each loop runs supervised:
an unexpected exception is logged and the loop restarts after a pause, so one bad
event or API answer never takes the service down.
"""

from __future__ import annotations

import asyncio
import logging

from gpushare.binder.asking import AskedResources
from gpushare.binder.assigning import AssignedMarker
from gpushare.binder.binding import BindingWorker
from gpushare.binder.capacity import CapacityWriter
from gpushare.binder.claim_ledger import ClaimLedger
from gpushare.binder.device_sync import DeviceSync
from gpushare.binder.gating import AgentGate
from gpushare.binder.reconciling import Reconciler
from gpushare.binder.releasing import OverdueSweeper, PodReleaser, Releases
from gpushare.binder.resource_slices import SlicePublisher
from gpushare.binder.rewriting import AnnotationRewriter
from gpushare.binder.settings import BinderSettings
from gpushare.binder.sighting import PodSightings
from gpushare.binder.watched_pods import WatchedPods
from gpushare.bus.follow import LogFollower
from gpushare.bus.lag import LogLag
from gpushare.bus.nats_types import JetStreamContext, NatsConnectionClosed
from gpushare.bus.streams import ensure_streams
from gpushare.clock import SYSTEM_CLOCK
from gpushare.core.ports import Clock
from gpushare.exposition import MetricsServer, serve_metrics
from gpushare.kube.client import KubeClient
from gpushare.tasks import cancel_and_wait, supervised

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0
STOP_WAIT_S = 30.0
"""The longest a stop waits for the binding loop's batch in flight (normally ~1 s)."""


class Binder:
    def __init__(
        self,
        js: JetStreamContext,
        kube: KubeClient,
        settings: BinderSettings,
        clock: Clock = SYSTEM_CLOCK,
        *,
        gate: AgentGate | None = None,
    ) -> None:
        self.settings = settings
        self._js = js
        self.follower = LogFollower(js, writer="binder")
        self.releases = releases = Releases(self.follower, clock, kube)
        self.asked = AskedResources(kube)
        self.sightings = PodSightings(kube)
        self.rewriter = AnnotationRewriter(self.follower, kube, settings, clock, self.asked)
        self.binding = BindingWorker(
            js,
            self.follower,
            kube,
            settings,
            clock,
            asked=self.asked,
            rewriter=self.rewriter,
            gate=gate,
        )
        self.watched = WatchedPods(self.follower)
        self.reconciler = Reconciler(
            self.follower, kube, settings, clock, rewriter=self.rewriter, watched=self.watched
        )
        self.releaser = PodReleaser(
            self.follower,
            kube,
            settings,
            releases,
            reconciler=self.reconciler,
            asked=self.asked,
            sightings=self.sightings,
            watched=self.watched,
        )
        self.sweeper = OverdueSweeper(self.follower, settings, clock, releases, self.sightings)
        self.marker = AssignedMarker(self.follower, kube, settings, watched=self.watched)
        self.capacity = CapacityWriter(self.follower, kube, settings, clock)
        self.devices = DeviceSync(self.follower, kube, settings, clock)
        self.slices = SlicePublisher(self.follower, kube, settings, clock)
        self.claims = ClaimLedger(self.follower, kube, settings, clock)
        self._tasks: list[asyncio.Task[None]] = []
        self.metrics: MetricsServer | None = None

    def inventoried(self, node: str) -> bool:
        """Whether the log holds cards reported for ``node`` (gpushare serves it)."""
        found = self.follower.state.nodes.get(node)
        return found is not None and bool(found.cards)

    async def start(self) -> Binder:
        """Replay the log, then start every loop. Returns once the fold is current."""
        await ensure_streams(self._js, self.settings.stream_replicas)
        await self.follower.start()
        await asyncio.wait_for(self.follower.ready.wait(), READY_TIMEOUT_S)
        self.rewriter.moved_before_start()
        await self.binding.subscribe()
        loops = {
            "binding": self.binding.run,
            "releasing": self.releaser.run,
            "reconciling": self.reconciler.run,
            "sweeping": self.sweeper.run,
            "assigning": self.marker.run,
            "capacity": self.capacity.run,
        }
        if self.settings.sync_devices:
            loops["devices"] = self.devices.run
        if self.settings.dra:
            loops["slices"] = self.slices.run
            loops["claims"] = self.claims.run
        for name, loop in loops.items():
            self._tasks.append(
                asyncio.create_task(
                    supervised(
                        f"binder loop {name}", loop, log, ends_quietly=(NatsConnectionClosed,)
                    ),
                    name=f"binder-{name}",
                )
            )
        if self.settings.metrics_port is not None:
            lag = LogLag("binder", [self.follower])
            self.metrics = await serve_metrics(self.settings.metrics_port, [lag], [lag.refresh])
        log.info("binder started (consumer %s)", self.settings.consumer)
        return self

    async def stop(self) -> None:
        """Let the binding loop finish its batch, then cancel the other loops (again: nothing)."""
        self.binding.stop()
        binding = [task for task in self._tasks if task.get_name() == "binder-binding"]
        if binding:  # not stopped already
            await asyncio.wait(binding, timeout=STOP_WAIT_S)
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        await self.releases.stop()
        await self.follower.stop()
        if self.metrics is not None:
            await self.metrics.stop()
            self.metrics = None
        log.info("binder stopped")
