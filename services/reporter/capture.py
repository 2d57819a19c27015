"""Record what NVML says about this machine's GPUs, as a fixture for the reporter.

    python -m gpushare.reporter.capture > tests/fixtures/nvml/my-node.json

Run it on a GPU machine (no root needed); replay the file anywhere with
``gpushare reporter --fixture my-node.json --node-name my-node``. A device whose queries
fail is recorded with NVML's error, so broken cards can be captured too.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path

from gpushare.reporter.nvml import (
    NvmlLibrary,
    NvmlUnavailable,
    as_text,
    load_nvml,
    query_device,
    query_driver_version,
)
from gpushare.reporter.recording import NvmlRecording, encode_recording


def record_node(nvml: NvmlLibrary, hostname: str, captured_at: datetime) -> NvmlRecording:
    """Every device's answers from an initialised NVML."""
    try:
        nvml_version = as_text(nvml.nvmlSystemGetNVMLVersion())
    except nvml.NVMLError:
        nvml_version = ""
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML could not count the GPUs: {error}") from None
    return NvmlRecording(
        driver_version=query_driver_version(nvml),
        nvml_version=nvml_version,
        captured_at=captured_at,
        hostname=hostname,
        devices=tuple(query_device(nvml, index) for index in range(count)),
    )


def capture(nvml: NvmlLibrary, hostname: str) -> bytes:
    """Initialise NVML, record, shut down; the fixture file's bytes."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML could not initialise: {error}") from None
    try:
        return encode_recording(record_node(nvml, hostname, datetime.now(UTC)))
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gpushare.reporter.capture",
        description="Write what NVML reports about this machine's GPUs as a reporter fixture.",
    )
    parser.add_argument("--output", "-o", type=Path, help="file to write (default: stdout)")
    parser.add_argument(
        "--hostname",
        default=socket.gethostname(),
        help="recorded for reference only (default: this host's name)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, nvml: NvmlLibrary | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        data = capture(nvml if nvml is not None else load_nvml(), args.hostname)
    except NvmlUnavailable as error:
        print(f"capture: {error}", file=sys.stderr)
        return 1
    if args.output is None:
        sys.stdout.write(data.decode())
        sys.stdout.flush()
        return 0
    try:
        args.output.write_bytes(data)
    except OSError as error:
        print(f"capture: cannot write {args.output}: {error.strerror or error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
