"""NvmlBackend's links and MPS against a fake pynvml replaying recorded topology answers."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec
import pynvml
import pytest

from gpushare.core.model import CardLink
from gpushare.reporter.fixture import FixtureBackend
from gpushare.reporter.mps import MpsMode
from gpushare.reporter.nvml import NvmlBackend, NvmlLibrary, query_topology
from gpushare.reporter.recording import (
    NvmlRecording,
    RecordedDevice,
    RecordedNvLink,
    RecordedPath,
    load_recording,
)
from tests.unit.reporter.fakes import DGX1_FIXTURE, H100_FIXTURE, FakeNvml
from tests.unit.reporter.test_topology import DGX1_MATRIX, parse_matrix, topo_matrix

DGX1 = load_recording(DGX1_FIXTURE)
H100 = load_recording(H100_FIXTURE)
NVML_LOG = "gpushare.reporter.nvml"


@pytest.fixture
def dgx1() -> FakeNvml:
    return FakeNvml(DGX1)


@pytest.fixture
def no_mps_pipe(tmp_path: Path) -> Path:
    return tmp_path / "nvidia-mps"


def open_backend(nvml: FakeNvml, pipes: Path, mps: MpsMode = "auto") -> NvmlBackend:
    return NvmlBackend.open(nvml, mps=mps, mps_pipe_directory=pipes)


def read_links(backend: NvmlBackend) -> tuple[CardLink, ...]:
    backend.read_cards()
    return backend.read_links()


def test_nvlinks_are_counted_per_pair_as_nvidia_smi_shows_them(
    dgx1: FakeNvml, no_mps_pipe: Path
) -> None:
    links = read_links(open_backend(dgx1, no_mps_pipe))
    assert topo_matrix(links, 8) == parse_matrix(DGX1_MATRIX)
    assert CardLink(a=0, b=3, path="NVLINK", nvlinks=2) in links
    assert CardLink(a=0, b=5, path="SYS") in links


def test_a_live_node_and_its_replay_report_the_same_links(
    dgx1: FakeNvml, no_mps_pipe: Path
) -> None:
    assert read_links(open_backend(dgx1, no_mps_pipe)) == FixtureBackend(DGX1).read_links()


def test_topology_is_read_once_while_the_cards_stay_the_same(
    dgx1: FakeNvml, no_mps_pipe: Path
) -> None:
    backend = open_backend(dgx1, no_mps_pipe)
    first = read_links(backend)
    asked = dgx1.calls.count("nvmlDeviceGetNvLinkState")
    assert asked > 0
    assert read_links(backend) == first
    assert dgx1.calls.count("nvmlDeviceGetNvLinkState") == asked


def test_topology_is_read_again_when_a_card_changes_health(
    dgx1: FakeNvml, no_mps_pipe: Path
) -> None:
    backend = open_backend(dgx1, no_mps_pipe)
    read_links(backend)
    asked = dgx1.calls.count("nvmlDeviceGetTopologyCommonAncestor")
    dgx1.fail("nvmlDeviceGetName", 4, pynvml.NVML_ERROR_UNKNOWN)
    read_links(backend)
    dgx1.failures.clear()
    links = read_links(backend)
    assert dgx1.calls.count("nvmlDeviceGetTopologyCommonAncestor") == 3 * asked
    assert topo_matrix(links, 8) == parse_matrix(DGX1_MATRIX)


def test_links_one_card_cannot_read_are_counted_from_the_other_end(
    dgx1: FakeNvml, no_mps_pipe: Path
) -> None:
    dgx1.fail("nvmlDeviceGetNvLinkRemotePciInfo", 0, pynvml.NVML_ERROR_UNKNOWN)
    links = read_links(open_backend(dgx1, no_mps_pipe))
    assert topo_matrix(links, 8) == parse_matrix(DGX1_MATRIX)


def test_a_pair_whose_nvlinks_cannot_be_read_falls_back_to_its_pcie_path(
    dgx1: FakeNvml, no_mps_pipe: Path
) -> None:
    dgx1.fail("nvmlDeviceGetNvLinkState", 3, pynvml.NVML_ERROR_GPU_IS_LOST)
    dgx1.fail("nvmlDeviceGetNvLinkRemotePciInfo", 7, pynvml.NVML_ERROR_UNKNOWN)
    links = read_links(open_backend(dgx1, no_mps_pipe))
    assert CardLink(a=3, b=7, path="SYS") in links
    assert CardLink(a=2, b=3, path="NVLINK", nvlinks=2) in links  # from card 2's end


def test_pairs_nvml_cannot_place_are_left_out_and_logged_once(
    dgx1: FakeNvml, no_mps_pipe: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dgx1.fail("nvmlDeviceGetTopologyCommonAncestor", 0, pynvml.NVML_ERROR_NOT_SUPPORTED)
    backend = open_backend(dgx1, no_mps_pipe)
    with caplog.at_level(logging.WARNING, logger=NVML_LOG):
        links = read_links(backend)
        read_links(backend)
    pairs = {(link.a, link.b) for link in links}
    assert {(0, 5), (0, 6), (0, 7)}.isdisjoint(pairs)  # SYS, had NVML said so
    assert {(0, 1), (0, 4), (5, 6)} <= pairs  # NVLinked, or placed by the other card
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1
    assert "7 NVML queries failed" in warnings[0]
    assert "GPUs 0 and 1: nvmlDeviceGetTopologyCommonAncestor: Not Supported" in warnings[0]
    assert "and 2 more" in warnings[0]


def test_topology_failures_never_make_a_card_unhealthy(dgx1: FakeNvml, no_mps_pipe: Path) -> None:
    for function in (
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetComputeMode",
    ):
        for index in range(8):
            dgx1.fail(function, index, pynvml.NVML_ERROR_UNKNOWN)
    backend = open_backend(dgx1, no_mps_pipe)
    assert all(card.healthy for card in backend.read_cards())
    assert backend.read_links() == ()
    assert not backend.mps_enabled()


def test_a_card_without_a_handle_has_no_links(dgx1: FakeNvml, no_mps_pipe: Path) -> None:
    backend = open_backend(dgx1, no_mps_pipe)
    dgx1.fail("nvmlDeviceGetHandleByIndex", 6, pynvml.NVML_ERROR_GPU_IS_LOST)
    links = read_links(backend)
    assert all(6 not in (link.a, link.b) for link in links)
    assert len(links) == 21  # the other seven cards' pairs


def test_cards_without_nvlink_or_topology_have_no_links(no_mps_pipe: Path) -> None:
    """The H100 recording predates topology: NVML "does not support" any of it here."""
    backend = open_backend(FakeNvml(H100), no_mps_pipe)
    assert read_links(backend) == ()
    assert all(card.healthy for card in backend.read_cards())


def test_a_pcie_only_card_is_asked_about_its_first_link_only(no_mps_pipe: Path) -> None:
    nvml = FakeNvml(H100)
    query_topology(nvml, range(8))
    assert nvml.calls.count("nvmlDeviceGetNvLinkState") == 8


def hgx(cards: int, switch_types: int | None = 2) -> NvmlRecording:
    """Cards whose 18 links each end at one of four NVSwitches, all under one host bridge."""
    devices = tuple(
        RecordedDevice(
            index=index,
            uuid=f"GPU-{index:08x}-0000-0000-0000-000000000000",
            name="NVIDIA H100 80GB HBM3",
            memory_total_bytes=85520809984,
            pci_bus_id=f"00000000:{0x18 + 16 * index:02X}:00.0",
            nvlinks=tuple(
                RecordedNvLink(
                    link=link,
                    remote_pci_bus_id=f"00000000:{0x05 + link % 4:02X}:00.0",
                    remote_device_type=switch_types,
                )
                for link in range(18)
            ),
        )
        for index in range(cards)
    )
    paths = tuple(
        RecordedPath(a=a, b=b, level=pynvml.NVML_TOPOLOGY_NODE)
        for a in range(cards)
        for b in range(a + 1, cards)
    )
    return NvmlRecording(driver_version="550.90.07", devices=devices, topology=paths)


def test_cards_on_an_nvswitch_board_are_all_nv18(no_mps_pipe: Path) -> None:
    links = read_links(open_backend(FakeNvml(hgx(4)), no_mps_pipe))
    assert len(links) == 6
    assert {(link.path, link.nvlinks) for link in links} == {("NVLINK", 18)}


def test_without_the_far_ends_type_a_switch_board_falls_back_to_pcie(no_mps_pipe: Path) -> None:
    links = read_links(open_backend(FakeNvml(hgx(2, switch_types=None)), no_mps_pipe))
    assert links == (CardLink(a=0, b=1, path="NODE"),)


def test_mps_auto_finds_the_control_daemons_pipe(no_mps_pipe: Path) -> None:
    backend = open_backend(FakeNvml(H100), no_mps_pipe)
    backend.read_cards()
    assert not backend.mps_enabled()
    no_mps_pipe.mkdir()
    os.mkfifo(no_mps_pipe / "control")
    assert backend.mps_enabled()


def test_mps_auto_reads_exclusive_process_compute_mode(dgx1: FakeNvml, no_mps_pipe: Path) -> None:
    backend = open_backend(dgx1, no_mps_pipe)
    backend.read_cards()
    assert backend.mps_enabled()
    assert dgx1.calls.count("nvmlDeviceGetComputeMode") == 8


def test_mps_auto_off_when_a_card_is_in_default_mode(no_mps_pipe: Path) -> None:
    devices = list(DGX1.devices)
    devices[5] = msgspec.structs.replace(devices[5], compute_mode=pynvml.NVML_COMPUTEMODE_DEFAULT)
    backend = open_backend(
        FakeNvml(msgspec.structs.replace(DGX1, devices=tuple(devices))), no_mps_pipe
    )
    backend.read_cards()
    assert not backend.mps_enabled()


def test_mps_off_is_off_and_asks_nvml_nothing(dgx1: FakeNvml, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "control")
    backend = open_backend(dgx1, tmp_path, mps="off")
    backend.read_cards()
    assert not backend.mps_enabled()
    assert "nvmlDeviceGetComputeMode" not in dgx1.calls


def test_mps_on_is_on_without_any_sign_of_a_daemon(no_mps_pipe: Path) -> None:
    backend = open_backend(FakeNvml(H100), no_mps_pipe, mps="on")
    backend.read_cards()
    assert backend.mps_enabled()


def test_a_change_of_mps_is_logged_once(
    no_mps_pipe: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = open_backend(FakeNvml(H100), no_mps_pipe)
    backend.read_cards()
    with caplog.at_level(logging.INFO, logger=NVML_LOG):
        for _ in range(3):
            backend.mps_enabled()
    assert [record.getMessage()[:7] for record in caplog.records] == ["MPS off"]


def test_pynvml_has_every_function_and_constant_the_reporter_uses() -> None:
    names = {*NvmlLibrary.__annotations__, *(n for n in vars(NvmlLibrary) if n.startswith("nvml"))}
    assert "nvmlDeviceGetNvLinkRemotePciInfo" in names
    assert sorted(name for name in names if not hasattr(pynvml, name)) == []
