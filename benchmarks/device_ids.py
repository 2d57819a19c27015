"""``make bench`` (its last lines): the node agent's advice to the kubelet, in process.

At each container's admission the kubelet calls ``GetPreferredAllocation`` with every
free ID of the resource: with a device per MiB, four 32 GiB cards are 131,072 IDs, read
here from a decoded request as the plugin reads them (new strings at each read, whose
hashes the set then computes). The
agent counts them per card, picks a container's IDs from its card, and checks the answer
(:mod:`gpushare.node_agent.matching`), the offer put in a set once for all of them.
Printed: the time of each step for one container of 4,000 MiB, and of the whole advice
(as when the log names no container), p50 and p99 of 50. Then what else counts IDs by
card: Allocate, for that container's IDs, and the pod-resources check, for a node whose
four cards are held whole by 32 containers of 4,096 MiB (every ``--check-interval`` and
after each burst of admissions).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from benchmarks.run import percentile
from gpushare.core.events import AnyEvent, ContainerAssigned, PodBound, PodReserved
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.state import NodeState, fold_events
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2
from gpushare.node_agent.device_table import DeviceTable, build_device_table
from gpushare.node_agent.matching import (
    exactly,
    fallback_ids,
    ids_per_card,
    offer_of,
    offered_per_card,
)
from gpushare.node_agent.reconciling import KubeletContainer, compare_with_log

CARDS = 4
CARD_MIB = 32768
SIZE = 4000
ROUNDS = 50
HELD_MIB = 4096
"""Each container's share in the pod-resources check's full node."""


def timed(step: Callable[[], object]) -> tuple[float, float]:
    """p50 and p99 of ``step``, in milliseconds."""
    step()  # the table's per-card ID sets are made on first use
    samples = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        step()
        samples.append(1000 * (time.perf_counter() - started))
    return percentile(samples, 50), percentile(samples, 99)


def full_node(table: DeviceTable) -> tuple[NodeState, list[KubeletContainer]]:
    """Every card held whole by containers of ``HELD_MIB``: the fold, and the kubelet's
    pod-resources answer that agrees with it."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    events: list[tuple[int, AnyEvent]] = []
    held: list[KubeletContainer] = []
    for card in table.cards:
        ids = table.ids_of(card)
        for first in range(0, len(ids), HELD_MIB):
            name = f"p{card.index}-{first}"
            pod = PodRef(namespace="ns", name=name, uid=name)
            share = ContainerShare(
                container="app", card_index=card.index, card_uuid=card.uuid, memory_mib=HELD_MIB
            )
            reserved = PodReserved(id=f"r-{name}", at=at, node="n", pod=pod, shares=(share,))
            bound = PodBound(id=f"b-{name}", at=at, node="n", pod=pod, reservation_id=reserved.id)
            assigned = ContainerAssigned(
                id=f"a-{name}",
                at=at,
                node="n",
                pod=pod,
                container="app",
                card_uuids=(card.uuid,),
                reservation_id=reserved.id,
            )
            ordered: tuple[AnyEvent, ...] = (reserved, bound, assigned)
            events += [(len(events) + n, event) for n, event in enumerate(ordered, 1)]
            held.append(KubeletContainer("ns", name, "app", ids[first : first + HELD_MIB]))
    return fold_events(events).node("n"), held


def main() -> int:
    cards = [
        Card(
            index=i,
            uuid=f"GPU-{i}0000000-1111-2222-3333-44444444444{i}",
            model="H100",
            memory_mib=CARD_MIB,
        )
        for i in range(CARDS)
    ]
    table = build_device_table(cards, "MiB")
    every_id = [device for card in table.cards for device in table.ids_of(card)]
    request = api_pb2.ContainerPreferredAllocationRequest.FromString(
        api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=every_id, allocation_size=SIZE
        ).SerializeToString()
    )
    available = list(request.available_deviceIDs)
    offered = offer_of(available, [])
    chosen = fallback_ids(table, available, [], SIZE, offered=offered)

    def advise() -> object:
        """As ``GetPreferredAllocation`` does when the log names no container."""
        offer_ids = list(request.available_deviceIDs)
        offer = offer_of(offer_ids, [])
        picked = fallback_ids(table, offer_ids, [], SIZE, offered=offer)
        return exactly(table, SIZE, [], picked, offer_ids, offered=offer)

    steps = {
        "read the offer": lambda: list(request.available_deviceIDs),
        "read it, put it in a set": lambda: offer_of(list(request.available_deviceIDs), []),
        "count the offer per card": lambda: offered_per_card(table, offered),
        "choose a container's IDs": lambda: fallback_ids(
            table, available, [], SIZE, offered=offered
        ),
        "check the answer": lambda: exactly(table, SIZE, [], chosen, available, offered=offered),
        "the whole advice": advise,
    }
    node, held = full_node(table)
    more = {
        "Allocate: IDs per card": lambda: ids_per_card(table, chosen),
        f"pod-resources check, {len(held)} containers": lambda: compare_with_log(node, table, held),
    }
    print(
        f"\nnode agent: advice for one container of {SIZE:,} MiB among {len(available):,} "
        f"free MiB IDs ({CARDS} x {CARD_MIB:,} MiB), in process"
    )
    for name, step in steps.items():
        p50, p99 = timed(step)
        print(f"  {name:<26} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
    print(
        f"node agent: counting device IDs by card ({sum(len(c.device_ids) for c in held):,} held)"
    )
    for name, step in more.items():
        p50, p99 = timed(step)
        print(f"  {name:<33} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
