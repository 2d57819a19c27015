"""What NVML returned for one node, as a value: the fixture format, and its reading as cards.

The NVML backend turns every query into a :class:`RecordedDevice` before it becomes a
:class:`~gpushare.core.model.Card`, the capture tool writes the same records to a file, and
the fixture backend reads them back. So a fixture replays through exactly the conversion a
live node goes through (bytes to MiB, failed queries to unhealthy cards).

File format (JSON, ``format_version`` 1)::

    {
      "format_version": 1,
      "note": "",                                 # optional: how the file was made
      "captured_at": "2026-03-02T10:15:00Z",      # optional
      "hostname": "gpu-h100-07",                  # optional, informational
      "driver_version": "550.90.07",
      "nvml_version": "12.550.90.07",             # optional
      "devices": [
        {"index": 0, "uuid": "GPU-…", "name": "NVIDIA H100 80GB HBM3",
         "memory_total_bytes": 85520809984,
         "pci_bus_id": "00000000:18:00.0",        # optional, with compute_mode and nvlinks
         "compute_mode": 0,
         "nvlinks": [{"link": 0, "remote_pci_bus_id": "00000000:2A:00.0",
                      "remote_device_type": 0}]},
        {"index": 1, "error": "GPU is lost"}      # a query failed: reported unhealthy
      ],
      "topology": [{"a": 0, "b": 1, "level": 10}], # optional: PCIe common ancestors
      "mps_control_pipe": false                   # optional: MPS daemon seen at capture
    }

Unknown fields are ignored, so later captures may record more; fields added later have
defaults, so older recordings still load (without topology: no links, no MPS evidence).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import msgspec

from gpushare.core.model import Card

FORMAT_VERSION = 1
MIB = 2**20


class RecordedNvLink(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One *active* NVLink of a device, and what is at its other end."""

    link: int
    """The link's number on its device, ``0 .. NVML_NVLINK_MAX_LINKS - 1``."""
    remote_pci_bus_id: str
    """``nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId``: a GPU's or an NVSwitch's."""
    remote_device_type: int | None = None
    """``nvmlDeviceGetNvLinkRemoteDeviceType``: 0 GPU, 1 IBM NPU, 2 NVSwitch, 255 unknown;
    ``None`` where NVML could not say (older drivers)."""


class RecordedDevice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One device's answers; ``None`` where NVML could not say."""

    index: int
    uuid: str | None = None
    name: str | None = None
    memory_total_bytes: int | None = None
    """``nvmlDeviceGetMemoryInfo(handle).total``: bytes, as NVML reports them."""
    pci_bus_id: str | None = None
    """``nvmlDeviceGetPciInfo(handle).busId``, e.g. ``00000000:18:00.0``: how NVLink peers
    name this device."""
    compute_mode: int | None = None
    """``nvmlDeviceGetComputeMode``: 0 default, 2 prohibited, 3 exclusive process (the usual
    setting under MPS)."""
    nvlinks: tuple[RecordedNvLink, ...] = ()
    """The device's active NVLinks; none on a PCIe-only card."""
    error: str = ""
    """What NVML said when a query for this device failed (e.g. ``GPU is lost``). Topology
    and compute mode queries never set it: a card without them is still a good card."""


class RecordedPath(msgspec.Struct, frozen=True, kw_only=True):
    """``nvmlDeviceGetTopologyCommonAncestor(a, b)``: where the PCIe tree joins two devices."""

    a: int
    """Index of one device."""
    b: int
    """Index of the other (``a < b``)."""
    level: int
    """``NVML_TOPOLOGY_*``: 0 internal (one board), 10 one PCIe switch, 20 several switches,
    30 a host bridge, 40 the NUMA node's interconnect, 50 across sockets."""


class NvmlRecording(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One node's NVML answers at one moment. Empty fields stay out of the file, so a
    recording without topology reads as it did before topology was recorded."""

    format_version: int = FORMAT_VERSION
    note: str = ""
    """How the recording was made, when not simply captured (e.g. built by hand)."""
    captured_at: datetime | None = None
    hostname: str = ""
    """The machine it was captured on; informational (a replay names its own node)."""
    driver_version: str = ""
    nvml_version: str = ""
    devices: tuple[RecordedDevice, ...] = ()
    topology: tuple[RecordedPath, ...] = ()
    """The PCIe common ancestor of each pair of devices NVML could place; empty when not
    recorded."""
    mps_control_pipe: bool | None = None
    """Whether an MPS control daemon's ``control`` pipe was in the MPS pipe directory at
    capture; ``None`` when nobody looked."""


class RecordingError(ValueError):
    """A fixture file that cannot be read or is not a recording; the message says which."""


def placeholder_uuid(index: int) -> str:
    """A stand-in key for a card whose UUID NVML would not give; never looks like a real one."""
    return f"unknown-gpu-{index}"


def card_from_record(device: RecordedDevice, previous: Card | None = None) -> Card:
    """The card ``device`` describes. A failed query yields an unhealthy card that keeps what
    ``previous`` (the same index's last good reading) knew, so its UUID does not change."""
    if device.uuid and device.name is not None and device.memory_total_bytes is not None:
        card = Card(
            index=device.index,
            uuid=device.uuid,
            model=device.name,
            memory_mib=device.memory_total_bytes // MIB,
        )
        if not device.error:
            return card
        return msgspec.structs.replace(card, healthy=False, health_reason=device.error)
    reason = device.error or "NVML gave no UUID, name or memory size for this card"
    return Card(
        index=device.index,
        uuid=device.uuid or (previous.uuid if previous else placeholder_uuid(device.index)),
        model=device.name or (previous.model if previous else ""),
        memory_mib=previous.memory_mib if previous else 0,
        healthy=False,
        health_reason=reason,
    )


def encode_recording(recording: NvmlRecording) -> bytes:
    """The recording as indented JSON, ready to commit as a fixture; ``format_version``
    always comes first, even though it has its default."""
    fields = msgspec.to_builtins(recording)
    data = {"format_version": recording.format_version, **fields}
    return msgspec.json.format(msgspec.json.encode(data), indent=2) + b"\n"


def decode_recording(data: bytes, origin: str = "fixture") -> NvmlRecording:
    try:
        recording = msgspec.json.decode(data, type=NvmlRecording)
    except msgspec.DecodeError as error:
        raise RecordingError(f"{origin}: not an NVML recording: {error}") from None
    if recording.format_version != FORMAT_VERSION:
        raise RecordingError(
            f"{origin}: format_version {recording.format_version} is not {FORMAT_VERSION}"
        )
    indices = [device.index for device in recording.devices]
    if len(set(indices)) != len(indices) or any(index < 0 for index in indices):
        raise RecordingError(f"{origin}: device indices must be distinct and >= 0: {indices}")
    return recording


def load_recording(path: Path) -> NvmlRecording:
    """Read a fixture file; any problem is a :class:`RecordingError` naming the file."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RecordingError(f"{path}: cannot read: {error.strerror or error}") from None
    return decode_recording(data, origin=str(path))
