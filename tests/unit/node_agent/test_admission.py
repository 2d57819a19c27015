"""Which pod the kubelet is admitting, from its pod-resources list; and the exact answer
GetPreferredAllocation gives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.events import AnyEvent
from gpushare.core.requests import GPU_CORE_NAMES, GPU_MEM, MGPU_CORE, MGPU_MEMORY
from gpushare.node_agent.admission import (
    Admitting,
    ListedPod,
    Unknown,
    admitting_allocation,
)
from gpushare.node_agent.device_table import build_device_table
from gpushare.node_agent.matching import (
    LEGACY,
    Asks,
    Match,
    NoMatch,
    exactly,
    match_container,
    preferred_for,
)
from tests.unit.node_agent.builders import (
    assign,
    at,
    card,
    inventory,
    node_state,
    reserve,
    reserve_and_bind,
    share,
)

GPU_CORE = GPU_CORE_NAMES[0]
GPU0, GPU1 = card(0), card(1)
MIB = build_device_table([GPU0, GPU1], "MiB")


def listed(name: str, **holding: Sequence[str]) -> ListedPod:
    """A pod the kubelet lists; per container, the resources it holds IDs of."""
    return ListedPod(
        namespace="ns", name=name, holding={c: frozenset(r) for c, r in holding.items()}
    )


SAME_SIZE_TWO_CARDS: list[AnyEvent] = [
    inventory(GPU0, GPU1),
    *reserve_and_bind(reserve("early", share("c", GPU0, 1024), created=at(0))),
    *reserve_and_bind(reserve("late", share("c", GPU1, 1024), created=at(9))),
]


@dataclass
class Case:
    events: list[AnyEvent]
    listed: list[ListedPod] | None
    expected: tuple[str, str | None] | None
    """``(pod uid, container)`` of the pod being admitted, or ``None``: unknown."""
    resource: str = GPU_MEM
    asks: Asks = LEGACY


CASES: Mapping[str, Case] = {
    "the later pod admitted first is named by the kubelet, not guessed by age": Case(
        SAME_SIZE_TWO_CARDS,
        [listed("late", c=[])],
        ("late", "c"),
    ),
    "admitted pods hold their IDs; the one without is being admitted": Case(
        [*SAME_SIZE_TWO_CARDS, assign(reserve("late", share("c", GPU1, 1024)), "c", GPU1)],
        [listed("late", c=[GPU_MEM]), listed("early", c=[])],
        ("early", "c"),
    ),
    "a pod the log does not know is not ours": Case(
        SAME_SIZE_TWO_CARDS,
        [listed("stranger", c=[]), listed("early", c=[])],
        ("early", "c"),
    ),
    "a container that asked nothing of ours does not make a pod wait": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(reserve("a", share("gpu", GPU0, 512))),
            assign(reserve("a", share("gpu", GPU0, 512)), "gpu", GPU0),
            *reserve_and_bind(reserve("b", share("gpu", GPU0, 512))),
        ],
        [listed("a", gpu=[GPU_MEM], sidecar=[]), listed("b", gpu=[], sidecar=[])],
        ("b", "gpu"),
    ),
    "the pod's next container, init containers first": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(
                reserve("p", share("init", GPU0, 256, init=True), share("app", GPU0, 512))
            ),
        ],
        [listed("p", app=[])],
        ("p", "init"),
    ),
    "a container this agent already claimed is skipped": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(reserve("p", share("one", GPU0, 256), share("two", GPU0, 512))),
            assign(reserve("p", share("one", GPU0, 256)), "one", GPU0),
        ],
        [listed("p", one=[GPU_MEM], two=[])],
        ("p", "two"),
    ),
    "a kubelet admitting an assigned pod again (restarted before its checkpoint)": Case(
        [*SAME_SIZE_TWO_CARDS, assign(reserve("late", share("c", GPU1, 1024)), "c", GPU1)],
        [listed("late", c=[])],
        ("late", "c"),
    ),
    "two pods waiting (an older kubelet lists rejected pods): unknown": Case(
        SAME_SIZE_TWO_CARDS,
        [listed("early", c=[]), listed("late", c=[])],
        None,
    ),
    "no pod waiting (the log is behind): unknown": Case(
        SAME_SIZE_TWO_CARDS,
        [listed("stranger", c=[])],
        None,
    ),
    "the kubelet did not answer: unknown": Case(SAME_SIZE_TWO_CARDS, None, None),
    "a resource asked only to count: the pod, but no container gets cards from it": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(
                reserve("p", share("c", GPU0, 512, core=30)),
                asked={"c": (GPU_MEM, GPU_CORE)},
            ),
        ],
        [listed("p", c=[GPU_MEM])],
        ("p", None),
        resource=GPU_CORE,
        asks=Asks(
            by_reservation={"reserve-p": {"c": (GPU_MEM, GPU_CORE)}},
            advertised=frozenset({GPU_MEM, GPU_CORE}),
        ),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_admitting_allocation(case: Case) -> None:
    node = node_state(case.events)
    found = admitting_allocation(node, case.listed, case.resource, case.asks, set())
    if case.expected is None:
        assert isinstance(found, Unknown)
        return
    assert isinstance(found, Admitting)
    uid, container = case.expected
    assert found.allocation.pod.uid == uid
    assert (found.container.name if found.container else None) == container


def test_unknown_says_whether_the_kubelet_answered_and_how_many_wait() -> None:
    node = node_state(SAME_SIZE_TWO_CARDS)
    silent = admitting_allocation(node, None, GPU_MEM, LEGACY, set())
    behind = admitting_allocation(node, [], GPU_MEM, LEGACY, set())
    two = admitting_allocation(
        node, [listed("early", c=[]), listed("late", c=[])], GPU_MEM, LEGACY, set()
    )
    assert isinstance(silent, Unknown)
    assert not silent.listed
    assert isinstance(behind, Unknown)
    assert behind.listed
    assert behind.waiting == 0
    assert isinstance(two, Unknown)
    assert two.waiting == 2
    assert "ns/early" in two.reason
    assert "ns/late" in two.reason


def _admitting(events: list[AnyEvent], name: str) -> Admitting:
    found = admitting_allocation(node_state(events), [listed(name, c=[])], GPU_MEM, LEGACY, set())
    assert isinstance(found, Admitting)
    assert found.container is not None
    return found


def test_the_admitted_pod_gets_its_own_card_ids_advised() -> None:
    late = _admitting(SAME_SIZE_TWO_CARDS, "late")
    assert late.container is not None
    advised = preferred_for(
        late.container,
        MIB,
        available=[d for c in MIB.cards for d in MIB.ids_of(c)],
        must_include=[],
        size=1024,
    )
    assert advised is not None
    assert len(advised) == 1024
    assert {MIB.card_of(device) for device in advised} == {GPU1}


def test_allocate_matches_the_admitted_pod_on_its_card() -> None:
    late = _admitting(SAME_SIZE_TWO_CARDS, "late")
    assert late.container is not None
    found = match_container(late.container, MIB, {GPU1.uuid: 1024})
    assert isinstance(found, Match)
    assert found.allocation.pod.uid == "late"
    assert found.card == GPU1


def test_allocate_on_another_card_follows_the_kubelet() -> None:
    late = _admitting(SAME_SIZE_TWO_CARDS, "late")
    assert late.container is not None
    found = match_container(late.container, MIB, {GPU0.uuid: 1024})
    assert isinstance(found, Match)
    assert found.card == GPU0
    assert [s.card_uuid for s in found.shares] == [GPU0.uuid]


def test_allocate_of_another_size_is_refused_with_the_reason() -> None:
    late = _admitting(SAME_SIZE_TWO_CARDS, "late")
    assert late.container is not None
    found = match_container(late.container, MIB, {GPU1.uuid: 512})
    assert isinstance(found, NoMatch)
    assert "ns/late" in found.reason
    assert "512" in found.reason


SMALL = build_device_table([card(0, mib=8), card(1, mib=8)], "MiB")
SMALL_IDS = [d for c in SMALL.cards for d in SMALL.ids_of(c)]


@given(
    size=st.integers(min_value=1, max_value=16),
    data=st.data(),
)
def test_exactly_answers_the_size_with_every_must_include(size: int, data: st.DataObject) -> None:
    available = data.draw(st.lists(st.sampled_from(SMALL_IDS), unique=True))
    must = data.draw(
        st.lists(st.sampled_from(SMALL_IDS), unique=True, max_size=size).filter(
            lambda ids: not set(ids) & set(available)
        )
    )
    chosen = data.draw(st.lists(st.sampled_from(SMALL_IDS), max_size=20))
    answer = exactly(SMALL, size, must, chosen, available)
    offered = set(available) | set(must)
    assert len(answer) == len(set(answer))
    assert set(must) <= set(answer) <= offered
    assert len(answer) == min(size, len(offered))


def test_exactly_pads_on_the_chosen_card_before_another() -> None:
    gpu0, gpu1 = SMALL.cards
    on0, on1 = list(SMALL.ids_of(gpu0)), list(SMALL.ids_of(gpu1))
    answer = exactly(SMALL, 3, [], on0[:1], on1 + on0)
    assert {SMALL.card_of(device) for device in answer} == {gpu0}


def test_exactly_never_returns_more_than_asked() -> None:
    gpu0 = SMALL.cards[0]
    on0 = list(SMALL.ids_of(gpu0))
    assert exactly(SMALL, 2, on0[:1], on0, on0) == (on0[0], on0[1])


def test_a_count_only_call_names_the_container_and_its_cards() -> None:
    asks = Asks(
        by_reservation={"reserve-p": {"c": (GPU_MEM, GPU_CORE)}},
        advertised=frozenset({GPU_MEM, GPU_CORE}),
    )
    events: list[AnyEvent] = [
        inventory(GPU0, GPU1),
        *reserve_and_bind(
            reserve("p", share("c", GPU1, 512, core=30)), asked={"c": (GPU_MEM, GPU_CORE)}
        ),
        assign(reserve("p", share("c", GPU1, 512, core=30)), "c", GPU1),
    ]
    found = admitting_allocation(
        node_state(events), [listed("p", c=[GPU_MEM])], GPU_CORE, asks, set()
    )
    assert isinstance(found, Admitting)
    assert found.container is None
    assert found.counting is not None
    core = build_device_table([GPU0, GPU1], "MiB", GPU_CORE)
    on1 = list(core.ids_of(GPU1))
    advised = preferred_for(
        found.counting,
        core,
        available=[d for c in core.cards for d in core.ids_of(c)],
        must_include=[],
        size=30,
    )
    assert advised is not None
    assert set(advised) <= set(on1)
    assert len(advised) == 30


# -- a call is the next container's that asked the resource, keyed or counting ------------

VKE_RESOURCES = frozenset({MGPU_CORE, MGPU_MEMORY})
TWO_ONE = reserve(
    "p",
    share("c0", GPU0, 3000, core=50),
    share("c0", GPU1, 3000, core=50),
    share("c1", GPU1, 0, core=50),
)
"""``c0`` keyed on ``mgpu-memory`` (its core call counts), ``c1`` keyed on ``mgpu-core``:
their core calls are the same size."""
TWO_ONE_ASKED = {"c0": (MGPU_CORE, MGPU_MEMORY), "c1": (MGPU_CORE,)}
WITH_INIT = reserve("q", share("i", GPU0, 1000, init=True, core=20), share("c", GPU1, 0, core=20))
WITH_INIT_ASKED = {"i": (MGPU_CORE, MGPU_MEMORY), "c": (MGPU_CORE,)}


@dataclass
class Next:
    events: list[AnyEvent]
    holding: Mapping[str, Sequence[str]]
    resource: str
    expected: tuple[str, str] | None
    """``("keyed" | "counting", container)``, or ``None``: no container known to wait."""
    answered: frozenset[tuple[str, str, str]] = frozenset()


def _two_one(*assigned: str) -> list[AnyEvent]:
    return [
        inventory(GPU0, GPU1),
        *reserve_and_bind(TWO_ONE, TWO_ONE_ASKED),
        *(assign(TWO_ONE, name, GPU0, GPU1) for name in assigned),
    ]


NEXT: Mapping[str, Next] = {
    "the first call on core is c0's, though it only counts": Next(
        _two_one(), {"c0": [], "c1": []}, MGPU_CORE, ("counting", "c0")
    ),
    "c0's memory call first: the core call is still c0's": Next(
        _two_one("c0"), {"c0": [MGPU_MEMORY], "c1": []}, MGPU_CORE, ("counting", "c0")
    ),
    "c0 holds its core IDs: the core call is c1's": Next(
        _two_one(), {"c0": [MGPU_CORE], "c1": []}, MGPU_CORE, ("keyed", "c1")
    ),
    "c0 holds its core IDs: the memory call is c0's": Next(
        _two_one(), {"c0": [MGPU_CORE], "c1": []}, MGPU_MEMORY, ("keyed", "c0")
    ),
    "c0 done: c1": Next(
        _two_one("c0"), {"c0": [MGPU_CORE, MGPU_MEMORY], "c1": []}, MGPU_CORE, ("keyed", "c1")
    ),
    "admitted again (no checkpoint): the kubelet's list, not the log, says who is next": Next(
        _two_one("c0", "c1"), {"c0": [], "c1": []}, MGPU_CORE, ("counting", "c0")
    ),
    "an init container that only counts (not listed): the agent's memory says": Next(
        [inventory(GPU0, GPU1), *reserve_and_bind(WITH_INIT, WITH_INIT_ASKED)],
        {"c": []},
        MGPU_CORE,
        ("counting", "i"),
    ),
    "its counted call remembered, the next call is the app container's": Next(
        [inventory(GPU0, GPU1), *reserve_and_bind(WITH_INIT, WITH_INIT_ASKED)],
        {"c": []},
        MGPU_CORE,
        ("keyed", "c"),
        answered=frozenset({("reserve-q", "i", MGPU_CORE)}),
    ),
}


@pytest.mark.parametrize("case", NEXT.values(), ids=list(NEXT))
def test_the_call_is_the_next_containers_that_asked_the_resource(case: Next) -> None:
    node = node_state(case.events)
    (allocation,) = node.pods.values()
    asks = Asks(
        by_reservation={allocation.reservation_id: dict(allocation.resources)},
        advertised=VKE_RESOURCES,
    )
    pod = listed(allocation.pod.name, **case.holding)
    found = admitting_allocation(node, [pod], case.resource, asks, set(), answered=case.answered)
    assert isinstance(found, Admitting)
    if case.expected is None:
        assert found.container is None
        assert found.counting is None
        return
    kind, name = case.expected
    pending = found.container if kind == "keyed" else found.counting
    other = found.counting if kind == "keyed" else found.container
    assert pending is not None
    assert pending.name == name
    assert other is None
