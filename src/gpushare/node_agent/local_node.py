"""One node as the agent sees it: the folded log, the device IDs, and local claims.

A :class:`LogFollower` restricted to the node keeps the fold current. Every change
bumps :attr:`LocalNode.version` (what Allocate waits on when the log is a moment
behind the kubelet); a change of the cards also rebuilds the device tables (one per
advertised resource) and bumps :attr:`LocalNode.devices_version` (what ListAndWatch
waits on). The resource names each bound container asked come with its ``PodBound``
and are kept while the reservation lives (:attr:`LocalNode.asks`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from gpushare.bus.follow import LogFollower
from gpushare.bus.nats_types import JetStreamContext
from gpushare.core.events import AnyEvent, InventoryReported
from gpushare.core.model import Card
from gpushare.core.requests import GPU_MEM
from gpushare.core.state import NodeState
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2
from gpushare.node_agent.device_table import (
    DeviceListTooLarge,
    DeviceTable,
    build_device_table,
    check_message_size,
    list_and_watch_response,
)
from gpushare.node_agent.matching import Asks, Call, Claim

log = logging.getLogger(__name__)

T = TypeVar("T")


class LocalNode:
    """The node's fold, its device table and ListAndWatch message, and the claims."""

    def __init__(
        self,
        js: JetStreamContext,
        node: str,
        memory_unit: str,
        resources: tuple[str, ...] = (GPU_MEM,),
    ) -> None:
        self.name = node
        self.memory_unit = memory_unit
        self.resources = resources
        """The extended resources advertised, one plugin socket each."""
        self.follower = LogFollower(js, node=node)
        self.follower.listen(self._on_event)
        self.tables: dict[str, DeviceTable] = {
            resource: build_device_table((), memory_unit, resource) for resource in resources
        }
        self.responses = {resource: api_pb2.ListAndWatchResponse() for resource in resources}
        """Per resource, the last device list that fits into a message the kubelet accepts."""
        self.problems: dict[str, str] = {}
        """Per resource, why the newest inventory could not be advertised (too many IDs)."""
        self._built_from: tuple[Card, ...] | None = None
        """The cards the tables were last built from: a heartbeat that repeats them (every
        few seconds, a table of a device per MiB) builds nothing."""
        self.claimed: set[Claim] = set()
        """Containers matched by Allocate whose ``ContainerAssigned`` is not folded yet."""
        self.answered: set[Call] = set()
        """Every ``Allocate`` answered, matched or only counted, while its pod lives: a
        counted call leaves nothing in the log, yet the next call on that resource is the
        next container's."""
        self.version = 0
        self.devices_version = 0
        self._changed = asyncio.Event()

    @property
    def node(self) -> NodeState:
        return self.follower.state.node(self.name)

    @property
    def table(self) -> DeviceTable:
        """The first resource's table (``aliyun.com/gpu-mem`` unless not advertised)."""
        return self.tables[self.resources[0]]

    @property
    def response(self) -> api_pb2.ListAndWatchResponse:
        return self.responses[self.resources[0]]

    @property
    def problem(self) -> str | None:
        return "; ".join(self.problems.values()) or None

    @property
    def asks(self) -> Asks:
        """What matching needs to know which resource hands each container its cards."""
        asked = {
            allocation.reservation_id: dict(allocation.resources)
            for allocation in self.node.pods.values()
            if allocation.resources
        }
        return Asks(by_reservation=asked, advertised=frozenset(self.resources))

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

    async def decide(self, decide: Callable[[], T | None], wait_seconds: float) -> T | None:
        """``decide()`` now; else after reading the log, and on each change until
        ``wait_seconds`` have passed (``None`` then).

        Returns synchronously after a successful ``decide()``, so the caller can claim
        the result before anything else runs. The device plugin's ``Allocate`` waits so
        for a bound pod, the DRA plugin's prepare for a recorded claim: each may be
        called a moment before this node's fold has seen what it needs.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        caught_up = False
        while True:
            version = self.version
            result = decide()
            if result is not None:
                return result
            if not caught_up:
                caught_up = True
                await self.catch_up()
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            await self.wait_changed(version, remaining)

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
            "resources": {name: table.count for name, table in self.tables.items()},
            "mps": node.mps,
            "unhealthy_cards": [card.uuid for card in self.table.cards if not card.healthy],
            "pods": len(node.pods),
            "last_seq": node.last_seq,
            "claimed": sorted(f"{rid}/{container}" for rid, container in self.claimed),
            "answered": sorted("/".join(call) for call in self.answered),
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
        """A claim ends when the fold shows the container assigned, or the pod gone; an
        answered call when the pod is gone."""
        live = {
            (allocation.reservation_id, share.container)
            for allocation in node.pods.values()
            for share in allocation.shares
            if share.container not in allocation.assigned
        }
        self.claimed &= live
        reservations = {allocation.reservation_id for allocation in node.pods.values()}
        self.answered -= {call for call in self.answered if call[0] not in reservations}

    def _rebuild_devices(self, node: NodeState) -> None:
        if node.cards == self._built_from and self.devices_version > 0:
            return
        self._built_from = node.cards
        changed = False
        for resource in self.resources:
            changed = self._rebuild_resource(resource, node) or changed
        if changed:
            self.devices_version += 1

    def _rebuild_resource(self, resource: str, node: NodeState) -> bool:
        table = build_device_table(node.cards, self.memory_unit, resource)
        if table == self.tables[resource] and self.devices_version > 0:
            return False
        response = list_and_watch_response(table)
        try:
            size = check_message_size(response, self.memory_unit, resource=resource)
        except DeviceListTooLarge as error:
            self.problems[resource] = str(error)
            log.error("node %s: not advertising the new inventory: %s", self.name, error)
            return False
        self.tables[resource], self.responses[resource] = table, response
        self.problems.pop(resource, None)
        log.info(
            "node %s: advertising %d %s device IDs on %d cards (%d bytes)",
            self.name,
            table.count,
            resource,
            len(table.cards),
            size,
        )
        return True
