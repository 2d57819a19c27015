"""Which nodes get a ResourceSlice: DRA nodes whose reporter is heard from."""

from __future__ import annotations

from datetime import timedelta

import msgspec

from gpushare.binder.resource_slices import SILENT_MIN_SECONDS, reporting, wanted_slice
from gpushare.core.events import FrontDoor
from gpushare.core.state import ClusterState, NodeState
from tests.unit.core.factories import T0, inventory, make_card

CARDS = (make_card(0, node="n"),)


def node(front_door: FrontDoor = "dra", heartbeat: float = 2.0) -> NodeState:
    state = ClusterState()
    event = msgspec.structs.replace(
        inventory("n", CARDS), front_door=front_door, heartbeat_seconds=heartbeat
    )
    state.apply(event)
    return state.node("n")


def test_a_slice_outlives_a_short_silence_but_not_a_long_one() -> None:
    dra = node()
    assert reporting(dra, T0 + timedelta(seconds=SILENT_MIN_SECONDS))  # 15 heartbeats: kept
    assert not reporting(dra, T0 + timedelta(seconds=SILENT_MIN_SECONDS + 1))
    slow = node(heartbeat=10.0)  # ten heartbeats of 10 s
    assert reporting(slow, T0 + timedelta(seconds=100))
    assert not reporting(slow, T0 + timedelta(seconds=101))


def test_only_dra_nodes_that_report_get_a_slice() -> None:
    assert wanted_slice(node(), True, 1) is not None
    assert wanted_slice(node(), False, 1) is None
    assert wanted_slice(node(front_door="extender"), True, 1) is None
