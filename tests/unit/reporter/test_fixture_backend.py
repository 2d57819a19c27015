"""Recordings of NVML: reading them as cards, replaying them, and capturing new ones."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pynvml
import pytest

from gpushare.core.model import CardLink
from gpushare.reporter import capture
from gpushare.reporter.fixture import FixtureBackend
from gpushare.reporter.mps import MpsMode
from gpushare.reporter.nvml import NvmlBackend
from gpushare.reporter.recording import (
    NvmlRecording,
    RecordedDevice,
    RecordedNvLink,
    RecordedPath,
    RecordingError,
    decode_recording,
    encode_recording,
    load_recording,
)
from tests.unit.reporter.fakes import DGX1_FIXTURE, H100_FIXTURE, FakeNvml


def test_the_fixture_backend_reads_the_h100_recording() -> None:
    backend = FixtureBackend.from_file(H100_FIXTURE)
    cards = backend.read_cards()
    assert len(cards) == 8
    assert {(card.model, card.memory_mib, card.healthy) for card in cards} == {
        ("NVIDIA H100 80GB HBM3", 81559, True)
    }
    assert cards[0].uuid == "GPU-424b1fee-9709-9315-05d9-5954058b4714"
    assert (backend.source, backend.driver_version()) == ("fixture", "550.90.07")


def test_a_replay_reports_what_nvml_reported() -> None:
    live = NvmlBackend.open(FakeNvml.from_fixture()).read_cards()
    assert FixtureBackend.from_file(H100_FIXTURE).read_cards() == live


def test_a_recorded_failure_replays_as_an_unhealthy_card() -> None:
    recording = decode_recording(
        b'{"format_version": 1, "driver_version": "535.1", "devices": ['
        b'{"index": 0, "uuid": "GPU-a", "name": "Tesla T4", "memory_total_bytes": 16106127360},'
        b'{"index": 1, "uuid": "GPU-b", "error": "NVML nvmlDeviceGetMemoryInfo: GPU is lost"}]}'
    )
    cards = FixtureBackend(recording).read_cards()
    assert [(card.uuid, card.memory_mib, card.healthy) for card in cards] == [
        ("GPU-a", 15360, True),
        ("GPU-b", 0, False),
    ]
    assert cards[1].health_reason == "NVML nvmlDeviceGetMemoryInfo: GPU is lost"


def test_fixture_cards_can_be_marked_by_hand() -> None:
    backend = FixtureBackend.from_file(H100_FIXTURE)
    uuid = backend.read_cards()[2].uuid
    backend.mark_unhealthy(uuid, "XID 79")
    assert backend.read_cards()[2].health_reason == "XID 79"
    backend.mark_healthy(uuid)
    assert backend.read_cards()[2].healthy


@pytest.mark.parametrize("fixture", [H100_FIXTURE, DGX1_FIXTURE], ids=lambda path: path.stem)
def test_the_committed_fixtures_are_in_canonical_form(fixture: Path) -> None:
    assert encode_recording(load_recording(fixture)) == fixture.read_bytes()


def test_a_recording_without_topology_has_no_links_and_no_mps() -> None:
    backend = FixtureBackend.from_file(H100_FIXTURE)
    assert backend.read_links() == ()
    assert not backend.mps_enabled()
    assert load_recording(H100_FIXTURE).mps_control_pipe is None


FIRST_VERSION_FIELDS = {
    "format_version",
    "captured_at",
    "hostname",
    "driver_version",
    "nvml_version",
    "devices",
}
FIRST_VERSION_DEVICE_FIELDS = {"index", "uuid", "name", "memory_total_bytes", "error"}


def test_a_recording_written_before_topology_was_recorded_still_loads() -> None:
    """The H100 recording holds only the fields a first-version capture wrote."""
    old = json.loads(H100_FIXTURE.read_bytes())
    assert set(old) <= FIRST_VERSION_FIELDS
    assert {key for device in old["devices"] for key in device} <= FIRST_VERSION_DEVICE_FIELDS
    recording = decode_recording(json.dumps(old).encode())
    assert (recording.topology, recording.note, recording.mps_control_pipe) == ((), "", None)
    topology = {(device.pci_bus_id, device.compute_mode) for device in recording.devices}
    assert topology == {(None, None)}
    assert all(device.nvlinks == () for device in recording.devices)


class FirstVersionDevice(msgspec.Struct, kw_only=True):
    index: int
    uuid: str | None = None
    memory_total_bytes: int | None = None


class FirstVersionRecording(msgspec.Struct, kw_only=True):
    format_version: int = 1
    devices: tuple[FirstVersionDevice, ...] = ()


def test_a_reader_that_knows_no_topology_ignores_it() -> None:
    """What a reporter of the previous version decodes from a new recording."""
    old = msgspec.json.decode(DGX1_FIXTURE.read_bytes(), type=FirstVersionRecording)
    assert [device.memory_total_bytes for device in old.devices] == [34089730048] * 8


def test_the_synthetic_dgx1_says_it_is_synthetic() -> None:
    recording = load_recording(DGX1_FIXTURE)
    assert recording.note.startswith("SYNTHETIC: built by hand")
    assert "synthetic" in DGX1_FIXTURE.name


def test_the_dgx1_replays_its_nvlink_mesh_and_mps() -> None:
    backend = FixtureBackend.from_file(DGX1_FIXTURE)
    links = backend.read_links()
    assert len(links) == 28
    assert sum(link.path == "NVLINK" for link in links) == 16
    assert CardLink(a=0, b=1, path="NVLINK", nvlinks=1) in links
    assert CardLink(a=4, b=7, path="NVLINK", nvlinks=2) in links
    assert CardLink(a=1, b=4, path="SYS") in links
    assert backend.mps_enabled()
    assert {card.memory_mib for card in backend.read_cards()} == {32510}


@pytest.mark.parametrize(("mode", "mps"), [("off", False), ("on", True), ("auto", True)])
def test_the_mps_flag_overrides_what_was_recorded(mode: MpsMode, mps: bool) -> None:
    assert FixtureBackend.from_file(DGX1_FIXTURE, mps=mode).mps_enabled() is mps


def test_a_recording_round_trips_through_its_file_format(tmp_path: Path) -> None:
    recording = NvmlRecording(
        note="hand-made",
        driver_version="550.90.07",
        devices=(
            RecordedDevice(
                index=0,
                uuid="GPU-a",
                name="NVIDIA A100-SXM4-80GB",
                memory_total_bytes=85899345920,
                pci_bus_id="00000000:07:00.0",
                compute_mode=3,
                nvlinks=(
                    RecordedNvLink(link=0, remote_pci_bus_id="00000000:0F:00.0"),
                    RecordedNvLink(
                        link=1, remote_pci_bus_id="00000000:C5:00.0", remote_device_type=2
                    ),
                ),
            ),
            RecordedDevice(index=1, error="GPU is lost"),
        ),
        topology=(RecordedPath(a=0, b=1, level=40),),
        mps_control_pipe=False,
    )
    path = tmp_path / "node.json"
    path.write_bytes(encode_recording(recording))
    assert load_recording(path) == recording
    assert json.loads(path.read_bytes())["mps_control_pipe"] is False


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not an NVML recording"),
        (b'{"format_version": 2, "devices": []}', "format_version 2 is not 1"),
        (b'{"devices": [{"index": "zero"}]}', "not an NVML recording"),
        (b'{"devices": [{"index": 0}, {"index": 0}]}', "indices must be distinct"),
    ],
)
def test_a_bad_fixture_names_the_file_and_the_problem(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(RecordingError, match=message) as raised:
        FixtureBackend.from_file(path)
    assert str(path) in str(raised.value)


def test_a_missing_fixture_is_a_recording_error(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="cannot read"):
        load_recording(tmp_path / "missing.json")


def test_capture_records_what_replays_to_the_same_cards(tmp_path: Path) -> None:
    nvml = FakeNvml.from_fixture()
    output = tmp_path / "node.json"
    assert capture.main(["--output", str(output), "--hostname", "gpu-h100-07"], nvml=nvml) == 0
    recording = load_recording(output)
    expected = load_recording(H100_FIXTURE)
    assert recording.devices == expected.devices
    assert (recording.driver_version, recording.nvml_version) == ("550.90.07", "12.550.90.07")
    assert recording.hostname == "gpu-h100-07"
    assert recording.captured_at is not None
    assert not nvml.initialised  # shut down again


def test_capture_records_topology_that_replays_to_the_same_links(tmp_path: Path) -> None:
    nvml = FakeNvml.from_fixture(DGX1_FIXTURE)
    pipes = tmp_path / "nvidia-mps"
    pipes.mkdir()
    os.mkfifo(pipes / "control")
    output = tmp_path / "dgx1.json"
    argv = ["--output", str(output), "--mps-pipe-directory", str(pipes)]
    assert capture.main(argv, nvml=nvml) == 0
    recording, expected = load_recording(output), load_recording(DGX1_FIXTURE)
    assert recording.devices == expected.devices
    assert recording.topology == expected.topology
    assert recording.mps_control_pipe is True
    live = NvmlBackend.open(FakeNvml.from_fixture(DGX1_FIXTURE), mps_pipe_directory=pipes)
    live.read_cards()
    replay = FixtureBackend(recording)
    assert replay.read_links() == live.read_links()
    assert replay.mps_enabled() == live.mps_enabled()


def test_capture_without_an_mps_daemon_records_none_seen(tmp_path: Path) -> None:
    output = tmp_path / "node.json"
    argv = ["--output", str(output), "--mps-pipe-directory", str(tmp_path / "none")]
    assert capture.main(argv, nvml=FakeNvml.from_fixture()) == 0
    assert load_recording(output).mps_control_pipe is False


def test_capture_names_the_topology_it_could_not_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nvml = FakeNvml.from_fixture(DGX1_FIXTURE)
    nvml.fail("nvmlDeviceGetTopologyCommonAncestor", 6, pynvml.NVML_ERROR_UNKNOWN)
    output = tmp_path / "node.json"
    assert capture.main(["--output", str(output)], nvml=nvml) == 0
    assert "GPUs 6 and 7: nvmlDeviceGetTopologyCommonAncestor: Unknown Error" in (
        capsys.readouterr().err
    )
    assert len(load_recording(output).topology) == 27


def test_capture_writes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert capture.main([], nvml=FakeNvml.from_fixture()) == 0
    recording = decode_recording(capsys.readouterr().out.encode())
    assert len(recording.devices) == 8


def test_capture_records_a_failing_card(capsys: pytest.CaptureFixture[str]) -> None:
    nvml = FakeNvml.from_fixture()
    nvml.fail("nvmlDeviceGetUUID", 3, pynvml.NVML_ERROR_GPU_IS_LOST)
    assert capture.main([], nvml=nvml) == 0
    recording = decode_recording(capsys.readouterr().out.encode())
    assert recording.devices[3].uuid is None
    assert recording.devices[3].error == "NVML nvmlDeviceGetUUID: GPU is lost"
    assert not FixtureBackend(recording).read_cards()[3].healthy


def test_capture_without_nvml_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    nvml = FakeNvml.from_fixture()
    nvml.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert capture.main([], nvml=nvml) == 1
    assert "capture: NVML could not initialise: NVML Shared Library Not Found" in (
        capsys.readouterr().err
    )
