"""A call on a resource is the next container's that asked it, keyed or only counting.

The kubelet serves a pod's containers in spec order and goes over each container's
resources in a Go map's order, different from run to run. Seed 003's multi-card pod,
``container-multiple-gpu: "2,1,3"``: ``c0`` asks ``mgpu-core: 100`` and
``mgpu-memory: 6000`` (two cards, keyed on memory: its core call only counts), ``c1``
``mgpu-core: 100`` (a whole card, keyed on core), ``c2`` ``mgpu-core: 99`` and
``mgpu-memory: 3000`` (three cards). ``c0``'s core call and ``c1``'s are the same size;
steered to ``c1``'s card, ``c0``'s took it, and ``c1`` ran on card 0 (found on a real
kubelet v1.36). Here every order of every container's resources is played through the
decisions the device plugin answers with, with pod-resources and without.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.core.events import AnyEvent
from gpushare.core.model import Card, ContainerShare
from gpushare.core.plugin_resources import container_demand
from gpushare.core.requests import (
    GPU_MEM,
    GPUSHARE_CORE,
    GPUSHARE_GPU,
    GPUSHARE_RATIO,
    MGPU_CORE,
    MGPU_MEMORY,
)
from gpushare.node_agent.device_table import DeviceTable, build_device_table
from gpushare.node_agent.matching import CountOnly, Match
from tests.unit.node_agent.builders import at, bind, card, inventory, reserve, share
from tests.unit.node_agent.kubelet_calls import KubeletCalls, Limits, check_served

V100 = 16276
CARDS = tuple(card(index, mib=V100) for index in range(4))
G0, G1, G2, G3 = CARDS
VKE = (MGPU_CORE, MGPU_MEMORY)
VKE_TABLES = {name: build_device_table(CARDS, "MiB", name) for name in VKE}


@dataclass(frozen=True)
class Pod:
    """A pod the log placed and bound, and what its containers ask the kubelet."""

    uid: str
    shares: tuple[ContainerShare, ...]
    asked: Mapping[str, tuple[str, ...]]

    def events(self, created: int = 0) -> list[AnyEvent]:
        reservation = reserve(self.uid, *self.shares, created=at(created))
        return [reservation, bind(reservation, self.asked)]

    def limits(self, tables: Mapping[str, DeviceTable]) -> dict[str, dict[str, int]]:
        """Container → resource → the count it asks: what the log gives it, card by card."""
        limits: dict[str, dict[str, int]] = {}
        for name, asked in self.asked.items():
            shares = [s for s in self.shares if s.container == name]
            limits[name] = {
                resource: sum(
                    container_demand(
                        resource, shares, tables[resource].by_uuid, tables[resource].memory_unit
                    ).values()
                )
                for resource in asked
            }
        return limits


def orders(limits: Mapping[str, Mapping[str, int]]) -> Iterator[list[Limits]]:
    """Every order the kubelet may go over each container's resources in."""
    per_container = [
        [Limits(name, order) for order in itertools.permutations(asked.items())]
        for name, asked in limits.items()
    ]
    for combination in itertools.product(*per_container):
        yield list(combination)


def mgpu(name: str, cards: Sequence[Card], core: int, mib: int = 0) -> list[ContainerShare]:
    return [share(name, on, mib, core=core) for on in cards]


SEED_003 = Pod(
    "p",
    (
        *mgpu("c0", [G0, G1], 50, 3000),
        *mgpu("c1", [G2], 100, V100),
        *mgpu("c2", [G0, G1, G3], 33, 1000),
    ),
    {"c0": VKE, "c1": (MGPU_CORE,), "c2": VKE},
)
"""``container-multiple-gpu: "2,1,3"``, as the log placed it."""
SEED_003_TWO = Pod(
    "p",
    (*mgpu("c0", [G0, G1], 50, 3000), *mgpu("c1", [G2], 100, V100)),
    {"c0": VKE, "c1": (MGPU_CORE,)},
)
"""``container-multiple-gpu: "2,1"``."""

MODES = {
    "pod-resources": (True, False),
    "pod-resources, the log behind": (True, True),
    "the order-based guess": (False, False),
    "the order-based guess, the log behind": (False, True),
}


