"""Random but plausible allocation histories, for properties of the fold and snapshots."""

from __future__ import annotations

import random

from gpushare.core.events import (
    AllocationCorrected,
    AnyEvent,
    BindFailed,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    ForeignHold,
    PodBound,
    PodReleased,
    PodReserved,
)
from gpushare.core.model import ContainerShare
from tests.unit.core.factories import inventory, later, make_card, pod_ref

NODES = ("a", "b", "c")
CARDS = 2


def _share(node: str, card: int, mib: int) -> tuple[ContainerShare, ...]:
    uuid = f"GPU-{node}-{card}"
    return (ContainerShare(container="c0", card_index=card, card_uuid=uuid, memory_mib=mib),)


def history(rng: random.Random, length: int) -> list[tuple[int, AnyEvent]]:
    """``(seq, event)`` pairs: inventories first, then pods' lives interleaved, with the odd
    duplicate (redelivery at an old sequence), foreign hold, correction and discrepancy."""
    pairs: list[tuple[int, AnyEvent]] = [
        (0, inventory(node, [make_card(i, node=node) for i in range(CARDS)])) for node in NODES
    ]
    live: list[tuple[str, str, str]] = []  # node, uid, reservation id
    seq = 0
    for step in range(length):
        seq += 1
        at, roll = later(step), rng.random()
        node = rng.choice(NODES)
        if roll < 0.35 or not live:
            uid = f"u{step}"
            rid = f"r{step}"
            event: AnyEvent = PodReserved(
                id=rid,
                at=at,
                node=node,
                pod=pod_ref(uid),
                shares=_share(node, rng.randrange(CARDS), rng.choice([512, 4096, 8000])),
            )
            live.append((node, uid, rid))
        elif roll < 0.85:
            node, uid, rid = rng.choice(live)
            common = {"at": at, "node": node, "pod": pod_ref(uid), "reservation_id": rid}
            kind = rng.randrange(5)
            if kind == 0:
                event = PodBound(id=f"b{step}", resources={"c0": ("aliyun.com/gpu-mem",)}, **common)
            elif kind == 1:
                event = ContainerAssigned(
                    id=f"a{step}", container="c0", card_uuids=(f"GPU-{node}-0",), **common
                )
            elif kind == 2:
                event = AllocationCorrected(
                    id=f"c{step}",
                    shares=_share(node, rng.randrange(CARDS), 1024),
                    reason="kubelet",
                    **common,
                )
            elif kind == 3:
                event = BindFailed(id=f"f{step}", reason="409", **common)
                live.remove((node, uid, rid))
            else:
                event = PodReleased(id=f"x{step}", reason="deleted", **common)
                live.remove((node, uid, rid))
        elif roll < 0.92:
            holds = tuple(
                ForeignHold(
                    card_uuid=f"GPU-{node}-{card}", resource="nvidia.com/gpu", pods=("o/p",)
                )
                for card in range(CARDS)
                if rng.random() < 0.5
            )
            event = ForeignCardsHeld(id=f"h{step}", at=at, node=node, holds=holds)
        elif roll < 0.96:
            event = DiscrepancyFound(
                id=f"d{step}", at=at, node=node, kind="unknown_to_log", detail="x"
            )
        else:
            earlier = rng.choice(pairs)  # a redelivery: an old event at its old sequence
            if earlier[0] == 0:
                continue
            pairs.append(earlier)
            continue
        pairs.append((seq, event))
    return pairs
