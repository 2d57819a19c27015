"""Advertising each node's healthy cards as ``aliyun.com/gpu-count`` in its status.

On every inventory (a change or a heartbeat) the node's count is compared with what was
last written; it is patched when it differs, or when ``capacity_resync_s`` has passed
(the kubelet or an operator may have overwritten it). A node the API does not know yet
is skipped with one log line, and tried again on its next heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from gpushare.binder.decisions import healthy_cards
from gpushare.binder.settings import BinderSettings
from gpushare.bus.follow import LogFollower
from gpushare.core.events import AnyEvent, InventoryReported
from gpushare.core.ports import Clock
from gpushare.core.state import NodeState
from gpushare.kube.client import KubeClient
from gpushare.kube.errors import KubeError, NotFound
from gpushare.kube.nodes import set_node_gpu_count

log = logging.getLogger(__name__)


class CapacityWriter:
    def __init__(
        self, follower: LogFollower, kube: KubeClient, settings: BinderSettings, clock: Clock
    ) -> None:
        self._follower = follower
        self._kube = kube
        self._settings = settings
        self._clock = clock
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._written: dict[str, tuple[int, datetime]] = {}
        self.missing: set[str] = set()
        """Nodes skipped because the API does not know them (yet)."""
        follower.listen(self._on_event)

    def _on_event(self, _seq: int, event: AnyEvent, _node: NodeState) -> None:
        if isinstance(event, InventoryReported):
            self._queue.put_nowait(event.node)

    def written(self, node: str) -> int | None:
        """The count last written for ``node`` (None if never)."""
        entry = self._written.get(node)
        return entry[0] if entry else None

    async def run(self) -> None:
        for name, node in list(self._follower.state.nodes.items()):
            if node.inventory_at is not None:
                self._queue.put_nowait(name)
        while True:
            await self.update(await self._queue.get())

    async def update(self, name: str) -> None:
        count = healthy_cards(self._follower.state.node(name))
        now = self._clock.now()
        last = self._written.get(name)
        resync = timedelta(seconds=self._settings.capacity_resync_s)
        if last is not None and last[0] == count and now - last[1] < resync:
            return
        try:
            await set_node_gpu_count(self._kube, name, count)
        except NotFound:
            if name not in self.missing:
                log.info("node %s is not in the Kubernetes API; gpu-count not written", name)
                self.missing.add(name)
            return
        except KubeError as error:
            log.warning("writing gpu-count of %s failed: %s", name, error.message)
            return
        self.missing.discard(name)
        self._written[name] = (count, now)
        log.info("node %s: aliyun.com/gpu-count=%d", name, count)
