"""``make bench``: extender filter latency and bind latency/throughput, printed.

The allocator runs as its own process (``gpushare allocator``) against a real
nats-server, exactly as deployed; this process is the client. Bind excludes the
Kubernetes API round trip: a binder double appends ``PodBound`` as soon as it sees a
reservation, so the figure is the allocator's own decision, CAS append and wait.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import uvloop

from benchmarks.interrupt import cancelled_by_sigterm, unwind_on_sigterm
from gpushare.bus.connection import connect
from gpushare.bus.log import AllocationLog, publish_inventory
from gpushare.bus.nats_types import DeliverPolicy
from gpushare.bus.provenance import decode_from
from gpushare.bus.streams import ensure_streams
from gpushare.bus.subjects import ALLOCATION_PREFIX, ALLOCATION_STREAM
from gpushare.collector import settle
from gpushare.core.events import InventoryReported, PodBound, PodReserved
from gpushare.core.model import Card
from gpushare.embedded.nats_server import NatsServer, free_port, wait_for_port

CARDS_PER_NODE = 8
PRIORITIZE_PODS = 300
PRIORITIZE_OFFSET = 1_000_000
"""Pod numbers of the prioritize runs (apart from the bind runs')."""
CHOOSING_OFFSET = 2_000_000
"""Pod numbers of the choosing filter's runs."""
CARD_MIB = 81559
PREFIX = "/gpushare-scheduler"
RESERVATIONS = f"{ALLOCATION_PREFIX}.*.allocator"
"""What the allocators append: the binder double's whole input."""
_json = msgspec.json.Encoder()


def percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


PREFERENCE = {
    "nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 10,
                "preference": {
                    "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
                },
            }
        ]
    }
}
"""A preference only kube-scheduler's scores weigh: filter then passes every node that
fits and prioritize ranks them (without one, filter answers the best node alone)."""


