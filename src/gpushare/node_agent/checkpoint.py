"""Reading the kubelet's device checkpoint, where pod-resources is unavailable.

The kubelet's device manager keeps every device it handed out in
``<device-plugins dir>/kubelet_internal_checkpoint`` (what seed 002's Koordinator reads
for the same purpose)::

    {"Data": {"PodDeviceEntries": [{"PodUID": "…", "ContainerName": "…",
                                    "ResourceName": "nvidia.com/gpu",
                                    "DeviceIDs": {"0": ["GPU-…"]}, "AllocResp": "…"}],
              "RegisteredDevices": {"nvidia.com/gpu": ["GPU-…"]}},
     "Checksum": 1234}

``DeviceIDs`` maps NUMA node → IDs since Kubernetes 1.20, and was a plain list before;
both are read. The checksum is the kubelet's own business and is not checked: a file
caught half-written fails to decode and is simply read again on the next check. The
entries name pods by UID only. Parsing is pure; :func:`read_checkpoint` reads the file.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from pathlib import Path

import msgspec

from gpushare.node_agent.foreign import ForeignDevices

log = logging.getLogger(__name__)


class _Entry(msgspec.Struct, frozen=True):
    pod_uid: str = msgspec.field(default="", name="PodUID")
    container: str = msgspec.field(default="", name="ContainerName")
    resource: str = msgspec.field(default="", name="ResourceName")
    device_ids: dict[str, list[str]] | list[str] | None = msgspec.field(
        default=None, name="DeviceIDs"
    )

    def ids(self) -> tuple[str, ...]:
        if isinstance(self.device_ids, dict):
            return tuple(i for _, ids in sorted(self.device_ids.items()) for i in ids)
        return tuple(self.device_ids or ())


class _Data(msgspec.Struct, frozen=True):
    entries: list[_Entry] | None = msgspec.field(default=None, name="PodDeviceEntries")


class _Checkpoint(msgspec.Struct, frozen=True):
    data: _Data = msgspec.field(default_factory=_Data, name="Data")


_decoder = msgspec.json.Decoder(_Checkpoint)


def parse_checkpoint(raw: bytes, ours: Collection[str]) -> list[ForeignDevices]:
    """Every entry of a resource not in ``ours``; raises ``ValueError`` on a bad file."""
    try:
        checkpoint = _decoder.decode(raw)
    except msgspec.MsgspecError as error:
        raise ValueError(f"unreadable device checkpoint: {error}") from None
    return [
        ForeignDevices(entry.pod_uid, entry.container, entry.resource, entry.ids())
        for entry in checkpoint.data.entries or ()
        if entry.resource not in ours and entry.ids()
    ]


async def read_checkpoint(path: Path, ours: Collection[str]) -> list[ForeignDevices] | None:
    """The foreign entries of the checkpoint at ``path``; ``None`` when it cannot be read."""
    try:
        raw = await asyncio.to_thread(path.read_bytes)
        return parse_checkpoint(raw, ours)
    except (OSError, ValueError) as error:
        log.debug("device checkpoint %s: %s", path, error)
        return None
