"""One node as the agent sees it: the folded log, the device IDs, and local claims.

A :class:`LogFollower` restricted to the node keeps the fold current. Every change
bumps :attr:`NodeView.version` (what Allocate waits on when the log is a moment
behind the kubelet); a change of the cards also rebuilds the device table and bumps
:attr:`NodeView.devices_version` (what ListAndWatch waits on).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from nats.js import JetStreamContext

from gpushare.bus.follow import LogFollower
from gpushare.core.events import AnyEvent, InventoryReported
from gpushare.core.state import NodeState
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2
from gpushare.node_agent.devices import (
    DeviceListTooLarge,
    DeviceTable,
    build_device_table,
    check_message_size,
    list_and_watch_response,
)
from gpushare.node_agent.matching import Claim

log = logging.getLogger(__name__)


class NodeView:
    """The node's fold, its device table and ListAndWatch message, and the claims."""

    def __init__(self, js: JetStreamContext, node: str, memory_unit: str) -> None:
        self.name = node
        self.memory_unit = memory_unit
        self.follower = LogFollower(js, node=node)
        self.follower.listen(self._on_event)
        self.table: DeviceTable = build_device_table((), memory_unit)
        self.response = api_pb2.ListAndWatchResponse()
        """The last device list that fits into a message the kubelet accepts."""
        self.problem: str | None = None
        """Why the newest inventory could not be advertised (e.g. too many IDs)."""
        self.claimed: set[Claim] = set()
        """Containers matched by Allocate whose ``ContainerAssigned`` is not folded yet."""
        self.version = 0
        self.devices_version = 0
        self._changed = asyncio.Event()

    @property
    def node(self) -> NodeState:
        return self.follower.state.node(self.name)

    async def start(self) -> None:
        """Replay the node's log and inventory; returns once the fold is current."""
        await self.follower.start()
        await self.follower.ready.wait()
        self._rebuild_devices(self.node)

    async def stop(self) -> None:
        await self.follower.stop()

    async def catch_up(self) -> None:
        """Read the node's newest events straight from the stream (the log may lead)."""
        try:
            await self.follower.catch_up(self.name)
        except Exception as error:  # NATS away: the live subscription will get there
            log.warning("node %s: catching up on the log failed: %s", self.name, error)

    async def wait_changed(self, since: int, limit_seconds: float | None = None) -> bool:
        """Until :attr:`version` moves past ``since``; False if ``limit_seconds`` pass first."""
        while self.version == since:
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), limit_seconds)
            except TimeoutError:
                return False
        return True

    async def wait_devices(self, since: int) -> int:
        """Until the device list differs from version ``since``; returns the new version."""
        while self.devices_version == since:
            await self._changed.wait()
        return self.devices_version

    def inspect(self) -> dict[str, Any]:
        node = self.node
        return {
            "node": self.name,
            "memory_unit": self.memory_unit,
            "cards": [card.uuid for card in self.table.cards],
            "device_ids": self.table.count,
            "unhealthy_cards": [card.uuid for card in self.table.cards if not card.healthy],
            "pods": len(node.pods),
            "last_seq": node.last_seq,
            "claimed": sorted(f"{rid}/{container}" for rid, container in self.claimed),
            "problem": self.problem,
        }

    def _on_event(self, seq: int, event: AnyEvent, node: NodeState) -> None:
        if isinstance(event, InventoryReported):
            self._rebuild_devices(node)
        else:
            self._prune_claims(node)
        self._notify()

    def _notify(self) -> None:
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _prune_claims(self, node: NodeState) -> None:
        """A claim ends when the fold shows the container assigned, or the pod gone."""
        live = {
            (allocation.reservation_id, share.container)
            for allocation in node.pods.values()
            for share in allocation.shares
            if share.container not in allocation.assigned
        }
        self.claimed &= live

    def _rebuild_devices(self, node: NodeState) -> None:
        table = build_device_table(node.cards, self.memory_unit)
        if table == self.table and self.devices_version > 0:
            return
        response = list_and_watch_response(table)
        try:
            size = check_message_size(response, self.memory_unit)
        except DeviceListTooLarge as error:
            self.problem = str(error)
            log.error("node %s: not advertising the new inventory: %s", self.name, error)
            return
        self.table, self.response, self.problem = table, response, None
        self.devices_version += 1
        log.info(
            "node %s: advertising %d device IDs on %d cards (%d bytes)",
            self.name,
            table.count,
            len(table.cards),
            size,
        )
