"""A follower's snapshot is the fold as of the moment it was captured, however far the
fold has moved on by the time the snapshot is built (off the event loop)."""

from __future__ import annotations

from gpushare.bus.follow import LogFollower
from gpushare.core.placement import reserve
from gpushare.core.snapshot import decode_snapshot, restore_state, take_snapshot
from tests.fakes import MemoryLog
from tests.unit.core.factories import T0, inventory, make_card, pod_ref, request_of


def test_a_captured_snapshot_is_the_fold_at_capture_not_at_build() -> None:
    follower = LogFollower(None, log=MemoryLog())
    follower.apply(1, inventory("n", (make_card(0, node="n"),)))
    follower.applied_seq = 1
    expected = take_snapshot(follower.state, 1, at=T0, by=follower.name)
    build = follower.capture_snapshot(T0)

    event = reserve(
        follower.state.node("n"), pod_ref("p"), request_of(1000), reservation_id="r1", at=T0
    )
    assert event is not None
    follower.apply(2, event)
    follower.applied_seq = 2

    encoded = build()
    snapshot = decode_snapshot(encoded.data)
    assert snapshot == expected
    assert encoded.seq == snapshot.seq == 1
    assert restore_state(snapshot).node("n").pods == {}
    assert follower.state.node("n").pods, "the fold itself moved on"
