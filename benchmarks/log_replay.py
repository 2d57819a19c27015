"""``make bench-log``: how fast the allocation log folds, and how fast a service starts.

1. Fold: a synthetic log of N allocation events (default 1,000,000: pods reserved, bound,
   assigned and released across 1,000 nodes of 8 cards, about 10 live pods per node)
   folded by :func:`gpushare.core.state.fold_events`, from decoded events and from the
   JSON bytes as they sit in the stream (decode included). Target: >= 200,000 events/s.
2. Start-up: the same log appended to a real nats-server; a follower of the whole log
   starts (a) with no snapshot, replaying everything, and (b) from a snapshot taken a
   few thousand events before the end. Target for (b): <= 2 s to ``ready``.
3. Stalls: how long the event loop waits while a service snapshots its fold, and while
   the binder's reconcile pass compares every GPU pod with it (on a worker thread now).
4. Heartbeats: every reporter republishes its node's inventory every few seconds, and
   every allocator and binder follows all of them. A follower of the whole cluster, in
   a process of its own, takes rounds of heartbeats from every node, published as the
   reporters publish them (one JetStream publish each); its CPU per heartbeat, and what
   10,000 nodes at the reporter's default period cost it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec
from nats.aio.client import Client

from benchmarks.interrupt import cancelled_by_sigterm, unwind_on_sigterm
from gpushare.binder.reconciling import decided
from gpushare.bus.connection import connect
from gpushare.bus.follow import LogFollower, let_the_loop_run
from gpushare.bus.log import publish_inventory
from gpushare.bus.snapshots import save_snapshot
from gpushare.bus.streams import ensure_streams
from gpushare.bus.subjects import allocation_subject, inventory_subject, writer_of
from gpushare.collector import settle
from gpushare.core.annotations import current_annotations
from gpushare.core.events import (
    AllocationEvent,
    AnyEvent,
    ContainerAssigned,
    InventoryReported,
    PodBound,
    PodReleased,
    PodReserved,
    decode_event,
    encode_event,
)
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.pods import Pod, pod_from_dict
from gpushare.core.reconciliation import Context, first_card_memory_mib, reconcile
from gpushare.core.snapshot import encode_fold, snapshot_of
from gpushare.core.state import ClusterState, fold_events
from gpushare.embedded.nats_server import NatsServer
from gpushare.reporter.settings import DEFAULT_HEARTBEAT_SECONDS

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CARD_MIB = 81559
LIVE_PER_NODE = 10


def inventories(nodes: int, cards: int) -> list[InventoryReported]:
    return [
        InventoryReported(
            id=f"inventory-n{n}",
            at=T0,
            node=f"n{n}",
            cards=tuple(
                Card(index=c, uuid=f"GPU-{n}-{c}", model="A100-SXM4-80GB", memory_mib=CARD_MIB)
                for c in range(cards)
            ),
            source="simulated",
            heartbeat_seconds=10.0,
        )
        for n in range(nodes)
    ]


def allocation_events(count: int, nodes: int, cards: int, seed: int = 1) -> Iterator[AnyEvent]:
    """Pods' whole lives, interleaved across nodes; each node keeps ~10 pods live."""
    rng = random.Random(seed)
    live: dict[int, list[tuple[PodRef, str]]] = {}
    made = 0
    for k in range(count):
        n = rng.randrange(nodes)
        at, node, card = T0 + timedelta(milliseconds=k), f"n{n}", rng.randrange(cards)
        pod = PodRef(namespace="bench", name=f"p{k}", uid=f"uid-{k}")
        rid = f"reserve:uid-{k}:{node}:{k}"
        share = ContainerShare(
            container="main", card_index=card, card_uuid=f"GPU-{n}-{card}", memory_mib=4096
        )
        lives: list[AllocationEvent] = [
            PodReserved(id=rid, at=at, node=node, pod=pod, shares=(share,), reserved_by="bench"),
            PodBound(id=f"bound:{rid}", at=at, node=node, pod=pod, reservation_id=rid),
            ContainerAssigned(
                id=f"assigned:{rid}:main",
                at=at,
                node=node,
                pod=pod,
                reservation_id=rid,
                container="main",
                card_uuids=(share.card_uuid,),
            ),
        ]
        held = live.setdefault(n, [])
        held.append((pod, rid))
        if len(held) > LIVE_PER_NODE:
            gone, gone_rid = held.pop(0)
            lives.append(
                PodReleased(
                    id=f"released:{gone_rid}",
                    at=at,
                    node=node,
                    pod=gone,
                    reservation_id=gone_rid,
                    reason="deleted",
                )
            )
        for event in lives:
            if made == count:
                return
            made += 1
            yield event


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f} events/s ({seconds:.2f} s for {count:,})"


