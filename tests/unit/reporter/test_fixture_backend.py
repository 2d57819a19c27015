"""Recordings of NVML: reading them as cards, replaying them, and capturing new ones."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from gpushare.reporter import capture
from gpushare.reporter.fixture import FixtureBackend
from gpushare.reporter.nvml import NvmlBackend
from gpushare.reporter.recording import (
    RecordingError,
    decode_recording,
    encode_recording,
    load_recording,
)
from tests.unit.reporter.fakes import H100_FIXTURE, FakeNvml


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


def test_the_committed_fixture_is_in_canonical_form() -> None:
    assert encode_recording(load_recording(H100_FIXTURE)) == H100_FIXTURE.read_bytes()


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
