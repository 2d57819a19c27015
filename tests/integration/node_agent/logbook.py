"""Writing a node's inventory and reservations into the log, as the reporter and binder do."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from nats.js import JetStreamContext

from gpushare.bus.log import AllocationLog, publish_inventory
from gpushare.core.events import (
    AnyEvent,
    ContainerAssigned,
    InventoryReported,
    PodBound,
    PodReleased,
    PodReserved,
)
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.pods import Pod, pod_from_dict
from gpushare.node_agent.agent import NodeAgent
from tests.unit.node_agent.builders import T0, at

RESOURCE = "aliyun.com/gpu-mem"


def gpu(index: int, mib: int = 4096, healthy: bool = True) -> Card:
    return Card(
        index=index,
        uuid=f"GPU-{index}{index}{index}0c0de-1111-2222-3333-44444444444{index}",
        model="T4",
        memory_mib=mib,
        healthy=healthy,
    )


def pod_spec(uid: str, containers: dict[str, int], init: dict[str, int] | None = None) -> Pod:
    def spec(name: str, units: int) -> dict[str, Any]:
        return {"name": name, "resources": {"limits": {RESOURCE: str(units)}}}

    return pod_from_dict(
        {
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {
                "nodeName": "n1",
                "containers": [spec(n, u) for n, u in containers.items()],
                "initContainers": [spec(n, u) for n, u in (init or {}).items()],
            },
        }
    )


class Logbook:
    """The writers the node agent reads from: the reporter's inventory, the log's events."""

    def __init__(self, js: JetStreamContext, node: str = "n1") -> None:
        self.js = js
        self.node = node
        self.log = AllocationLog(js)
        self._inventories = 0

    async def report(self, *cards: Card, mps: bool = False) -> None:
        """A new inventory (each later than the last, so the fold takes it)."""
        self._inventories += 1
        n = self._inventories
        event = InventoryReported(
            id=f"inv-{self.node}-{n}",
            at=at(n),
            node=self.node,
            cards=cards,
            source="fixture",
            heartbeat_seconds=5,
            mps=mps,
        )
        await publish_inventory(self.js, event)

    async def reserve(
        self, uid: str, shares: list[tuple[str, Card, int, bool]], created: datetime = T0
    ) -> PodReserved:
        event = PodReserved(
            id=f"reserve-{uid}",
            at=T0,
            node=self.node,
            pod=PodRef(namespace="ns", name=uid, uid=uid),
            shares=tuple(
                ContainerShare(
                    container=name, card_index=c.index, card_uuid=c.uuid, memory_mib=mib, init=init
                )
                for name, c, mib, init in shares
            ),
            pod_created_at=created,
        )
        await self.log.append(event)
        return event

    async def reserve_shares(
        self, uid: str, *shares: ContainerShare, created: datetime = T0
    ) -> PodReserved:
        """A reservation of any shares (several cards per container, core percent, ...)."""
        event = PodReserved(
            id=f"reserve-{uid}",
            at=T0,
            node=self.node,
            pod=PodRef(namespace="ns", name=uid, uid=uid),
            shares=shares,
            pod_created_at=created,
        )
        await self.log.append(event)
        return event

    async def bind(
        self, reservation: PodReserved, asked: dict[str, tuple[str, ...]] | None = None
    ) -> None:
        """``asked``: container → the resource names it asked, as the binder reads them."""
        await self.log.append(
            PodBound(
                id=f"bound-{reservation.pod.uid}",
                at=T0,
                node=self.node,
                pod=reservation.pod,
                reservation_id=reservation.id,
                resources=asked or {},
            )
        )

    async def release(self, reservation: PodReserved) -> None:
        """The pod deleted: its reservation released, as the binder records it."""
        await self.log.append(
            PodReleased(
                id=f"release-{reservation.pod.uid}",
                at=datetime.now(UTC),
                node=self.node,
                pod=reservation.pod,
                reservation_id=reservation.id,
                reason="deleted",
            )
        )

    async def assignments(self) -> list[ContainerAssigned]:
        events: list[AnyEvent] = [event async for _, event in self.log.read_node(self.node, 0)]
        return [event for event in events if isinstance(event, ContainerAssigned)]


async def wait_until_assigned(agent: NodeAgent, uid: str, containers: set[str]) -> None:
    """Until the agent's own fold shows ``containers`` of pod ``uid`` assigned."""
    async with asyncio.timeout(10):
        while True:
            allocation = agent.view.node.pods.get(uid)
            if allocation is not None and containers <= allocation.assigned:
                return
            await agent.view.wait_changed(agent.view.version)
