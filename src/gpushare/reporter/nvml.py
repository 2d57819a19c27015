"""The real node: cards, XID health, links and MPS through NVML (pynvml, ``nvidia-ml-py``).

NVML is reached only through :class:`NvmlLibrary`, the handful of pynvml functions used
here. Production passes the pynvml module itself (:func:`load_nvml`); tests pass a small
object that replays recorded answers, so all of this runs without a GPU.

Every NVML call may fail (a card fell off the bus, the driver was reloaded). A failure is
never a crash: the card concerned is reported unhealthy with NVML's words as the reason.
Topology and compute mode queries are different: a card whose links NVML cannot tell is
still a good card, so such a failure only leaves that link out (and is logged once).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from itertools import combinations
from pathlib import Path
from typing import Any, Protocol

import msgspec

from gpushare.core.model import Card, CardLink
from gpushare.reporter import metrics
from gpushare.reporter.backends import InventorySource
from gpushare.reporter.health import ALL_CARDS, HealthEvent, HealthMarks, mark_unhealthy
from gpushare.reporter.mps import (
    DEFAULT_MPS_MODE,
    DEFAULT_MPS_PIPE_DIRECTORY,
    MpsMode,
    decide_mps,
    find_control_pipe,
)
from gpushare.reporter.recording import (
    RecordedDevice,
    RecordedNvLink,
    RecordedPath,
    card_from_record,
)
from gpushare.reporter.topology import links_from_records

log = logging.getLogger(__name__)

# XIDs that an application causes (a bad kernel, an out-of-bounds access, a killed context):
# the GPU itself is fine afterwards, so they must not take a card out of service. This is the
# list NVIDIA's k8s-device-plugin ignores (internal/rm/health.go); the Aliyun plugin ignored
# only 31, 43 and 45. See https://docs.nvidia.com/deploy/xid-errors/ for what each means.
APPLICATION_XIDS = frozenset(
    {
        13,  # graphics engine exception
        31,  # GPU memory page fault
        43,  # GPU stopped processing
        45,  # preemptive cleanup, due to previous errors
        68,  # video processor exception
        109,  # context switch timeout
    }
)

MAX_EVENTS_PER_POLL = 64
"""Events drained from NVML's queue in one poll, so a storm cannot hold the loop forever."""

MAX_LOGGED_PROBLEMS = 5
"""Topology problems quoted in the one warning about them; the rest are counted."""


class NvmlLibrary(Protocol):
    """The part of pynvml the reporter uses (the pynvml module satisfies it)."""

    NVMLError: type[Exception]
    NVML_ERROR_TIMEOUT: int
    NVML_ERROR_NOT_SUPPORTED: int
    NVML_ERROR_INVALID_ARGUMENT: int
    NVML_ERROR_FUNCTION_NOT_FOUND: int
    NVML_FEATURE_ENABLED: int
    NVML_NVLINK_MAX_LINKS: int
    nvmlEventTypeXidCriticalError: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetNVMLVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetComputeMode(self, handle: Any) -> int: ...
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any: ...
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int: ...
    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None: ...
    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any) -> None: ...


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine (no library, no driver, no permission)."""


def load_nvml() -> NvmlLibrary:
    """The pynvml module: the one place production code looks NVML up."""
    try:
        import pynvml
    except ImportError as error:
        raise NvmlUnavailable(f"pynvml is not installed ({error})") from None
    library: NvmlLibrary = pynvml
    return library


def error_code(error: BaseException) -> int | None:
    """NVML's return code carried by an ``NVMLError``."""
    code = getattr(error, "value", None)
    return code if isinstance(code, int) else None


def as_text(value: str | bytes) -> str:
    """pynvml decodes strings; older versions and raw ctypes calls hand back bytes."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def query_device(nvml: NvmlLibrary, index: int) -> RecordedDevice:
    """What NVML says about device ``index``; each failed query is named in ``error``."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as error:
        metrics.NVML_ERRORS.labels("nvmlDeviceGetHandleByIndex").inc()
        return RecordedDevice(index=index, error=f"NVML nvmlDeviceGetHandleByIndex: {error}")
    errors: list[str] = []

    def ask(name: str) -> Any:
        try:
            return getattr(nvml, name)(handle)
        except nvml.NVMLError as error:
            metrics.NVML_ERRORS.labels(name).inc()
            errors.append(f"NVML {name}: {error}")
            return None

    uuid = ask("nvmlDeviceGetUUID")
    name = ask("nvmlDeviceGetName")
    memory = ask("nvmlDeviceGetMemoryInfo")
    return RecordedDevice(
        index=index,
        uuid=None if uuid is None else as_text(uuid),
        name=None if name is None else as_text(name),
        memory_total_bytes=None if memory is None else int(memory.total),
        error="; ".join(errors),
    )