def bench_fold(count: int, nodes: int, cards: int) -> dict[str, float]:
    events = [*inventories(nodes, cards), *allocation_events(count, nodes, cards)]
    pairs = [(seq, event) for seq, event in enumerate(events, start=1)]
    raw = [encode_event(event) for event in events]
    gc.collect()
    gc.freeze()  # the bench's own million events out of the collector's sight, as a service's
    started = time.perf_counter()
    folded = fold_events(pairs)
    fold_s = time.perf_counter() - started
    started = time.perf_counter()
    decoded = fold_events((seq, decode_event(data)) for seq, data in enumerate(raw, start=1))
    decode_fold_s = time.perf_counter() - started
    sample = ClusterState()
    started = time.perf_counter()
    for seq, event in pairs[:100_000]:
        sample.apply(event, seq)
    incremental_s = time.perf_counter() - started
    gc.unfreeze()
    assert decoded.nodes == folded.nodes, "folding decoded bytes must give the same state"
    live = sum(len(node.pods) for node in folded.nodes.values())
    print(f"fold ({len(pairs):,} events, {nodes} nodes, {live:,} live pods at the end)")
    print(f"  fold_events, decoded:           {rate(len(pairs), fold_s)}")
    print(f"  fold_events, from stream bytes: {rate(len(pairs), decode_fold_s)}")
    print(f"  ClusterState.apply one by one:  {rate(min(len(pairs), 100_000), incremental_s)}")
    return {
        "fold_events_per_s": len(pairs) / fold_s,
        "decode_and_fold_events_per_s": len(pairs) / decode_fold_s,
        "incremental_events_per_s": min(len(pairs), 100_000) / incremental_s,
    }


async def _append_all(url: str, count: int, nodes: int, cards: int) -> None:
    nc = await connect(url, "bench-writer")
    js = nc.jetstream()
    await ensure_streams(js)
    for event in inventories(nodes, cards):
        await js.publish(inventory_subject(event.node), encode_event(event))
    await _publish_fast(nc, list(allocation_events(count, nodes, cards)))
    await nc.close()


async def _publish_fast(nc: Client, events: list[AnyEvent]) -> None:
    """Core-publish all but the last; the last one's JetStream ack means all are stored
    (one connection's messages reach the stream in order)."""
    for index, event in enumerate(events[:-1], start=1):
        await nc.publish(_subject(event), encode_event(event))
        if index % 20_000 == 0:
            await nc.flush()
    last = events[-1]
    await nc.jetstream().publish(_subject(last), encode_event(last))


def _subject(event: AnyEvent) -> str:
    """Where its writer appends it (on another writer's subject, the fold refuses it)."""
    assert not isinstance(event, InventoryReported)
    return allocation_subject(event.node, writer_of(event))


async def _start_follower(url: str, use_snapshots: bool) -> tuple[float, LogFollower, Client]:
    nc = await connect(url, "bench-follower")
    follower = LogFollower(nc.jetstream(), use_snapshots=use_snapshots, keep_snapshots=False)
    started = time.perf_counter()
    await follower.start()
    await follower.ready.wait()
    return time.perf_counter() - started, follower, nc