def test_the_seed_pods_ask_what_the_seed_says() -> None:
    assert SEED_003.limits(VKE_TABLES) == {
        "c0": {MGPU_CORE: 100, MGPU_MEMORY: 6000},
        "c1": {MGPU_CORE: 100},
        "c2": {MGPU_CORE: 99, MGPU_MEMORY: 3000},
    }
    assert len(list(orders(SEED_003.limits(VKE_TABLES)))) == 4
    assert len(list(orders(SEED_003_TWO.limits(VKE_TABLES)))) == 2


@pytest.mark.parametrize("mode", MODES.values(), ids=list(MODES))
@pytest.mark.parametrize("pod", [SEED_003, SEED_003_TWO], ids=["2,1,3", "2,1"])
def test_every_resource_order_gives_each_container_its_own_cards(
    pod: Pod, mode: tuple[bool, bool]
) -> None:
    lists_pods, log_behind = mode
    for containers in orders(pod.limits(VKE_TABLES)):
        calls = KubeletCalls(
            VKE_TABLES,
            [inventory(*CARDS), *pod.events()],
            lists_pods=lists_pods,
            log_behind=log_behind,
        )
        calls.admit(pod.uid, containers)
        check_served(calls)
        node = calls.node
        (allocation,) = node.pods.values()
        assert allocation.fully_assigned
        assert len(calls.served) == sum(len(c.limits) for c in containers)


def test_c1_gets_card_2_whatever_c0_asks_first() -> None:
    """The reported case: ``c0``'s core call first, then ``c1``'s, the same size."""
    containers = [
        Limits("c0", ((MGPU_CORE, 100), (MGPU_MEMORY, 6000))),
        Limits("c1", ((MGPU_CORE, 100),)),
    ]
    calls = KubeletCalls(VKE_TABLES, [inventory(*CARDS), *SEED_003_TWO.events()])
    calls.admit("p", containers)
    core = VKE_TABLES[MGPU_CORE]
    c0_core, _, c1_core = calls.served
    assert isinstance(c0_core.outcome, CountOnly)
    assert core.sort_by_card(c0_core.taken).per_card == {G0.uuid: 50, G1.uuid: 50}
    assert isinstance(c1_core.outcome, Match)
    assert c1_core.outcome.cards == (G2,)
    assert core.sort_by_card(c1_core.taken).per_card == {G2.uuid: 100}
    assert ("reserve-p", "c0", MGPU_CORE) in calls.answered


# -- the property: any pods of shares, any order of any container's resources ------------

SMALL = tuple(card(index, mib=1024) for index in range(4))
GPUSHARE = (GPUSHARE_CORE, GPUSHARE_RATIO, GPUSHARE_GPU)
SMALL_TABLES = {name: build_device_table(SMALL, "MiB", name) for name in (*VKE, *GPUSHARE, GPU_MEM)}


@dataclass(frozen=True)
class Kind:
    """What a container asks, by dialect."""

    asked: tuple[str, ...]
    core: bool
    """Whether it asks compute (else its shares' core is 0)."""
    memory: bool
    """Whether it asks memory (else its shares' memory is 0)."""
    whole: bool = False
    """Whole cards: 100 % of untouched cards."""
    one_card: bool = False
    """``aliyun.com/gpu-mem``: a container's memory is on one card."""


KINDS = {
    "vke": (
        Kind(VKE, core=True, memory=True),
        Kind((MGPU_CORE,), core=True, memory=False),
        Kind((MGPU_MEMORY,), core=False, memory=True),
        Kind((MGPU_CORE,), core=True, memory=False, whole=True),
    ),
    "gpushare": (
        Kind((GPUSHARE_CORE, GPUSHARE_RATIO), core=True, memory=True),
        Kind((GPUSHARE_CORE,), core=True, memory=False),
        Kind((GPUSHARE_RATIO,), core=False, memory=True),
        Kind((GPUSHARE_GPU,), core=True, memory=True),
        Kind((GPUSHARE_CORE,), core=True, memory=False, whole=True),
        Kind((GPU_MEM, GPUSHARE_CORE), core=True, memory=True, one_card=True),
        Kind((GPU_MEM,), core=False, memory=True, one_card=True),
    ),
}


