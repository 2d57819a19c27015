"""``gpushare reporter``: publish each node's GPU inventory to NATS, with a heartbeat.

    gpushare reporter --node-name "$NODE_NAME"                 # this machine, via NVML
    gpushare reporter --node gpu-a=16276,16276 --node gpu-b=16276,16276,32510
    gpushare reporter --node gpu-c=81559,81559,81559,81559 --topology nvlink-pairs --mps on
    gpushare reporter --fixture h100x8.json --node-name gpu-h100-1

Exit codes: 0 after a clean stop (SIGTERM, SIGINT), 1 when NVML or a fixture cannot be
used, 2 for flags that make no sense.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from gpushare.flags import add_nats_flag
from gpushare.logs import setup_logging
from gpushare.reporter.mps import DEFAULT_MPS_MODE, DEFAULT_MPS_PIPE_DIRECTORY, MPS_MODES
from gpushare.reporter.nvml import NvmlUnavailable
from gpushare.reporter.recording import RecordingError
from gpushare.reporter.running import open_backends, serve
from gpushare.reporter.settings import (
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_SIMULATED_CARDS_MIB,
    ReporterSettings,
    SettingsError,
    check_settings,
    parse_cards_mib,
    parse_heartbeat,
    parse_mps_mode,
    parse_nats_url,
    parse_simulated_node,
    parse_topology,
)
from gpushare.reporter.simulated import SIMULATED_TOPOLOGIES
from gpushare.telemetry.tracing import configure_tracing

T = TypeVar("T")


def flag_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` for argparse: its own message, not argparse's "invalid value"."""

    def parse_flag(text: str) -> T:
        try:
            return parse(text)
        except SettingsError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse_flag.__name__ = parse.__name__
    return parse_flag


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare reporter",
        description="Publish each node's GPU inventory (NVML, simulated or a fixture) to NATS.",
    )
    add_nats_flag(parser, environ)
    parser.add_argument(
        "--heartbeat",
        type=flag_type(parse_heartbeat),
        default=DEFAULT_HEARTBEAT_SECONDS,
        metavar="SECONDS",
        help="republish at least this often (default %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(environ.get("GPUSHARE_METRICS_PORT", "0")),
        help="serve Prometheus /metrics on this port (env GPUSHARE_METRICS_PORT; 0: off)",
    )
    add_source_flags(parser.add_argument_group("which cards"), environ)
    add_sharing_flags(parser.add_argument_group("how the cards are joined and shared"), environ)
    return parser


def add_source_flags(group: argparse._ArgumentGroup, environ: Mapping[str, str]) -> None:
    """Simulated nodes, or this machine (NVML, or a fixture in its place)."""
    group.add_argument(
        "--node",
        action="append",
        default=[],
        type=flag_type(parse_simulated_node),
        metavar="NAME=MIB[,MIB...]",
        help="a simulated node and its cards' memory in MiB; repeat for more nodes",
    )
    group.add_argument(
        "--node-name",
        default=environ.get("NODE_NAME", ""),
        help="this machine's Kubernetes node name, for NVML or --fixture (env NODE_NAME)",
    )
    group.add_argument("--fixture", type=Path, help="replay this NVML recording instead of NVML")
    group.add_argument(
        "--simulate-if-no-gpu",
        action="store_true",
        help="if NVML cannot start, report --simulated-cards instead of failing",
    )
    group.add_argument(
        "--simulated-cards",
        type=flag_type(parse_cards_mib),
        default=DEFAULT_SIMULATED_CARDS_MIB,
        metavar="MIB[,MIB...]",
        help="the cards --simulate-if-no-gpu reports (default 16276)",
    )


def add_sharing_flags(group: argparse._ArgumentGroup, environ: Mapping[str, str]) -> None:
    """Simulated topology, and MPS."""
    group.add_argument(
        "--topology",
        type=flag_type(parse_topology),
        default="none",
        metavar="|".join(SIMULATED_TOPOLOGIES),
        help="how simulated cards are joined: nvlink-pairs (cards 2k, 2k+1 NV4, others SYS), "
        "nvswitch (all NV18), pcie (all PHB), none (unknown; the default)",
    )
    group.add_argument(
        "--mps",
        type=flag_type(parse_mps_mode),
        default=environ.get("GPUSHARE_MPS", DEFAULT_MPS_MODE),
        metavar="|".join(MPS_MODES),
        help="whether an MPS daemon serves the cards; auto looks for its control pipe, or "
        "every card in EXCLUSIVE_PROCESS compute mode (env GPUSHARE_MPS, default auto)",
    )
    group.add_argument(
        "--mps-pipe-directory",
        type=Path,
        default=Path(environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIRECTORY),
        metavar="DIR",
        help="where --mps auto looks for the daemon's control pipe "
        "(env CUDA_MPS_PIPE_DIRECTORY, default %(default)s)",
    )


def parse_settings(argv: list[str] | None, environ: Mapping[str, str]) -> ReporterSettings:
    """Flags first, then the environment; raises ``SystemExit`` (argparse) or SettingsError."""
    args = build_parser(environ).parse_args(argv)
    return check_settings(
        ReporterSettings(
            nats_url=parse_nats_url(args.nats),
            simulated_nodes=tuple(args.node),
            node_name=args.node_name.strip(),
            fixture=args.fixture,
            heartbeat_seconds=args.heartbeat,
            simulate_if_no_gpu=args.simulate_if_no_gpu,
            simulated_cards_mib=args.simulated_cards,
            simulated_topology=args.topology,
            mps=args.mps,
            mps_pipe_directory=args.mps_pipe_directory,
            metrics_port=args.metrics_port or None,
        )
    )


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_settings(argv, os.environ)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    except SettingsError as error:
        print(f"gpushare reporter: {error}", file=sys.stderr)
        return 2
    setup_logging("reporter")
    configure_tracing("gpushare-reporter")
    try:
        backends = open_backends(settings)
    except NvmlUnavailable as error:
        print(
            f"gpushare reporter: {error}. Is the NVIDIA driver loaded and the GPU visible to "
            "this container? Use --simulate-if-no-gpu to report simulated cards instead.",
            file=sys.stderr,
        )
        return 1
    except RecordingError as error:
        print(f"gpushare reporter: {error}", file=sys.stderr)
        return 1
    return asyncio.run(serve(settings, backends))


if __name__ == "__main__":
    sys.exit(main())
