"""Fakes for the reporter's own seams: an NVML library that replays a recording, and a clock.

``FakeNvml`` has the shape of the pynvml functions the reporter uses (its ``NvmlLibrary``
protocol) and raises pynvml's real ``NVMLError`` classes, so error handling is exercised
exactly as on a GPU machine. It answers from an ``NvmlRecording`` (a fixture file) and lets a
test make any call fail for one device, or queue XID events. Topology answers come from the
recording too: what it lacks, NVML "does not support", as on a card or driver without it.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from gpushare.reporter.recording import (
    NvmlRecording,
    RecordedDevice,
    RecordedNvLink,
    load_recording,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvml"
H100_FIXTURE = FIXTURES / "h100-80gb-hbm3-x8.json"
DGX1_FIXTURE = FIXTURES / "dgx1-v100-sxm2-32gb-x8-synthetic.json"

T = TypeVar("T")


def recorded(value: T | None) -> T:
    """What the recording holds; what it lacks, this NVML does not support."""
    if value is None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return value


@dataclass(frozen=True)
class FakeHandle:
    """NVML's device handle: an opaque, truthy token."""

    index: int


@dataclass(frozen=True)
class FakeMemory:
    total: int
    free: int = 0
    used: int = 0


@dataclass(frozen=True)
class FakePciInfo:
    """``nvmlPciInfo_t``; pynvml hands ``busId`` back decoded."""

    busId: str


@dataclass
class FakeEventData:
    """``c_nvmlEventData_t``: ``device`` is ``None`` for an event NVML tied to no device."""

    device: FakeHandle | None
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeNvml:
    """Replays ``recording``; ``failures[(function, index)] = code`` makes a call fail."""

    recording: NvmlRecording
    failures: dict[tuple[str, int | None], int] = field(default_factory=dict)
    init_error: int | None = None
    events: deque[FakeEventData] = field(default_factory=deque)
    registered: list[tuple[int, int]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    initialised: bool = False
    event_sets_freed: int = 0
    _event_ready: threading.Condition = field(default_factory=threading.Condition)

    NVMLError = pynvml.NVMLError
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    @classmethod
    def from_fixture(cls, path: Path = H100_FIXTURE) -> FakeNvml:
        return cls(load_recording(path))

    # -- test controls -------------------------------------------------------------------

    def fail(self, function: str, index: int | None, code: int) -> None:
        self.failures[(function, index)] = code

    def queue_xid(self, index: int | None, xid: int, event_type: int | None = None) -> None:
        """An XID on device ``index`` (``None``: on no particular device)."""
        kind = self.nvmlEventTypeXidCriticalError if event_type is None else event_type
        device = None if index is None else FakeHandle(index)
        with self._event_ready:
            self.events.append(FakeEventData(device=device, eventType=kind, eventData=xid))
            self._event_ready.notify_all()

    # -- the NvmlLibrary protocol ---------------------------------------------------------

    def _check(self, function: str, index: int | None = None) -> None:
        self.calls.append(function)
        code = self.failures.get((function, index))
        if code is not None:
            raise pynvml.NVMLError(code)

    def _device(self, handle: FakeHandle) -> RecordedDevice:
        return next(d for d in self.recording.devices if d.index == handle.index)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return self.recording.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check("nvmlSystemGetNVMLVersion")
        return self.recording.nvml_version

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.recording.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check("nvmlDeviceGetHandleByIndex", index)
        return FakeHandle(index)

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> bytes:
        self._check("nvmlDeviceGetUUID", handle.index)
        uuid = self._device(handle).uuid
        assert uuid is not None
        return uuid.encode()  # raw bytes, as older pynvml versions return them

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        self._check("nvmlDeviceGetName", handle.index)
        name = self._device(handle).name
        assert name is not None
        return name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> FakeMemory:
        self._check("nvmlDeviceGetMemoryInfo", handle.index)
        total = self._device(handle).memory_total_bytes
        assert total is not None
        return FakeMemory(total=total, free=total)

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> FakePciInfo:
        self._check("nvmlDeviceGetPciInfo", handle.index)
        return FakePciInfo(busId=recorded(self._device(handle).pci_bus_id))

    def nvmlDeviceGetComputeMode(self, handle: FakeHandle) -> int:
        self._check("nvmlDeviceGetComputeMode", handle.index)
        return recorded(self._device(handle).compute_mode)

    def _nvlink(self, handle: FakeHandle, link: int) -> RecordedNvLink | None:
        """The recorded active link, ``None`` for an inactive one. A device with no links
        recorded has no NVLink (NOT_SUPPORTED); links past the last recorded one do not
        exist (INVALID_ARGUMENT), as NVML answers for a card with fewer links than the max."""
        links = self._device(handle).nvlinks
        if not links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link <= max(active.link for active in links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return next((active for active in links if active.link == link), None)

    def _active_nvlink(self, handle: FakeHandle, link: int) -> RecordedNvLink:
        active = self._nvlink(handle, link)
        if active is None:  # nothing answers at the far end of a link that is down
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return active

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState", handle.index)
        active = self._nvlink(handle, link) is not None
        return pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: FakeHandle, link: int) -> FakePciInfo:
        self._check("nvmlDeviceGetNvLinkRemotePciInfo", handle.index)
        return FakePciInfo(busId=self._active_nvlink(handle, link).remote_pci_bus_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: FakeHandle, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkRemoteDeviceType", handle.index)
        return recorded(self._active_nvlink(handle, link).remote_device_type)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: FakeHandle, device2: FakeHandle) -> int:
        """``fail(..., index)`` fails every pair whose first device is ``index``."""
        self._check("nvmlDeviceGetTopologyCommonAncestor", device1.index)
        pair = {device1.index, device2.index}
        levels = [path.level for path in self.recording.topology if {path.a, path.b} == pair]
        return recorded(levels[0] if levels else None)

    def nvmlEventSetCreate(self) -> str:
        self._check("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(
        self, handle: FakeHandle, event_types: int, event_set: Any
    ) -> None:
        self._check("nvmlDeviceRegisterEvents", handle.index)
        assert event_set == "event-set"
        self.registered.append((handle.index, event_types))

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> FakeEventData:
        self._check("nvmlEventSetWait_v2")
        assert event_set == "event-set"
        with self._event_ready:
            self._event_ready.wait_for(lambda: bool(self.events), timeout_ms / 1000)
            if not self.events:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            return self.events.popleft()

    def nvmlEventSetFree(self, event_set: Any) -> None:
        assert event_set == "event-set"
        self.event_sets_freed += 1
