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
