"""A node replayed from a recording of what NVML returned (see :mod:`.recording`).

Useful to run the whole system against a real machine's inventory (eight H100s, a card
that had failed) without that machine. The recording goes through the same conversion a
live NVML node does; health can be flipped by hand as on a simulated node.
"""

from __future__ import annotations

from pathlib import Path

from gpushare.core.model import Card
from gpushare.reporter.backends import InventorySource
from gpushare.reporter.health import HealthEvent, HealthMarks
from gpushare.reporter.recording import NvmlRecording, card_from_record, load_recording


class FixtureBackend:
    """The cards and driver version of one recording."""

    def __init__(self, recording: NvmlRecording) -> None:
        self.recording = recording
        self._cards = tuple(
            card_from_record(device)
            for device in sorted(recording.devices, key=lambda device: device.index)
        )
        self._marks = HealthMarks()

    @classmethod
    def from_file(cls, path: Path) -> FixtureBackend:
        """Raises :class:`~gpushare.reporter.recording.RecordingError` naming the problem."""
        return cls(load_recording(path))

    @property
    def source(self) -> InventorySource:
        return "fixture"

    def driver_version(self) -> str:
        return self.recording.driver_version

    def read_cards(self) -> tuple[Card, ...]:
        return self._marks.apply(self._cards)

    def mark_unhealthy(self, uuid: str, reason: str) -> None:
        self._marks.record(HealthEvent(card_uuid=uuid, healthy=False, reason=reason))

    def mark_healthy(self, uuid: str) -> None:
        self._marks.record(HealthEvent(card_uuid=uuid, healthy=True))

    def poll_health_events(self, timeout: float) -> list[HealthEvent]:
        return self._marks.wait_for_events(timeout)

    def close(self) -> None:
        self._marks.close()