class TopologyReading(msgspec.Struct, frozen=True, kw_only=True):
    """What NVML said about how the devices are joined, and what it would not say."""

    devices: tuple[RecordedDevice, ...]
    """Per device only ``index``, ``pci_bus_id`` and ``nvlinks``."""
    paths: tuple[RecordedPath, ...]
    problems: tuple[str, ...] = ()
    """Each failed query, in NVML's words; the links concerned are left out."""

    def links(self) -> tuple[CardLink, ...]:
        return links_from_records(self.devices, self.paths)


def query_topology(nvml: NvmlLibrary, indices: Iterable[int]) -> TopologyReading:
    """PCI addresses, active NVLinks and PCIe common ancestors of the devices ``indices``.

    Never raises: a device with no NVLink is normal, and any other failure leaves out what
    it concerns and is named in ``problems``.
    """
    problems: list[str] = []
    handles: dict[int, Any] = {}
    for index in indices:
        try:
            handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as error:
            problems.append(f"GPU {index}: nvmlDeviceGetHandleByIndex: {error}")
    devices = tuple(
        RecordedDevice(
            index=index,
            pci_bus_id=query_pci_bus_id(nvml, index, handle, problems),
            nvlinks=query_nvlinks(nvml, index, handle, problems),
        )
        for index, handle in handles.items()
    )
    paths = query_paths(nvml, handles, problems)
    return TopologyReading(devices=devices, paths=paths, problems=tuple(problems))


def query_pci_bus_id(nvml: NvmlLibrary, index: int, handle: Any, problems: list[str]) -> str | None:
    try:
        return as_text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    except nvml.NVMLError as error:
        problems.append(f"GPU {index}: nvmlDeviceGetPciInfo: {error}")
        return None


def query_nvlinks(
    nvml: NvmlLibrary, index: int, handle: Any, problems: list[str]
) -> tuple[RecordedNvLink, ...]:
    """The device's active links. ``NOT_SUPPORTED`` (a PCIe-only card) or
    ``INVALID_ARGUMENT`` (no link with that number) ends the scan; other errors skip a link."""
    links = []
    no_more_links = (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT)
    for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
        try:
            active = int(nvml.nvmlDeviceGetNvLinkState(handle, link)) == nvml.NVML_FEATURE_ENABLED
        except nvml.NVMLError as error:
            if error_code(error) in no_more_links:
                break
            problems.append(f"GPU {index} NVLink {link}: nvmlDeviceGetNvLinkState: {error}")
            continue
        if not active:
            continue
        try:
            remote = as_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except nvml.NVMLError as error:
            problems.append(f"GPU {index} NVLink {link}: nvmlDeviceGetNvLinkRemotePciInfo: {error}")
            continue
        remote_type = query_remote_device_type(nvml, index, handle, link, problems)
        links.append(
            RecordedNvLink(link=link, remote_pci_bus_id=remote, remote_device_type=remote_type)
        )
    return tuple(links)


def query_remote_device_type(
    nvml: NvmlLibrary, index: int, handle: Any, link: int, problems: list[str]
) -> int | None:
    """GPU or NVSwitch at the link's far end; ``None`` quietly where the driver cannot say."""
    try:
        return int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
    except nvml.NVMLError as error:
        quiet = (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if error_code(error) not in quiet:
            problems.append(
                f"GPU {index} NVLink {link}: nvmlDeviceGetNvLinkRemoteDeviceType: {error}"
            )
        return None


def query_paths(
    nvml: NvmlLibrary, handles: Mapping[int, Any], problems: list[str]
) -> tuple[RecordedPath, ...]:
    paths = []
    for a, b in combinations(sorted(handles), 2):
        try:
            level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
        except nvml.NVMLError as error:
            problems.append(f"GPUs {a} and {b}: nvmlDeviceGetTopologyCommonAncestor: {error}")
            continue
        paths.append(RecordedPath(a=a, b=b, level=level))
    return tuple(paths)


def query_compute_mode(nvml: NvmlLibrary, index: int) -> int | None:
    """``nvmlDeviceGetComputeMode`` of device ``index``; ``None`` if NVML cannot say."""
    try:
        return int(nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByIndex(index)))
    except nvml.NVMLError:
        return None


def summarize_problems(problems: tuple[str, ...]) -> str:
    quoted = "; ".join(problems[:MAX_LOGGED_PROBLEMS])
    more = len(problems) - MAX_LOGGED_PROBLEMS
    return f"{quoted}; and {more} more" if more > 0 else quoted


def query_driver_version(nvml: NvmlLibrary) -> str:
    try:
        return as_text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError as error:
        log.warning("NVML could not tell the driver version: %s", error)
        return ""


