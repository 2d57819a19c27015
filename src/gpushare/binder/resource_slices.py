"""Publishing the cards of DRA-served nodes as ResourceSlices (:mod:`gpushare.core.dra`).

Every inventory event marks its node; marked nodes are rendered and applied when the
devices they publish changed since this replica last applied them (a heartbeat changes
nothing, so it costs nothing). A node gets a slice while it reports and says
``front_door: dra``; the slice of a node that went silent (for ``SILENT_HEARTBEATS``
heartbeats: a reporter starved for a moment must not make kube-scheduler see the pool
vanish and come back), left DRA or is gone is deleted, so kube-scheduler does not go on
allocating cards nobody reports. Every
``device_resync_s`` all slices are listed and compared again (one deleted or edited by
hand comes back).

Every binder replica renders the same slices from the same log; server-side apply makes
their writes agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta
from typing import Any

from gpushare.binder.settings import BinderSettings
from gpushare.bus.follow import LogFollower
from gpushare.core.dra import resource_slice, slice_devices, slice_name
from gpushare.core.events import AnyEvent, InventoryReported
from gpushare.core.ports import Clock
from gpushare.core.requests import MEMORY_UNITS_MIB
from gpushare.core.state import NodeState
from gpushare.kube.client import KubeClient
from gpushare.kube.dra_objects import apply_slice, delete_slice, list_slices
from gpushare.kube.errors import KubeError

log = logging.getLogger(__name__)


SILENT_HEARTBEATS = 10
"""A DRA node's slice is withdrawn once its reporter has been silent this many heartbeats
(at least ``SILENT_MIN_SECONDS``); the extender stops offering a node after 3."""
SILENT_MIN_SECONDS = 30.0


def reporting(node: NodeState, now: datetime) -> bool:
    """Whether ``node``'s reporter has been heard from recently enough to keep its slice."""
    if node.inventory_at is None:
        return False
    silence = max(SILENT_HEARTBEATS * node.heartbeat_seconds, SILENT_MIN_SECONDS)
    return node.inventory_at >= now - timedelta(seconds=silence)


def wanted_slice(node: NodeState, now_fresh: bool, memory_step_mib: int) -> dict[str, Any] | None:
    """The slice ``node`` should have now; ``None`` when it should have none."""
    if node.front_door != "dra" or node.inventory_at is None or not now_fresh:
        return None
    generation = int(node.inventory_at.timestamp())
    return resource_slice(
        node.name,
        node.cards,
        node.links,
        generation=generation,
        memory_step_mib=memory_step_mib,
    )


class SlicePublisher:
    def __init__(
        self, follower: LogFollower, kube: KubeClient, settings: BinderSettings, clock: Clock
    ) -> None:
        self._follower = follower
        self._kube = kube
        self._settings = settings
        self._clock = clock
        self._marked: set[str] = set()
        self._wake = asyncio.Event()
        self._applied: dict[str, list[Any] | None] = {}
        """The devices this replica last applied per node (``None``: it deleted the slice)."""
        self.writes = 0
        follower.listen(self._on_event)

    def _on_event(self, _seq: int, event: AnyEvent, _node: NodeState) -> None:
        if isinstance(event, InventoryReported):
            self._marked.add(event.node)
            self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_resync = loop.time()
        while True:
            if loop.time() >= next_resync:
                await self.resync()
                next_resync = loop.time() + self._settings.device_resync_s
            with contextlib.suppress(TimeoutError):
                # stale inventories are noticed within a heartbeat or so
                wait = min(max(0.0, next_resync - loop.time()), self._settings.slice_check_s)
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            self._wake.clear()
            marked, self._marked = sorted(self._marked | self._silenced()), set()
            for name in marked:
                await self.sync(name)

    def _silenced(self) -> set[str]:
        """Nodes whose slice this replica applied and whose reporter has gone silent since:
        their slice is withdrawn. (A reporting node's devices change only with an
        inventory event, which marks it, so it need not be rendered again every round.)"""
        now, nodes = self._clock.now(), self._follower.state.nodes
        return {
            name
            for name, devices in self._applied.items()
            if devices is not None and not (name in nodes and reporting(nodes[name], now))
        }

    async def resync(self) -> None:
        """Compare every slice of our driver with the log; delete those no node wants."""
        try:
            existing = await list_slices(self._kube)
        except KubeError as error:
            log.warning("listing ResourceSlices failed: %s", error.message)
            return
        self._applied = {}
        nodes = self._follower.state.nodes
        for name, node in sorted(nodes.items()):
            want, have = self._wanted(node), existing.get(slice_name(name))
            if want is None and have is None:
                self._applied[name] = None
            elif (
                want is not None and have is not None and slice_devices(have) == slice_devices(want)
            ):
                self._applied[name] = slice_devices(want)
            else:
                await self.sync(name)
        for name, body in sorted(existing.items()):
            owner = str(body.get("spec", {}).get("nodeName", ""))
            if owner not in nodes:  # a node the log never heard of
                await self._delete(owner, name)

    def _wanted(self, node: NodeState) -> dict[str, Any] | None:
        fresh = reporting(node, self._clock.now())
        step = MEMORY_UNITS_MIB[self._settings.memory_unit]
        return wanted_slice(node, fresh, step)

    async def sync(self, name: str) -> None:
        """Apply or delete ``name``'s slice if what it publishes changed."""
        want = self._wanted(self._follower.state.node(name))
        devices = None if want is None else slice_devices(want)
        if name in self._applied and self._applied[name] == devices:
            return
        if want is None:
            await self._delete(name, slice_name(name))
            return
        try:
            await apply_slice(self._kube, want)
        except KubeError as error:
            log.warning("applying the ResourceSlice of %s failed: %s", name, error.message)
            self._applied.pop(name, None)
            self._marked.add(name)  # tried again in the next round
            return
        self._applied[name] = devices
        self.writes += 1
        log.info("published %d card(s) of %s to DRA", len(devices or ()), name)

    async def _delete(self, node: str, name: str) -> None:
        try:
            await delete_slice(self._kube, name)
        except KubeError as error:
            log.warning("deleting the ResourceSlice %s failed: %s", name, error.message)
            self._applied.pop(node, None)
            return
        self._applied[node] = None
