"""``gpushare node-agent``: the kubelet device plugin for one node (or several simulated).

Settings come from flags, falling back to the environment: ``--nats``
(``GPUSHARE_NATS_URL``), ``--memory-unit`` (``GPUSHARE_MEMORY_UNIT``), ``--node
NAME[=PLUGIN_DIR]`` (repeatable; default ``NODE_NAME`` with the kubelet's directory),
``--pod-resources-socket [NAME=]PATH`` (default ``<plugin dir>/../pod-resources/kubelet.sock``),
``--dialect NAME`` (repeatable, or ``GPUSHARE_DIALECTS=aliyun,gpushare``): which resource
names to advertise, one plugin socket each (``aliyun``, ``gpushare``, ``koordinator``,
``vke``, ``nvidia``; default ``aliyun`` and ``gpushare``).
SIGTERM and SIGINT stop it cleanly: sockets are removed and the NATS connection drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Mapping, Sequence

import uvloop

from gpushare.bus.connection import connect
from gpushare.bus.lag import LogLag
from gpushare.bus.nats_types import Client, JetStreamContext, NatsError, NotFoundError
from gpushare.bus.subjects import ALLOCATION_STREAM, INVENTORY_STREAM
from gpushare.collector import settle
from gpushare.exposition import MetricsServer, serve_metrics
from gpushare.logs import setup_logging
from gpushare.node_agent.agent import NodeAgent
from gpushare.node_agent.doorbell import pause
from gpushare.node_agent.settings import AgentSettings, NodeTarget
from gpushare.node_agent.sockets import socket_problems
from gpushare.settings_spec import SettingsError, read_settings, run_service
from gpushare.tasks import unless_stopped
from gpushare.telemetry.tracing import configure_tracing

log = logging.getLogger(__name__)

PROG = "gpushare node-agent"
STREAM_WAIT_SECONDS = 1.0


def parse_settings(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> AgentSettings:
    """Flags, then the environment; raises ``SystemExit`` (argparse) or ``SettingsError``."""
    settings = read_settings(AgentSettings, argv, environ, prog=PROG, description=__doc__ or "")
    too_long = socket_problems(settings.targets, settings.resources)
    if too_long:
        raise SettingsError("; ".join(too_long))
    return settings


async def wait_for_streams(js: JetStreamContext, stop: asyncio.Event) -> bool:
    """The streams are created by whoever deploys gpushare; wait rather than guess replicas."""
    while not stop.is_set():
        try:
            for stream in (INVENTORY_STREAM, ALLOCATION_STREAM):
                await js.stream_info(stream)
            return True
        except NotFoundError:
            log.info("waiting for the JetStream streams to be created")
        except Exception as error:
            log.warning("waiting for JetStream: %s", error)
        await pause(stop, STREAM_WAIT_SECONDS)
    return False


async def serve(
    settings: AgentSettings, targets: Sequence[NodeTarget], stop: asyncio.Event
) -> None:
    nc = await connect(settings.nats_url, name="gpushare-node-agent")
    agents: list[NodeAgent] = []
    server: MetricsServer | None = None
    try:
        js = nc.jetstream()
        if not await wait_for_streams(js, stop):
            return
        for target in targets:
            agent = NodeAgent(js, target, settings, nc)
            agents.append(agent)  # stopping one that never started is harmless
            await unless_stopped(agent.start(), stop)  # it waits for a busy bus
            if stop.is_set():
                return
        if settings.metrics_port:
            server = await serve_agent_metrics(js, agents, settings.metrics_port)
        await stop.wait()
    finally:
        if server is not None:
            await server.stop()
        for agent in agents:
            await agent.stop()
        await drain(nc)


async def drain(nc: Client) -> None:
    """Drain the NATS connection; when the bus is gone already (nats-server stopped
    first), say so in one line instead of a traceback: nothing is left to flush."""
    if nc.is_closed:
        return
    try:
        await nc.drain()
    except (NatsError, OSError, TimeoutError) as error:
        log.info("NATS is gone at shutdown (%s): closing without draining", type(error).__name__)
        with contextlib.suppress(Exception):
            await nc.close()


async def serve_agent_metrics(
    js: JetStreamContext, agents: Sequence[NodeAgent], port: int
) -> MetricsServer:
    """``/metrics`` on ``port`` (0: any free one): the process-wide registry and each
    node's log lag."""
    lag = LogLag("node_agent", [agent.view.follower for agent in agents], js)
    return await serve_metrics(port, [lag], [lag.refresh])


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)


async def _main(settings: AgentSettings, targets: Sequence[NodeTarget]) -> None:
    stop = asyncio.Event()
    _install_signal_handlers(stop)
    await serve(settings, targets, stop)


def start(settings: AgentSettings) -> int:
    setup_logging("node-agent")
    configure_tracing("gpushare-node-agent")
    settle("node agent")
    uvloop.run(_main(settings, settings.targets))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_service(parse_settings, argv, prog=PROG, start=start)


if __name__ == "__main__":
    sys.exit(main())
