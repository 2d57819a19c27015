"""The filter's answer per node, and its reasons (seed 000's worked filter example)."""

from __future__ import annotations

from datetime import datetime

import pytest

from gpushare.core.fit import FITS, check_fit, is_stale
from gpushare.core.state import ClusterState, NodeState
from tests.unit.core.factories import (
    HEARTBEAT_SECONDS,
    T0,
    V100,
    inventory,
    later,
    make_card,
    node_with_usage,
    request_of,
)

# Seed 000, "2.1": three nodes with two 16276 MiB cards each; the pod asks 8138 MiB.
SEED_NODES = {
    "N1": node_with_usage("N1", [(V100, V100), (V100, 12207)]),
    "N2": node_with_usage("N2", [(V100, 12207), (V100, 12207)]),
    "N3": node_with_usage("N3", [(V100, 8138), (V100, V100)]),
}


@pytest.mark.parametrize(
    ("name", "free_by_card", "node_free", "fits", "reason"),
    [
        pytest.param(
            "N1",
            (0, 4069),
            4069,
            False,
            "the most free on any card is 4069 MiB (GPU0 0/16276 MiB free, "
            "GPU1 4069/16276 MiB free)",
            id="N1-too-little-in-total",
        ),
        pytest.param(
            "N2",
            (4069, 4069),
            8138,
            False,
            "the most free on any card is 4069 MiB (GPU0 4069/16276 MiB free, "
            "GPU1 4069/16276 MiB free)",
            id="N2-enough-in-total-but-split",
        ),
        pytest.param("N3", (8138, 0), 8138, True, "", id="N3-all-on-GPU0"),
    ],
)
def test_seed_filter_example(
    name: str, free_by_card: tuple[int, int], node_free: int, fits: bool, reason: str
) -> None:
    node = SEED_NODES[name]
    assert tuple(node.free_mib(card) for card in node.cards) == free_by_card
    assert sum(free_by_card) == node_free  # what kube-scheduler's own filter sees
    verdict = check_fit(node, request_of(8138), T0)
    assert verdict.fits is fits
    assert verdict.unresolvable is False
    if fits:
        assert verdict == FITS
    else:
        assert verdict.reason == f"needs 8138 MiB of GPU memory on one card; {reason}"


def _stale_node() -> NodeState:
    return node_with_usage("old", [(V100, 0)])


@pytest.mark.parametrize(
    ("node", "need", "now", "reason_parts", "unresolvable"),
    [
        pytest.param(
            NodeState(name="new"),
            1,
            T0,
            ("no GPU inventory reported", "reporter running"),
            True,
            id="no-inventory",
        ),
        pytest.param(
            _stale_node(),
            1,
            later(3 * HEARTBEAT_SECONDS + 1),
            ("GPU inventory is stale", "31s ago"),
            True,
            id="stale-after-three-heartbeats",
        ),
        pytest.param(
            node_with_usage("sick", [(V100, 0), (V100, 0)], unhealthy=(0, 1)),
            1,
            T0,
            ("no healthy GPU on this node", "GPU0 unhealthy (XID 79)", "GPU1 unhealthy (XID 79)"),
            True,
            id="no-healthy-card",
        ),
        pytest.param(
            node_with_usage("empty", []),
            1,
            T0,
            ("no healthy GPU on this node (no cards)",),
            True,
            id="no-cards-at-all",
        ),
        pytest.param(
            node_with_usage("small", [(V100, 0), (32768, 0)], unhealthy=(1,)),
            V100 + 1,
            T0,
            ("needs 16277 MiB", "more than any card here has in total", "largest 16276 MiB"),
            True,
            id="bigger-than-any-healthy-card",
        ),
        pytest.param(
            node_with_usage("busy", [(V100, 10000), (V100, 12000)]),
            8138,
            T0,
            ("needs 8138 MiB", "the most free on any card is 6276 MiB", "GPU1 4276/16276"),
            False,
            id="insufficient-free-memory-is-resolvable",
        ),
        pytest.param(
            node_with_usage("half", [(V100, V100), (V100, 0)], unhealthy=(1,)),
            1,
            T0,
            ("the most free on any card is 0 MiB", "GPU1 unhealthy (XID 79)"),
            False,
            id="the-only-free-card-is-unhealthy",
        ),
    ],
)
def test_check_fit_reasons(
    node: NodeState,
    need: int,
    now: datetime,
    reason_parts: tuple[str, ...],
    unresolvable: bool,
) -> None:
    verdict = check_fit(node, request_of(need), now)
    assert verdict.fits is False
    assert verdict.unresolvable is unresolvable
    for part in reason_parts:
        assert part in verdict.reason


@pytest.mark.parametrize(
    ("seconds", "stale"),
    [
        pytest.param(0, False, id="just-reported"),
        pytest.param(3 * HEARTBEAT_SECONDS, False, id="exactly-three-heartbeats"),
        pytest.param(3 * HEARTBEAT_SECONDS + 0.5, True, id="past-three-heartbeats"),
    ],
)
def test_staleness_boundary(seconds: float, stale: bool) -> None:
    node = node_with_usage("n", [(V100, 0)])
    assert is_stale(node, later(seconds)) is stale
    assert check_fit(node, request_of(1), later(seconds)).fits is not stale


def test_stale_node_with_room_is_not_offered() -> None:
    state = ClusterState()
    state.apply(inventory("n", [make_card(0, node="n")], at=T0))
    node = state.node("n")
    assert node.max_free_mib == V100
    assert not check_fit(node, request_of(1024), later(60)).fits
    # The next heartbeat makes it fresh again.
    state.apply(inventory("n", [make_card(0, node="n")], at=later(55)))
    assert check_fit(state.node("n"), request_of(1024), later(60)) == FITS


def test_fit_is_exact_at_the_boundary() -> None:
    node = node_with_usage("n", [(V100, 8138)])
    assert check_fit(node, request_of(8138), T0).fits
    assert not check_fit(node, request_of(8139), T0).fits


def test_init_container_peak_decides_fit() -> None:
    node = node_with_usage("n", [(V100, 8138)])
    assert check_fit(node, request_of(4000, 4000), T0).fits
    assert not check_fit(node, request_of(4000, 4000, init=[9000]), T0).fits
