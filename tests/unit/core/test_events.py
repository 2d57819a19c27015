"""Events on the wire: round trips, tolerance of newer writers, and rejection of garbage."""

from __future__ import annotations

import json

import msgspec
import pytest

from gpushare.core.events import (
    ALL_DECISION_TYPES,
    ALL_EVENT_TYPES,
    SCHEMA_VERSION,
    AllocationCorrected,
    AnyDecision,
    AnyEvent,
    BindFailed,
    ClaimAllocated,
    ClaimReleased,
    ClaimShare,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    ForeignHold,
    InventoryReported,
    NodesFiltered,
    NodesScored,
    PodBound,
    PodReleased,
    PodReserved,
    decode_decision,
    decode_event,
    encode_decision,
    encode_event,
)
from gpushare.core.model import ClaimRef, ContainerShare
from tests.unit.core.factories import T0, later, make_card, pod_ref

POD = pod_ref("uid-1")
SHARE = ContainerShare(container="c0", card_index=1, card_uuid="GPU-n-1", memory_mib=4069)
CLAIM = ClaimRef(namespace="a", name="b-gpu", uid="claim-uid")
EXAMPLES: dict[type, AnyEvent] = {
    InventoryReported: InventoryReported(
        id="inv-1",
        at=T0,
        node="n",
        cards=(make_card(0), make_card(1, healthy=False, health_reason="XID 79")),
        source="nvml",
        heartbeat_seconds=10.0,
        driver_version="550.54.15",
    ),
    PodReserved: PodReserved(
        id="r-1",
        at=T0,
        node="n",
        pod=POD,
        shares=(
            SHARE,
            ContainerShare(
                container="i", card_index=1, card_uuid="GPU-n-1", memory_mib=8138, init=True
            ),
        ),
        pod_created_at=later(-5),
        reserved_by="allocator-0",
    ),
    PodBound: PodBound(id="b-1", at=later(1), node="n", pod=POD, reservation_id="r-1"),
    BindFailed: BindFailed(
        id="f-1", at=later(1), node="n", pod=POD, reservation_id="r-1", reason="409 elsewhere"
    ),
    ContainerAssigned: ContainerAssigned(
        id="a-1",
        at=later(2),
        node="n",
        pod=POD,
        reservation_id="r-1",
        container="c0",
        card_uuids=("GPU-n-1",),
        device_ids=("n-1-0", "n-1-1"),
    ),
    PodReleased: PodReleased(
        id="x-1",
        at=later(3),
        node="n",
        pod=POD,
        reservation_id="r-1",
        reason="deleted",
        detail="pod deleted",
    ),
    AllocationCorrected: AllocationCorrected(
        id="c-1",
        at=later(4),
        node="n",
        pod=POD,
        reservation_id="r-1",
        shares=(
            ContainerShare(container="c0", card_index=0, card_uuid="GPU-n-0", memory_mib=4069),
        ),
        reason="the kubelet handed c0 card 0",
    ),
    ForeignCardsHeld: ForeignCardsHeld(
        id="h-1",
        at=later(5),
        node="n",
        holds=(ForeignHold(card_uuid="GPU-n-0", resource="nvidia.com/gpu", pods=("a/b",)),),
    ),
    DiscrepancyFound: DiscrepancyFound(
        id="d-1",
        at=later(6),
        node="n",
        kind="unknown_to_log",
        detail="a/b holds n-1-0 but the log has no reservation for it",
        pod=POD,
        reporter="node-agent-n",
    ),
    ClaimAllocated: ClaimAllocated(
        id="claim-1",
        at=later(7),
        node="n",
        claim=CLAIM,
        shares=(
            ClaimShare(
                request="gpu",
                device="gpu-0",
                card_index=0,
                card_uuid="GPU-n-0",
                memory_mib=4096,
                core_percent=20,
                share_id="6f1c",
            ),
        ),
        pods=(POD,),
    ),
    ClaimReleased: ClaimReleased(
        id="claim-1-released",
        at=later(8),
        node="n",
        claim=CLAIM,
        allocation_id="claim-1",
        reason="deleted",
        pods=(POD,),
    ),
}

