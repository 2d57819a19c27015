"""The binding's annotations, written and read back."""

from __future__ import annotations

import json

import pytest

from gpushare.core.annotations import (
    ALLOCATION,
    ASSIGNED,
    ASSUME_TIME,
    DEV,
    IDX,
    POD,
    RESERVATION,
    AllocationAnnotation,
    binding_annotations,
    read_allocation,
)
from gpushare.core.events import PodReserved
from gpushare.core.placement import reserve
from tests.unit.core.factories import T0, V100, node_with_usage, pod_ref, request_of

NODE = node_with_usage("N1", [(V100, 4069), (V100, 8138), (V100, 12207), (V100, 0)])


def seed_reservation() -> PodReserved:
    event = reserve(
        NODE,
        pod_ref("p1"),
        request_of(2048, 3072, init=[4096]),
        reservation_id="reserve-p1-N1",
        at=T0,
    )
    assert event is not None
    return event


@pytest.mark.parametrize(
    ("unit", "pod", "dev"),
    [
        pytest.param("MiB", "5120", "16276", id="MiB"),
        pytest.param("GiB", "5", "15", id="GiB-rounds-down"),
    ],
)
def test_binding_annotations(unit: str, pod: str, dev: str) -> None:
    reservation = seed_reservation()
    annotations = binding_annotations(reservation, V100, unit)
    assert {k: v for k, v in annotations.items() if k != ALLOCATION} == {
        IDX: "1",
        POD: pod,
        DEV: dev,
        ASSUME_TIME: str(int(T0.timestamp()) * 1_000_000_000),
        ASSIGNED: "false",
        RESERVATION: "reserve-p1-N1",
    }
    document = json.loads(annotations[ALLOCATION])
    assert document["unit"] == unit
    assert document["node"] == "N1"
    assert sorted(document["containers"]) == ["c0", "c1", "init0"]
    assert document["containers"]["c1"] == [
        {
            "container": "c1",
            "card_index": 1,
            "card_uuid": "GPU-N1-1",
            "memory_mib": 3072,
            "core_percent": 0,
            "init": False,
        }
    ]


@pytest.mark.parametrize("unit", ["MiB", "GiB"])
def test_allocation_round_trip(unit: str) -> None:
    reservation = seed_reservation()
    allocation = read_allocation(binding_annotations(reservation, V100, unit))
    assert allocation == AllocationAnnotation(
        node="N1",
        reservation="reserve-p1-N1",
        unit=unit,
        containers={share.container: [share] for share in reservation.shares},
    )


def test_assume_time_keeps_microseconds() -> None:
    reservation = seed_reservation()
    at = T0.replace(microsecond=123456)
    moved = PodReserved(
        id=reservation.id, at=at, node="N1", pod=reservation.pod, shares=reservation.shares
    )
    nanos = int(binding_annotations(moved, V100, "MiB")[ASSUME_TIME])
    assert nanos == int(T0.timestamp()) * 1_000_000_000 + 123_456_000


@pytest.mark.parametrize(
    "annotations",
    [
        pytest.param({}, id="none"),
        pytest.param({IDX: "1"}, id="only-legacy-keys"),
        pytest.param({ALLOCATION: "{not json"}, id="malformed-json"),
        pytest.param({ALLOCATION: '{"node": "N1"}'}, id="missing-fields"),
        pytest.param({ALLOCATION: "[]"}, id="wrong-shape"),
    ],
)
def test_read_allocation_without_a_readable_allocation(annotations: dict[str, str]) -> None:
    assert read_allocation(annotations) is None


def test_read_allocation_ignores_fields_from_newer_writers() -> None:
    raw = json.loads(binding_annotations(seed_reservation(), V100, "MiB")[ALLOCATION])
    raw["policy"] = "spread"
    raw["containers"]["c0"][0]["mig"] = "1g.5gb"
    allocation = read_allocation({ALLOCATION: json.dumps(raw)})
    assert allocation is not None
    assert allocation.containers["c0"][0].memory_mib == 2048
