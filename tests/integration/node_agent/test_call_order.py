"""Seed 003's multi-card pods through the agent's sockets, each container's resources in
every order the kubelet may go over them (a Go map's: any).

``c0``'s ``mgpu-core`` call only counts (its cards come with ``mgpu-memory``) and is as
large as ``c1``'s, which hands ``c1`` its whole card. Advised onto ``c1``'s card, the
counting call took it, and ``c1`` ran on another card (seen on a real kubelet v1.36).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
from nats.js import JetStreamContext

from gpushare.core.model import Card, ContainerShare
from gpushare.core.pods import Container, Pod, pod_from_dict
from gpushare.core.requests import MGPU_CORE, MGPU_MEMORY
from gpushare.embedded.kubelet import EmbeddedKubelet
from gpushare.node_agent.settings import NodeTarget
from tests.integration.node_agent.conftest import FAST, StartAgent
from tests.integration.node_agent.logbook import Logbook, gpu, wait_until_assigned

CARDS = tuple(gpu(index) for index in range(4))
G0, G1, G2, G3 = CARDS
VKE = (MGPU_CORE, MGPU_MEMORY)


class OrderedKubelet(EmbeddedKubelet):
    """The test kubelet, going over each named container's resources in the order given."""

    def __init__(self, *args: Any, orders: Mapping[str, Sequence[str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.orders = orders

    def _device_requests(self, container: Container) -> list[tuple[str, int]]:
        asked = dict(super()._device_requests(container))
        order = self.orders.get(container.name, sorted(asked))
        return [(resource, asked[resource]) for resource in order if resource in asked]


def shares(name: str, cards: Sequence[Card], core: int, mib: int) -> list[ContainerShare]:
    return [
        ContainerShare(
            container=name, card_index=c.index, card_uuid=c.uuid, memory_mib=mib, core_percent=core
        )
        for c in cards
    ]


LOGGED = {
    "2,1,3": {"c0": (G0, G1), "c1": (G2,), "c2": (G0, G1, G3)},
    "2,1": {"c0": (G0, G1), "c1": (G2,)},
}
"""The cards the log gives each container."""
SHARES = {
    "c0": shares("c0", LOGGED["2,1,3"]["c0"], 50, 3000),
    "c1": shares("c1", LOGGED["2,1,3"]["c1"], 100, G2.memory_mib),
    "c2": shares("c2", LOGGED["2,1,3"]["c2"], 33, 1000),
}
LIMITS = {
    "c0": {MGPU_CORE: "100", MGPU_MEMORY: "6000"},
    "c1": {MGPU_CORE: "100"},
    "c2": {MGPU_CORE: "99", MGPU_MEMORY: "3000"},
}


def pod_spec(counts: str) -> Pod:
    names = list(LOGGED[counts])
    return pod_from_dict(
        {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "uid": "p",
                "annotations": {"vke.volcengine.com/container-multiple-gpu": counts},
            },
            "spec": {
                "nodeName": "n1",
                "containers": [
                    {"name": name, "resources": {"limits": LIMITS[name]}} for name in names
                ],
            },
        }
    )


def every_order(counts: str) -> list[tuple[str, dict[str, tuple[str, ...]]]]:
    names = list(LOGGED[counts])
    per_container = [list(itertools.permutations(LIMITS[name])) for name in names]
    return [
        (counts, dict(zip(names, combination, strict=True)))
        for combination in itertools.product(*per_container)
    ]


Case = tuple[str, dict[str, tuple[str, ...]], bool]
"""The pod's counts, each container's resources in the kubelet's order, and whether the
kubelet serves pod-resources (else the agent guesses by order)."""
CASES: list[Case] = [
    (counts, orders, lists_pods)
    for lists_pods in (True, False)
    for counts, orders in (*every_order("2,1,3"), *every_order("2,1"))
]


def case_id(case: Case) -> str:
    counts, orders, lists_pods = case
    short = {MGPU_CORE: "core", MGPU_MEMORY: "mem"}
    each = " ".join(f"{c}:{'+'.join(short[r] for r in o)}" for c, o in orders.items())
    return f"{counts} {each} {'pod-resources' if lists_pods else 'order-based'}"


def counting(count: int) -> Callable[[dict[str, str]], bool]:
    """Whether the kubelet has the whole device list."""
    return lambda devices: len(devices) == count


@pytest.fixture
async def kubelets() -> AsyncIterator[list[EmbeddedKubelet]]:
    started: list[EmbeddedKubelet] = []
    try:
        yield started
    finally:
        for kubelet in started:
            await kubelet.stop()


@pytest.mark.parametrize("case", CASES, ids=[case_id(case) for case in CASES])
async def test_each_container_runs_on_the_cards_the_log_gave_it(
    js: JetStreamContext,
    target: NodeTarget,
    start_agent: StartAgent,
    kubelets: list[EmbeddedKubelet],
    case: Case,
) -> None:
    counts, orders, lists_pods = case
    book = Logbook(js)
    await book.report(*CARDS)
    kubelet = OrderedKubelet(
        target.name,
        target.plugin_dir,
        serve_pod_resources=lists_pods,
        keep_checkpoint=True,
        orders=orders,
    )
    await kubelet.start()
    kubelets.append(kubelet)
    agent = await start_agent(target, replace(FAST, dialects=("vke",)))
    for resource, table in agent.view.tables.items():
        await kubelet.wait_for_devices(resource, counting(table.count))
    logged = LOGGED[counts]
    reserved = await book.reserve_shares("p", *(s for name in logged for s in SHARES[name]))
    await book.bind(reserved, {"c0": VKE, "c1": (MGPU_CORE,), "c2": VKE})

    admitted = await kubelet.admit(pod_spec(counts))

    for name, cards in logged.items():
        indices = ",".join(str(card.index) for card in cards)
        assert admitted.envs(name)["GPUSHARE_VISIBLE_INDICES"] == indices, name
    for entry in admitted.devices:  # counted calls too: their IDs on the container's cards
        table = agent.view.tables[entry.resource]
        held = table.sort_by_card(entry.device_ids).per_card
        assert set(held) == {card.uuid for card in logged[entry.container]}, entry
    await wait_until_assigned(agent, "p", set(logged))
    assigned = {event.container: event.card_uuids for event in await book.assignments()}
    assert assigned == {name: tuple(c.uuid for c in cards) for name, cards in logged.items()}
    if lists_pods:
        assert await agent.check.check() == ()
    counted = {("reserve-p", name, MGPU_CORE) for name in logged if name != "c1"}
    assert counted <= agent.view.answered  # c0's and c2's core calls only counted

    await book.release(reserved)
    await agent.view.catch_up()
    assert agent.view.answered == set()  # forgotten with the pod