DECISIONS: dict[type, AnyDecision] = {
    NodesFiltered: NodesFiltered(
        id="filter-1",
        at=T0,
        pod=POD,
        allocator="allocator-0",
        request="1 container: 4069 MiB",
        passed=("n",),
        failed={"m": "no card has 4069 MiB free"},
    ),
    NodesScored: NodesScored(
        id="score-1", at=T0, pod=POD, allocator="allocator-0", policy="binpack", scores={"n": 7}
    ),
}


def test_decision_records_round_trip() -> None:
    assert set(DECISIONS) == set(ALL_DECISION_TYPES)
    for decision in DECISIONS.values():
        assert decode_decision(encode_decision(decision)) == decision
    with pytest.raises(msgspec.ValidationError):
        decode_decision(encode_event(EXAMPLES[PodBound]))


def test_examples_cover_every_event_type() -> None:
    assert set(EXAMPLES) == set(ALL_EVENT_TYPES)


@pytest.mark.parametrize("event", EXAMPLES.values(), ids=lambda e: type(e).__name__)
def test_round_trip(event: AnyEvent) -> None:
    data = encode_event(event)
    assert json.loads(data)["type"] == type(event).__name__
    assert json.loads(data)["version"] == SCHEMA_VERSION
    decoded = decode_event(data)
    assert type(decoded) is type(event)
    assert decoded == event


@pytest.mark.parametrize("event", EXAMPLES.values(), ids=lambda e: type(e).__name__)
def test_unknown_fields_from_newer_writers_are_ignored(event: AnyEvent) -> None:
    raw = json.loads(encode_event(event))
    raw["added_in_v2"] = {"anything": [1, 2, 3]}
    raw["version"] = 2
    nested = next(key for key in ("pod", "cards", "holds", "claim") if key in raw)
    raw[nested] = _with_extra(raw[nested])
    decoded = decode_event(json.dumps(raw).encode())
    assert decoded == msgspec.structs.replace(event, version=2)


def _with_extra(value: object) -> object:
    if isinstance(value, dict):
        return {**value, "nested_extra": True}
    assert isinstance(value, list)
    return [{**item, "nested_extra": True} for item in value]


def test_defaults_fill_fields_older_writers_left_out() -> None:
    raw = {
        "type": "PodReserved",
        "id": "r-old",
        "at": "2026-01-01T12:00:00Z",
        "node": "n",
        "pod": {"namespace": "default", "name": "p", "uid": "u"},
        "shares": [{"container": "c", "card_index": 0, "card_uuid": "G", "memory_mib": 1}],
    }
    decoded = decode_event(json.dumps(raw).encode())
    assert isinstance(decoded, PodReserved)
    assert decoded.version == SCHEMA_VERSION
    assert decoded.policy == "binpack"
    assert decoded.pod_created_at is None
    assert decoded.shares[0].init is False


def _event_json(**changes: object) -> bytes:
    raw = json.loads(encode_event(EXAMPLES[PodBound]))
    raw.update(changes)
    return json.dumps({k: v for k, v in raw.items() if v is not None}).encode()


@pytest.mark.parametrize(
    ("data", "error"),
    [
        pytest.param(_event_json(type="PodExploded"), msgspec.ValidationError, id="unknown-tag"),
        pytest.param(_event_json(type=None), msgspec.ValidationError, id="no-tag"),
        pytest.param(
            _event_json(type="PodReserved"), msgspec.ValidationError, id="tag-of-another-type"
        ),
        pytest.param(_event_json(reservation_id=None), msgspec.ValidationError, id="missing-field"),
        pytest.param(_event_json(at="yesterday"), msgspec.ValidationError, id="bad-datetime"),
        pytest.param(
            _event_json(type="PodReleased", reason="evicted"),
            msgspec.ValidationError,
            id="release-reason-not-in-the-list",
        ),
        pytest.param(b'{"type": "PodBound", ', msgspec.DecodeError, id="truncated-json"),
        pytest.param(b"", msgspec.DecodeError, id="empty"),
        pytest.param(b"[1, 2]", msgspec.ValidationError, id="not-an-object"),
    ],
)
def test_bad_input_raises_msgspec_errors(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_event(data)
