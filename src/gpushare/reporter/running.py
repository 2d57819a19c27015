"""Running the reporter process: choose the backends, connect, report until told to stop.

One process may report several nodes (``--node`` repeated): each gets its own
:class:`~gpushare.reporter.publishing.NodeReporter` task, and its own worker thread for
the blocking backend calls, so a slow node never delays another's heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from gpushare.bus.connection import connect
from gpushare.bus.log import publish_inventory
from gpushare.bus.nats_types import Client, JetStreamContext
from gpushare.bus.streams import ensure_streams
from gpushare.core.ports import Clock
from gpushare.exposition import MetricsServer, serve_metrics
from gpushare.redaction import redact_text
from gpushare.reporter.backends import GpuBackend
from gpushare.reporter.fixture import FixtureBackend
from gpushare.reporter.koordinator import KoordinatorDeviceBackend
from gpushare.reporter.nvml import NvmlBackend, NvmlLibrary, NvmlUnavailable
from gpushare.reporter.publishing import PUBLISH_ERRORS, NodeReporter
from gpushare.reporter.settings import KOORDINATOR_DEVICE, ReporterSettings
from gpushare.reporter.simulated import SimulatedBackend
from gpushare.tasks import unless_stopped

log = logging.getLogger(__name__)

CONNECT_RETRY_SECONDS = 2.0


def open_backends(
    settings: ReporterSettings, nvml: NvmlLibrary | None = None
) -> dict[str, GpuBackend]:
    """A backend per node, by node name. Raises :class:`NvmlUnavailable` when this machine's
    GPUs are wanted, NVML does not work, and ``simulate_if_no_gpu`` is off; and
    :class:`~gpushare.reporter.recording.RecordingError` for an unreadable fixture."""
    backends: dict[str, GpuBackend] = {
        node.name: simulated_backend(settings, node.name, node.cards_mib)
        for node in settings.simulated_nodes
    }
    if settings.fixture is not None:
        backends[settings.node_name] = FixtureBackend.from_file(settings.fixture, mps=settings.mps)
    if settings.uses_nvml:
        backends[settings.node_name] = open_nvml_or_simulate(settings, nvml)
    if settings.source == KOORDINATOR_DEVICE:
        backends[settings.node_name] = KoordinatorDeviceBackend.connect(
            settings.node_name, settings.kubeconfig, refresh_seconds=settings.heartbeat_seconds
        )
    return backends


def simulated_backend(
    settings: ReporterSettings, node: str, cards_mib: tuple[int, ...]
) -> SimulatedBackend:
    return SimulatedBackend(node, cards_mib, topology=settings.simulated_topology, mps=settings.mps)


def open_nvml_or_simulate(settings: ReporterSettings, nvml: NvmlLibrary | None) -> GpuBackend:
    try:
        return NvmlBackend.open(
            nvml, mps=settings.mps, mps_pipe_directory=settings.mps_pipe_directory
        )
    except NvmlUnavailable as error:
        if not settings.simulate_if_no_gpu:
            raise
        log.warning(
            "%s; --simulate-if-no-gpu: reporting simulated cards %s MiB instead",
            error,
            ",".join(str(size) for size in settings.simulated_cards_mib),
        )
        return simulated_backend(settings, settings.node_name, settings.simulated_cards_mib)


def build_reporters(
    settings: ReporterSettings,
    backends: Mapping[str, GpuBackend],
    js: JetStreamContext,
    clock: Clock | None = None,
) -> list[NodeReporter]:
    publish = partial(publish_inventory, js)
    return [
        NodeReporter(
            node,
            backend,
            publish,
            clock=clock,
            heartbeat_seconds=settings.heartbeat_seconds,
            poll_seconds=min(settings.poll_seconds, settings.heartbeat_seconds),
            front_door=settings.front_door,
        )
        for node, backend in backends.items()
    ]


async def run_reporters(reporters: list[NodeReporter], stopping: asyncio.Event) -> None:
    """One task per node until ``stopping`` is set."""
    async with asyncio.TaskGroup() as group:
        for reporter in reporters:
            group.create_task(reporter.run(stopping), name=f"reporter {reporter.node}")


async def connect_until_stopped(url: str, stopping: asyncio.Event) -> Client | None:
    """Connect and make sure the streams exist, waiting while NATS is not ready (a DaemonSet
    may well start before it). ``None`` if told to stop first."""
    while not stopping.is_set():
        try:
            client = await unless_stopped(connect(url, name="gpushare-reporter"), stopping)
        except PUBLISH_ERRORS as error:
            shown = redact_text(url)
            log.warning("cannot connect to NATS at %s (%s); retrying", shown, error)
        else:
            if client is None:
                return None
            if await streams_ready(client):
                return client
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), CONNECT_RETRY_SECONDS)
    return None


async def streams_ready(client: Client) -> bool:
    """Create or update the streams; on failure (JetStream off, say) close and say so."""
    try:
        await ensure_streams(client.jetstream())
    except PUBLISH_ERRORS as error:
        log.warning("cannot set up the JetStream streams (%s); retrying", error)
        await client.close()
        return False
    return True


@contextlib.contextmanager
def stop_on_signals(stopping: asyncio.Event) -> Iterator[None]:
    """SIGTERM (kubelet) and SIGINT (a terminal) set ``stopping`` while inside."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for signum in signals:
        loop.add_signal_handler(signum, stopping.set)
    try:
        yield
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


async def serve(
    settings: ReporterSettings,
    backends: Mapping[str, GpuBackend],
    stopping: asyncio.Event | None = None,
) -> int:
    """The whole process after start-up; stops cleanly on SIGTERM or SIGINT."""
    stopping = stopping or asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_default_executor(
        ThreadPoolExecutor(max_workers=len(backends) + 2, thread_name_prefix="reporter")
    )
    server: MetricsServer | None = None
    try:
        if settings.metrics_port is not None:
            server = await serve_metrics(settings.metrics_port)
        with stop_on_signals(stopping):
            client = await connect_until_stopped(settings.nats_url, stopping)
            if client is None:
                return 0
            try:
                reporters = build_reporters(settings, backends, client.jetstream())
                await run_reporters(reporters, stopping)
            finally:
                await client.close()
    finally:
        if server is not None:
            await server.stop()
        for backend in backends.values():
            await asyncio.to_thread(backend.close)
    return 0
