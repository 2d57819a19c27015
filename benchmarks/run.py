"""``make bench``: extender filter latency and bind latency/throughput, printed.

The allocator runs as its own process (``gpushare allocator``) against a real
nats-server, exactly as deployed; this process is the client. Bind excludes the
Kubernetes API round trip: a binder double appends ``PodBound`` as soon as it sees a
reservation, so the figure is the allocator's own decision, CAS append and wait.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from gpushare.bus.connection import connect
from gpushare.bus.log import AllocationLog, publish_inventory
from gpushare.bus.nats_types import DeliverPolicy
from gpushare.bus.provenance import decode_from
from gpushare.bus.streams import ensure_streams
from gpushare.bus.subjects import ALL_ALLOCATIONS, ALLOCATION_STREAM
from gpushare.core.events import InventoryReported, PodBound, PodReserved
from gpushare.core.model import Card
from gpushare.embedded.nats_server import NatsServer, free_port, wait_for_port

CARDS_PER_NODE = 8
PRIORITIZE_PODS = 300
PRIORITIZE_OFFSET = 1_000_000
"""Pod numbers of the prioritize runs (apart from the bind runs')."""
CARD_MIB = 81559
PREFIX = "/gpushare-scheduler"


def percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def pod(index: int, mib: int) -> dict[str, Any]:
    limits = {"aliyun.com/gpu-mem": str(mib)}
    return {
        "metadata": {"name": f"bench-{index}", "namespace": "bench", "uid": f"uid-{index}"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def node_object(name: str) -> dict[str, Any]:
    """A Node as kube-scheduler sends it with nodeCacheCapable: false (trimmed managedFields)."""
    capacity = {"cpu": "96", "memory": "1056Gi", "aliyun.com/gpu-mem": str(8 * CARD_MIB)}
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        },
    }


async def publish_nodes(js: Any, count: int) -> list[str]:
    names = [f"node-{i:05d}" for i in range(count)]
    at = datetime.now(UTC)
    for name in names:
        cards = tuple(
            Card(index=i, uuid=f"GPU-{name}-{i}", model="H100", memory_mib=CARD_MIB)
            for i in range(CARDS_PER_NODE)
        )
        event = InventoryReported(
            id=f"bench:{name}", at=at, node=name, cards=cards, source="simulated",
            heartbeat_seconds=3600,
        )  # fmt: skip
        await publish_inventory(js, event)
    return names


class BinderDouble:
    """Answers every reservation with PodBound at once: no Kubernetes round trip, and no
    fold (the real binder folds in a process of its own; here that would only take CPU
    from the allocator being measured, on the same cores)."""

    def __init__(self, js: Any) -> None:
        self.js = js
        self.log = AllocationLog(js)
        self.queue: asyncio.Queue[PodReserved] = asyncio.Queue()

    async def start(self) -> None:
        self.subscription = await self.js.subscribe(
            ALL_ALLOCATIONS,
            cb=self._on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
            stream=ALLOCATION_STREAM,
        )
        self.task = asyncio.create_task(self._run())

    async def _on_message(self, msg: Any) -> None:
        event = decode_from(msg.subject, msg.data)
        if isinstance(event, PodReserved):
            self.queue.put_nowait(event)

    async def _run(self) -> None:
        while True:
            reserved = await self.queue.get()
            bound = PodBound(
                id=f"{reserved.id}.bound", at=datetime.now(UTC), node=reserved.node,
                pod=reserved.pod, reservation_id=reserved.id,
            )  # fmt: skip
            await self.log.append(bound)


async def time_filter(
    session: aiohttp.ClientSession, url: str, body: bytes, requests: int
) -> list[float]:
    samples = []
    for _ in range(requests):
        start = time.perf_counter()
        async with session.post(f"{url}{PREFIX}/filter", data=body) as reply:
            await reply.read()
            assert reply.status == 200, reply.status
        samples.append((time.perf_counter() - start) * 1000)
    return samples


async def bench_filter(session: aiohttp.ClientSession, url: str, names: list[str]) -> None:
    for mode in ("node names", "full Node objects"):
        if mode == "node names":
            args = {"Pod": pod(0, 4096), "Nodes": None, "NodeNames": names}
        else:
            items = [node_object(name) for name in names]
            args = {
                "Pod": pod(0, 4096),
                "Nodes": {"metadata": {}, "items": items},
                "NodeNames": None,
            }
        body = json.dumps(args, separators=(",", ":")).encode()
        requests = 300 if mode == "node names" else 40
        await time_filter(session, url, body, 20)
        samples = await time_filter(session, url, body, requests)
        print(
            f"  filter {len(names):>5} nodes x {CARDS_PER_NODE} cards, {mode:<17} "
            f"({len(body) / 1024:>7.0f} KiB): p50 {percentile(samples, 50):6.2f} ms  "
            f"p99 {percentile(samples, 99):6.2f} ms  (n={requests})",
            flush=True,
        )


async def bench_bind(
    session: aiohttp.ClientSession,
    url: str,
    names: list[str],
    binds: int,
    *,
    workers: int,
    offset: int = 0,
) -> None:
    latencies: list[float] = []
    errors = 0

    async def one(index: int) -> None:
        nonlocal errors
        node = names[index % len(names)]
        args = {"Pod": pod(index, 1024), "Nodes": None, "NodeNames": [node]}
        async with session.post(f"{url}{PREFIX}/filter", json=args) as reply:
            await reply.read()
        bind = {"PodName": f"bench-{index}", "PodNamespace": "bench",
                "PodUID": f"uid-{index}", "Node": node}  # fmt: skip
        start = time.perf_counter()
        async with session.post(f"{url}{PREFIX}/bind", json=bind) as reply:
            result = await reply.json()
        latencies.append((time.perf_counter() - start) * 1000)
        errors += bool(result.get("Error"))

    queue = iter(range(offset, offset + binds))

    async def worker() -> None:
        for index in queue:
            await one(index)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    elapsed = time.perf_counter() - start
    print(
        f"  bind {binds} pods, {workers} concurrent, real nats-server, binder double: "
        f"p50 {percentile(latencies, 50):6.2f} ms  p99 {percentile(latencies, 99):6.2f} ms  "
        f"{binds / elapsed:6.0f} binds/s  errors {errors}",
        flush=True,
    )


async def bench_prioritize(
    session: aiohttp.ClientSession, url: str, names: list[str], subset: int, pods: int
) -> None:
    """kube-scheduler's order for each pod: filter, prioritize the nodes that passed, bind
    to the best. Only prioritize is timed; each bind changes one node, so the allocator
    scores again exactly what a real cycle would make it score again."""
    rng = random.Random(subset)
    samples = []
    for index in range(pods):
        mib = rng.choice((1024, 2048, 4096, 8192, 16384))
        asked = rng.sample(names, subset) if subset < len(names) else names
        args = {"Pod": pod(PRIORITIZE_OFFSET + index, mib), "Nodes": None, "NodeNames": asked}
        body = json.dumps(args, separators=(",", ":")).encode()
        async with session.post(f"{url}{PREFIX}/filter", data=body) as reply:
            passed = (await reply.json())["NodeNames"]
        args["NodeNames"] = passed
        body = json.dumps(args, separators=(",", ":")).encode()
        start = time.perf_counter()
        async with session.post(f"{url}{PREFIX}/prioritize", data=body) as reply:
            scores = await reply.json()
            assert reply.status == 200, reply.status
        samples.append((time.perf_counter() - start) * 1000)
        best = max(scores, key=lambda host: host["Score"])["Host"]
        number = PRIORITIZE_OFFSET + index
        bind = {"PodName": f"bench-{number}", "PodNamespace": "bench",
                "PodUID": f"uid-{number}", "Node": best}  # fmt: skip
        async with session.post(f"{url}{PREFIX}/bind", json=bind) as reply:
            await reply.read()
    print(
        f"  prioritize {subset:>5} of {len(names):>5} nodes, names only, default policy, "
        f"a bind after each: p50 {percentile(samples, 50):6.2f} ms  "
        f"p99 {percentile(samples, 99):6.2f} ms  (n={pods})",
        flush=True,
    )


async def run_scenario(data_dir: Path, node_count: int, binds: int) -> None:
    nats = NatsServer(data_dir / f"js-{node_count}").start()
    port = free_port()
    allocator = None
    try:
        nc = await connect(nats.url, name="bench")
        js = nc.jetstream()
        await ensure_streams(js)
        names = await publish_nodes(js, node_count)
        allocator = subprocess.Popen(  # noqa: ASYNC220 (started once, before timing)
            [sys.executable, "-m", "gpushare.cli.main", "allocator", "--nats", nats.url,
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port(port, 60)
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:
            await wait_ready(session, url)
            await bench_filter(session, url, names)
            binder = BinderDouble(js)
            await binder.start()
            for subset in sorted({min(500, node_count), node_count}):
                await bench_prioritize(session, url, names, subset, PRIORITIZE_PODS)
            if binds:
                for workers in (4, 16):
                    await bench_bind(
                        session, url, names, binds, workers=workers, offset=workers * binds
                    )
        await nc.close()
    finally:
        if allocator is not None:
            allocator.terminate()
            allocator.wait(10)
        nats.stop()


async def wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(600):
        async with session.get(f"{url}/readyz") as reply:
            if reply.status == 200:
                return
        await asyncio.sleep(0.1)
    raise TimeoutError("allocator never became ready")


def main(argv: list[str] | None = None) -> int:
    parse = argparse.ArgumentParser(prog="make bench", description=__doc__.split("\n\n")[0])
    parse.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 10000])
    parse.add_argument("--binds", type=int, default=2000)
    args = parse.parse_args(argv)
    print("gpushare benchmarks (allocator as a separate process, real nats-server)")
    with tempfile.TemporaryDirectory(prefix="gs-bench-", dir="/tmp") as tmp:
        for index, count in enumerate(args.nodes):
            binds = args.binds if index == len(args.nodes) - 1 else 0
            uvloop.run(run_scenario(Path(tmp), count, binds))  # the client's own cost, kept low
    return 0


if __name__ == "__main__":
    sys.exit(main())
