"""The command-line flags every service shares, read from the environment alike."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from gpushare.core.requests import MEMORY_UNITS_MIB

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def add_nats_flag(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    parser.add_argument(
        "--nats",
        default=environ.get("GPUSHARE_NATS_URL", DEFAULT_NATS_URL),
        help="NATS URL(s), comma-separated (env GPUSHARE_NATS_URL; default %(default)s)",
    )


def add_stream_replicas_flag(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """How many JetStream servers keep each stream (the service creating them sets it)."""
    parser.add_argument(
        "--stream-replicas",
        type=int,
        choices=range(1, 6),
        metavar="1-5",
        default=int(environ.get("GPUSHARE_STREAM_REPLICAS", "1")),
        help="JetStream replicas of gpushare's streams and snapshot bucket: 3 on a 3-server "
        "NATS cluster (env GPUSHARE_STREAM_REPLICAS; default %(default)s)",
    )


def add_memory_unit_flag(
    parser: argparse.ArgumentParser,
    environ: Mapping[str, str],
    purpose: str = "unit of aliyun.com/gpu-mem",
) -> None:
    """Cluster-wide: pod requests, node capacity and device IDs all count in this unit."""
    parser.add_argument(
        "--memory-unit",
        choices=sorted(MEMORY_UNITS_MIB),
        default=environ.get("GPUSHARE_MEMORY_UNIT", "MiB"),
        help=f"{purpose} (env GPUSHARE_MEMORY_UNIT; default %(default)s)",
    )
