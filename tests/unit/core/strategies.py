"""Hypothesis strategies: random cards, requests, and nodes folded from real reservations."""

from __future__ import annotations

import msgspec
from hypothesis import strategies as st

from gpushare.core.model import Card
from gpushare.core.placement import reserve
from gpushare.core.requests import ContainerRequest, PodRequest
from gpushare.core.state import ClusterState, NodeState
from tests.unit.core.factories import T0, inventory, make_card, pod_ref, request_of

CARD_SIZES = st.one_of(
    st.sampled_from([4069, 8138, 12207, 16276, 24576, 40960, 81920]),
    st.integers(min_value=1, max_value=2048),
)
CONTAINER_SIZES = st.one_of(
    st.sampled_from([1024, 2048, 4069, 8138, 12207, 16276]),
    st.integers(min_value=1, max_value=20000),
)


@st.composite
def card_lists(draw: st.DrawFn, node: str) -> tuple[Card, ...]:
    """1 to 8 cards of various sizes; about one in five is unhealthy."""
    specs = draw(
        st.lists(
            st.tuples(CARD_SIZES, st.sampled_from([True, True, True, True, False])),
            min_size=1,
            max_size=8,
        )
    )
    return tuple(
        make_card(
            index,
            memory,
            node=node,
            healthy=healthy,
            health_reason="" if healthy else "XID 79",
        )
        for index, (memory, healthy) in enumerate(specs)
    )


@st.composite
def requests(draw: st.DrawFn) -> PodRequest:
    """One to three app containers and up to two init containers (at least one in all)."""
    app = draw(st.lists(CONTAINER_SIZES, max_size=3))
    init = draw(st.lists(CONTAINER_SIZES, min_size=0 if app else 1, max_size=2))
    return request_of(*app, init=init)


@st.composite
def container_requests(draw: st.DrawFn, name: str, init: bool = False) -> ContainerRequest:
    """One container in any shape the dialects produce: whole cards, or a share of 1-3 cards."""
    cards = draw(st.integers(min_value=1, max_value=3))
    if draw(st.integers(0, 5)) == 0:
        return ContainerRequest(container=name, cards=cards, exclusive=True, init=init)
    core = draw(st.sampled_from([0, 0, 10, 25, 30, 50, 70, 100]))
    if draw(st.booleans()):
        memory = {"memory_ratio": draw(st.sampled_from([10, 25, 50, 100]))}
    else:
        memory = {"memory_mib": draw(CONTAINER_SIZES)}
    return ContainerRequest(container=name, cards=cards, core_percent=core, init=init, **memory)


@st.composite
def gpu_requests(draw: st.DrawFn) -> PodRequest:
    """Any pod: seeds 000/001 memory-only pods, or one to three containers of any shape."""
    if draw(st.booleans()):
        return draw(requests())
    count = draw(st.integers(min_value=1, max_value=3))
    app = [draw(container_requests(f"c{i}")) for i in range(count)]
    before = draw(st.lists(st.sampled_from(["init", "sidecar"]), max_size=3))
    return PodRequest(containers=(*(draw(early_containers(before)) if before else ()), *app))


@st.composite
def early_containers(draw: st.DrawFn, roles: list[str]) -> tuple[ContainerRequest, ...]:
    """The pod's ``spec.initContainers`` in order: run-to-completion init containers and
    native sidecars (``restartPolicy: Always``), as ``roles`` says."""
    made = []
    for position, role in enumerate(roles):
        wanted = draw(container_requests(f"{role}{position}", init=role == "init"))
        made.append(msgspec.structs.replace(wanted, sidecar=role == "sidecar"))
    return tuple(made)


@st.composite
def folded_nodes(draw: st.DrawFn, pods: st.SearchStrategy[PodRequest] | None = None) -> NodeState:
    """A node with random cards and the pods that ``reserve`` managed to place on it."""
    state = ClusterState()
    state.apply(inventory("n", draw(card_lists("n"))))
    for seq, wanted in enumerate(
        draw(st.lists(requests() if pods is None else pods, max_size=12)), start=1
    ):
        event = reserve(
            state.node("n"), pod_ref(f"pod-{seq}"), wanted, reservation_id=f"r-{seq}", at=T0
        )
        if event is not None:
            state.apply(event, seq)
    return state.node("n")
