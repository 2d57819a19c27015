"""What NVML returned for one node, as a value: the fixture format, and its reading as cards.

The NVML backend turns every query into a :class:`RecordedDevice` before it becomes a
:class:`~gpushare.core.model.Card`, the capture tool writes the same records to a file, and
the fixture backend reads them back. So a fixture replays through exactly the conversion a
live node goes through (bytes to MiB, failed queries to unhealthy cards).

File format (JSON, ``format_version`` 1)::

    {
      "format_version": 1,
      "captured_at": "2026-03-02T10:15:00Z",      # optional
      "hostname": "gpu-h100-07",                  # optional, informational
      "driver_version": "550.90.07",
      "nvml_version": "12.550.90.07",             # optional
      "devices": [
        {"index": 0, "uuid": "GPU-…", "name": "NVIDIA H100 80GB HBM3",
         "memory_total_bytes": 85520809984},
        {"index": 1, "error": "GPU is lost"}      # a query failed: reported unhealthy
      ]
    }

Unknown fields are ignored, so later captures may record more.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import msgspec

from gpushare.core.model import Card

FORMAT_VERSION = 1
MIB = 2**20


class RecordedDevice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One device's answers; ``None`` where NVML could not say."""

    index: int
    uuid: str | None = None
    name: str | None = None
    memory_total_bytes: int | None = None
    """``nvmlDeviceGetMemoryInfo(handle).total``: bytes, as NVML reports them."""
    error: str = ""
    """What NVML said when a query for this device failed (e.g. ``GPU is lost``)."""


class NvmlRecording(msgspec.Struct, frozen=True, kw_only=True):
    """One node's NVML answers at one moment."""

    format_version: int = FORMAT_VERSION
    captured_at: datetime | None = None
    hostname: str = ""
    """The machine it was captured on; informational (a replay names its own node)."""
    driver_version: str = ""
    nvml_version: str = ""
    devices: tuple[RecordedDevice, ...] = ()


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
    """The recording as indented JSON, ready to commit as a fixture."""
    return msgspec.json.format(msgspec.json.encode(recording), indent=2) + b"\n"


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
