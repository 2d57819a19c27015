"""Allocate on several resources: the keyed call hands out the cards, the others count."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from gpushare.core.events import AnyEvent, PodBound
from gpushare.core.model import Card
from gpushare.core.plugin_resources import KEYING_ORDER
from gpushare.node_agent.device_table import DeviceTable, build_device_table
from gpushare.node_agent.matching import (
    Asks,
    Claim,
    CountOnly,
    Match,
    NoMatch,
    fallback_ids,
    match_allocate,
    preferred_ids,
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

GPU0, GPU1 = card(0), card(1)
CARDS = [GPU0, GPU1]
MEM = "aliyun.com/gpu-mem"
CORE = "gpushare.io/gpu-core"
RATIO = "gpushare.io/gpu-memory-ratio"
MGPU_CORE = "vke.volcengine.com/mgpu-core"
MGPU_MEMORY = "vke.volcengine.com/mgpu-memory"
TABLES = {name: build_device_table(CARDS, "MiB", name) for name in KEYING_ORDER}
EVERYTHING = frozenset(KEYING_ORDER)


def ids(resource: str, on: Card, count: int, start: int = 0) -> list[str]:
    return list(TABLES[resource].ids_of(on)[start : start + count])


def asks_of(events: Sequence[AnyEvent], advertised: frozenset[str] = EVERYTHING) -> Asks:
    bound = {e.reservation_id: e.resources for e in events if isinstance(e, PodBound)}
    return Asks(by_reservation=bound, advertised=advertised)


CORE_ONLY = reserve("core", share("c", GPU1, 0, core=30), created=at(0))
CORE_AND_RATIO = reserve("both", share("c", GPU0, 8192, core=50), created=at(1))
MEM_AND_CORE = reserve("mem", share("c", GPU1, 1024, core=30), created=at(2))
VKE = reserve("vke", share("c", GPU1, 4000, core=50), share("c", GPU0, 4000, core=50))
WHOLE = reserve("whole", share("c", GPU0, 16384, core=100), share("c", GPU1, 16384, core=100))

EVENTS: list[AnyEvent] = [
    inventory(GPU0, GPU1),
    *reserve_and_bind(CORE_ONLY, {"c": (CORE,)}),
    *reserve_and_bind(CORE_AND_RATIO, {"c": (CORE, RATIO)}),
    *reserve_and_bind(MEM_AND_CORE, {"c": (MEM, CORE)}),
    *reserve_and_bind(VKE, {"c": (MGPU_CORE, MGPU_MEMORY)}),
]


@dataclass
class Case:
    resource: str
    device_ids: list[str]
    expected: str | tuple[str, tuple[Card, ...]] | None
    """``(pod uid, its cards)`` for a match, the keyed resource for a count, None: refused."""
    events: list[AnyEvent] = field(default_factory=lambda: EVENTS)
    claimed: set[Claim] = field(default_factory=set)
    reason: Sequence[str] = ()
    answered: frozenset[tuple[str, str, str]] = frozenset()


SAME_CORE = reserve(
    "same",
    share("c0", GPU0, 3000, core=50),
    share("c0", GPU1, 3000, core=50),
    share("c1", GPU0, 0, core=50),
    share("c1", GPU1, 0, core=50),
)
"""``c0`` counts 100 ``mgpu-core`` (keyed on memory), ``c1`` is keyed on 100 of it, both
half of each card: only the kubelet's order tells their core calls apart."""
SAME_CORE_EVENTS: list[AnyEvent] = [
    inventory(GPU0, GPU1),
    *reserve_and_bind(SAME_CORE, {"c0": (MGPU_CORE, MGPU_MEMORY), "c1": (MGPU_CORE,)}),
]
BOTH_CORE = ids(MGPU_CORE, GPU0, 50) + ids(MGPU_CORE, GPU1, 50)

