"""Which container an Allocate call is for, and which IDs to prefer for it.

The kubelet's Allocate carries device IDs and nothing else: no pod, no container. The
log, though, says which card every bound container was given. Since a device ID names
its card, the call is for a container that (1) is bound and not yet assigned, (2) asks
as many memory units as there are IDs, and (3) was given the very card the IDs belong
to. Among several, the kubelet admits one pod at a time, in creation order, and a pod's
containers in spec order (init containers first). So a pod part-way through admission
(some containers assigned or claimed, some waiting) comes first, then the earliest by
``(pod_created_at, reserved_seq, container position)``.

Two same-size pods on *different* cards therefore never trade cards when the kubelet
admits them in creation order (complaint 1 of the anchors). Admitted against that
order, they can: each card still holds one container of that size, so the memory
accounting stays right, but the log names the wrong pod on each card; the
pod-resources check (:mod:`.reconciling`) reports it. Same-size containers on the
*same* card may trade places unnoticed, with nothing they get changed but the name.

``claimed`` holds containers this agent has matched but whose ``ContainerAssigned`` the
fold has not applied yet, so back-to-back calls never pick one container twice.

Pure: folded state and request in, a decision (or the reason there is none) out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass
from datetime import datetime

from gpushare.core.model import Card, ContainerShare
from gpushare.core.requests import to_units
from gpushare.core.state import NodeState, PodAllocation
from gpushare.node_agent.devices import DeviceTable

Claim = tuple[str, str]
"""``(reservation_id, container)``: one container of one reservation."""

MAX_LISTED = 8
"""How many waiting containers a refusal names before it says "and N more"."""


@dataclass(frozen=True)
class PendingContainer:
    """A container the log placed on a card that has not got its devices yet."""

    allocation: PodAllocation
    share: ContainerShare
    position: int
    """The container's place among the pod's shares (init containers come first)."""

    @property
    def claim(self) -> Claim:
        return (self.allocation.reservation_id, self.share.container)

    def order(self, started: Set[str]) -> tuple[bool, datetime, int, int]:
        """Pods whose admission has started (by reservation id) first, then by age."""
        created = self.allocation.pod_created_at or self.allocation.reserved_at
        first = self.allocation.reservation_id in started
        return (not first, created, self.allocation.reserved_seq, self.position)

    def units(self, memory_unit: str) -> int:
        return to_units(self.share.memory_mib, memory_unit)

    def describe(self, memory_unit: str, table: DeviceTable) -> str:
        pod = self.allocation.pod
        state = "bound" if self.allocation.bound else "reserved, not bound yet"
        card = _card_name(table, self.share.card_uuid, self.share.card_index)
        return (
            f"{pod.key} container {self.share.container!r} "
            f"({self.units(memory_unit)} {memory_unit} on {card}, {state})"
        )


@dataclass(frozen=True)
class Match:
    """The container an Allocate call is for, and the card it gets."""

    allocation: PodAllocation
    share: ContainerShare
    card: Card

    @property
    def claim(self) -> Claim:
        return (self.allocation.reservation_id, self.share.container)


@dataclass(frozen=True)
class NoMatch:
    """Why no container fits; the text goes back to the kubelet (and the pod's status)."""

    reason: str


def _card_name(table: DeviceTable, uuid: str, index: int) -> str:
    card = table.card(uuid)
    return f"GPU{card.index if card else index} ({uuid})"


def started_admissions(node: NodeState, claimed: Set[Claim]) -> set[str]:
    """Reservations with a container assigned or claimed: the kubelet is admitting them."""
    started = {rid for rid, _ in claimed}
    started.update(a.reservation_id for a in node.pods.values() if a.assigned)
    return started


def waiting_containers(node: NodeState, claimed: Set[Claim]) -> list[PendingContainer]:
    """Every not-yet-assigned, unclaimed container on the node, bound or not, in order."""
    waiting = [
        PendingContainer(allocation=allocation, share=share, position=position)
        for allocation in node.pods.values()
        for position, share in enumerate(allocation.shares)
        if share.container not in allocation.assigned
        and (allocation.reservation_id, share.container) not in claimed
    ]
    started = started_admissions(node, claimed)
    return sorted(waiting, key=lambda pending: pending.order(started))


def describe_waiting(
    waiting: Sequence[PendingContainer], memory_unit: str, table: DeviceTable
) -> str:
    if not waiting:
        return "none"
    listed = [pending.describe(memory_unit, table) for pending in waiting[:MAX_LISTED]]
    more = len(waiting) - MAX_LISTED
    return "; ".join(listed) + (f"; and {more} more" if more > 0 else "")


def card_of_ids(table: DeviceTable, device_ids: Iterable[str]) -> Card | NoMatch:
    """The one card all ``device_ids`` belong to, or why there is not exactly one."""
    ids = list(device_ids)
    if not ids:
        return NoMatch("the request names no device IDs")
    unknown = [device for device in ids if table.card_of(device) is None]
    if unknown:
        return NoMatch(f"device IDs {', '.join(unknown[:MAX_LISTED])} are not advertised")
    cards = {card.uuid: card for device in ids if (card := table.card_of(device)) is not None}
    if len(cards) > 1:
        names = ", ".join(f"GPU{c.index} ({c.uuid})" for c in cards.values())
        return NoMatch(f"the device IDs span cards {names}; a container's memory is on one card")
    return next(iter(cards.values()))


def match_allocate(
    node: NodeState, table: DeviceTable, claimed: Set[Claim], device_ids: Sequence[str]
) -> Match | NoMatch:
    """The earliest bound, waiting container of this size on the IDs' card."""
    card = card_of_ids(table, device_ids)
    if isinstance(card, NoMatch):
        return NoMatch(f"on node {node.name}: {card.reason}")
    units = len(set(device_ids))
    waiting = waiting_containers(node, claimed)
    for pending in waiting:
        if (
            pending.allocation.bound
            and pending.share.card_uuid == card.uuid
            and pending.units(table.memory_unit) == units
        ):
            return Match(allocation=pending.allocation, share=pending.share, card=card)
    unit = table.memory_unit
    return NoMatch(
        f"no bound pod on node {node.name} waits for {units} {unit} on "
        f"GPU{card.index} ({card.uuid}); pending: {describe_waiting(waiting, unit, table)}"
    )


def offered_per_card(table: DeviceTable, offered: Iterable[str]) -> dict[str, int]:
    """How many of the offered IDs each card (by UUID) has."""
    counts: dict[str, int] = {}
    for device in offered:
        card = table.card_of(device)
        if card is not None:
            counts[card.uuid] = counts.get(card.uuid, 0) + 1
    return counts


def _preferred_card(
    node: NodeState, table: DeviceTable, claimed: Set[Claim], offered: Set[str], size: int
) -> Card | None:
    """The card of the earliest bound, waiting container of ``size`` units with room."""
    room = offered_per_card(table, offered)
    for pending in waiting_containers(node, claimed):
        if not pending.allocation.bound or pending.units(table.memory_unit) != size:
            continue
        card = table.card(pending.share.card_uuid)
        if card is not None and room.get(card.uuid, 0) >= size:
            return card
    return None


def preferred_ids(
    node: NodeState,
    table: DeviceTable,
    claimed: Set[Claim],
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> tuple[str, ...] | None:
    """The IDs to advise for one container: ``must_include`` first, then its card's IDs.

    ``None`` when no waiting container fits (the caller may wait for the log and ask
    again). A ``must_include`` on one card (IDs reused from an init container) pins
    the card; the kubelet requires those IDs whatever we advise.
    """
    offered = set(available) | set(must_include)
    pinned = card_of_ids(table, must_include) if must_include else None
    if isinstance(pinned, NoMatch):
        return None
    card = pinned or _preferred_card(node, table, claimed, offered, size)
    if card is None:
        return None
    return _take_ids(table, card, offered, must_include, size)


def _take_ids(
    table: DeviceTable, card: Card | None, offered: Set[str], must_include: Sequence[str], size: int
) -> tuple[str, ...]:
    """``must_include`` first, then ``card``'s offered IDs in order, up to ``size``."""
    chosen = list(dict.fromkeys(must_include))
    taken = set(chosen)
    for device in table.ids_of(card) if card is not None else ():
        if len(chosen) >= size:
            break
        if device in offered and device not in taken:
            chosen.append(device)
            taken.add(device)
    return tuple(chosen)


def fallback_ids(
    table: DeviceTable, available: Sequence[str], must_include: Sequence[str], size: int
) -> tuple[str, ...]:
    """Advice when the log names no container: at least keep the IDs on one card.

    ``must_include`` first, then the card with the most offered IDs; Allocate will
    still refuse a call the log cannot explain, but with a reason about one card.
    """
    offered = set(available) | set(must_include)
    pinned = card_of_ids(table, must_include) if must_include else None
    card = pinned if isinstance(pinned, Card) else None
    if card is None:
        room = offered_per_card(table, offered)
        card = max(table.cards, key=lambda c: room.get(c.uuid, 0), default=None)
    return _take_ids(table, card, offered, must_include, size)
