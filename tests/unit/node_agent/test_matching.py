"""Which container an Allocate call is for, and which IDs GetPreferredAllocation advises."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from gpushare.core.events import AnyEvent
from gpushare.core.model import Card
from gpushare.node_agent.device_table import DeviceTable, build_device_table
from gpushare.node_agent.matching import (
    Claim,
    Match,
    NoMatch,
    fallback_ids,
    match_allocate,
    preferred_ids,
)
from tests.unit.node_agent.builders import (
    NODE,
    assign,
    at,
    bind,
    card,
    inventory,
    node_state,
    reserve,
    reserve_and_bind,
    share,
)

GPU0, GPU1 = card(0), card(1)
MIB = build_device_table([GPU0, GPU1], "MiB")


def ids(table: DeviceTable, on: Card, count: int, start: int = 0) -> list[str]:
    return list(table.ids_of(on)[start : start + count])


def pod_a_on_gpu1_b_on_gpu0() -> list[AnyEvent]:
    """Two 1024 MiB pods; B was created first but sits on GPU0, A on GPU1."""
    return [
        inventory(GPU0, GPU1),
        *reserve_and_bind(reserve("a", share("c", GPU1, 1024), created=at(1))),
        *reserve_and_bind(reserve("b", share("c", GPU0, 1024), created=at(0))),
    ]


@dataclass
class Case:
    events: list[AnyEvent]
    device_ids: list[str]
    expected: tuple[str, str] | None
    """``(pod uid, container)``, or ``None`` for no match."""
    reason: Sequence[str] = ()
    """Fragments the refusal must contain."""
    claimed: set[Claim] = field(default_factory=set)
    table: DeviceTable = MIB


CASES = {
    "same size on different cards: GPU1's IDs get the pod the log put on GPU1": Case(
        pod_a_on_gpu1_b_on_gpu0(), ids(MIB, GPU1, 1024), ("a", "c")
    ),
    "same size on different cards: GPU0's IDs get the pod the log put on GPU0": Case(
        pod_a_on_gpu1_b_on_gpu0(), ids(MIB, GPU0, 1024, start=2000), ("b", "c")
    ),
    "same card, same size: the earlier-created pod first": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(reserve("late", share("c", GPU0, 512), created=at(5))),
            *reserve_and_bind(reserve("early", share("c", GPU0, 512), created=at(2))),
        ],
        ids(MIB, GPU0, 512),
        ("early", "c"),
    ),
    "same creation time: the earlier reservation first": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(reserve("first", share("c", GPU0, 512), created=at(0))),
            *reserve_and_bind(reserve("second", share("c", GPU0, 512), created=at(0))),
        ],
        ids(MIB, GPU0, 512),
        ("first", "c"),
    ),
    "a claimed container is skipped": Case(
        pod_a_on_gpu1_b_on_gpu0()
        + reserve_and_bind(reserve("d", share("c", GPU1, 1024), created=at(9))),
        ids(MIB, GPU1, 1024),
        ("d", "c"),
        claimed={("reserve-a", "c")},
    ),
    "an assigned container is skipped": Case(
        [
            *pod_a_on_gpu1_b_on_gpu0(),
            assign(reserve("a", share("c", GPU1, 1024)), "c", GPU1),
        ],
        ids(MIB, GPU1, 1024),
        None,
        reason=["no bound pod on node n1 waits for 1024 MiB on GPU1", "pending: ns/b"],
    ),
    "multi-container pod: matched per container by size": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(
                reserve("m", share("small", GPU0, 1024), share("big", GPU0, 2048), created=at(0))
            ),
        ],
        ids(MIB, GPU0, 2048),
        ("m", "big"),
    ),
    "multi-container pod, same sizes: in container order": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(
                reserve("m", share("one", GPU0, 1024), share("two", GPU0, 1024), created=at(0))
            ),
        ],
        ids(MIB, GPU0, 1024),
        ("m", "one"),
    ),
    "multi-container pod, first assigned: the second": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(
                pod := reserve("m", share("one", GPU0, 1024), share("two", GPU0, 1024))
            ),
            assign(pod, "one", GPU0),
        ],
        ids(MIB, GPU0, 1024, start=1024),
        ("m", "two"),
    ),
    "a pod part-way through admission before an older pod bound meanwhile": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(
                pod := reserve(
                    "m", share("one", GPU0, 1024), share("two", GPU0, 1024), created=at(5)
                )
            ),
            assign(pod, "one", GPU0),
            *reserve_and_bind(reserve("old", share("c", GPU0, 1024), created=at(0))),
        ],
        ids(MIB, GPU0, 1024, start=1024),
        ("m", "two"),
    ),
    "a claimed container counts as started too": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(
                reserve("m", share("one", GPU0, 1024), share("two", GPU0, 1024), created=at(5))
            ),
            *reserve_and_bind(reserve("old", share("c", GPU0, 1024), created=at(0))),
        ],
        ids(MIB, GPU0, 1024, start=1024),
        ("m", "two"),
        claimed={("reserve-m", "one")},
    ),
    "init container first": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(
                reserve(
                    "i",
                    share("setup", GPU0, 1024, init=True),
                    share("app", GPU0, 1024),
                    created=at(0),
                )
            ),
        ],
        ids(MIB, GPU0, 1024),
        ("i", "setup"),
    ),
    "init container done: the app container reuses its IDs": Case(
        [
            inventory(GPU0),
            *reserve_and_bind(
                pod := reserve("i", share("setup", GPU0, 2048, init=True), share("app", GPU0, 1024))
            ),
            assign(pod, "setup", GPU0),
        ],
        ids(MIB, GPU0, 1024),
        ("i", "app"),
    ),
    "GiB: one ID per GiB": Case(
        [inventory(GPU0, GPU1), *reserve_and_bind(reserve("g", share("c", GPU1, 3072)))],
        ids(build_device_table([GPU0, GPU1], "GiB"), GPU1, 3),
        ("g", "c"),
        table=build_device_table([GPU0, GPU1], "GiB"),
    ),
    "IDs spanning cards": Case(
        pod_a_on_gpu1_b_on_gpu0(),
        ids(MIB, GPU0, 512) + ids(MIB, GPU1, 512),
        None,
        reason=["span cards", "GPU0", "GPU1", "one card"],
    ),
    "IDs the plugin never advertised": Case(
        pod_a_on_gpu1_b_on_gpu0(), ["gpu7-0", "gpu7-1"], None, reason=["gpu7-0", "not advertised"]
    ),
    "no request IDs at all": Case(pod_a_on_gpu1_b_on_gpu0(), [], None, reason=["no device IDs"]),
    "nothing of that size on that card": Case(
        pod_a_on_gpu1_b_on_gpu0(),
        ids(MIB, GPU1, 512),
        None,
        reason=[
            "no bound pod on node n1 waits for 512 MiB on GPU1",
            "ns/a container 'c' (1024 MiB on GPU1",
            "ns/b container 'c' (1024 MiB on GPU0",
        ],
    ),
    "reserved but not bound yet": Case(
        [inventory(GPU0), reserve("r", share("c", GPU0, 1024))],
        ids(MIB, GPU0, 1024),
        None,
        reason=["reserved, not bound yet"],
    ),
    "an empty node": Case([inventory(GPU0)], ids(MIB, GPU0, 1), None, reason=["pending: none"]),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_match_allocate(case: Case) -> None:
    outcome = match_allocate(node_state(case.events), case.table, case.claimed, case.device_ids)
    if case.expected is None:
        assert isinstance(outcome, NoMatch), outcome
        assert NODE in outcome.reason
        for fragment in case.reason:
            assert fragment in outcome.reason
    else:
        assert isinstance(outcome, Match), outcome
        assert (outcome.allocation.pod.uid, outcome.share.container) == case.expected
        assert outcome.card.uuid == outcome.share.card_uuid


def test_each_of_two_same_size_pods_gets_its_logged_card_in_either_order() -> None:
    node = node_state(pod_a_on_gpu1_b_on_gpu0())
    claimed: set[Claim] = set()
    for on, uid in ((GPU0, "b"), (GPU1, "a")):
        outcome = match_allocate(node, MIB, claimed, ids(MIB, on, 1024))
        assert isinstance(outcome, Match)
        assert outcome.allocation.pod.uid == uid
        claimed.add(outcome.claim)


def prefer(
    events: list[AnyEvent],
    available: list[str],
    size: int,
    must: Sequence[str] = (),
    claimed: set[Claim] | None = None,
) -> tuple[str, ...] | None:
    return preferred_ids(
        node_state(events),
        MIB,
        claimed or set(),
        available=available,
        must_include=must,
        size=size,
    )


def test_preferred_ids_are_on_the_card_of_the_earliest_waiting_container() -> None:
    everything = [d for d, _ in MIB.devices()]
    chosen = prefer(pod_a_on_gpu1_b_on_gpu0(), everything, 1024)
    assert chosen == MIB.ids_of(GPU0)[:1024]  # pod b was created first, on GPU0
    chosen = prefer(pod_a_on_gpu1_b_on_gpu0(), everything, 1024, claimed={("reserve-b", "c")})
    assert chosen == MIB.ids_of(GPU1)[:1024]


def test_preferred_ids_skip_a_card_without_room() -> None:
    only_gpu1 = list(MIB.ids_of(GPU1))
    assert prefer(pod_a_on_gpu1_b_on_gpu0(), only_gpu1, 1024) == MIB.ids_of(GPU1)[:1024]


def test_preferred_ids_keep_must_include_first_and_on_its_card() -> None:
    events = [
        inventory(GPU0, GPU1),
        *reserve_and_bind(
            reserve("i", share("setup", GPU1, 512, init=True), share("app", GPU1, 1024))
        ),
        assign(reserve("i", share("setup", GPU1, 512, init=True)), "setup", GPU1),
    ]
    must = ids(MIB, GPU1, 512, start=100)
    available = [d for d, _ in MIB.devices() if d not in must]
    chosen = prefer(events, available, 1024, must=must)
    assert chosen is not None
    assert list(chosen[:512]) == must
    assert len(chosen) == len(set(chosen)) == 1024
    assert {MIB.card_of(d) for d in chosen} == {GPU1}


def test_no_waiting_container_gives_no_preference_and_the_fallback_keeps_one_card() -> None:
    everything = [d for d, _ in MIB.devices()]
    assert prefer([inventory(GPU0, GPU1)], everything, 300) is None
    fallback = fallback_ids(MIB, everything[:200] + everything[-400:], (), 300)
    assert len(fallback) == 300
    assert {MIB.card_of(d) for d in fallback} == {GPU1}


def test_unbound_pods_get_no_preference() -> None:
    events: list[AnyEvent] = [inventory(GPU0), reserve("r", share("c", GPU0, 1024))]
    assert prefer(events, list(MIB.ids_of(GPU0)), 1024) is None
    assert prefer([*events, bind(reserve("r", share("c", GPU0, 1024)))], [], 1024) is None
