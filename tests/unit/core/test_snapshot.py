"""Snapshots: restoring one gives the folded state back, and folding on top of one gives
what folding the whole log gives."""

from __future__ import annotations

import random
import zlib

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.snapshot import (
    ENCODED_BATCH,
    SNAPSHOT_FORMAT,
    SnapshotUnreadable,
    array_header,
    decode_snapshot,
    encode_fold,
    encode_snapshot,
    restore_state,
    snapshot_of,
    take_snapshot,
)
from gpushare.core.state import ClusterState, fold_events
from tests.unit.core.event_streams import history
from tests.unit.core.factories import T0, inventory, make_card


def event_by_event(pairs: list) -> ClusterState:  # type: ignore[type-arg]
    state = ClusterState()
    for seq, event in pairs:
        state.apply(event, seq)
    return state


def same(a: ClusterState, b: ClusterState) -> bool:
    return a.nodes == b.nodes and a.pod_nodes == b.pod_nodes


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), length=st.integers(0, 120), cut=st.floats(0, 1))
def test_fold_on_a_snapshot_equals_folding_the_whole_log(
    seed: int, length: int, cut: float
) -> None:
    pairs = history(random.Random(seed), length)
    whole = fold_events(pairs)
    assert same(whole, event_by_event(pairs))
    at = int(len(pairs) * cut)
    covered = max((seq for seq, _ in pairs[:at]), default=0)
    snapshot = take_snapshot(fold_events(pairs[:at]), covered, at=T0, by="test")
    restored = restore_state(decode_snapshot(encode_snapshot(snapshot)))
    assert same(restored, fold_events(pairs[:at]))
    assert same(fold_events(pairs[at:], restored), whole)


def test_a_node_follower_restores_only_its_node() -> None:
    state = fold_events(history(random.Random(7), 80))
    snapshot = take_snapshot(state, 999, at=T0)
    only_a = restore_state(snapshot, node="a")
    assert set(only_a.nodes) == {"a"}
    assert only_a.nodes["a"] == state.nodes["a"]


def test_snapshots_of_the_same_state_are_the_same_bytes() -> None:
    pairs = history(random.Random(3), 100)
    one = take_snapshot(fold_events(pairs), 100, at=T0, by="x")
    two = take_snapshot(event_by_event(pairs), 100, at=T0, by="x")
    assert encode_snapshot(one) == encode_snapshot(two)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "not a readable snapshot"),
        (b"garbage", "not a readable snapshot"),
        (zlib.compress(b"\x93\x01\x02"), "not a readable snapshot"),
    ],
)
def test_damaged_bytes_are_refused_with_a_reason(data: bytes, says: str) -> None:
    with pytest.raises(SnapshotUnreadable, match=says):
        decode_snapshot(data)


def test_a_snapshot_of_another_format_is_refused() -> None:
    snapshot = take_snapshot(ClusterState(), 0, at=T0)
    newer = msgspec.structs.replace(snapshot, format=SNAPSHOT_FORMAT + 1)
    with pytest.raises(SnapshotUnreadable, match="format"):
        decode_snapshot(encode_snapshot(newer))


def with_more_nodes(state: ClusterState, count: int) -> ClusterState:
    """``state`` and ``count`` more nodes of two cards each."""
    for index in range(count):
        name = f"extra-{index:05d}"
        state.apply(inventory(name, [make_card(0, node=name), make_card(1, node=name)]), 0)
    return state


@pytest.mark.parametrize(
    "extra", [0, 1, ENCODED_BATCH - 1, ENCODED_BATCH, ENCODED_BATCH + 1, 2 * ENCODED_BATCH + 3]
)
def test_a_fold_encoded_a_batch_at_a_time_is_the_snapshot_encoded_at_once(extra: int) -> None:
    """The keeper's encoding (node parts built and encoded batch by batch, on either side
    of every batch boundary) decompresses to the very bytes of the whole snapshot."""
    state = with_more_nodes(fold_events(history(random.Random(extra), 60)), extra)
    whole = snapshot_of(state.nodes, 77, at=T0, by="keeper")
    encoded = encode_fold(state.nodes, 77, at=T0, by="keeper")
    assert zlib.decompress(encoded.data) == msgspec.msgpack.encode(whole)
    assert zlib.decompress(encode_snapshot(whole)) == msgspec.msgpack.encode(whole)
    assert decode_snapshot(encoded.data) == whole
    assert (encoded.seq, encoded.taken_by, encoded.taken_at) == (77, "keeper", T0)
    assert encoded.nodes == len(whole.nodes) == len(state.nodes)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), length=st.integers(0, 120), extra=st.integers(0, 600))
def test_restoring_a_fold_encoded_in_batches_gives_the_fold(
    seed: int, length: int, extra: int
) -> None:
    state = with_more_nodes(fold_events(history(random.Random(seed), length)), extra)
    restored = restore_state(decode_snapshot(encode_fold(state.nodes, 5, at=T0).data))
    assert same(restored, state)


@pytest.mark.parametrize("count", [0, 1, 15, 16, 65_535, 65_536])
def test_an_array_header_is_msgpacks_shortest(count: int) -> None:
    header = array_header(count)
    assert msgspec.msgpack.encode([None] * count).startswith(header)
    assert len(header) == (1 if count < 16 else 3 if count < 65_536 else 5)