class NvmlBackend:
    """A GPU node read through NVML, with XID critical errors as the health signal.

    An XID mark is sticky: most critical XIDs call for a GPU reset or a reboot, around which
    the node's GPU daemons (this one holds NVML open) are restarted, and a restarted reporter
    reads every card afresh. A failed query, by contrast, marks the card only for as long as
    the query keeps failing.
    """

    def __init__(
        self,
        nvml: NvmlLibrary,
        *,
        mps: MpsMode = DEFAULT_MPS_MODE,
        mps_pipe_directory: Path = DEFAULT_MPS_PIPE_DIRECTORY,
    ) -> None:
        """Wrap an *initialised* library; :meth:`open` is the usual way in."""
        self._nvml = nvml
        self._marks = HealthMarks()
        self._driver_version = query_driver_version(nvml)
        self._last_by_index: dict[int, Card] = {}
        self._event_set: Any = None
        self._wait_lock = threading.Lock()
        self._closing = threading.Event()
        self._mps_mode = mps
        self._mps_pipe_directory = mps_pipe_directory
        self._last_mps: bool | None = None
        self._links: tuple[CardLink, ...] = ()
        self._links_read_for: tuple[tuple[int, str, bool], ...] | None = None

    @classmethod
    def open(
        cls,
        nvml: NvmlLibrary | None = None,
        *,
        mps: MpsMode = DEFAULT_MPS_MODE,
        mps_pipe_directory: Path = DEFAULT_MPS_PIPE_DIRECTORY,
    ) -> NvmlBackend:
        """Initialise NVML and start watching XID events; :class:`NvmlUnavailable` if it can't."""
        library = nvml if nvml is not None else load_nvml()
        try:
            library.nvmlInit()
        except library.NVMLError as error:
            raise NvmlUnavailable(f"NVML could not initialise: {error}") from None
        backend = cls(library, mps=mps, mps_pipe_directory=mps_pipe_directory)
        backend.watch_xid_events()
        return backend

    @property
    def source(self) -> InventorySource:
        return "nvml"

    def driver_version(self) -> str:
        return self._driver_version

    def read_cards(self) -> tuple[Card, ...]:
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except self._nvml.NVMLError as error:
            log.warning("NVML could not count the GPUs: %s", error)
            reason = f"NVML nvmlDeviceGetCount: {error}"
            last = tuple(self._last_by_index[index] for index in sorted(self._last_by_index))
            return self._marks.apply(mark_unhealthy(card, reason) for card in last)
        cards = []
        for index in range(count):
            device = query_device(self._nvml, index)
            if device.error:
                log.warning("GPU %d: %s", index, device.error)
            cards.append(card_from_record(device, self._last_by_index.get(index)))
        self._last_by_index = {card.index: card for card in cards}
        return self._marks.apply(cards)

    def read_links(self) -> tuple[CardLink, ...]:
        """The links between the cards of the last :meth:`read_cards`. Topology does not
        change while the cards do not, so NVML is asked again only when a card appears,
        goes, or changes health (a card that recovers may now answer)."""
        cards = [self._last_by_index[index] for index in sorted(self._last_by_index)]
        read_for = tuple((card.index, card.uuid, card.healthy) for card in cards)
        if read_for != self._links_read_for:
            self._links = self._read_links(card.index for card in cards)
            self._links_read_for = read_for
        return self._links

    def _read_links(self, indices: Iterable[int]) -> tuple[CardLink, ...]:
        reading = query_topology(self._nvml, indices)
        if reading.problems:
            log.warning(
                "GPU topology: %d NVML queries failed, the links they concern are left out: %s",
                len(reading.problems),
                summarize_problems(reading.problems),
            )
        links = reading.links()
        log.debug("GPU topology from NVML: %s", reading)
        log.info(
            "GPU topology: %d links (%d NVLink)",
            len(links),
            sum(link.path == "NVLINK" for link in links),
        )
        return links

    def mps_enabled(self) -> bool:
        """``--mps`` as given, or under ``auto`` whether a daemon's pipe or every card's
        compute mode shows MPS; asked at each read, since a daemon may start at any time."""
        control_pipe: bool | None = None
        compute_modes: list[int | None] = []
        if self._mps_mode == "auto":
            control_pipe = find_control_pipe(self._mps_pipe_directory)
            if not control_pipe:
                compute_modes = [
                    query_compute_mode(self._nvml, index) for index in sorted(self._last_by_index)
                ]
        mps = decide_mps(self._mps_mode, control_pipe=control_pipe, compute_modes=compute_modes)
        if mps != self._last_mps:
            log.info(
                "MPS %s (--mps %s; control pipe in %s: %s; compute modes: %s)",
                "on" if mps else "off",
                self._mps_mode,
                self._mps_pipe_directory,
                "not looked for" if control_pipe is None else control_pipe,
                compute_modes or "not asked",
            )
            self._last_mps = mps
        return mps

    def watch_xid_events(self) -> None:
        """Register every device for XID critical error events, the health signal NVIDIA's
        device plugin relies on too."""
        try:
            self._event_set = self._nvml.nvmlEventSetCreate()
            count = int(self._nvml.nvmlDeviceGetCount())
        except self._nvml.NVMLError as error:
            log.warning("NVML events unavailable (%s): XID health checks are off", error)
            return
        for index in range(count):
            self._register_xid_events(index)

    def _register_xid_events(self, index: int) -> None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            nvml.nvmlDeviceRegisterEvents(
                handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
            )
        except nvml.NVMLError as error:
            if error_code(error) == nvml.NVML_ERROR_NOT_SUPPORTED:
                # Some older and consumer cards have no XID events. They stay in service,
                # unwatched, as with NVIDIA's plugin (it registers only supported events).
                log.warning("GPU %d reports no XID events: no health checks for it", index)
                return
            self._mark_unwatched(index, f"NVML: cannot watch XID events: {error}")

    def _mark_unwatched(self, index: int, reason: str) -> None:
        """A card whose registration failed for a real error is not trusted with pods."""
        device = query_device(self._nvml, index)
        log.warning("GPU %d: %s", index, reason)
        if device.uuid:
            self._marks.record(HealthEvent(card_uuid=device.uuid, healthy=False, reason=reason))

    def poll_health_events(self, timeout: float) -> list[HealthEvent]:
        if self._event_set is None:
            # Nothing to wait on: sleep (interruptibly) and report what registration found.
            return self._marks.wait_for_events(timeout)
        for event in self._wait_for_xid_events(timeout):
            self._marks.record(event)
        return self._marks.take_events()

    def _wait_for_xid_events(self, timeout: float) -> list[HealthEvent]:
        """Wait up to ``timeout`` for the first event, then drain the queue without waiting."""
        nvml = self._nvml
        events: list[HealthEvent] = []
        wait_ms = max(0, int(timeout * 1000))
        with self._wait_lock:
            for _ in range(MAX_EVENTS_PER_POLL):
                if self._event_set is None:
                    break
                try:
                    data = nvml.nvmlEventSetWait_v2(self._event_set, wait_ms)
                except nvml.NVMLError as error:
                    if error_code(error) != nvml.NVML_ERROR_TIMEOUT:
                        events.append(self._stop_watching(error))
                    break
                event = self._health_event(data)
                if event is not None:
                    events.append(event)
                wait_ms = 0
        return events

    def _stop_watching(self, error: Exception) -> HealthEvent:
        """The event set is broken. As NVIDIA's plugin does, trust no card any more: without
        events nobody would hear of an XID. Dropping the set keeps the loop from spinning on
        a wait that fails at once. Called with ``_wait_lock`` held."""
        log.error("NVML event wait failed (%s): marking every GPU unhealthy", error)
        event_set, self._event_set = self._event_set, None
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except self._nvml.NVMLError as free_error:
            log.warning("NVML could not free the event set: %s", free_error)
        return HealthEvent(
            card_uuid=ALL_CARDS, healthy=False, reason=f"NVML event wait failed: {error}"
        )

    def _health_event(self, data: Any) -> HealthEvent | None:
        """The health event an NVML event data record means, if any."""
        if int(data.eventType) != self._nvml.nvmlEventTypeXidCriticalError:
            return None
        xid = int(data.eventData)
        if xid in APPLICATION_XIDS:
            log.info("ignoring application XID %d (the GPU is still healthy)", xid)
            return None
        uuid = self._uuid_of(data.device)
        if uuid is None:
            log.error("XID %d on no particular GPU: marking every GPU unhealthy", xid)
        else:
            log.error("XID %d on %s: marking it unhealthy", xid, uuid)
        return HealthEvent(card_uuid=uuid, healthy=False, reason=f"XID {xid}")

    def _uuid_of(self, handle: Any) -> str | None:
        if not handle:
            return None
        try:
            return as_text(self._nvml.nvmlDeviceGetUUID(handle))
        except self._nvml.NVMLError as error:
            log.warning("NVML could not name the GPU of an event: %s", error)
            return None

    def close(self) -> None:
        """Free the event set (after any running wait returns) and shut NVML down, once."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._marks.close()
        with self._wait_lock:
            event_set, self._event_set = self._event_set, None
        try:
            if event_set is not None:
                self._nvml.nvmlEventSetFree(event_set)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as error:
            log.warning("NVML shutdown: %s", error)