def pod(index: int, mib: int, *, preferring: bool = False) -> dict[str, Any]:
    limits = {"aliyun.com/gpu-mem": str(mib)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits}}]}
    if preferring:
        spec["affinity"] = PREFERENCE
    return {
        "metadata": {"name": f"bench-{index}", "namespace": "bench", "uid": f"uid-{index}"},
        "spec": spec,
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
    from the allocator being measured, on the same cores). It reads only what allocators
    append, so it is not also handed back its own PodBound events, and it answers
    reservations concurrently, as the real binder binds a fetched batch."""

    def __init__(self, js: Any) -> None:
        self.js = js
        self.log = AllocationLog(js)
        self.answering: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.subscription = await self.js.subscribe(
            RESERVATIONS,
            cb=self._on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
            stream=ALLOCATION_STREAM,
        )

    async def _on_message(self, msg: Any) -> None:
        event = decode_from(msg.subject, msg.data)
        if isinstance(event, PodReserved):
            task = asyncio.create_task(self._answer(event))
            self.answering.add(task)
            task.add_done_callback(self.answering.discard)

    async def _answer(self, reserved: PodReserved) -> None:
        bound = PodBound(
            id=f"{reserved.id}.bound", at=datetime.now(UTC), node=reserved.node,
            pod=reserved.pod, reservation_id=reserved.id,
        )  # fmt: skip
        await self.log.append(bound)


class KeepAliveClient(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection to the extender, one request at a time, each
    sent in one write and its answer read whole (by ``Content-Length``), as
    kube-scheduler's Go client does. The figures are the allocator's, so the client that
    measures them takes as little of the shared cores as it can: aiohttp's client took a
    third of this process's CPU in the bind runs, and binds/s rose from about 740 to
    1,100 without it."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._answer: asyncio.Future[tuple[int, bytes]] | None = None
        self._transport: asyncio.Transport | None = None

    @classmethod
    async def open(cls, host: str, port: int) -> KeepAliveClient:
        _, protocol = await asyncio.get_running_loop().create_connection(cls, host, port)
        return protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0 or self._answer is None:
            return
        head = bytes(self._buffer[:end]).lower()
        length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        if len(self._buffer) < end + 4 + length:
            return
        body = bytes(self._buffer[end + 4 : end + 4 + length])
        del self._buffer[: end + 4 + length]
        self._answer.set_result((int(head[9:12]), body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc or ConnectionError("the allocator closed"))

    async def request(self, method: bytes, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """(status, body) of one request."""
        assert self._transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._transport.write(
            b"%s %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (method, path.encode(), len(body), body)
        )
        return await self._answer

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self.request(b"POST", PREFIX + path, body)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def time_filter(client: KeepAliveClient, body: bytes, requests: int) -> list[float]:
    samples = []
    for _ in range(requests):
        start = time.perf_counter()
        status, _ = await client.post("/filter", body)
        samples.append((time.perf_counter() - start) * 1000)
        assert status == 200, status
    return samples


async def bench_filter(client: KeepAliveClient, names: list[str]) -> None:
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
        body = _json.encode(args)
        requests = 300 if mode == "node names" else 40
        await time_filter(client, body, 20)
        samples = await time_filter(client, body, requests)
        print(
            f"  filter {len(names):>5} nodes x {CARDS_PER_NODE} cards, {mode:<17} "
            f"({len(body) / 1024:>7.0f} KiB): p50 {percentile(samples, 50):6.2f} ms  "
            f"p99 {percentile(samples, 99):6.2f} ms  (n={requests})",
            flush=True,
        )


async def bench_bind(
    port: int, names: list[str], binds: int, *, workers: int, offset: int = 0
) -> None:
    latencies: list[float] = []
    errors = 0

    async def one(client: KeepAliveClient, index: int) -> None:
        nonlocal errors
        node = names[index % len(names)]
        args = {"Pod": pod(index, 1024), "Nodes": None, "NodeNames": [node]}
        status, _ = await client.post("/filter", _json.encode(args))
        assert status == 200, status
        bind = {"PodName": f"bench-{index}", "PodNamespace": "bench",
                "PodUID": f"uid-{index}", "Node": node}  # fmt: skip
        body = _json.encode(bind)
        start = time.perf_counter()
        status, answer = await client.post("/bind", body)
        latencies.append((time.perf_counter() - start) * 1000)
        errors += status != 200 or bool(msgspec.json.decode(answer).get("Error"))

    queue = iter(range(offset, offset + binds))

    async def worker() -> None:
        client = await KeepAliveClient.open("127.0.0.1", port)
        try:
            for index in queue:
                await one(client, index)
        finally:
            client.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    elapsed = time.perf_counter() - start
    print(
        f"  bind {binds} pods, {workers} concurrent, real nats-server, binder double: "
        f"p50 {percentile(latencies, 50):6.2f} ms  p99 {percentile(latencies, 99):6.2f} ms  "
        f"{binds / elapsed:6.0f} binds/s  errors {errors}",
        flush=True,
    )


async def bench_scrape(client: KeepAliveClient, nodes: int, scrapes: int = 6) -> None:
    """The allocator answers Prometheus on its event loop: while a scrape is built no
    filter or bind is answered. The first scrape renders every card; the next ones only
    the nodes that changed (none here)."""
    samples: list[float] = []
    size = 0
    for _ in range(scrapes):
        start = time.perf_counter()
        status, body = await client.request(b"GET", "/metrics")
        samples.append((time.perf_counter() - start) * 1000)
        assert status == 200, status
        size = len(body)
    print(
        f"  /metrics {nodes:>5} nodes x {CARDS_PER_NODE} cards ({size / 2**20:5.1f} MiB): "
        f"first {samples[0]:7.1f} ms, then p50 {percentile(samples[1:], 50):6.1f} ms  "
        f"(n={scrapes - 1})",
        flush=True,
    )


def bench_pods(
    names: list[str], subset: int, pods: int, offset: int
) -> Iterator[tuple[int, int, list[str]]]:
    """(pod number, MiB, the names kube-scheduler asks about) per pod, seeded by ``subset``."""
    rng = random.Random(subset)
    for index in range(pods):
        mib = rng.choice((1024, 2048, 4096, 8192, 16384))
        yield offset + index, mib, rng.sample(names, subset) if subset < len(names) else names


async def bench_prioritize(
    client: KeepAliveClient, names: list[str], subset: int, pods: int, *, offset: int
) -> None:
    """kube-scheduler's order for each pod that states a preference: filter, prioritize
    the nodes that passed, bind to the best. Only prioritize is timed; each bind changes
    one node, so the allocator scores again exactly what a real cycle would make it score
    again."""
    samples = []
    for number, mib, asked in bench_pods(names, subset, pods, offset):
        args = {"Pod": pod(number, mib, preferring=True), "Nodes": None, "NodeNames": asked}
        status, answer = await client.post("/filter", _json.encode(args))
        assert status == 200, status
        args["NodeNames"] = msgspec.json.decode(answer)["NodeNames"]
        body = _json.encode(args)
        start = time.perf_counter()
        status, answer = await client.post("/prioritize", body)
        samples.append((time.perf_counter() - start) * 1000)
        assert status == 200, status
        best = max(msgspec.json.decode(answer), key=lambda host: host["Score"])["Host"]
        await bind_bench_pod(client, number, best)
    print(
        f"  prioritize {subset:>5} of {len(names):>5} nodes, names only, default policy, "
        f"a bind after each: p50 {percentile(samples, 50):6.2f} ms  "
        f"p99 {percentile(samples, 99):6.2f} ms  (n={pods})",
        flush=True,
    )


async def bench_choosing_filter(
    client: KeepAliveClient, names: list[str], subset: int, pods: int, *, offset: int
) -> None:
    """kube-scheduler's order for a pod that states no preference: filter answers the
    node the policy places it best on, and kube-scheduler binds there without calling
    prioritize. filter is timed: its verdicts and its choice, which is prioritize's work
    for the nodes that fit."""
    samples = []
    for number, mib, asked in bench_pods(names, subset, pods, offset):
        body = _json.encode({"Pod": pod(number, mib), "Nodes": None, "NodeNames": asked})
        start = time.perf_counter()
        status, answer = await client.post("/filter", body)
        samples.append((time.perf_counter() - start) * 1000)
        assert status == 200, status
        (chosen,) = msgspec.json.decode(answer)["NodeNames"]
        await bind_bench_pod(client, number, chosen)
    print(
        f"  filter choosing {subset:>5} of {len(names):>5} nodes, names only, default "
        f"policy, a bind after each: p50 {percentile(samples, 50):6.2f} ms  "
        f"p99 {percentile(samples, 99):6.2f} ms  (n={pods})",
        flush=True,
    )


async def bind_bench_pod(client: KeepAliveClient, number: int, node: str) -> None:
    bind = {"PodName": f"bench-{number}", "PodNamespace": "bench",
            "PodUID": f"uid-{number}", "Node": node}  # fmt: skip
    status, _ = await client.post("/bind", _json.encode(bind))
    assert status == 200, status


async def run_scenario(data_dir: Path, node_count: int, binds: int) -> None:
    nats = NatsServer(data_dir / f"js-{node_count}").start()
    port = free_port()
    allocator = None
    try:
        nc = await connect(nats.url, name="bench")
        js = nc.jetstream()
        await ensure_streams(js)
        names = await publish_nodes(js, node_count)
        # The measuring client collects garbage as the services do: with Python's default
        # thresholds its own full collections (11-28 ms, a few per run) landed in the
        # latencies it measures, as kube-scheduler's Go client's would not.
        settle("make bench")
        allocator = subprocess.Popen(  # noqa: ASYNC220 (started once, before timing)
            [sys.executable, "-m", "gpushare.cli.main", "allocator", "--nats", nats.url,
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port(port, 60)
        client = await ready_client(port)
        try:
            await bench_filter(client, names)
            await bench_scrape(client, node_count)
            binder = BinderDouble(js)
            await binder.start()
            for subset in sorted({min(500, node_count), node_count}):
                await bench_prioritize(
                    client, names, subset, PRIORITIZE_PODS, offset=PRIORITIZE_OFFSET + subset
                )
                await bench_choosing_filter(
                    client, names, subset, PRIORITIZE_PODS, offset=CHOOSING_OFFSET + subset
                )
        finally:
            client.close()
        if binds:
            for workers in (4, 16):
                await bench_bind(port, names, binds, workers=workers, offset=workers * binds)
        await nc.close()
    finally:
        if allocator is not None:
            allocator.terminate()
            allocator.wait(10)
        nats.stop()


async def ready_client(port: int) -> KeepAliveClient:
    """A connection to the allocator once it answers ``/readyz``."""
    client = await KeepAliveClient.open("127.0.0.1", port)
    for _ in range(600):
        status, _ = await client.request(b"GET", "/readyz")
        if status == 200:
            return client
        await asyncio.sleep(0.1)
    client.close()
    raise TimeoutError("allocator never became ready")


def main(argv: list[str] | None = None) -> int:
    parse = argparse.ArgumentParser(prog="make bench", description=__doc__.split("\n\n")[0])
    parse.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 10000])
    parse.add_argument("--binds", type=int, default=2000)
    args = parse.parse_args(argv)
    unwind_on_sigterm()
    print("gpushare benchmarks (allocator as a separate process, real nats-server)")
    with tempfile.TemporaryDirectory(prefix="gs-bench-", dir="/tmp") as tmp:
        for index, count in enumerate(args.nodes):
            binds = args.binds if index == len(args.nodes) - 1 else 0
            scenario = run_scenario(Path(tmp), count, binds)
            uvloop.run(cancelled_by_sigterm(scenario))  # uvloop: the client's own cost, kept low
    return 0


if __name__ == "__main__":
    sys.exit(main())
