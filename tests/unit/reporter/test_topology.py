"""Links from NVML's answers: the PCIe path table, NVLink lane counting, NVSwitch fabrics."""

from __future__ import annotations

import pynvml
import pytest

from gpushare.core.model import LINK_PATHS, CardLink
from gpushare.reporter.recording import (
    RecordedDevice,
    RecordedNvLink,
    RecordedPath,
    load_recording,
)
from gpushare.reporter.topology import (
    NVLINK_DEVICE_TYPE_SWITCH,
    NVML_TOPOLOGY_PATHS,
    links_from_records,
    normalize_bus_id,
    nvlinks_between,
    path_for_level,
)
from tests.unit.reporter.fakes import DGX1_FIXTURE

DGX1_MATRIX = """
X   NV1 NV1 NV2 NV2 SYS SYS SYS
NV1 X   NV2 NV1 SYS NV2 SYS SYS
NV1 NV2 X   NV2 SYS SYS NV1 SYS
NV2 NV1 NV2 X   SYS SYS SYS NV1
NV2 SYS SYS SYS X   NV1 NV1 NV2
SYS NV2 SYS SYS NV1 X   NV2 NV1
SYS SYS NV1 SYS NV1 NV2 X   NV2
SYS SYS SYS NV1 NV2 NV1 NV2 X
"""
"""``nvidia-smi topo -m`` of a DGX-1 with V100s, the synthetic fixture's model."""


def topo_matrix(links: tuple[CardLink, ...], count: int) -> list[list[str]]:
    """The links as ``nvidia-smi topo -m`` shows them (``?`` for a pair with no link)."""
    names = {
        (link.a, link.b): f"NV{link.nvlinks}" if link.path == "NVLINK" else link.path
        for link in links
    }
    return [
        ["X" if a == b else names.get((min(a, b), max(a, b)), "?") for b in range(count)]
        for a in range(count)
    ]


