"""Malformed events and annotations: decoding refuses them with msgspec errors only, and
whatever does decode can be folded, so one bad message never stops a consumer.

The consumers' contract (:mod:`gpushare.bus.follow`, :mod:`gpushare.binder.binding`) is
that ``decode_event`` raises :class:`msgspec.MsgspecError` for a message to skip or
terminate; anything else it raised would escape their handlers. And an event that
decodes must fold, or it poisons every replay of the log after it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpushare.core.annotations import ALLOCATION, AllocationAnnotation, read_allocation
from gpushare.core.events import (
    AllocationCorrected,
    AnyEvent,
    BindFailed,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    ForeignHold,
    InventoryReported,
    PodBound,
    PodReleased,
    PodReserved,
    decode_event,
    encode_event,
)
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.state import ClusterState, fold_events
from tests.fuzz.bodies import mutated, non_json
from tests.fuzz.generation import from_schema
from tests.fuzz.schemas import wire_schema

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NODE = "n"
POD = PodRef(namespace="ns", name="p", uid="uid-p")
SHARE = ContainerShare(container="main", card_index=0, card_uuid="GPU-0", memory_mib=1024)
CARD = Card(index=0, uuid="GPU-0", model="Tesla T4", memory_mib=15360)
COMMON: dict[str, Any] = {"at": AT, "node": NODE}
ABOUT_POD: dict[str, Any] = {**COMMON, "pod": POD, "reservation_id": "r1"}
VALID: tuple[AnyEvent, ...] = (
    InventoryReported(id="i1", **COMMON, cards=(CARD,), source="fixture", heartbeat_seconds=5.0),
    PodReserved(id="r1", **COMMON, pod=POD, shares=(SHARE,), pod_created_at=AT),
    PodBound(id="b1", **ABOUT_POD, resources={"main": ("aliyun.com/gpu-mem",)}),
    ContainerAssigned(id="a1", **ABOUT_POD, container="main", card_uuids=("GPU-0",)),
    AllocationCorrected(id="c1", **ABOUT_POD, shares=(SHARE,), reason="kubelet"),
    ForeignCardsHeld(id="f1", **COMMON, holds=(ForeignHold(card_uuid="GPU-0", resource="x"),)),
    DiscrepancyFound(id="d1", **COMMON, kind="card_mismatch", detail="?", pod=POD),
    PodReleased(id="x1", **ABOUT_POD, reason="deleted"),
    BindFailed(id="e1", **ABOUT_POD, reason="409"),
)
"""One valid event of each type, about one pod on one card."""
LOG = [(seq, event) for seq, event in enumerate(VALID[:2], start=1)]
"""A node with its inventory and one reservation: what a bad event is folded onto."""

timestamps = st.one_of(
    st.datetimes().map(datetime.isoformat),  # no offset: naive
    st.datetimes(timezones=st.just(UTC)).map(datetime.isoformat),
    st.builds(
        lambda at, minutes: at.replace(tzinfo=timezone(timedelta(minutes=minutes))).isoformat(),
        st.datetimes(),
        st.integers(-1439, 1439),
    ),
)
"""Every kind of RFC 3339-like timestamp msgspec decodes: naive, UTC, any offset."""


@st.composite
def mutated_events(draw: st.DrawFn) -> bytes:
    """A valid event's JSON with fields dropped, recased, retyped or re-dated."""
    document = msgspec.to_builtins(draw(st.sampled_from(VALID)))
    if draw(st.booleans()):
        document["at"] = draw(timestamps)
        return msgspec.json.encode(document)
    return msgspec.json.encode(draw(mutated(document)))


def decoded_or_refused(data: bytes) -> AnyEvent | None:
    """The event, or ``None`` when decoding raised a msgspec error (anything else escapes)."""
    try:
        return decode_event(data)
    except msgspec.MsgspecError:
        return None


def folds(event: AnyEvent) -> None:
    """Folding ``event`` after :data:`LOG`, alone and in bulk, raises nothing and agrees."""
    one_by_one = fold_events(LOG)
    one_by_one.apply(event, len(LOG) + 1)
    bulk = fold_events([*LOG, (len(LOG) + 1, event)])
    assert bulk.nodes == one_by_one.nodes
    assert bulk.pod_nodes == one_by_one.pod_nodes
    ClusterState().apply(event, 1)  # and first in an empty log


@FUZZ
@given(data=non_json)
def test_bytes_decode_to_an_event_or_a_msgspec_error(data: bytes) -> None:
    event = decoded_or_refused(data)
    if event is not None:
        folds(event)


NAIVE_INVENTORY = msgspec.json.encode(msgspec.to_builtins(VALID[0]) | {"at": "2026-03-01T12:00:00"})
"""Found by this fuzzer: decodes (``datetime`` allows no offset), then the fold compares it
with an aware time and raises ``TypeError`` (kept as a regression)."""


@FUZZ
@example(data=NAIVE_INVENTORY)
@given(data=mutated_events())
def test_a_mutated_event_is_refused_or_folds(data: bytes) -> None:
    event = decoded_or_refused(data)
    if event is not None:
        assert decode_event(encode_event(event)) == event  # what decodes round-trips
        folds(event)


EMPTY_UID_RESERVATION = {
    "type": "PodReserved",
    "id": "r",
    "at": "2026-03-01T12:00:00Z",
    "node": "n",
    "pod": {"namespace": "ns", "name": "p", "uid": ""},
    "shares": [],
}
"""Found by this fuzzer: the bulk fold indexes a pod with an empty uid, the incremental one
does not (kept as a regression)."""


@FUZZ
@example(document=EMPTY_UID_RESERVATION)
@given(document=from_schema(wire_schema(AnyEvent)))
def test_every_event_the_schema_allows_decodes_and_folds(document: dict[str, Any]) -> None:
    folds(decode_event(msgspec.json.encode(document)))


allocation = msgspec.to_builtins(
    AllocationAnnotation(node=NODE, reservation="r1", unit="MiB", containers={"main": [SHARE]})
)
any_text = st.lists(st.characters() | st.characters(categories=["Cs"]).map(str), max_size=40).map(
    "".join
)
"""Any string Python can hold, lone surrogates included (a JSON ``"\\ud800"`` gives one)."""


@FUZZ
@example(raw='{"node": "\ud800"}')  # found by this fuzzer: UnicodeEncodeError escaped
@given(
    raw=any_text
    | mutated(allocation).map(lambda document: msgspec.json.encode(document).decode())
    | st.just(msgspec.json.encode(allocation).decode())
)
def test_read_allocation_returns_a_value_or_none(raw: str) -> None:
    found = read_allocation({ALLOCATION: raw})
    assert found is None or isinstance(found, AllocationAnnotation)
