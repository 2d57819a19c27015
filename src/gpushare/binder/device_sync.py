"""Keeping each node's ``Device`` custom resource in step with the fold.

Every inventory and every allocation event marks its node; at most once every
``device_sync_interval_s`` the marked nodes are rendered (:mod:`gpushare.core.device_resource`)
and written, each only when its status differs from what this replica last wrote. A
burst of reservations on a node therefore costs one write, not one per event.

Every ``device_resync_s`` all nodes are rendered and compared with the API again (a
Device deleted or edited by hand comes back), and the Devices of nodes that are gone
(no inventory, or no longer in the API and silent) are deleted.

Every binder replica runs this and renders the same content from the same log, so
their writes agree; a replica behind the log never overwrites a Device written from
further along (:func:`gpushare.kube.device_objects.write_device`). Without the CRD installed
the writes are skipped with one log line and tried again at the next resync.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime
from typing import Any

from gpushare.binder.settings import BinderSettings
from gpushare.bus.follow import LogFollower
from gpushare.core.device_resource import devices_to_delete, render_device
from gpushare.core.events import AnyEvent, InventoryReported
from gpushare.core.ports import Clock
from gpushare.core.state import NodeState
from gpushare.kube.client import KubeClient
from gpushare.kube.device_objects import delete_device, list_devices, write_device
from gpushare.kube.errors import KubeError, NotFound
from gpushare.kube.nodes import list_node_names

log = logging.getLogger(__name__)


class DeviceSync:
    def __init__(
        self, follower: LogFollower, kube: KubeClient, settings: BinderSettings, clock: Clock
    ) -> None:
        self._follower = follower
        self._kube = kube
        self._settings = settings
        self._clock = clock
        self._marked: set[str] = set()
        self._wake = asyncio.Event()
        self._drivers: dict[str, str] = {}
        self._written: dict[str, dict[str, Any]] = {}
        """The status this replica last wrote (or found already there), by node."""
        self._versions: dict[str, str] = {}
        self._gone: dict[str, datetime | None] = {}
        """Nodes the last resync found gone, with the inventory time it judged: a write
        marked before that resync must not bring their Device back; a newer report does."""
        self._writing = asyncio.Lock()
        """One write (or forgetting what was written) at a time: a resync called while
        the loop's write of the same Device is in flight must not take that write's
        record for the Device it has to put back."""
        self.crd_missing = False
        self.writes = 0
        follower.listen(self._on_event)

    def _on_event(self, _seq: int, event: AnyEvent, _node: NodeState) -> None:
        if isinstance(event, InventoryReported) and event.driver_version:
            self._drivers[event.node] = event.driver_version
        self.mark(event.node)

    def mark(self, name: str) -> None:
        self._marked.add(name)
        self._wake.set()

    def written(self, name: str) -> dict[str, Any] | None:
        """The status last written for ``name`` (None if never)."""
        return self._written.get(name)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_resync = loop.time()
        while True:
            if loop.time() >= next_resync:
                await self.resync()
                next_resync = loop.time() + self._settings.device_resync_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_resync - loop.time())):
                    await self._wake.wait()
            if not self._wake.is_set():
                continue
            self._wake.clear()
            marked, self._marked = sorted(self._marked), set()
            for name in marked:
                await self.sync(name)
            await asyncio.sleep(self._settings.device_sync_interval_s)

    async def resync(self) -> None:
        """Compare every node's Device with the API again; delete those of gone nodes."""
        async with self._writing:
            self._written.clear()
            self.crd_missing = False
        api_nodes = await self._api_nodes()
        nodes = self._follower.state.nodes
        gone = set(devices_to_delete(nodes, nodes, api_nodes, self._clock.now()))
        async with self._writing:
            self._gone = {name: nodes[name].inventory_at for name in gone}
        for name in sorted(set(nodes) - gone):
            await self.sync(name)
        if not self.crd_missing:
            await self.delete_gone(api_nodes)

    async def _api_nodes(self) -> frozenset[str] | None:
        try:
            return await list_node_names(self._kube)
        except KubeError as error:
            log.warning("listing nodes failed (%s); only unreported nodes count as gone", error)
            return None

    async def sync(self, name: str) -> None:
        """Write ``name``'s Device if its rendered status changed since the last write."""
        async with self._writing:
            await self._sync(name)

    async def _sync(self, name: str) -> None:
        node = self._follower.state.node(name)
        if node.inventory_at is None or self.crd_missing:
            return
        if name in self._gone:
            if self._gone[name] == node.inventory_at:
                return  # still the report the resync found gone
            del self._gone[name]
        body = render_device(node, self._drivers.get(name, ""))
        if self._written.get(name) == body["status"]:
            return
        try:
            self._versions[name] = await write_device(self._kube, body, self._versions.get(name))
        except NotFound:
            self.crd_missing = True
            log.warning("devices.gpushare.io is not installed; Devices not written until resync")
            return
        except KubeError as error:
            log.warning("writing the Device of %s failed: %s", name, error.message)
            self.mark(name)  # tried again in the next round
            return
        self._written[name] = body["status"]
        self.writes += 1
        log.debug("device %s: %s", name, body["status"]["healthy"])

    async def delete_gone(self, api_nodes: frozenset[str] | None) -> None:
        try:
            existing = await list_devices(self._kube)
        except KubeError as error:
            log.warning("listing Devices failed: %s", error.message)
            return
        nodes = self._follower.state.nodes
        for name in devices_to_delete(existing, nodes, api_nodes, self._clock.now()):
            try:
                await delete_device(self._kube, name)
            except KubeError as error:
                log.warning("deleting the Device of %s failed: %s", name, error.message)
                continue
            self._written.pop(name, None)
            self._versions.pop(name, None)
            log.info("deleted the Device of gone node %s", name)
