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

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from gpushare.bus.connection import connect
from gpushare.bus.lag import LogLag
from gpushare.bus.subjects import ALLOCATION_STREAM, INVENTORY_STREAM
from gpushare.core.requests import MEMORY_UNITS_MIB
from gpushare.exposition import MetricsServer, serve_metrics
from gpushare.flags import add_memory_unit_flag, add_nats_flag
from gpushare.logs import setup_logging
from gpushare.node_agent.agent import NodeAgent
from gpushare.node_agent.resources import DEFAULT_DIALECTS, DIALECTS, resources_of
from gpushare.node_agent.settings import DEVICE_PLUGIN_PATH, AgentSettings, NodeTarget
from gpushare.telemetry.tracing import configure_tracing

log = logging.getLogger(__name__)

STREAM_WAIT_SECONDS = 1.0


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(prog="gpushare node-agent", description=__doc__)
    add_nats_flag(parser, env)
    parser.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME[=PLUGIN_DIR]",
        help=f"a node to serve (repeatable); default $NODE_NAME with {DEVICE_PLUGIN_PATH}",
    )
    add_memory_unit_flag(parser, env, "one device ID per this much memory; cluster-wide")
    parser.add_argument(
        "--pod-resources-socket",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="the kubelet's pod-resources socket (for all nodes, or NAME's)",
    )
    parser.add_argument(
        "--dialect",
        action="append",
        default=[],
        metavar="NAME",
        help=(
            f"advertise this dialect's resources (repeatable; one of {', '.join(DIALECTS)}; "
            f"env GPUSHARE_DIALECTS, comma-separated; default {','.join(DEFAULT_DIALECTS)})"
        ),
    )
    parser.add_argument(
        "--reconcile-interval",
        type=float,
        default=AgentSettings.reconcile_interval_seconds,
        help="seconds between pod-resources checks; 0 checks only after Allocate",
    )
    parser.add_argument(
        "--match-wait",
        type=float,
        default=AgentSettings.match_wait_seconds,
        help="seconds Allocate waits for the log to show the pod before refusing",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(env.get("GPUSHARE_METRICS_PORT", "0")),
        help="serve Prometheus metrics on this port (0: off)",
    )
    return parser


def parse_dialects(flags: Sequence[str]) -> tuple[str, ...]:
    """The resources to advertise for ``--dialect`` flags (or ``$GPUSHARE_DIALECTS``)."""
    names = list(flags) or [
        part.strip() for part in os.environ.get("GPUSHARE_DIALECTS", "").split(",")
    ]
    names = [name for name in names if name] or list(DEFAULT_DIALECTS)
    return resources_of(names)


def parse_targets(nodes: Sequence[str], sockets: Sequence[str]) -> list[NodeTarget]:
    """``NAME[=DIR]`` flags (or ``$NODE_NAME``) into targets; raises ``ValueError``."""
    specs = list(nodes) or ([os.environ["NODE_NAME"]] if os.environ.get("NODE_NAME") else [])
    if not specs:
        raise ValueError("no node to serve: pass --node NAME[=PLUGIN_DIR] or set NODE_NAME")
    pairs = [spec.partition("=") for spec in specs]
    names = {name for name, _, _ in pairs}
    if "" in names or len(names) != len(pairs):
        raise ValueError(f"--node names must be non-empty and unique: {specs}")
    shared: Path | None = None
    per_node: dict[str, Path] = {}
    for value in sockets:
        name, sep, path = value.partition("=")
        if sep and name in names:
            per_node[name] = Path(path)
        else:
            shared = Path(value)
    return [
        NodeTarget(
            name=name,
            plugin_dir=Path(directory) if directory else DEVICE_PLUGIN_PATH,
            pod_resources_socket=per_node.get(name, shared),
        )
        for name, _, directory in pairs
    ]


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
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), STREAM_WAIT_SECONDS)
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
            await agent.start()
            agents.append(agent)
        if settings.metrics_port:
            server = await serve_agent_metrics(js, agents, settings.metrics_port)
        await stop.wait()
    finally:
        if server is not None:
            await server.stop()
        for agent in agents:
            await agent.stop()
        await nc.drain()


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        targets = parse_targets(args.node, args.pod_resources_socket)
        resources = parse_dialects(args.dialect)
        if args.memory_unit not in MEMORY_UNITS_MIB:
            raise ValueError(f"memory unit must be MiB or GiB, not {args.memory_unit!r}")
    except ValueError as error:
        print(f"gpushare node-agent: {error}", file=sys.stderr)
        return 2
    setup_logging("node-agent")
    configure_tracing("gpushare-node-agent")
    settings = AgentSettings(
        nats_url=args.nats,
        memory_unit=args.memory_unit,
        resources=resources,
        reconcile_interval_seconds=args.reconcile_interval,
        match_wait_seconds=args.match_wait,
        metrics_port=args.metrics_port,
    )
    asyncio.run(_main(settings, targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
