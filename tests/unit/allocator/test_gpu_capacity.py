"""The cluster's GPU by model, kept per inventory event, against counting every card."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.allocator.gpu_capacity import CapacityByModel
from gpushare.core.model import Card
from gpushare.core.policies.workload import cluster_capacity
from gpushare.core.state import ClusterState, fold_events
from tests.unit.allocator.builders import inventory

MODELS = ("A10", "H100", "T4")

reports = st.lists(
    st.tuples(
        st.sampled_from(["n1", "n2", "n3"]),
        st.lists(st.tuples(st.sampled_from(MODELS), st.booleans()), max_size=4),
    ),
    max_size=12,
)


def cards(node: str, shapes: list[tuple[str, bool]]) -> list[Card]:
    return [
        Card(
            index=at,
            uuid=f"GPU-{node}-{at}",
            model=model,
            memory_mib=16384,
            healthy=healthy,
            health_reason="" if healthy else "XID 79",
        )
        for at, (model, healthy) in enumerate(shapes)
    ]


def counted(state: ClusterState) -> tuple[tuple[str, int], ...]:
    return cluster_capacity(node.view for node in state.nodes.values())


@settings(max_examples=80, deadline=None)
@given(reports, reports)
def test_kept_capacity_equals_a_count_of_every_card(
    before: list[tuple[str, list[tuple[str, bool]]]],
    after: list[tuple[str, list[tuple[str, bool]]]],
) -> None:
    # a bulk fold first (as at start), then events one by one through the listener
    state = fold_events(
        [(0, inventory(node, cards(node, shapes))) for node, shapes in before], ClusterState()
    )
    kept = CapacityByModel()
    assert kept.capacity(state) == counted(state)
    for node, shapes in after:
        event = inventory(node, cards(node, shapes))
        kept.changed(0, event, state.apply(event))
        assert kept.capacity(state) == counted(state)
