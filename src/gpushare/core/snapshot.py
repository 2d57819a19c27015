"""A folded :class:`ClusterState` as bytes, and back: start-up without replaying everything.

A snapshot holds what the fold cannot recompute (each node's cards, inventory time, links,
front door, allocations, DRA claims, foreign holds and ``last_seq``) and the
allocation-stream sequence it covers.
Totals and placement views are rebuilt on restore by the same code the fold uses, so
``restore_state(take_snapshot(state, seq))`` equals ``state``, and folding the events
after ``seq`` onto it equals folding the whole log.

Pure: the bus decides where snapshots are kept (:mod:`gpushare.bus.snapshots`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import TypeVar

import msgspec

from gpushare.core.events import ForeignHold, FrontDoor
from gpushare.core.model import Card, CardLink, ContainerShare, PodRef
from gpushare.core.state import ClaimAllocation, ClusterState, NodeState, PodAllocation, with_pods

T = TypeVar("T")

SNAPSHOT_FORMAT = 2
"""Bumped whenever the fold's meaning changes: an older snapshot is then ignored."""


class PodSnapshot(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    pod: PodRef
    reservation_id: str
    shares: tuple[ContainerShare, ...]
    reserved_seq: int
    reserved_at: datetime
    pod_created_at: datetime | None
    policy: str
    bound: bool
    bound_at: datetime | None
    assigned: tuple[str, ...]
    resources: dict[str, tuple[str, ...]]
    corrected: bool


class NodeSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    cards: tuple[Card, ...]
    inventory_at: datetime | None
    heartbeat_seconds: float
    links: tuple[CardLink, ...]
    mps: bool
    last_seq: int
    foreign: tuple[ForeignHold, ...]
    pods: tuple[PodSnapshot, ...]
    claims: tuple[ClaimAllocation, ...]
    front_door: FrontDoor


class StateSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    seq: int
    """The allocation-stream sequence the state covers: events after it are folded on top."""
    stream_created: datetime | None
    """When the allocation stream was created: a snapshot of another stream is no use."""
    taken_at: datetime
    taken_by: str
    nodes: tuple[NodeSnapshot, ...]


class SnapshotUnreadable(ValueError):
    """The bytes are not a snapshot this version can restore."""


class EncodedSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot's bytes (:func:`encode_snapshot`), with what its head names."""

    seq: int
    taken_by: str
    taken_at: datetime
    nodes: int
    data: bytes

    @classmethod
    def of(cls, snapshot: StateSnapshot) -> EncodedSnapshot:
        head = msgspec.structs.replace(snapshot, nodes=())
        return _encoded(head, len(snapshot.nodes), _batches(snapshot.nodes))


def _pod_snapshot(allocation: PodAllocation) -> PodSnapshot:
    return PodSnapshot(
        pod=allocation.pod,
        reservation_id=allocation.reservation_id,
        shares=allocation.shares,
        reserved_seq=allocation.reserved_seq,
        reserved_at=allocation.reserved_at,
        pod_created_at=allocation.pod_created_at,
        policy=allocation.policy,
        bound=allocation.bound,
        bound_at=allocation.bound_at,
        assigned=tuple(sorted(allocation.assigned)),
        resources=dict(allocation.resources),
        corrected=allocation.corrected,
    )


def _node_snapshot(node: NodeState) -> NodeSnapshot:
    return NodeSnapshot(
        name=node.name,
        cards=node.cards,
        inventory_at=node.inventory_at,
        heartbeat_seconds=node.heartbeat_seconds,
        links=node.links,
        mps=node.mps,
        last_seq=node.last_seq,
        foreign=node.foreign,
        pods=tuple(_pod_snapshot(allocation) for allocation in node.pods.values()),
        claims=tuple(node.claims.values()),
        front_door=node.front_door,
    )


def take_snapshot(
    state: ClusterState,
    seq: int,
    *,
    at: datetime,
    by: str = "",
    stream_created: datetime | None = None,
) -> StateSnapshot:
    """``state`` as folded up to allocation-stream sequence ``seq``."""
    return snapshot_of(state.nodes, seq, at=at, by=by, stream_created=stream_created)


def snapshot_of(
    nodes: Mapping[str, NodeState],
    seq: int,
    *,
    at: datetime,
    by: str = "",
    stream_created: datetime | None = None,
) -> StateSnapshot:
    """The snapshot of a fold whose nodes are ``nodes``. A ``NodeState`` is an immutable
    value, so a copy of the fold's map taken at ``seq`` may be turned into its snapshot
    later, anywhere (a service builds it off its event loop)."""
    head = _head(seq, at, by, stream_created)
    return msgspec.structs.replace(
        head, nodes=tuple(_node_snapshot(nodes[name]) for name in sorted(nodes))
    )


def _head(seq: int, at: datetime, by: str, stream_created: datetime | None) -> StateSnapshot:
    """A snapshot without its nodes."""
    return StateSnapshot(
        format=SNAPSHOT_FORMAT,
        seq=seq,
        stream_created=stream_created,
        taken_at=at,
        taken_by=by,
        nodes=(),
    )


def _allocation(pod: PodSnapshot) -> PodAllocation:
    return PodAllocation(
        pod=pod.pod,
        reservation_id=pod.reservation_id,
        shares=pod.shares,
        reserved_seq=pod.reserved_seq,
        reserved_at=pod.reserved_at,
        pod_created_at=pod.pod_created_at,
        policy=pod.policy,
        bound=pod.bound,
        bound_at=pod.bound_at,
        assigned=frozenset(pod.assigned),
        resources=MappingProxyType(dict(pod.resources)),
        corrected=pod.corrected,
    )


def restore_node(snapshot: NodeSnapshot) -> NodeState:
    node = NodeState(
        name=snapshot.name,
        cards=snapshot.cards,
        inventory_at=snapshot.inventory_at,
        heartbeat_seconds=snapshot.heartbeat_seconds,
        links=snapshot.links,
        mps=snapshot.mps,
        front_door=snapshot.front_door,
    )
    pods = {pod.pod.uid: _allocation(pod) for pod in snapshot.pods}
    claims = {held.claim.uid: held for held in snapshot.claims}
    return with_pods(node, pods, snapshot.last_seq, foreign=snapshot.foreign, claims=claims)


def restore_state(snapshot: StateSnapshot, node: str | None = None) -> ClusterState:
    """The state the snapshot describes (only ``node``'s part when one is named)."""
    nodes = (restore_node(entry) for entry in snapshot.nodes if node in (None, entry.name))
    return ClusterState({entry.name: entry for entry in nodes})


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StateSnapshot)

