"""How a node's cards are joined, read from NVML's answers: NVLink lanes, else the PCIe path.

Pure: recorded answers (:class:`~gpushare.reporter.recording.RecordedDevice` with its
NVLinks, :class:`~gpushare.reporter.recording.RecordedPath`) in, one
:class:`~gpushare.core.model.CardLink` per connected pair out. The NVML backend and the
fixture backend both go through :func:`links_from_records`, so a replay reports exactly
the links a live node would.

Two cards are NVLinked when active links of one end at the other's PCI address (a bridge
or a direct board trace: ``nvidia-smi topo -m`` shows ``NV4``), or when both have links
into the NVSwitch fabric (DGX and HGX boards, where every link ends at a switch and any
two cards talk at the rate of the narrower one's links: ``NV18`` on H100). Otherwise the
PCIe common ancestor names the path. A pair NVML could say nothing about gets no entry:
the allocator treats it as the worst path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import combinations

from gpushare.core.model import CardLink, LinkPath
from gpushare.reporter.recording import RecordedDevice, RecordedPath

NVML_TOPOLOGY_PATHS: Mapping[int, LinkPath] = {
    0: "PIX",  # NVML_TOPOLOGY_INTERNAL: two GPUs on one board
    10: "PIX",  # NVML_TOPOLOGY_SINGLE: one PCIe switch
    20: "PXB",  # NVML_TOPOLOGY_MULTIPLE: several switches, no host bridge
    30: "PHB",  # NVML_TOPOLOGY_HOSTBRIDGE
    40: "NODE",  # NVML_TOPOLOGY_NODE (formerly _CPU): host bridges of one NUMA node
    50: "SYS",  # NVML_TOPOLOGY_SYSTEM: across sockets (QPI/UPI, SMP interconnect)
}
"""``nvmlGpuTopologyLevel_t`` to ``nvidia-smi topo -m``'s names."""

NVLINK_DEVICE_TYPE_SWITCH = 2
"""``NVML_NVLINK_DEVICE_TYPE_SWITCH``: the link ends at an NVSwitch."""


def path_for_level(level: int | None) -> LinkPath | None:
    """The path an NVML topology level means; ``None`` for a level NVML did not define."""
    return None if level is None else NVML_TOPOLOGY_PATHS.get(level)


def normalize_bus_id(bus_id: str) -> str:
    """One spelling of a PCI address: NVML writes an 8-digit domain (``00000000:18:00.0``),
    sysfs and some answers a 4-digit one, in either case."""
    text = bus_id.strip().rstrip("\0").upper()
    domain, sep, rest = text.partition(":")
    if not sep or rest.count(":") != 1:
        return text  # no domain: compare as written
    try:
        return f"{int(domain, 16):08X}:{rest}"
    except ValueError:
        return text


def direct_nvlinks(device: RecordedDevice, peer: RecordedDevice) -> int:
    """Active links of ``device`` that end at ``peer``."""
    if not peer.pci_bus_id:
        return 0
    target = normalize_bus_id(peer.pci_bus_id)
    return sum(normalize_bus_id(link.remote_pci_bus_id) == target for link in device.nvlinks)


def switch_nvlinks(device: RecordedDevice) -> int:
    """Active links of ``device`` that end at an NVSwitch."""
    return sum(link.remote_device_type == NVLINK_DEVICE_TYPE_SWITCH for link in device.nvlinks)


def nvlinks_between(a: RecordedDevice, b: RecordedDevice) -> int:
    """NVLink lanes joining two cards: direct links (counted from whichever end NVML read
    better), plus the narrower card's links into a shared NVSwitch fabric."""
    direct = max(direct_nvlinks(a, b), direct_nvlinks(b, a))
    return direct + min(switch_nvlinks(a), switch_nvlinks(b))


def pair_key(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


def links_from_records(
    devices: Iterable[RecordedDevice], paths: Iterable[RecordedPath] = ()
) -> tuple[CardLink, ...]:
    """One link per pair of ``devices`` that NVML could place, ordered by ``(a, b)``."""
    by_index = {device.index: device for device in devices}
    levels = {pair_key(path.a, path.b): path.level for path in paths if path.a != path.b}
    links = []
    for a, b in combinations(sorted(by_index), 2):
        lanes = nvlinks_between(by_index[a], by_index[b])
        if lanes:
            links.append(CardLink(a=a, b=b, path="NVLINK", nvlinks=lanes))
            continue
        path = path_for_level(levels.get((a, b)))
        if path is not None:
            links.append(CardLink(a=a, b=b, path=path))
    return tuple(links)
