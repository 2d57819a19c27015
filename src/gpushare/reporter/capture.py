"""Record what NVML says about this machine's GPUs, as a fixture for the reporter.

    python -m gpushare.reporter.capture > tests/fixtures/nvml/my-node.json

Run it on a GPU machine (no root needed); replay the file anywhere with
``gpushare reporter --fixture my-node.json --node-name my-node``. A device whose queries
fail is recorded with NVML's error, so broken cards can be captured too. The topology
(PCI addresses, active NVLinks, PCIe common ancestors), compute modes and whether an MPS
control daemon's pipe exists are recorded as well; run it where that pipe is visible
(``--mps-pipe-directory``) for the last to mean anything.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
from datetime import datetime
from pathlib import Path

import msgspec

from gpushare.clock import SYSTEM_CLOCK
from gpushare.core.ports import Clock
from gpushare.reporter.mps import DEFAULT_MPS_PIPE_DIRECTORY, find_control_pipe
from gpushare.reporter.nvml import (
    NvmlLibrary,
    NvmlUnavailable,
    as_text,
    load_nvml,
    query_compute_mode,
    query_device,
    query_driver_version,
    query_topology,
    summarize_problems,
)
from gpushare.reporter.recording import NvmlRecording, RecordedDevice, encode_recording


def record_node(
    nvml: NvmlLibrary,
    hostname: str,
    captured_at: datetime,
    mps_control_pipe: bool | None = None,
) -> NvmlRecording:
    """Every device's answers from an initialised NVML."""
    try:
        nvml_version = as_text(nvml.nvmlSystemGetNVMLVersion())
    except nvml.NVMLError:
        nvml_version = ""
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML could not count the GPUs: {error}") from None
    topology = query_topology(nvml, range(count))
    if topology.problems:
        print(
            f"capture: topology left out: {summarize_problems(topology.problems)}", file=sys.stderr
        )
    placed = {device.index: device for device in topology.devices}
    return NvmlRecording(
        driver_version=query_driver_version(nvml),
        nvml_version=nvml_version,
        captured_at=captured_at,
        hostname=hostname,
        devices=tuple(
            with_topology(nvml, query_device(nvml, index), placed.get(index))
            for index in range(count)
        ),
        topology=topology.paths,
        mps_control_pipe=mps_control_pipe,
    )


def with_topology(
    nvml: NvmlLibrary, device: RecordedDevice, placed: RecordedDevice | None
) -> RecordedDevice:
    """``device`` with its compute mode, PCI address and NVLinks, as far as NVML told them."""
    return msgspec.structs.replace(
        device,
        compute_mode=query_compute_mode(nvml, device.index),
        pci_bus_id=placed.pci_bus_id if placed else None,
        nvlinks=placed.nvlinks if placed else (),
    )


def capture(
    nvml: NvmlLibrary,
    hostname: str,
    mps_pipe_directory: Path = DEFAULT_MPS_PIPE_DIRECTORY,
    clock: Clock = SYSTEM_CLOCK,
) -> bytes:
    """Initialise NVML, record, shut down; the fixture file's bytes."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML could not initialise: {error}") from None
    try:
        mps_control_pipe = find_control_pipe(mps_pipe_directory)
        return encode_recording(
            record_node(nvml, hostname, clock.now(), mps_control_pipe=mps_control_pipe)
        )
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
    parser.add_argument(
        "--mps-pipe-directory",
        type=Path,
        default=Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIRECTORY),
        metavar="DIR",
        help="where an MPS control daemon's pipe would be "
        "(env CUDA_MPS_PIPE_DIRECTORY, default %(default)s)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, nvml: NvmlLibrary | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        library = nvml if nvml is not None else load_nvml()
        data = capture(library, args.hostname, args.mps_pipe_directory)
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