@dataclass
class Room:
    """What is left of the small cards while pods are drawn: percent of compute and of
    memory (memory-ratio percent; vke's MiB are ten per percent here)."""

    core: list[int]
    memory: list[int]
    untouched: list[bool]

    def fits(self, at: int, kind: Kind, core: int, percent: int) -> bool:
        if kind.whole:
            return self.untouched[at]
        return self.core[at] >= core and self.memory[at] >= percent

    def take(self, at: int, kind: Kind, core: int, percent: int) -> None:
        self.untouched[at] = False
        self.core[at] -= 100 if kind.whole else core
        self.memory[at] -= 100 if kind.whole else percent


def _mib(dialect: str, percent: int) -> int:
    """Memory for ``percent`` of a small card: vke asks MiB, gpushare a ratio (whose MiB
    the allocator rounds down, :func:`~gpushare.core.plugin_resources.share_demand`)."""
    return percent * 10 if dialect == "vke" else percent * 1024 // 100


@st.composite
def containers(
    draw: st.DrawFn, dialect: str, name: str, room: Room
) -> tuple[tuple[str, ...], list[ContainerShare]]:
    """What one container asks, and its shares on cards with room (none when none has)."""
    kind = draw(st.sampled_from(KINDS[dialect]))
    core = draw(st.integers(1, 60)) if kind.core else 0
    percent = draw(st.integers(1, 60)) if kind.memory else 0
    if kind.asked == (GPUSHARE_GPU,):
        percent = core  # the shorthand: as much memory as compute
    fitting = [index for index in range(len(SMALL)) if room.fits(index, kind, core, percent)]
    if not fitting:
        return kind.asked, []
    count = 1 if kind.one_card else draw(st.integers(1, min(3, len(fitting))))
    chosen = draw(st.permutations(fitting))[:count]
    placed = []
    for index in chosen:
        room.take(index, kind, core, percent)
        whole = kind.whole
        placed.append(
            share(
                name,
                SMALL[index],
                SMALL[index].memory_mib if whole else _mib(dialect, percent),
                core=100 if whole else core,
            )
        )
    return kind.asked, placed


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Pod], list[int], bool, bool]:
    """Pods placed on the small cards; the order the kubelet admits them in; whether
    pod-resources answers; whether the log is behind."""
    dialect = draw(st.sampled_from(sorted(KINDS)))
    room = Room(core=[100] * 4, memory=[100] * 4, untouched=[True] * 4)
    pods: list[Pod] = []
    for number in range(draw(st.integers(1, 3))):
        placed: list[ContainerShare] = []
        asked: dict[str, tuple[str, ...]] = {}
        for position in range(draw(st.integers(1, 3))):
            name = f"c{position}"
            names, found = draw(containers(dialect, name, room))
            if found:
                placed += found
                asked[name] = names
        if placed:
            pods.append(Pod(f"p{number}", tuple(placed), asked))
    lists_pods = draw(st.booleans())
    # without pod-resources the agent guesses by creation order, and so the kubelet admits
    order = draw(st.permutations(range(len(pods)))) if lists_pods else range(len(pods))
    return pods, list(order), lists_pods, draw(st.booleans())


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(scenario=scenarios(), data=st.data())
def test_any_pods_any_order_each_call_is_its_own_containers(
    scenario: tuple[list[Pod], list[int], bool, bool], data: st.DataObject
) -> None:
    pods, order, lists_pods, log_behind = scenario
    events: list[AnyEvent] = [inventory(*SMALL)]
    for created, pod in enumerate(pods):
        events += pod.events(created)
    calls = KubeletCalls(SMALL_TABLES, events, lists_pods=lists_pods, log_behind=log_behind)
    for index in order:
        pod = pods[index]
        containers = [
            Limits(name, tuple(data.draw(st.permutations(list(asked.items())))))
            for name, asked in pod.limits(SMALL_TABLES).items()
        ]
        calls.admit(pod.uid, containers)
    check_served(calls)
    assert all(allocation.fully_assigned for allocation in calls.node.pods.values())
