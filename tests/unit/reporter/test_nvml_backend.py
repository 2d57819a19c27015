"""NvmlBackend against a fake pynvml that replays the 8 x H100 recording."""

from __future__ import annotations

import pynvml
import pytest

from gpushare.reporter.health import ALL_CARDS, HealthEvent
from gpushare.reporter.nvml import APPLICATION_XIDS, NvmlBackend, NvmlUnavailable
from gpushare.reporter.recording import load_recording, placeholder_uuid
from tests.unit.reporter.fakes import H100_FIXTURE, FakeNvml

H100 = load_recording(H100_FIXTURE)
UUIDS = [device.uuid for device in H100.devices]


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml(H100)


def open_backend(nvml: FakeNvml) -> NvmlBackend:
    return NvmlBackend.open(nvml)


def test_reads_every_card_as_nvml_reports_it(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    cards = backend.read_cards()
    assert [card.index for card in cards] == list(range(8))
    assert [card.uuid for card in cards] == UUIDS
    assert {card.model for card in cards} == {"NVIDIA H100 80GB HBM3"}
    assert {card.memory_mib for card in cards} == {81559}  # 85520809984 bytes // 2**20
    assert all(card.healthy and card.health_reason == "" for card in cards)
    assert backend.driver_version() == "550.90.07"
    assert backend.source == "nvml"


def test_watches_xid_critical_errors_on_every_card(nvml: FakeNvml) -> None:
    open_backend(nvml)
    assert nvml.registered == [(index, pynvml.nvmlEventTypeXidCriticalError) for index in range(8)]


def test_critical_xid_marks_that_card_unhealthy(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    nvml.queue_xid(3, 79)
    events = backend.poll_health_events(timeout=5)
    assert events == [HealthEvent(card_uuid=UUIDS[3], healthy=False, reason="XID 79")]
    cards = backend.read_cards()
    assert [card.index for card in cards if not card.healthy] == [3]
    assert cards[3].health_reason == "XID 79"


def test_an_xid_mark_stays_after_later_polls(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    nvml.queue_xid(1, 48)
    backend.poll_health_events(timeout=5)
    assert backend.poll_health_events(timeout=0) == []
    assert backend.read_cards()[1].health_reason == "XID 48"


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_leave_the_card_healthy(nvml: FakeNvml, xid: int) -> None:
    backend = open_backend(nvml)
    nvml.queue_xid(0, xid)
    assert backend.poll_health_events(timeout=0) == []
    assert all(card.healthy for card in backend.read_cards())


def test_the_ignored_xids_are_nvidias_application_errors() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == APPLICATION_XIDS


def test_events_other_than_xid_are_ignored(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    nvml.queue_xid(0, 79, event_type=pynvml.nvmlEventTypeSingleBitEccError)
    assert backend.poll_health_events(timeout=0) == []
    assert all(card.healthy for card in backend.read_cards())


def test_an_xid_without_a_device_marks_every_card(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    nvml.queue_xid(None, 79)
    assert backend.poll_health_events(timeout=5) == [
        HealthEvent(card_uuid=ALL_CARDS, healthy=False, reason="XID 79")
    ]
    assert {(card.healthy, card.health_reason) for card in backend.read_cards()} == {
        (False, "XID 79")
    }


def test_an_xid_whose_device_cannot_be_named_marks_every_card(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    nvml.fail("nvmlDeviceGetUUID", 5, pynvml.NVML_ERROR_GPU_IS_LOST)
    nvml.queue_xid(5, 79)
    assert backend.poll_health_events(timeout=5)[0].card_uuid is ALL_CARDS


def test_one_poll_drains_every_queued_event(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    nvml.queue_xid(0, 79)
    nvml.queue_xid(1, 31)
    nvml.queue_xid(2, 94)
    events = backend.poll_health_events(timeout=5)
    assert [(event.card_uuid, event.reason) for event in events] == [
        (UUIDS[0], "XID 79"),
        (UUIDS[2], "XID 94"),
    ]


def test_a_card_that_fails_a_query_is_unhealthy_not_a_crash(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    nvml.fail("nvmlDeviceGetMemoryInfo", 2, pynvml.NVML_ERROR_GPU_IS_LOST)
    cards = backend.read_cards()
    assert len(cards) == 8
    assert [card.index for card in cards if not card.healthy] == [2]
    assert cards[2].uuid == UUIDS[2]
    assert cards[2].health_reason == "NVML nvmlDeviceGetMemoryInfo: GPU is lost"


def test_a_card_with_no_handle_keeps_its_last_known_identity(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    good = backend.read_cards()
    nvml.fail("nvmlDeviceGetHandleByIndex", 6, pynvml.NVML_ERROR_UNKNOWN)
    card = backend.read_cards()[6]
    assert (card.uuid, card.model, card.memory_mib) == (good[6].uuid, good[6].model, 81559)
    assert not card.healthy
    assert "nvmlDeviceGetHandleByIndex" in card.health_reason


def test_a_card_never_read_gets_a_placeholder_that_is_not_a_gpu_uuid(nvml: FakeNvml) -> None:
    nvml.fail("nvmlDeviceGetHandleByIndex", 7, pynvml.NVML_ERROR_UNKNOWN)
    card = open_backend(nvml).read_cards()[7]
    assert card.uuid == placeholder_uuid(7)
    assert not card.uuid.startswith("GPU-")
    assert (card.healthy, card.memory_mib) == (False, 0)


def test_a_failed_count_reports_the_known_cards_unhealthy(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    backend.read_cards()
    nvml.fail("nvmlDeviceGetCount", None, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    cards = backend.read_cards()
    assert [card.uuid for card in cards] == UUIDS
    assert not any(card.healthy for card in cards)
    assert "nvmlDeviceGetCount" in cards[0].health_reason


def test_a_card_recovers_when_its_queries_work_again(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    nvml.fail("nvmlDeviceGetName", 4, pynvml.NVML_ERROR_UNKNOWN)
    assert not backend.read_cards()[4].healthy
    nvml.failures.clear()
    assert backend.read_cards()[4].healthy


def test_init_failure_is_a_clear_error() -> None:
    nvml = FakeNvml(H100, init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(NvmlUnavailable, match="NVML could not initialise: NVML Shared Library"):
        NvmlBackend.open(nvml)


def test_a_card_without_xid_events_stays_in_service(nvml: FakeNvml) -> None:
    nvml.fail("nvmlDeviceRegisterEvents", 0, pynvml.NVML_ERROR_NOT_SUPPORTED)
    backend = open_backend(nvml)
    assert backend.poll_health_events(timeout=0) == []
    assert all(card.healthy for card in backend.read_cards())


def test_a_card_whose_events_cannot_be_registered_is_unhealthy(nvml: FakeNvml) -> None:
    nvml.fail("nvmlDeviceRegisterEvents", 1, pynvml.NVML_ERROR_GPU_IS_LOST)
    backend = open_backend(nvml)
    cards = backend.read_cards()
    assert [card.index for card in cards if not card.healthy] == [1]
    assert cards[1].health_reason == "NVML: cannot watch XID events: GPU is lost"
    assert backend.poll_health_events(timeout=0)[0].card_uuid == UUIDS[1]


def test_without_an_event_set_cards_are_still_reported(nvml: FakeNvml) -> None:
    nvml.fail("nvmlEventSetCreate", None, pynvml.NVML_ERROR_NOT_SUPPORTED)
    backend = open_backend(nvml)
    assert backend.poll_health_events(timeout=0) == []
    assert len(backend.read_cards()) == 8
    assert "nvmlEventSetWait_v2" not in nvml.calls


def test_a_failing_wait_marks_every_card_and_stops_waiting(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    nvml.fail("nvmlEventSetWait_v2", None, pynvml.NVML_ERROR_UNKNOWN)
    events = backend.poll_health_events(timeout=0)
    assert [event.card_uuid for event in events] == [ALL_CARDS]
    assert nvml.event_sets_freed == 1
    assert not any(card.healthy for card in backend.read_cards())
    waits = nvml.calls.count("nvmlEventSetWait_v2")
    backend.poll_health_events(timeout=0)
    assert nvml.calls.count("nvmlEventSetWait_v2") == waits


def test_close_frees_the_event_set_and_shuts_nvml_down_once(nvml: FakeNvml) -> None:
    backend = open_backend(nvml)
    assert nvml.initialised
    backend.close()
    backend.close()
    assert nvml.event_sets_freed == 1
    assert not nvml.initialised
    assert backend.poll_health_events(timeout=5) == []
