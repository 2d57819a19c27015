"""Folding the streams into a :class:`ClusterState` as they grow.

A :class:`LogFollower` starts from the newest snapshot in the KV bucket (if any is
usable), reads the allocation log after it and the last inventory of every node in bulk
(:func:`gpushare.core.state.fold_events`), and only then sets ``ready``. From there an
ordered subscription applies each new event and tells the listeners. Listeners hear of
events folded after ``ready`` only: everything a service needs from the past is in the
state itself.

A follower of the whole log also keeps snapshots (:class:`SnapshotKeeper`), so the
next start replays only what came after the newest one.

After the client reconnects (a nats-server restart, a network cut) the follower does not
wait for the ordered consumers to notice their server-side state is gone (two missed
heartbeats, 10 s): it drops them, reads what it missed straight from the streams and
subscribes again from there. Otherwise inventory heartbeats stop arriving and every node
looks stale until then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from functools import partial

import msgspec
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from prometheus_client import Counter

from gpushare.bus.log import AllocationLog as JetStreamLog
from gpushare.bus.provenance import RefusedOrigin, decode_from, origin_of
from gpushare.bus.reading import read_records
from gpushare.bus.rejected import record_rejected
from gpushare.bus.snapshots import SnapshotKeeper, load_snapshot, stream_created
from gpushare.bus.subjects import (
    ALL_ALLOCATIONS,
    ALL_INVENTORY,
    ALLOCATION_STREAM,
    INVENTORY_STREAM,
    Writer,
    inventory_subject,
    node_allocations,
)
from gpushare.core.events import AnyEvent, InventoryReported
from gpushare.core.ports import AllocationLog
from gpushare.core.snapshot import (
    EncodedSnapshot,
    StateSnapshot,
    encode_fold,
    restore_state,
    snapshot_of,
)
from gpushare.core.state import ClusterState, Folded, NodeState, Unfolded, fold_events
from gpushare.tasks import cancel_and_wait

log = logging.getLogger(__name__)


LOOP_TURN_S = 0.00005
"""How long a thread making a snapshot sleeps between batches of nodes."""


def let_the_loop_run() -> None:
    """Sleep :data:`LOOP_TURN_S`, so that the event loop's thread takes the interpreter if
    it waits for it: a sleep of 0 releases it too, but the sleeping thread often took it
    straight back (the loop's longest wait then 4.2 ms rather than 2.2)."""
    time.sleep(LOOP_TURN_S)


START_RETRY_S = 0.5
"""The first wait before starting again after JetStream timed out (``LogFollower.start``)."""
START_RETRY_MAX_S = 15.0

UNFOLDED = Counter(
    "gpushare_unfolded_messages",
    "Messages a follower did not fold: undecodable, or refused for where they came from "
    "(an event whose node or type its subject's writer may not write).",
    ["stream", "reason"],
)

Listener = Callable[[int, AnyEvent, NodeState], None]
"""Called after each applied event with its sequence (0 for inventory) and the new node."""


def default_replica_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class LogFollower:
    def __init__(
        self,
        js: JetStreamContext | None,
        state: ClusterState | None = None,
        node: str | None = None,
        *,
        name: str | None = None,
        use_snapshots: bool = True,
        keep_snapshots: bool | None = None,
        snapshot_interval_s: float = 30.0,
        snapshot_min_events: int = 1000,
        writer: Writer | None = None,
        log: AllocationLog | None = None,
    ) -> None:
        """``node`` folds only that node's part; ``keep_snapshots`` (default: when
        following the whole log) writes snapshots for the next start; ``writer`` is the
        role :attr:`log` appends as (default: each event's own); ``log`` replaces the
        JetStream log: with ``js`` None, an offline follower, fed by hand or by that log."""
        self._js = js
        self.state = state or ClusterState()
        self.node = node
        self.name = name or default_replica_name()
        if log is None:
            if js is None:
                raise ValueError("a follower needs JetStream or a log to read")
            log = JetStreamLog(js, writer)
        self.log: AllocationLog = log
        self.ready = asyncio.Event()
        self.applied_seq = 0
        self.bad_messages = 0
        self.use_snapshots = use_snapshots
        self.snapshot_seq = 0
        """The sequence of the snapshot this follower started from (0: none)."""
        self.stream_created: datetime | None = None
        keep = node is None if keep_snapshots is None else keep_snapshots
        self.keeper = (
            SnapshotKeeper(
                js,
                self.capture_snapshot,
                lambda: self.applied_seq,
                interval_s=snapshot_interval_s,
                min_events=snapshot_min_events,
            )
            if keep and js is not None
            else None
        )
        self._keeper_task: asyncio.Task[None] | None = None
        self._resume_task: asyncio.Task[None] | None = None
        self._listeners: list[Listener] = []
        self._subscriptions: list[object] = []
        self._recording: set[asyncio.Task[None]] = set()
        self.resumed = 0
        """How many times the live subscriptions were made again after a reconnect."""

    @property
    def _jetstream(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError("an offline follower has no JetStream to follow")
        return self._js

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def apply(self, seq: int, event: Folded) -> NodeState:
        """Fold one event and tell the listeners (live events and catch-up reads); an
        :class:`Unfolded` only moves its node's ``last_seq``."""
        before = self.state.node(event.node).last_seq
        node = self.state.apply(event, seq)
        if isinstance(event, Unfolded):
            return node
        if isinstance(event, InventoryReported) or node.last_seq != before:
            for listener in self._listeners:
                listener(seq, event, node)
        return node

    async def catch_up(self, node: str) -> NodeState:
        """Read ``node``'s newest events straight from the stream (after a lost race)."""
        after = self.state.node(node).last_seq
        async for seq, event in self.log.read_node_folded(node, after):
            self.apply(seq, event)
        return self.state.node(node)

    async def start(self, retry_s: float = START_RETRY_S) -> None:
        """Catch up (snapshot, then the log after it, then inventory), then follow live.

        A JetStream request that times out here (a bus busy with many services starting
        at once: 40 node agents on two cores did) is tried again, from the start, after
        ``retry_s`` doubling up to ``START_RETRY_MAX_S``: the service waits for the bus
        instead of exiting."""
        while True:
            try:
                await self._catch_up_in_bulk(self._alloc_subject, self._inv_subject)
                await self._subscribe()
                break
            except NatsTimeoutError:
                await self._unsubscribe()
                log.warning("JetStream did not answer while starting; again in %.1f s", retry_s)
                await asyncio.sleep(retry_s)
                retry_s = min(START_RETRY_MAX_S, retry_s * 2)
        self.ready.set()
        if self.keeper is not None:
            self._keeper_task = asyncio.create_task(self.keeper.run(), name="snapshot-keeper")
        self._resume_task = asyncio.create_task(self._resume_after_reconnects(), name="resume")

    @property
    def _alloc_subject(self) -> str:
        return ALL_ALLOCATIONS if self.node is None else node_allocations(self.node)

    @property
    def _inv_subject(self) -> str:
        return ALL_INVENTORY if self.node is None else inventory_subject(self.node)

    async def _subscribe(self) -> None:
        self._subscriptions.append(
            await self._jetstream.subscribe(
                self._inv_subject,
                cb=self._on_inventory,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                stream=INVENTORY_STREAM,
            )
        )
        self._subscriptions.append(
            await self._jetstream.subscribe(
                self._alloc_subject,
                cb=self._on_allocation,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                config=ConsumerConfig(opt_start_seq=self.applied_seq + 1),
                stream=ALLOCATION_STREAM,
            )
        )

    async def _resume_after_reconnects(self, poll_s: float = 0.25) -> None:
        client = self._jetstream._nc  # nats-py counts reconnects on the client only
        seen = client.stats["reconnects"]
        while True:
            await asyncio.sleep(poll_s)
            if client.stats["reconnects"] == seen or not client.is_connected:
                continue
            try:
                await self.resume()
            except Exception as error:  # NATS down again: the next reconnect retries
                log.warning("resuming after a reconnect failed: %s", error)
                continue
            seen = client.stats["reconnects"]

    async def resume(self) -> None:
        """Subscribe again from what was applied, after reading what came in between."""
        await self._unsubscribe()
        start = self.applied_seq + 1
        async for seq, event in self._decoded(self._alloc_subject, start, None):
            if seq > self.applied_seq:
                self.apply(seq, event)
                self.applied_seq = seq
        async for _, event in self._decoded(self._inv_subject, 1, None, INVENTORY_STREAM):
            self.apply(0, event)
        await self._subscribe()
        self.resumed += 1
        log.info("following again from seq %d after a reconnect", self.applied_seq)

    async def _catch_up_in_bulk(self, alloc_subject: str, inv_subject: str) -> None:
        created = await stream_created(self._jetstream)
        last = int((await self._jetstream.stream_info(ALLOCATION_STREAM)).state.last_seq)
        snapshot = await load_snapshot(self._jetstream) if self.use_snapshots else None
        if snapshot is not None and (snapshot.seq > last or snapshot.stream_created != created):
            log.warning("ignoring a snapshot of another allocation stream (seq %d)", snapshot.seq)
            snapshot = None
        self.stream_created = created
        base = ClusterState() if snapshot is None else restore_state(snapshot, self.node)
        start = 1 if snapshot is None else snapshot.seq + 1
        self.snapshot_seq = 0 if snapshot is None else snapshot.seq
        pairs = [pair async for pair in self._decoded(alloc_subject, start, last)]
        inventory = [pair async for pair in self._decoded(inv_subject, 1, None, INVENTORY_STREAM)]
        folded = fold_events([*pairs, *((0, event) for _, event in inventory)], base)
        self.state.nodes, self.state.pod_nodes = folded.nodes, folded.pod_nodes
        self.applied_seq = max(self.applied_seq, last)
        if self.keeper is not None:
            self.keeper.written_seq = self.snapshot_seq
        log.info(
            "folded %d events after snapshot seq %d and %d inventories; at seq %d",
            len(pairs),
            self.snapshot_seq,
            len(inventory),
            self.applied_seq,
        )

    async def _decoded(
        self, subject: str, start: int, until: int | None, stream: str = ALLOCATION_STREAM
    ) -> AsyncIterator[tuple[int, Folded]]:
        records = read_records(self._jetstream, stream, subject, start_seq=start, until_seq=until)
        async for record in records:
            folded = self._fold_form(stream, record.seq, record.subject, record.data)
            if folded is not None:
                yield record.seq, folded

    def _fold_form(
        self, stream: str, seq: int, subject: str, data: bytes, *, live: bool = False
    ) -> Folded | None:
        """The event a message holds, checked against its subject; else an
        :class:`Unfolded` for a message on a node's allocation subject (the node's
        ``last_seq`` still moves), or ``None``.

        The binders' consumer records the allocation log's refusals in the rejected
        stream; an inventory message refused live is recorded here (by every follower
        that sees it, written once: the record's id is the stream and sequence)."""
        try:
            return decode_from(subject, data)
        except msgspec.MsgspecError as error:
            refused = isinstance(error, RefusedOrigin)
            self.bad_messages += 1
            UNFOLDED.labels(stream, "refused" if refused else "undecodable").inc()
            log.error("not folding message %d on %s: %s", seq, subject, error)
            if live and stream == INVENTORY_STREAM:
                reason = f"{'refused' if refused else 'undecodable'}: {error}"
                self._record(stream, seq, subject, data, reason)
        origin = origin_of(subject)
        if stream != ALLOCATION_STREAM or origin is None:
            return None
        return Unfolded(node=origin.node)

    def _record(self, stream: str, seq: int, subject: str, data: bytes, error: str) -> None:
        async def record() -> None:
            try:
                await record_rejected(
                    self._jetstream, stream=stream, seq=seq, subject=subject, data=data, error=error
                )
            except Exception as failure:  # a side record; the refusal itself is done
                log.warning("could not record message %d of %s: %s", seq, stream, failure)

        task = asyncio.create_task(record(), name=f"reject-{stream}-{seq}")
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def _on_inventory(self, msg: Msg) -> None:
        event = self._decode(msg, INVENTORY_STREAM)
        if event is not None:
            self.apply(0, event)

    async def _on_allocation(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= self.applied_seq:
            return  # already folded in bulk (or delivered twice after a reconnect)
        event = self._decode(msg, ALLOCATION_STREAM)
        if event is not None:
            self.apply(seq, event)
        self.applied_seq = seq

    def take_snapshot(self, at: datetime) -> StateSnapshot:
        """The fold as of now (state and ``applied_seq`` agree: nothing awaits in between)."""
        return snapshot_of(
            self.state.nodes,
            self.applied_seq,
            at=at,
            by=self.name,
            stream_created=self.stream_created,
        )

    def capture_snapshot(self, at: datetime) -> Callable[[], EncodedSnapshot]:
        """The fold as of now, to be built into a snapshot and encoded later, off the event
        loop: its nodes are immutable values, so a copy of the map (0.3 ms at 10,000 nodes)
        holds it at this sequence. Built on the loop, a snapshot of 10,000 nodes stalled
        every request for 30-45 ms (9 ms to build, 12-17 to encode, 15-17 to compress).
        On the worker thread it is built and encoded a batch of nodes at a time
        (:func:`~gpushare.core.snapshot.encode_fold`), pausing between batches
        (:func:`let_the_loop_run`): in one piece there, its encoding still held the
        interpreter for 49-55 ms at 10,000 nodes and 33,000 pods, in batches for 1.6-2.2 ms
        at the longest (``make bench-log``)."""
        return partial(
            encode_fold,
            dict(self.state.nodes),
            self.applied_seq,
            at=at,
            by=self.name,
            stream_created=self.stream_created,
            between=let_the_loop_run,
        )

    def _decode(self, msg: Msg, stream: str) -> Folded | None:
        seq = msg.metadata.sequence.stream
        return self._fold_form(stream, seq, msg.subject, msg.data, live=True)

    async def stop(self) -> None:
        await cancel_and_wait(*(t for t in (self._keeper_task, self._resume_task) if t))
        self._keeper_task = self._resume_task = None
        await self._unsubscribe()

    async def _unsubscribe(self) -> None:
        for subscription in self._subscriptions:
            try:
                await subscription.unsubscribe()  # type: ignore[attr-defined]
            except Exception as error:  # the connection may already be closed
                log.debug("unsubscribe: %s", error)
        self._subscriptions.clear()
