"""The reporter against a real nats-server: what lands in GPUSHARE_INVENTORY, and when."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from gpushare.bus.log import publish_inventory
from gpushare.bus.subjects import ALL_INVENTORY, INVENTORY_STREAM, inventory_subject
from gpushare.core.events import InventoryReported, decode_event
from gpushare.core.model import CardLink
from gpushare.embedded.nats_server import NatsServer, free_port
from gpushare.reporter.__main__ import parse_settings
from gpushare.reporter.publishing import NodeReporter
from gpushare.reporter.running import open_backends, serve
from gpushare.reporter.simulated import SimulatedBackend
from tests.fakes import FakeClock
from tests.unit.reporter.fakes import DGX1_FIXTURE

HEARTBEAT = 0.2
"""Short, so the loop tests see several heartbeats; nothing asserts how long they took."""


async def last_inventory(js: JetStreamContext, node: str) -> InventoryReported | None:
    try:
        message = await js.get_last_msg(INVENTORY_STREAM, inventory_subject(node))
    except NotFoundError:
        return None
    assert message.data is not None
    event = decode_event(message.data)
    assert isinstance(event, InventoryReported)
    return event


async def published_count(js: JetStreamContext) -> int:
    """Messages ever stored in the inventory stream (a duplicate id stores nothing)."""
    info = await js.stream_info(INVENTORY_STREAM)
    return int(info.state.last_seq)


class InventoryWatch:
    """Every inventory event as it is published, through a plain NATS subscription."""

    def __init__(self) -> None:
        self.events: list[InventoryReported] = []
        self._arrived = asyncio.Condition()

    async def on_message(self, message: Msg) -> None:
        event = decode_event(message.data)
        assert isinstance(event, InventoryReported)
        async with self._arrived:
            self.events.append(event)
            self._arrived.notify_all()

    def of(self, node: str) -> list[InventoryReported]:
        return [event for event in self.events if event.node == node]

    async def wait_for(self, seen: Callable[[], bool]) -> None:
        async with asyncio.timeout(30), self._arrived:
            await self._arrived.wait_for(seen)


@pytest.fixture
async def watch(nc: Client) -> AsyncIterator[InventoryWatch]:
    watching = InventoryWatch()
    subscription = await nc.subscribe(ALL_INVENTORY, cb=watching.on_message)
    await nc.flush()  # the server knows the subscription before anything is published
    yield watching
    await subscription.unsubscribe()


def reporter_for(
    js: JetStreamContext, backend: SimulatedBackend, clock: FakeClock | None = None
) -> NodeReporter:
    return NodeReporter(
        backend.node,
        backend,
        partial(publish_inventory, js),
        clock=clock,
        heartbeat_seconds=5 if clock else HEARTBEAT,
        poll_seconds=0.05,
    )


async def test_the_first_inventory_is_published_at_once(js: JetStreamContext) -> None:
    backend = SimulatedBackend("gpu.a", (16276, 16276, 32510))
    sent = await reporter_for(js, backend, FakeClock()).report_once()
    stored = await last_inventory(js, "gpu.a")
    assert stored is not None
    assert stored == sent
    assert [card.memory_mib for card in stored.cards] == [16276, 16276, 32510]


async def test_a_change_is_published_immediately(js: JetStreamContext) -> None:
    backend = SimulatedBackend("gpu-a", (16276, 16276))
    reporter = reporter_for(js, backend, FakeClock())
    await reporter.report_once()
    backend.mark_unhealthy(0, "XID 79")
    await reporter.report_once()
    stored = await last_inventory(js, "gpu-a")
    assert stored is not None
    assert [(card.healthy, card.health_reason) for card in stored.cards] == [
        (False, "XID 79"),
        (True, ""),
    ]
    assert await published_count(js) == 2


async def test_heartbeats_republish_the_same_cards(js: JetStreamContext) -> None:
    clock = FakeClock()
    reporter = reporter_for(js, SimulatedBackend("gpu-a", (1000,)), clock)
    first = await reporter.report_once()
    for _ in range(2):
        clock.advance(5)
        await reporter.report_once()
    stored = await last_inventory(js, "gpu-a")
    assert first is not None
    assert stored is not None
    assert await published_count(js) == 3
    assert (stored.cards, stored.at) == (first.cards, clock.now())


async def test_a_duplicate_publish_is_harmless(js: JetStreamContext) -> None:
    clock = FakeClock()
    for _ in range(2):  # e.g. the old and the new reporter pod during a rollout
        await reporter_for(js, SimulatedBackend("gpu-a", (1000,)), clock).report_once()
    assert await published_count(js) == 1


async def test_the_loop_publishes_changes_and_heartbeats_and_stops(
    js: JetStreamContext, watch: InventoryWatch
) -> None:
    backend = SimulatedBackend("gpu-a", (1000, 2000))
    stopping = asyncio.Event()
    task = asyncio.create_task(reporter_for(js, backend).run(stopping))
    await watch.wait_for(lambda: len(watch.events) >= 1)
    assert watch.events[0].cards[1].healthy

    backend.mark_unhealthy(1, "XID 79")
    await watch.wait_for(lambda: not watch.events[-1].cards[1].healthy)
    changed_at = len(watch.events)
    await watch.wait_for(lambda: len(watch.events) >= changed_at + 2)
    heartbeats = watch.events[changed_at - 1 :]
    assert len({event.id for event in heartbeats}) == len(heartbeats)
    assert {event.cards for event in heartbeats} == {watch.events[changed_at - 1].cards}

    stopping.set()
    await task
    backend.close()
    stopped_at = len(watch.events)
    await asyncio.sleep(3 * HEARTBEAT)
    assert len(watch.events) == stopped_at


async def test_one_process_reports_several_nodes(
    nats_server: NatsServer, js: JetStreamContext, watch: InventoryWatch
) -> None:
    argv = ["--nats", nats_server.url, "--node", "gpu-a=16276,16276"]
    argv += ["--node", "gpu-b=16276,16276,32510", "--heartbeat", str(HEARTBEAT)]
    settings = parse_settings(argv, {})
    backends = open_backends(settings)
    stopping = asyncio.Event()
    serving = asyncio.create_task(serve(settings, backends, stopping))

    await watch.wait_for(lambda: bool(watch.of("gpu-a")) and bool(watch.of("gpu-b")))
    stopping.set()
    assert await serving == 0
    gpu_b = await last_inventory(js, "gpu-b")
    assert gpu_b is not None
    assert [card.memory_mib for card in gpu_b.cards] == [16276, 16276, 32510]
    assert gpu_b.heartbeat_seconds == HEARTBEAT


async def test_links_and_mps_reach_the_inventory_stream(
    nats_server: NatsServer, js: JetStreamContext, watch: InventoryWatch
) -> None:
    """A replayed DGX-1 (NVLink mesh, MPS) and simulated NVLink pairs, through one process."""
    argv = ["--nats", nats_server.url, "--heartbeat", str(HEARTBEAT)]
    argv += ["--fixture", str(DGX1_FIXTURE), "--node-name", "dgx-1"]
    argv += ["--node", "gpu-a=16276,16276,16276,16276", "--topology", "nvlink-pairs"]
    settings = parse_settings(argv, {})
    stopping = asyncio.Event()
    serving = asyncio.create_task(serve(settings, open_backends(settings), stopping))
    await watch.wait_for(lambda: bool(watch.of("dgx-1")) and bool(watch.of("gpu-a")))
    stopping.set()
    assert await serving == 0

    dgx = await last_inventory(js, "dgx-1")
    assert dgx is not None
    assert (dgx.source, dgx.mps, len(dgx.links)) == ("fixture", True, 28)
    assert CardLink(a=0, b=3, path="NVLINK", nvlinks=2) in dgx.links
    assert CardLink(a=0, b=5, path="SYS") in dgx.links
    simulated = await last_inventory(js, "gpu-a")
    assert simulated is not None
    assert not simulated.mps
    nvlinked = [(link.a, link.b) for link in simulated.links if link.path == "NVLINK"]
    assert nvlinked == [(0, 1), (2, 3)]


async def test_the_command_stops_cleanly_on_sigterm(
    nats_server: NatsServer, js: JetStreamContext, watch: InventoryWatch
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "gpushare.cli.main", "reporter", "--nats", nats_server.url),
        *("--node", "gpu-z=1000", "--heartbeat", str(HEARTBEAT)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )

    try:
        await watch.wait_for(lambda: bool(watch.of("gpu-z")))
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        _, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()
    assert b"gpu-z: reporter stopped" in stderr
    stopped_at = len(watch.events)
    await asyncio.sleep(3 * HEARTBEAT)
    assert len(watch.events) == stopped_at


async def test_a_reporter_waiting_for_nats_stops_when_told() -> None:
    """NATS is not up yet (nobody listens on the port): stopping still stops at once."""
    argv = ["--nats", f"nats://127.0.0.1:{free_port()}", "--node", "gpu-a=1000"]
    settings = parse_settings(argv, {})
    backends = open_backends(settings)
    stopping = asyncio.Event()
    serving = asyncio.create_task(serve(settings, backends, stopping))
    await asyncio.sleep(0.3)  # let it try, and fail, to connect a few times
    stopping.set()
    assert await serving == 0
