"""Folding the streams into a :class:`ClusterState` as they grow.

A :class:`LogFollower` replays the allocation log from the start (or one node's part of
it) and the last inventory of every node, then keeps applying new events. ``ready`` is
set once it has applied everything that was in the streams when it started.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from gpushare.bus.log import AllocationLog
from gpushare.bus.subjects import (
    ALL_ALLOCATIONS,
    ALL_INVENTORY,
    ALLOCATION_STREAM,
    INVENTORY_STREAM,
    allocation_subject,
    inventory_subject,
)
from gpushare.core.events import AnyEvent, InventoryReported, decode_event
from gpushare.core.state import ClusterState, NodeState

log = logging.getLogger(__name__)

Listener = Callable[[int, AnyEvent, NodeState], None]
"""Called after each applied event with its sequence (0 for inventory) and the new node."""


class LogFollower:
    def __init__(
        self,
        js: JetStreamContext,
        state: ClusterState | None = None,
        node: str | None = None,
    ) -> None:
        self._js = js
        self.state = state or ClusterState()
        self.node = node
        self.log = AllocationLog(js)
        self.ready = asyncio.Event()
        self.applied_seq = 0
        self.bad_messages = 0
        self._listeners: list[Listener] = []
        self._subscriptions: list[object] = []
        self._target_seq = 0

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def apply(self, seq: int, event: AnyEvent) -> NodeState:
        """Fold one event and tell the listeners (also used by catch-up reads)."""
        before = self.state.node(event.node).last_seq
        node = self.state.apply(event, seq)
        if isinstance(event, InventoryReported) or node.last_seq != before:
            for listener in self._listeners:
                listener(seq, event, node)
        return node

    async def catch_up(self, node: str) -> NodeState:
        """Read ``node``'s newest events straight from the stream (after a lost race)."""
        async for seq, event in self.log.read_node(node, self.state.node(node).last_seq):
            self.apply(seq, event)
        return self.state.node(node)

    async def start(self) -> None:
        alloc_subject = ALL_ALLOCATIONS if self.node is None else allocation_subject(self.node)
        inv_subject = ALL_INVENTORY if self.node is None else inventory_subject(self.node)
        self._target_seq = await self._last_seq(ALLOCATION_STREAM, alloc_subject)
        inventory_pending = await self._count(INVENTORY_STREAM, inv_subject)
        inventory_seen = asyncio.Event()
        if inventory_pending == 0:
            inventory_seen.set()
        seen = 0

        async def on_inventory(msg: Msg) -> None:
            nonlocal seen
            event = self._decode(msg)
            if event is not None:
                self.apply(0, event)
            seen += 1
            if msg.metadata.num_pending == 0 or seen >= inventory_pending:
                inventory_seen.set()

        async def on_allocation(msg: Msg) -> None:
            seq = msg.metadata.sequence.stream
            event = self._decode(msg)
            if event is not None:
                self.apply(seq, event)
            self.applied_seq = max(self.applied_seq, seq)
            if not self.ready.is_set() and (
                self.applied_seq >= self._target_seq or msg.metadata.num_pending == 0
            ):
                await inventory_seen.wait()
                self.ready.set()

        self._subscriptions.append(
            await self._js.subscribe(
                inv_subject,
                cb=on_inventory,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                stream=INVENTORY_STREAM,
            )
        )
        self._subscriptions.append(
            await self._js.subscribe(
                alloc_subject,
                cb=on_allocation,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
                stream=ALLOCATION_STREAM,
            )
        )
        if self._target_seq == 0:
            await inventory_seen.wait()
            self.ready.set()

    async def _last_seq(self, stream: str, subject: str) -> int:
        """The sequence of the newest message on ``subject`` (0 when there is none)."""
        if self.node is None:
            return int((await self._js.stream_info(stream)).state.last_seq)
        try:
            raw = await self._js.get_msg(stream, subject=subject, direct=True)
        except NotFoundError:
            return 0
        return int(raw.seq or 0)

    async def _count(self, stream: str, subject: str) -> int:
        if self.node is None:
            return int((await self._js.stream_info(stream)).state.messages)
        return 1 if await self._last_seq(stream, subject) else 0

    def _decode(self, msg: Msg) -> AnyEvent | None:
        try:
            return decode_event(msg.data)
        except msgspec.MsgspecError as error:
            self.bad_messages += 1
            log.error("skipping an undecodable event on %s: %s", msg.subject, error)
            return None

    async def stop(self) -> None:
        for subscription in self._subscriptions:
            try:
                await subscription.unsubscribe()  # type: ignore[attr-defined]
            except Exception as error:  # the connection may already be closed
                log.debug("unsubscribe: %s", error)
        self._subscriptions.clear()