CASES = {
    "gpu-core alone: the core call hands out the card (before one that only counts)": Case(
        CORE, ids(CORE, GPU1, 30), ("core", (GPU1,))
    ),
    "core and ratio: the ratio call hands out the card": Case(
        RATIO, ids(RATIO, GPU0, 50), ("both", (GPU0,))
    ),
    "core and ratio: the core call counts": Case(CORE, ids(CORE, GPU0, 50), RATIO),
    "with the keyed one claimed, the same call counts for the gpu-mem container": Case(
        CORE, ids(CORE, GPU1, 30), MEM, claimed={("reserve-core", "c")}
    ),
    "gpu-mem and core: the gpu-mem call hands out the card": Case(
        MEM, ids(MEM, GPU1, 1024), ("mem", (GPU1,))
    ),
    "vke on two cards: the mgpu-memory call with each card's share": Case(
        MGPU_MEMORY,
        ids(MGPU_MEMORY, GPU0, 4000) + ids(MGPU_MEMORY, GPU1, 4000),
        ("vke", (GPU1, GPU0)),
    ),
    "vke: the mgpu-core call counts, wherever its IDs are": Case(
        MGPU_CORE, ids(MGPU_CORE, GPU0, 100), MGPU_MEMORY
    ),
    "vke: all memory IDs on one card is not its share": Case(
        MGPU_MEMORY,
        ids(MGPU_MEMORY, GPU0, 8000),
        None,
        reason=["waits for 8000 vke.volcengine.com/mgpu-memory on GPU0", "ns/vke container 'c'"],
    ),
    "whole cards asked as gpu-core 200": Case(
        CORE,
        ids(CORE, GPU0, 100) + ids(CORE, GPU1, 100),
        ("whole", (GPU0, GPU1)),
        events=[inventory(GPU0, GPU1), *reserve_and_bind(WHOLE, {"c": (CORE,)})],
    ),
    "a pod from an older binder (no names) is not served on gpu-core": Case(
        CORE,
        ids(CORE, GPU1, 30),
        None,
        events=[inventory(GPU0, GPU1), *reserve_and_bind(CORE_ONLY)],
        reason=["no bound pod on node n1 waits for 30 gpushare.io/gpu-core on GPU1"],
    ),
    "an assigned container is not handed out twice, and the call does not count": Case(
        CORE,
        ids(CORE, GPU1, 30),
        None,
        events=[
            inventory(GPU0, GPU1),
            *reserve_and_bind(CORE_ONLY, {"c": (CORE,)}),
            assign(CORE_ONLY, "c", GPU1),
        ],
        reason=["pending: none"],
    ),
    "the same size: the core call counts for c0, the earlier container": Case(
        MGPU_CORE, BOTH_CORE, MGPU_MEMORY, events=SAME_CORE_EVENTS
    ),
    "c0's core call counted: the next one hands c1 its cards": Case(
        MGPU_CORE,
        BOTH_CORE,
        ("same", (GPU0, GPU1)),
        events=SAME_CORE_EVENTS,
        answered=frozenset({("reserve-same", "c0", MGPU_CORE)}),
    ),
    "c0 assigned before its core call: still c0's": Case(
        MGPU_CORE,
        BOTH_CORE,
        MGPU_MEMORY,
        events=[*SAME_CORE_EVENTS, assign(SAME_CORE, "c0", GPU0, GPU1)],
    ),
    "c1 assigned: the kubelet is past c0, whose core call was made": Case(
        MGPU_CORE,
        BOTH_CORE,
        None,
        events=[*SAME_CORE_EVENTS, assign(SAME_CORE, "c1", GPU0, GPU1)],
        reason=["pending: none"],
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_match_allocate_per_resource(case: Case) -> None:
    outcome = match_allocate(
        node_state(case.events),
        TABLES[case.resource],
        case.claimed,
        case.device_ids,
        asks_of(case.events),
        answered=case.answered,
    )
    if case.expected is None:
        assert isinstance(outcome, NoMatch), outcome
        for fragment in case.reason:
            assert fragment in outcome.reason
    elif isinstance(case.expected, str):
        assert isinstance(outcome, CountOnly), outcome
        assert outcome.keyed == case.expected
    else:
        assert isinstance(outcome, Match), outcome
        assert (outcome.allocation.pod.uid, outcome.cards) == case.expected
        assert [s.card_uuid for s in outcome.shares] == [c.uuid for c in outcome.cards]


def prefer(
    resource: str,
    size: int,
    events: list[AnyEvent] = EVENTS,
    claimed: set[Claim] | None = None,
    available: Sequence[str] | None = None,
) -> tuple[str, ...] | None:
    table = TABLES[resource]
    return preferred_ids(
        node_state(events),
        table,
        claimed or set(),
        available=[d for d, _ in table.devices()] if available is None else available,
        must_include=(),
        size=size,
        asks=asks_of(events),
    )


def per_card(table: DeviceTable, chosen: Sequence[str] | None) -> dict[int, int]:
    counts: dict[int, int] = {}
    for device in chosen or ():
        found = table.card_of(device)
        assert found is not None
        counts[found.index] = counts.get(found.index, 0) + 1
    return counts


def test_preferred_ids_split_over_the_containers_cards() -> None:
    chosen = prefer(MGPU_MEMORY, 8000)
    assert per_card(TABLES[MGPU_MEMORY], chosen) == {1: 4000, 0: 4000}


def test_preferred_ids_steer_a_counting_call_to_the_containers_card() -> None:
    chosen = prefer(CORE, 30, claimed={("reserve-core", "c")})
    assert per_card(TABLES[CORE], chosen) == {1: 30}
    assert per_card(TABLES[CORE], prefer(CORE, 50)) == {0: 50}


def test_no_preference_without_room_on_the_containers_cards() -> None:
    only_gpu0 = ids(MGPU_MEMORY, GPU0, 16384)
    assert prefer(MGPU_MEMORY, 8000, available=only_gpu0) is None


def test_the_fallback_spreads_a_share_resource_over_cards_but_not_gpu_mem() -> None:
    core = TABLES[CORE]
    everything = [d for d, _ in core.devices()]
    assert sum(per_card(core, fallback_ids(core, everything[:120], (), 150)).values()) == 120
    assert per_card(core, fallback_ids(core, everything, (), 150)) == {0: 100, 1: 50}
    mem = TABLES[MEM]
    offered = ids(MEM, GPU0, 100) + ids(MEM, GPU1, 200)
    assert per_card(mem, fallback_ids(mem, offered, (), 250)) == {1: 200}


def test_the_default_asks_serve_only_gpu_mem() -> None:
    table: DeviceTable = TABLES[CORE]
    events = [inventory(GPU0, GPU1), *reserve_and_bind(CORE_ONLY, {"c": (CORE,)})]
    outcome = match_allocate(node_state(events), table, set(), ids(CORE, GPU1, 30))
    assert isinstance(outcome, NoMatch)