async def bench_start(count: int, nodes: int, cards: int, tail: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as data:
        server = NatsServer(Path(data) / "jetstream").start()
        try:
            print(f"start-up (appending {count:,} events to a real nats-server first)")
            await _append_all(server.url, count - tail, nodes, cards)
            full_s, follower, nc = await _start_follower(server.url, use_snapshots=False)
            print(f"  replaying all {follower.applied_seq:,} events, no snapshot: {full_s:.2f} s")
            await save_snapshot(nc.jetstream(), follower.take_snapshot(datetime.now(UTC)))
            await follower.stop()
            await nc.close()
            await _append_tail(server.url, count, tail, nodes, cards)
            snap_s, follower, nc = await _start_follower(server.url, use_snapshots=True)
            after = follower.applied_seq - follower.snapshot_seq
            print(f"  from a snapshot plus {after:,} events after it: {snap_s:.2f} s")
            await follower.stop()
            await nc.close()
        finally:
            server.stop()
    return {"start_full_replay_s": full_s, "start_with_snapshot_s": snap_s}


SNAPSHOT_NODES = 10_000
"""The cluster a snapshot's stall is measured on: the size ``docs/scaling.md`` plans for."""


async def _longest_wait(work: Callable[[], object], tick_s: float = 0.0005) -> float:
    """The event loop's longest wait past a ``tick_s`` sleep while ``work`` runs on a
    worker thread, in milliseconds: how long a request arriving then waits for the loop."""
    return await _longest_wait_for(asyncio.to_thread(work), tick_s)


async def _longest_wait_for(work: Awaitable[object], tick_s: float = 0.0005) -> float:
    """:func:`_longest_wait` while ``work`` is awaited."""
    longest = 0.0
    done = asyncio.Event()

    async def tick() -> None:
        nonlocal longest
        while not done.is_set():
            started = time.perf_counter()
            await asyncio.sleep(tick_s)
            longest = max(longest, time.perf_counter() - started - tick_s)

    ticking = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    await work
    done.set()
    await ticking
    return longest * 1000


def bench_snapshot_stall(cards: int, runs: int = 5) -> dict[str, float]:
    """A service's snapshot is built and encoded on a worker thread; how long does it keep
    the event loop (and every request) waiting? Both ways, a run of each in turn."""
    nodes = SNAPSHOT_NODES
    events = [*inventories(nodes, cards), *allocation_events(LIVE_PER_NODE * nodes, nodes, cards)]
    state, seq = fold_events(list(enumerate(events, start=1))), len(events)
    del events
    settle("make bench-log")  # as a service's collector is set once its fold is replayed
    pods = sum(len(node.pods) for node in state.nodes.values())
    at = datetime.now(UTC)

    def at_once() -> object:  # what the keeper did before 2026-11-29: one encoding call
        snapshot = snapshot_of(state.nodes, seq, at=at)
        return zlib.compress(msgspec.msgpack.encode(snapshot), level=1)

    def in_batches() -> object:
        return encode_fold(state.nodes, seq, at=at, between=let_the_loop_run)

    waits: dict[str, list[float]] = {"at_once": [], "in_batches": []}
    for _ in range(runs):
        waits["at_once"].append(asyncio.run(_longest_wait(at_once)))
        waits["in_batches"].append(asyncio.run(_longest_wait(in_batches)))
    print(f"a snapshot of {nodes:,} nodes, {pods:,} pods, made on a worker thread ({runs} runs)")
    for key, label in (("at_once", "encoded at once"), ("in_batches", "in batches of nodes")):
        print(
            f"  {label:<20} the event loop waits up to {max(waits[key]):5.1f} ms "
            f"(median of the runs' longest {statistics.median(waits[key]):5.1f} ms)"
        )
    return {f"snapshot_loop_wait_{key}_ms": max(values) for key, values in waits.items()}


def api_pods(state: ClusterState) -> list[Pod]:
    """The pods of the fold's allocations as the API shows them: a bound one on its node,
    running, its annotations what the binding wrote; one not bound yet pending."""
    pods = []
    limits = {"aliyun.com/gpu-mem": "1"}
    for node in state.nodes.values():
        for allocation in node.pods.values():
            bound = allocation.bound
            card_mib = first_card_memory_mib(node, allocation.shares)
            annotations = current_annotations(allocation, node.name, card_mib, "MiB", mgpu=False)
            manifest = {
                "metadata": {
                    "name": allocation.pod.name,
                    "namespace": allocation.pod.namespace,
                    "uid": allocation.pod.uid,
                    "annotations": annotations if bound else {},
                },
                "spec": {
                    "nodeName": node.name if bound else None,
                    "containers": [
                        {"name": share.container, "resources": {"limits": limits}}
                        for share in allocation.shares
                    ],
                },
                "status": {"phase": "Running" if bound else "Pending"},
            }
            pods.append(pod_from_dict(manifest))
    return pods


def bench_reconcile_stall(cards: int, runs: int = 5) -> dict[str, float]:
    """The binder's reconcile pass compares every watched GPU pod with the fold: how long
    does the event loop (and every binding) wait meanwhile? On the loop, as before
    2026-11-29, and on a worker thread (:func:`gpushare.binder.reconciling.decided`)."""
    nodes = SNAPSHOT_NODES
    events = [*inventories(nodes, cards), *allocation_events(LIVE_PER_NODE * nodes, nodes, cards)]
    state = fold_events(list(enumerate(events, start=1)))
    del events
    pods = api_pods(state)
    settle("make bench-log")
    context = Context(now=T0 + timedelta(days=1), bind_timeout=timedelta(seconds=60))
    folded = dict(state.nodes)

    def on_the_loop() -> float:
        started = time.perf_counter()
        corrections = reconcile(ClusterState(folded), pods, None, context)
        if any((corrections.adoptions, corrections.releases, corrections.repairs)):
            raise SystemExit("bench-log: the API pods do not agree with the fold")
        return (time.perf_counter() - started) * 1000

    async def on_a_thread() -> float:
        return await _longest_wait_for(decided(folded, pods, None, context))

    on_loop = [on_the_loop() for _ in range(runs)]
    threaded = [asyncio.run(on_a_thread()) for _ in range(runs)]
    print(f"a reconcile pass over {len(pods):,} GPU pods on {nodes:,} nodes ({runs} runs)")
    print(
        f"  on the event loop   the event loop waits {statistics.median(on_loop):6.1f} ms "
        f"(median; the whole pass)"
    )
    print(
        f"  on a worker thread  the event loop waits up to {max(threaded):5.1f} ms "
        f"(median of the runs' longest {statistics.median(threaded):5.1f} ms)"
    )
    return {
        "reconcile_loop_wait_ms": statistics.median(on_loop),
        "reconcile_thread_wait_ms": max(threaded),
    }


async def _append_tail(url: str, count: int, tail: int, nodes: int, cards: int) -> None:
    nc = await connect(url, "bench-tail")
    await _publish_fast(nc, list(allocation_events(count, nodes, cards))[count - tail :])
    await nc.close()


def heartbeat_round(nodes: int, cards: int, round_: int) -> list[InventoryReported]:
    """Every node's inventory again, ``round_`` seconds after :data:`T0`."""
    return [
        msgspec.structs.replace(event, id=f"{event.id}-{round_}", at=T0 + timedelta(seconds=round_))
        for event in inventories(nodes, cards)
    ]


async def _follow_heartbeats(url: str, nodes: int, last: datetime, ready: Connection) -> float:
    nc = await connect(url, "bench-heartbeats")
    follower = LogFollower(nc.jetstream(), use_snapshots=False, keep_snapshots=False)
    await follower.start()
    started = time.process_time()
    ready.send(True)
    states = follower.state.nodes
    while sum(node.inventory_at == last for node in states.values()) < nodes:  # noqa: ASYNC110
        await asyncio.sleep(0.02)  # a poll: the follower signals no inventory
    spent = time.process_time() - started
    await follower.stop()
    await nc.close()
    return spent


def follow_heartbeats(url: str, nodes: int, last: datetime, ready: Connection) -> None:
    """The follower's process: once it follows, says so; once every node's ``last``
    heartbeat is folded, sends the CPU seconds it spent since."""
    logging.getLogger("gpushare.bus.connection").setLevel(logging.ERROR)
    ready.send(asyncio.run(_follow_heartbeats(url, nodes, last, ready)))


async def _publish_heartbeats(url: str, nodes: int, cards: int, rounds: int) -> None:
    nc = await connect(url, "bench-reporters")
    js = nc.jetstream()
    for round_ in range(1, rounds + 1):
        await asyncio.gather(
            *(publish_inventory(js, e) for e in heartbeat_round(nodes, cards, round_))
        )
    await nc.close()


def bench_heartbeats(nodes: int, cards: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as data:
        server = NatsServer(Path(data) / "jetstream").start()
        try:
            asyncio.run(_ensure_streams(server.url))
            spawn = multiprocessing.get_context("spawn")
            parent, child = spawn.Pipe()
            last = T0 + timedelta(seconds=rounds)
            follower = spawn.Process(
                target=follow_heartbeats, args=(server.url, nodes, last, child)
            )
            follower.start()
            try:
                if not parent.poll(60):
                    raise TimeoutError("the heartbeats' follower did not start")
                parent.recv()
                asyncio.run(_publish_heartbeats(server.url, nodes, cards, rounds))
                if not parent.poll(120):
                    raise TimeoutError("the heartbeats' follower did not fold them all")
                spent: float = parent.recv()
            finally:
                follower.join(10)
                if follower.is_alive():
                    follower.kill()
        finally:
            server.stop()
    count = nodes * rounds
    per_heartbeat_us = 1e6 * spent / count
    per_second = 10_000 / DEFAULT_HEARTBEAT_SECONDS
    print(f"heartbeats ({rounds} rounds of {nodes} nodes of {cards} cards, plain TCP)")
    print(f"  a follower of the whole cluster: {per_heartbeat_us:.1f} µs of CPU a heartbeat")
    print(
        f"  10,000 nodes every {DEFAULT_HEARTBEAT_SECONDS:g} s ({per_second:,.0f}/s): "
        f"{per_second * per_heartbeat_us / 1e4:.1f} % of a core for each allocator and binder"
    )
    return {"heartbeat_cpu_us": per_heartbeat_us}


async def _ensure_streams(url: str) -> None:
    nc = await connect(url, "bench-setup")
    await ensure_streams(nc.jetstream())
    await nc.close()


def main(argv: list[str] | None = None) -> int:
    parse = argparse.ArgumentParser(prog="make bench-log", description=__doc__.split("\n\n")[0])
    parse.add_argument("--events", type=int, default=1_000_000)
    parse.add_argument("--nodes", type=int, default=1000)
    parse.add_argument("--cards", type=int, default=8)
    parse.add_argument("--tail", type=int, default=5000, help="events after the snapshot")
    parse.add_argument("--heartbeat-rounds", type=int, default=20)
    parse.add_argument("--json", action="store_true")
    args = parse.parse_args(argv)
    unwind_on_sigterm()
    logging.getLogger("gpushare.bus.connection").setLevel(logging.ERROR)  # closing is expected
    figures = bench_fold(args.events, args.nodes, args.cards)
    figures |= asyncio.run(
        cancelled_by_sigterm(bench_start(args.events, args.nodes, args.cards, args.tail))
    )
    figures |= bench_snapshot_stall(args.cards)
    figures |= bench_reconcile_stall(args.cards)
    figures |= bench_heartbeats(args.nodes, args.cards, args.heartbeat_rounds)
    if args.json:
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
