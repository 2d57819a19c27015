"""What the node agent appends for what its pod-resources check found (pure).

* ``card_mismatch`` → ``AllocationCorrected``: the kubelet's pod-resources is the truth,
  so the pod's shares move to the cards its IDs are on, each container keeping its
  memory and core. When that cannot be said (an ID names no card here, or the container
  holds another number of cards than the log gave it) → ``DiscrepancyFound(card_mismatch)``.
* ``unknown_to_log`` and ``missing_from_kubelet`` → ``DiscrepancyFound`` of that kind:
  releasing or re-adopting a pod is the binder's decision, not the device plugin's.
* Foreign cards (:mod:`.foreign`) → ``ForeignCardsHeld`` whenever they differ from what
  the fold holds (an empty list frees them), and ``DiscrepancyFound(foreign_overlap)``
  for each live reservation of ours on such a card.

Ids derive from the finding (kind, node, pod, container, reservation; the corrected
shares; the held cards and the node's sequence), so the same finding is the same event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

import msgspec

from gpushare.core.discrepancies import digest, discrepancy
from gpushare.core.events import (
    AllocationCorrected,
    CorrectedShares,
    DiscrepancyFound,
    ForeignCardsHeld,
    ForeignHold,
)
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.state import NodeState, with_pods
from gpushare.node_agent.foreign import overlaps
from gpushare.node_agent.reconciling import Finding


def reporter_of(node: str) -> str:
    return f"node-agent/{node}"


def moved_shares(
    shares: tuple[ContainerShare, ...],
    container: str,
    kubelet_cards: Sequence[str],
    cards: Mapping[str, Card],
) -> tuple[ContainerShare, ...] | None:
    """``shares`` with the app container's moved onto ``kubelet_cards``; ``None`` when the
    move is not one card for one card (or names a card the node does not have)."""
    own = sorted(
        (s for s in shares if s.container == container and not s.init), key=lambda s: s.card_index
    )
    given = list(dict.fromkeys(share.card_uuid for share in own))
    leaving = [uuid for uuid in given if uuid not in kubelet_cards]
    arriving = [uuid for uuid in kubelet_cards if uuid not in given]
    if not own or len(leaving) != len(arriving) or any(u not in cards for u in arriving):
        return None
    target = dict(zip(leaving, arriving, strict=True))

    def move(share: ContainerShare) -> ContainerShare:
        if share.container != container or share.init or share.card_uuid not in target:
            return share
        card = cards[target[share.card_uuid]]
        return msgspec.structs.replace(share, card_uuid=card.uuid, card_index=card.index)

    return tuple(move(share) for share in shares)


def discrepancy_for(node: str, finding: Finding, at: datetime) -> DiscrepancyFound:
    """The ``DiscrepancyFound`` recording ``finding`` as it is."""
    allocation = finding.allocation
    rid = allocation.reservation_id if allocation else ""
    return discrepancy(
        kind=finding.kind,
        identity=digest(node, finding.pod, finding.container, rid),
        node=node,
        at=at,
        detail=f"{finding.pod} container {finding.container!r}: {finding.detail}",
        pod=allocation.pod if allocation else None,
        reservation_id=rid,
        reporter=reporter_of(node),
    )


def corrections(
    node: NodeState, findings: Iterable[Finding], at: datetime
) -> list[AllocationCorrected | DiscrepancyFound]:
    """One ``AllocationCorrected`` for every reservation whose containers can be moved, a
    ``DiscrepancyFound`` for every other finding.

    The moves travel in one event, and only those that leave no card holding more than it
    has: when the kubelet swapped two same-size pods' cards but has admitted only one of
    them yet, moving that one alone would put both on one card; it waits (recorded as a
    ``card_mismatch``) until the other is admitted and both move at once.
    """
    cards = {card.uuid: card for card in node.cards}
    events: list[AllocationCorrected | DiscrepancyFound] = []
    moved: dict[str, tuple[ContainerShare, ...]] = {}
    found_for: dict[str, list[Finding]] = {}
    pods: dict[str, PodRef] = {}
    for finding in findings:
        allocation = finding.allocation
        if finding.kind != "card_mismatch" or allocation is None:
            events.append(discrepancy_for(node.name, finding, at))
            continue
        rid = allocation.reservation_id
        shares = moved.get(rid, allocation.shares)
        found = moved_shares(shares, finding.container, finding.kubelet_cards, cards)
        if found is None:
            events.append(discrepancy_for(node.name, finding, at))
            continue
        moved[rid], pods[rid] = found, allocation.pod
        found_for.setdefault(rid, []).append(finding)
    for rid in _crowding(node, moved):
        for finding in found_for[rid]:
            waiting = f"{finding.detail}; {WAITING_FOR_THE_SWAP}"
            events.append(discrepancy_for(node.name, replace(finding, detail=waiting), at))
        del moved[rid]
    if moved:
        events.append(_corrected(node.name, moved, pods, found_for, at))
    return events


WAITING_FOR_THE_SWAP = (
    "moving it now would put more on a card than it has: waiting for the kubelet to admit "
    "the pod it swapped cards with"
)


def _crowding(node: NodeState, moved: Mapping[str, tuple[ContainerShare, ...]]) -> list[str]:
    """The reservations whose moves must wait: dropped one card at a time until the rest
    leave every card within its size (a card already over stays as it was)."""
    waiting: list[str] = []
    before = node.used_mib
    while True:
        pods = dict(node.pods)
        for allocation in node.pods.values():
            shares = moved.get(allocation.reservation_id)
            if shares is not None and allocation.reservation_id not in waiting:
                pods[allocation.pod.uid] = msgspec.structs.replace(allocation, shares=shares)
        after = with_pods(node, pods, node.last_seq).used_mib
        crowded = {
            card.uuid
            for card in node.cards
            if after.get(card.uuid, 0) > max(card.memory_mib, before.get(card.uuid, 0))
        }
        movers = [
            rid
            for rid, shares in moved.items()
            if rid not in waiting and any(share.card_uuid in crowded for share in shares)
        ]
        if not movers:
            return waiting
        waiting.extend(movers)


def _corrected(
    node: str,
    moved: Mapping[str, tuple[ContainerShare, ...]],
    pods: Mapping[str, PodRef],
    found_for: Mapping[str, list[Finding]],
    at: datetime,
) -> AllocationCorrected:
    first, *others = (
        CorrectedShares(pod=pods[rid], reservation_id=rid, shares=moved[rid])
        for rid in sorted(moved)
    )
    reasons = [
        f"{pods[rid].key} container {finding.container!r}: {finding.detail}"
        for rid in sorted(moved)
        for finding in found_for[rid]
    ]
    return AllocationCorrected(
        id=f"corrected-{digest(node, sorted(moved.items()))}",
        at=at,
        node=node,
        pod=first.pod,
        reservation_id=first.reservation_id,
        shares=first.shares,
        also=tuple(others),
        reason="the kubelet's pod-resources: " + "; ".join(reasons),
    )


def foreign_held(
    node: NodeState, holds: tuple[ForeignHold, ...], at: datetime
) -> ForeignCardsHeld | None:
    """``ForeignCardsHeld`` when ``holds`` differ from the fold's (``None``: they agree)."""
    if set(holds) == set(node.foreign):
        return None
    return ForeignCardsHeld(
        id=f"foreign-{node.name}-{node.last_seq}-{digest(holds)}",
        at=at,
        node=node.name,
        holds=holds,
    )


def foreign_overlaps(
    node: NodeState, holds: Iterable[ForeignHold], at: datetime
) -> list[DiscrepancyFound]:
    """One finding per live reservation of ours on a card another plugin's pod holds."""
    overlapping: list[DiscrepancyFound] = []
    for hold, allocation in overlaps(node, holds):
        rid = allocation.reservation_id
        holders = ", ".join(hold.pods) or "pods"
        overlapping.append(
            discrepancy(
                kind="foreign_overlap",
                identity=digest(node.name, hold.card_uuid, rid),
                node=node.name,
                at=at,
                detail=(
                    f"{hold.card_uuid} is held through {hold.resource} by {holders}, "
                    f"and the log reserved it for {allocation.pod.key}"
                ),
                pod=allocation.pod,
                reservation_id=rid,
                reporter=reporter_of(node.name),
            )
        )
    return overlapping
