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
    VKE_ASSUMED,
    AllocationAnnotation,
    asked_resources,
    asks_mgpu,
    binding_annotations,
    current_annotations,
    moved_annotations,
    read_allocation,
)
from gpushare.core.events import (
    AllocationCorrected,
    AllocationEvent,
    ContainerAssigned,
    PodBound,
    PodReserved,
)
from gpushare.core.koordinator import DEVICE_ALLOCATED
from gpushare.core.model import ContainerShare
from gpushare.core.placement import reserve
from gpushare.core.pods import pod_from_dict
from gpushare.core.state import ClusterState, PodAllocation
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


KOORDINATOR = (
    '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-memory":"5Gi",'
    '"koordinator.sh/gpu-memory-ratio":"31"}}]}'
)
"""Koordinator's view of the seed reservation: the pod's 5120 MiB on card 1 (the init
container's 4096 runs before the apps' 2048 + 3072), 31 % of 16276 MiB, in bytes whatever
the unit."""


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
        DEVICE_ALLOCATED: KOORDINATOR,
        "gpushare.io/gpu-index-container-init0": "1",
        "gpushare.io/gpu-index-container-c0": "1",
        "gpushare.io/gpu-index-container-c1": "1",
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
            "sidecar": False,
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


def on(
    container: str, *cards: tuple[int, int], core: int = 0, init: bool = False
) -> list[ContainerShare]:
    """One share per ``(card index, MiB)`` of ``container``, in that order."""
    return [
        ContainerShare(
            container=container,
            card_index=index,
            card_uuid=f"GPU-N1-{index}",
            memory_mib=mib,
            core_percent=core,
            init=init,
        )
        for index, mib in cards
    ]


def reserved(*shares: list[ContainerShare]) -> PodReserved:
    return PodReserved(
        id="reserve-p1-N1",
        at=T0,
        node="N1",
        pod=pod_ref("p1"),
        shares=tuple(share for group in shares for share in group),
    )


INDEX = "gpushare.io/gpu-index-container-"
VKE_INDEX = "vke.volcengine.com/gpu-index-container-"

CARD_LISTS = {
    "aliyun, one card: one key per container": (
        reserved(on("c0", (1, 2048)), on("c1", (1, 3072))),
        False,
        {f"{INDEX}c0": "1", f"{INDEX}c1": "1"},
    ),
    "a container on three cards, in share order": (
        reserved(on("train", (1, 5000), (0, 5000), (3, 5000), core=33)),
        False,
        {f"{INDEX}train": "1,0,3"},
    ),
    "init container too": (
        reserved(on("setup", (2, 1024), init=True), on("app", (2, 4096), (3, 4096))),
        False,
        {f"{INDEX}setup": "2", f"{INDEX}app": "2,3"},
    ),
    "whole cards": (
        reserved(on("c", (0, V100), (1, V100), core=100)),
        False,
        {f"{INDEX}c": "0,1"},
    ),
    "vke pod (seed 003): also vke's keys and assumed": (
        reserved(on("c1", (1, 4000), core=50), on("c2", (2, 2000), (3, 2000), core=25)),
        True,
        {
            f"{INDEX}c1": "1",
            f"{INDEX}c2": "2,3",
            f"{VKE_INDEX}c1": "1",
            f"{VKE_INDEX}c2": "2,3",
            VKE_ASSUMED: "true",
        },
    ),
    "a container name too long for a key: only the allocation JSON has it": (
        reserved(on("x" * 44, (0, 1024)), on("y" * 43, (1, 1024))),
        True,
        {f"{INDEX}{'y' * 43}": "1", f"{VKE_INDEX}{'y' * 43}": "1", VKE_ASSUMED: "true"},
    ),
}


@pytest.mark.parametrize(
    ("reservation", "mgpu", "expected"), CARD_LISTS.values(), ids=CARD_LISTS.keys()
)
def test_per_container_card_lists(
    reservation: PodReserved, mgpu: bool, expected: dict[str, str]
) -> None:
    annotations = binding_annotations(reservation, V100, "MiB", mgpu=mgpu)
    lists = {
        key: value
        for key, value in annotations.items()
        if key.startswith((INDEX, VKE_INDEX)) or key == VKE_ASSUMED
    }
    assert lists == expected
    for key in annotations:
        assert len(key.rpartition("/")[2]) <= 63


def test_a_multi_card_pod_keeps_the_aliyun_keys_of_its_first_card() -> None:
    reservation = reserved(on("c", (1, 5000), (0, 5000), core=50))
    annotations = binding_annotations(reservation, V100, "MiB")
    assert (annotations[IDX], annotations[POD], annotations[DEV]) == ("1", "10000", str(V100))
    allocation = read_allocation(annotations)
    assert allocation is not None
    assert [s.card_index for s in allocation.containers["c"]] == [1, 0]


def pod_asking(
    containers: dict[str, dict[str, str]], init: dict[str, dict[str, str]] | None = None
) -> dict[str, object]:
    def spec(name: str, limits: dict[str, str]) -> dict[str, object]:
        return {"name": name, "resources": {"limits": limits}}

    return {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {
            "containers": [spec(n, r) for n, r in containers.items()],
            "initContainers": [spec(n, r) for n, r in (init or {}).items()],
        },
    }


