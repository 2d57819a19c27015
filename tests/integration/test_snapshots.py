"""Start-up from a snapshot in the KV bucket, against a real nats-server."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
from nats.js import JetStreamContext

from gpushare.bus.follow import LogFollower
from gpushare.bus.log import AllocationLog, publish_inventory
from gpushare.bus.snapshots import (
    CHUNK_BYTES,
    HEAD_KEY,
    SnapshotHead,
    load_snapshot,
    save_snapshot,
    snapshot_bucket,
)
from gpushare.core.events import AnyEvent, InventoryReported
from gpushare.core.snapshot import take_snapshot
from gpushare.core.state import ClusterState
from tests.unit.core.event_streams import history
from tests.unit.core.factories import T0, inventory, make_card


async def append(js: JetStreamContext, pairs: list[tuple[int, AnyEvent]]) -> None:
    log = AllocationLog(js)
    for _seq, event in pairs:
        if isinstance(event, InventoryReported):
            await publish_inventory(js, event)
        else:
            await log.append(event)


@asynccontextmanager
async def started(js: JetStreamContext, **options: object) -> AsyncIterator[LogFollower]:
    options.setdefault("keep_snapshots", False)
    follower = LogFollower(js, **options)  # type: ignore[arg-type]
    await follower.start()
    try:
        yield follower
    finally:
        await follower.stop()


def same(a: ClusterState, b: ClusterState) -> bool:
    return a.nodes == b.nodes and a.pod_nodes == b.pod_nodes


def fresh_events(length: int, seed: int = 1) -> list[tuple[int, AnyEvent]]:
    """A history without redeliveries (the stream would deduplicate those by id)."""
    seen: set[str] = set()
    pairs = []
    for seq, event in history(random.Random(seed), length):
        if event.id not in seen:
            seen.add(event.id)
            pairs.append((seq, event))
    return pairs


async def test_a_follower_starts_from_the_snapshot_and_reaches_the_same_state(
    js: JetStreamContext,
) -> None:
    pairs = fresh_events(150)
    await append(js, pairs[:100])
    async with started(js) as first:
        assert await save_snapshot(js, first.take_snapshot(T0))
        covered = first.applied_seq
    await append(js, pairs[100:])
    async with started(js) as from_snapshot, started(js, use_snapshots=False) as replayed:
        assert from_snapshot.snapshot_seq == covered > 0
        assert from_snapshot.applied_seq == replayed.applied_seq
        assert same(from_snapshot.state, replayed.state)
        # and it keeps following live, like any follower
        await append(js, fresh_events(30, seed=2)[3:])


async def test_the_keepers_snapshot_is_one_a_follower_starts_from(js: JetStreamContext) -> None:
    """What a service's keeper writes (built and encoded a batch of nodes at a time, on a
    worker thread) restores the fold it captured."""
    pairs = fresh_events(120)
    await append(js, pairs)
    async with started(js, keep_snapshots=True) as first:
        assert first.keeper is not None
        assert await first.keeper.write_now(force=True)
        assert first.keeper.written_seq == first.applied_seq > 0
        covered, truth = first.applied_seq, first.state
    async with started(js) as from_snapshot:
        assert from_snapshot.snapshot_seq == covered
        assert same(from_snapshot.state, truth)


async def test_a_damaged_snapshot_means_a_full_replay_not_a_wrong_state(
    js: JetStreamContext,
) -> None:
    await append(js, fresh_events(60))
    async with started(js) as first:
        await save_snapshot(js, first.take_snapshot(T0))
        truth = first.state
    bucket = await snapshot_bucket(js)
    head = msgspec.json.decode((await bucket.get(HEAD_KEY)).value or b"", type=SnapshotHead)
    await bucket.put(f"chunk.{head.writer}.{head.seq}.0", b"not the chunk")
    assert await load_snapshot(js) is None
    async with started(js) as follower:
        assert follower.snapshot_seq == 0
        assert same(follower.state, truth)


async def test_a_snapshot_ahead_of_the_stream_is_ignored(js: JetStreamContext) -> None:
    await append(js, fresh_events(40))
    async with started(js) as first:
        await save_snapshot(js, take_snapshot(ClusterState(), 10_000, at=T0, by="elsewhere"))
        truth = first.state
    async with started(js) as follower:
        assert follower.snapshot_seq == 0
        assert same(follower.state, truth)


async def test_a_large_snapshot_is_chunked_and_an_older_one_never_replaces_it(
    js: JetStreamContext,
) -> None:
    state = ClusterState()
    for seq, event in history(random.Random(9), 400):
        state.apply(event, seq)
    noise = random.Random(1).randbytes(3 * CHUNK_BYTES).hex()  # does not compress below a chunk
    state.apply(inventory("huge", [msgspec.structs.replace(make_card(0), model=noise)]))
    big = take_snapshot(state, 400, at=T0, by="a")
    assert await save_snapshot(js, big)
    loaded = await load_snapshot(js)
    assert loaded is not None
    assert (loaded.seq, loaded.nodes) == (400, big.nodes)
    older = take_snapshot(ClusterState(), 399, at=T0, by="b")
    assert not await save_snapshot(js, older)
    loaded = await load_snapshot(js)
    assert loaded is not None
    assert loaded.seq == 400
