"""A node replayed from a recording of what NVML returned (see :mod:`.recording`).

Useful to run the whole system against a real machine's inventory (eight H100s, a card
that had failed, an NVLink mesh) without that machine. The recording goes through the same
conversion a live NVML node does, links included; health can be flipped by hand as on a
simulated node. Under ``--mps auto`` the recorded evidence decides MPS (the pipe seen at
capture, the cards' compute modes), not this machine's.
"""

from __future__ import annotations

from pathlib import Path

from gpushare.core.model import Card, CardLink
from gpushare.reporter.backends import InventorySource
from gpushare.reporter.health import HealthEvent, HealthMarks
from gpushare.reporter.mps import DEFAULT_MPS_MODE, MpsMode, decide_mps
from gpushare.reporter.recording import NvmlRecording, card_from_record, load_recording
from gpushare.reporter.topology import links_from_records


class FixtureBackend:
    """The cards, links, MPS and driver version of one recording."""

    def __init__(self, recording: NvmlRecording, *, mps: MpsMode = DEFAULT_MPS_MODE) -> None:
        self.recording = recording
        devices = sorted(recording.devices, key=lambda device: device.index)
        self._cards = tuple(card_from_record(device) for device in devices)
        self._links = links_from_records(devices, recording.topology)
        self._mps = decide_mps(
            mps,
            control_pipe=recording.mps_control_pipe,
            compute_modes=(device.compute_mode for device in devices),
        )
        self._marks = HealthMarks()

    @classmethod
    def from_file(cls, path: Path, *, mps: MpsMode = DEFAULT_MPS_MODE) -> FixtureBackend:
        """Raises :class:`~gpushare.reporter.recording.RecordingError` naming the problem."""
        return cls(load_recording(path), mps=mps)

    @property
    def source(self) -> InventorySource:
        return "fixture"

    def driver_version(self) -> str:
        return self.recording.driver_version

    def read_cards(self) -> tuple[Card, ...]:
        return self._marks.apply(self._cards)

    def read_links(self) -> tuple[CardLink, ...]:
        return self._links

    def mps_enabled(self) -> bool:
        return self._mps

    def mark_unhealthy(self, uuid: str, reason: str) -> None:
        self._marks.record(HealthEvent(card_uuid=uuid, healthy=False, reason=reason))

    def mark_healthy(self, uuid: str) -> None:
        self._marks.record(HealthEvent(card_uuid=uuid, healthy=True))

    def poll_health_events(self, timeout: float) -> list[HealthEvent]:
        return self._marks.wait_for_events(timeout)

    def close(self) -> None:
        self._marks.close()