def parse_matrix(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def bus(index: int) -> str:
    return f"00000000:{index + 0x10:02X}:00.0"


def gpu(index: int, *peers: int, switch_links: int = 0) -> RecordedDevice:
    """A device with one active link to each of ``peers`` (repeat a peer for more lanes)."""
    links = [RecordedNvLink(link=n, remote_pci_bus_id=bus(peer)) for n, peer in enumerate(peers)]
    links += [
        RecordedNvLink(
            link=len(peers) + n,
            remote_pci_bus_id=f"00000000:{0xC0 + n % 4:02X}:00.0",
            remote_device_type=NVLINK_DEVICE_TYPE_SWITCH,
        )
        for n in range(switch_links)
    ]
    return RecordedDevice(index=index, pci_bus_id=bus(index), nvlinks=tuple(links))


@pytest.mark.parametrize(
    ("level", "path"),
    [
        (pynvml.NVML_TOPOLOGY_INTERNAL, "PIX"),
        (pynvml.NVML_TOPOLOGY_SINGLE, "PIX"),
        (pynvml.NVML_TOPOLOGY_MULTIPLE, "PXB"),
        (pynvml.NVML_TOPOLOGY_HOSTBRIDGE, "PHB"),
        (pynvml.NVML_TOPOLOGY_NODE, "NODE"),
        (pynvml.NVML_TOPOLOGY_CPU, "NODE"),
        (pynvml.NVML_TOPOLOGY_SYSTEM, "SYS"),
        (35, None),
        (None, None),
    ],
)
def test_nvml_topology_levels_map_to_nvidia_smi_paths(level: int | None, path: str | None) -> None:
    assert path_for_level(level) == path


def test_every_mapped_path_is_one_the_core_knows() -> None:
    assert set(NVML_TOPOLOGY_PATHS.values()) <= set(LINK_PATHS)


def test_the_switch_device_type_is_nvmls() -> None:
    assert pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH == NVLINK_DEVICE_TYPE_SWITCH


@pytest.mark.parametrize(
    ("written", "normal"),
    [
        ("00000000:18:00.0", "00000000:18:00.0"),
        ("0000:18:00.0", "00000000:18:00.0"),
        ("0000:8a:00.0", "00000000:8A:00.0"),
        (" 00000001:8A:00.0\0", "00000001:8A:00.0"),
        ("18:00.0", "18:00.0"),
        ("zz:18:00.0", "ZZ:18:00.0"),
    ],
)
def test_pci_addresses_are_compared_in_one_spelling(written: str, normal: str) -> None:
    assert normalize_bus_id(written) == normal


def test_direct_links_are_counted_per_lane() -> None:
    links = links_from_records([gpu(0, 1, 1, 1, 1), gpu(1, 0, 0, 0, 0)])
    assert links == (CardLink(a=0, b=1, path="NVLINK", nvlinks=4),)


def test_links_are_counted_from_the_end_nvml_read_better() -> None:
    """Card 1's links could not be read: card 0's still say how they are joined."""
    blind = RecordedDevice(index=1, pci_bus_id=bus(1))
    assert nvlinks_between(gpu(0, 1, 1), blind) == nvlinks_between(blind, gpu(0, 1, 1)) == 2


def test_a_peer_spelled_differently_is_still_the_peer() -> None:
    device = RecordedDevice(
        index=0, nvlinks=(RecordedNvLink(link=0, remote_pci_bus_id="0000:11:00.0"),)
    )
    assert nvlinks_between(device, gpu(1)) == 1


def test_nvlink_beats_the_pcie_path_and_pcie_names_the_rest() -> None:
    devices = [gpu(0, 1), gpu(1, 0), gpu(2)]
    paths = [
        RecordedPath(a=0, b=1, level=pynvml.NVML_TOPOLOGY_SYSTEM),
        RecordedPath(a=2, b=0, level=pynvml.NVML_TOPOLOGY_SINGLE),  # either order
        RecordedPath(a=1, b=2, level=pynvml.NVML_TOPOLOGY_HOSTBRIDGE),
    ]
    assert links_from_records(devices, paths) == (
        CardLink(a=0, b=1, path="NVLINK", nvlinks=1),
        CardLink(a=0, b=2, path="PIX"),
        CardLink(a=1, b=2, path="PHB"),
    )


def test_a_pair_nvml_could_not_place_has_no_link() -> None:
    devices = [gpu(0), gpu(1), gpu(2)]
    paths = [RecordedPath(a=0, b=1, level=pynvml.NVML_TOPOLOGY_NODE)]
    assert links_from_records(devices, paths) == (CardLink(a=0, b=1, path="NODE"),)


def test_paths_of_devices_not_read_or_of_one_device_are_ignored() -> None:
    paths = [RecordedPath(a=0, b=0, level=10), RecordedPath(a=0, b=9, level=10)]
    assert links_from_records([gpu(0)], paths) == ()


def test_no_answers_no_links() -> None:
    assert links_from_records([]) == ()
    assert links_from_records([RecordedDevice(index=0), RecordedDevice(index=1)]) == ()


def test_cards_on_an_nvswitch_fabric_are_joined_by_the_narrower_ones_links() -> None:
    """HGX H100: every link ends at a switch, so no link names a peer, yet all are NV18."""
    devices = [gpu(0, switch_links=18), gpu(1, switch_links=18), gpu(2, switch_links=12)]
    assert links_from_records(devices) == (
        CardLink(a=0, b=1, path="NVLINK", nvlinks=18),
        CardLink(a=0, b=2, path="NVLINK", nvlinks=12),
        CardLink(a=1, b=2, path="NVLINK", nvlinks=12),
    )


def test_a_card_off_the_fabric_is_not_joined_through_it() -> None:
    paths = [RecordedPath(a=0, b=1, level=pynvml.NVML_TOPOLOGY_SYSTEM)]
    devices = [gpu(0, switch_links=18), gpu(1)]
    assert links_from_records(devices, paths) == (CardLink(a=0, b=1, path="SYS"),)


def test_a_link_whose_far_end_is_unknown_is_not_taken_for_a_switch() -> None:
    unknown = RecordedDevice(
        index=1, nvlinks=(RecordedNvLink(link=0, remote_pci_bus_id="00000000:C0:00.0"),)
    )
    assert nvlinks_between(gpu(0, switch_links=18), unknown) == 0


def test_the_synthetic_dgx1_reads_as_its_nvidia_smi_matrix() -> None:
    recording = load_recording(DGX1_FIXTURE)
    links = links_from_records(recording.devices, recording.topology)
    assert topo_matrix(links, 8) == parse_matrix(DGX1_MATRIX)
    assert all(link.a < link.b for link in links)