ASKED = {
    "aliyun": (
        pod_asking({"a": {"aliyun.com/gpu-mem": "1024", "cpu": "1"}, "b": {"cpu": "1"}}),
        {"a": ("aliyun.com/gpu-mem",)},
        False,
    ),
    "gpushare core and ratio, init container": (
        pod_asking(
            {"a": {"gpushare.io/gpu-core": "50", "gpushare.io/gpu-memory-ratio": "50"}},
            init={"i": {"nvidia.com/gpu": "1"}},
        ),
        {"i": ("nvidia.com/gpu",), "a": ("gpushare.io/gpu-core", "gpushare.io/gpu-memory-ratio")},
        False,
    ),
    "vke": (
        pod_asking({"a": {"vke.volcengine.com/mgpu-core": "50"}, "b": {"cpu": "1"}}),
        {"a": ("vke.volcengine.com/mgpu-core",)},
        True,
    ),
    "no GPU at all": (pod_asking({"a": {"cpu": "1"}}), {}, False),
}


@pytest.mark.parametrize(("raw", "names", "mgpu"), ASKED.values(), ids=ASKED.keys())
def test_asked_resources(
    raw: dict[str, object], names: dict[str, tuple[str, ...]], mgpu: bool
) -> None:
    asked = asked_resources(pod_from_dict(raw))
    assert asked == names
    assert asks_mgpu(asked) is mgpu


def test_requests_without_limits_count_too() -> None:
    raw = pod_asking({})
    raw["spec"] = {
        "containers": [{"name": "a", "resources": {"requests": {"gpushare.io/gpu": "30"}}}]
    }
    assert asked_resources(pod_from_dict(raw)) == {"a": ("gpushare.io/gpu",)}


# --- rewrites after the log moved a pod ---------------------------------------------------


def fold_of(reservation: PodReserved, *later: AllocationEvent) -> PodAllocation:
    state = ClusterState()
    for seq, event in enumerate((reservation, *later), start=1):
        state.apply(event, seq)
    allocation = state.allocation(reservation.pod.uid)
    assert allocation is not None
    return allocation


def bound_event(reservation: PodReserved) -> PodBound:
    return PodBound(id="b", at=T0, node="N1", pod=reservation.pod, reservation_id=reservation.id)


def moved_event(reservation: PodReserved, *shares: list[ContainerShare]) -> AllocationCorrected:
    return AllocationCorrected(
        id="m",
        at=T0,
        node="N1",
        pod=reservation.pod,
        reservation_id=reservation.id,
        shares=tuple(share for group in shares for share in group),
        reason="pod-resources",
    )


def assigned_event(reservation: PodReserved, container: str) -> ContainerAssigned:
    return ContainerAssigned(
        id=f"a-{container}",
        at=T0,
        node="N1",
        pod=reservation.pod,
        reservation_id=reservation.id,
        container=container,
        card_uuids=("GPU-N1-0",),
    )


SWAPPED = reserved(on("c0", (1, 2048)), on("c1", (2, 3072)))
MOVED_SHARES = (on("c0", (0, 2048)), on("c1", (3, 3072)))


@pytest.mark.parametrize("mgpu", [False, True])
def test_a_moved_pod_gets_the_binding_keys_of_its_new_cards(mgpu: bool) -> None:
    allocation = fold_of(SWAPPED, bound_event(SWAPPED), moved_event(SWAPPED, *MOVED_SHARES))
    patch = moved_annotations(allocation, "N1", V100, "MiB", mgpu=mgpu)
    as_bound_there = binding_annotations(SWAPPED, V100, "MiB", mgpu=mgpu, shares=allocation.shares)
    # the builder's keys, less the assume time and ASSIGNED (not every container assigned)
    assert patch == {k: v for k, v in as_bound_there.items() if k not in {ASSUME_TIME, ASSIGNED}}
    assert (patch[IDX], patch[f"{INDEX}c0"], patch[f"{INDEX}c1"]) == ("0", "0", "3")
    if mgpu:
        assert patch[f"{VKE_INDEX}c1"] == "3"
    document = read_allocation(patch)
    assert document is not None
    assert [s.card_index for group in document.containers.values() for s in group] == [0, 3]


def test_a_moved_pod_already_assigned_keeps_assigned_true() -> None:
    allocation = fold_of(
        SWAPPED,
        bound_event(SWAPPED),
        assigned_event(SWAPPED, "c0"),
        assigned_event(SWAPPED, "c1"),
        moved_event(SWAPPED, *MOVED_SHARES),
    )
    patch = moved_annotations(allocation, "N1", V100, "MiB", mgpu=False)
    assert patch[ASSIGNED] == "true"
    assert ASSUME_TIME not in patch


def test_current_annotations_leave_out_an_unknown_card_size() -> None:
    allocation = fold_of(SWAPPED, bound_event(SWAPPED))
    known = current_annotations(allocation, "N1", V100, "MiB", mgpu=False)
    assert known[DEV] == str(V100)
    assert known[ASSIGNED] == "false"
    assert known[ASSUME_TIME] == binding_annotations(SWAPPED, V100, "MiB")[ASSUME_TIME]
    assert DEV not in current_annotations(allocation, "N1", 0, "MiB", mgpu=False)
    assert DEV not in moved_annotations(allocation, "N1", 0, "MiB", mgpu=False)