ENCODED_BATCH = 64
"""Nodes built and encoded at a time. A snapshot is made on a worker thread, and made in
one piece it held the interpreter, and so the event loop and every request, for all of
it: one ``msgspec`` call over 10,000 nodes and 33,000 pods kept the loop waiting 49-55 ms
(``make bench-log``). A batch of 64 such nodes takes about 1 ms, and the caller lets the
loop run between batches."""


def encode_snapshot(snapshot: StateSnapshot) -> bytes:
    """``snapshot`` as bytes: zlib-compressed msgpack."""
    return EncodedSnapshot.of(snapshot).data


def encode_fold(
    nodes: Mapping[str, NodeState],
    seq: int,
    *,
    at: datetime,
    by: str = "",
    stream_created: datetime | None = None,
    between: Callable[[], object] = lambda: None,
) -> EncodedSnapshot:
    """``encode_snapshot(snapshot_of(...))``, each node's part built just before it is
    encoded, :data:`ENCODED_BATCH` nodes at a time, calling ``between`` after each batch
    (what a service's snapshot keeper runs on its worker thread, letting its event loop
    run between batches)."""
    names = sorted(nodes)
    batches = ([_node_snapshot(nodes[name]) for name in batch] for batch in _batches(names))
    return _encoded(_head(seq, at, by, stream_created), len(names), batches, between)


def _batches(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """``items`` :data:`ENCODED_BATCH` at a time."""
    return (items[start : start + ENCODED_BATCH] for start in range(0, len(items), ENCODED_BATCH))


def _encoded(
    head: StateSnapshot,
    count: int,
    batches: Iterable[Sequence[NodeSnapshot]],
    between: Callable[[], object] = lambda: None,
) -> EncodedSnapshot:
    """``head`` with its ``count`` nodes given in ``batches``, compressed msgpack: the same
    bytes, decompressed, as the encoding of the whole snapshot at once."""
    empty = _encoder.encode(head)
    if head.nodes or not empty.endswith(_EMPTY_ARRAY):
        raise ValueError("a snapshot's head must end with its empty list of nodes")
    compressor = zlib.compressobj(level=1)
    parts = [compressor.compress(empty[: -len(_EMPTY_ARRAY)] + array_header(count))]
    for batch in batches:
        parts.append(compressor.compress(b"".join(map(_encoder.encode, batch))))
        between()
    parts.append(compressor.flush())
    return EncodedSnapshot(
        seq=head.seq,
        taken_by=head.taken_by,
        taken_at=head.taken_at,
        nodes=count,
        data=b"".join(parts),
    )


_EMPTY_ARRAY = b"\x90"
"""msgpack's empty array: ``nodes`` is the last field of a snapshot, so its encoding ends so."""


def array_header(count: int) -> bytes:
    """msgpack's header of an array of ``count`` items, in its shortest form (as msgspec
    writes it)."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def decode_snapshot(data: bytes) -> StateSnapshot:
    """Raises :class:`SnapshotUnreadable` for damaged bytes or another format."""
    try:
        snapshot = _decoder.decode(zlib.decompress(data))
    except (zlib.error, msgspec.MsgspecError) as error:
        raise SnapshotUnreadable(f"not a readable snapshot: {error}") from error
    if snapshot.format != SNAPSHOT_FORMAT:
        raise SnapshotUnreadable(
            f"snapshot format {snapshot.format}, this version reads {SNAPSHOT_FORMAT}"
        )
    return snapshot
