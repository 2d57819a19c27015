"""Which container an Allocate call is for, and which IDs to prefer for it.

The kubelet's Allocate carries device IDs and nothing else: no pod, no container, and
one resource (each resource has its own plugin socket). The log, though, says which
cards every bound container was given, and ``PodBound`` which resources it asked.
Since a device ID names its card, a call on resource R is for a bound container that
asked R and has not had its call on R yet (:func:`calls_to_come`). The kubelet serves a
pod's containers one at a time in spec order (init containers first), and each of a
container's resources once, in no set order (a Go map's); it admits one pod at a time.
So a pod part-way through admission (some call answered) comes first, then the earliest
by ``(pod_created_at, reserved_seq, container position)``, keyed and counting calls
alike; the first that fits the call's size is the one.

On the container's *keyed* resource (the one of its resources that hands it its cards,
:func:`~gpushare.core.plugin_resources.keyed_resource`) the IDs must lie on its cards,
as many of R's units on each as it holds there. A call on a resource it asked *besides*
its keyed one only counts (:class:`CountOnly`): it hands nothing out, and the agent
remembers it (``answered``) so that the next call on R goes to the next container.

Two same-size pods on *different* cards therefore never trade cards when the kubelet
admits them in creation order (complaint 1 of the anchors). Admitted against that
order, they can: each card still holds one container of that size, so the memory
accounting stays right, but the log names the wrong pod on each card; the
pod-resources check (:mod:`.reconciling`) reports it. Same-size containers on the
*same* card may trade places unnoticed, with nothing they get changed but the name.

``claimed`` holds containers this agent has matched but whose ``ContainerAssigned`` the
fold has not applied yet, so back-to-back calls never pick one container twice;
``answered`` every call this agent answered, matched or counted, while its pod lives.

Pure: folded state and request in, a decision (or the reason there is none) out.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

import msgspec

from gpushare.core.model import Card, ContainerShare
from gpushare.core.plugin_resources import container_demand, keyed_resource, share_demand
from gpushare.core.requests import GPU_MEM
from gpushare.core.state import NodeState, PodAllocation
from gpushare.node_agent.device_table import DeviceTable

Claim = tuple[str, str]
"""``(reservation_id, container)``: one container of one reservation."""

Call = tuple[str, str, str]
"""``(reservation_id, container, resource)``: one container's call on one resource."""

NO_CALLS: frozenset[Call] = frozenset()

MAX_LISTED = 8
"""How many waiting containers a refusal names before it says "and N more"."""

_NO_ASKS: Mapping[str, Mapping[str, tuple[str, ...]]] = MappingProxyType({})


@dataclass(frozen=True)
class Asks:
    """The resource names each bound container asked (from ``PodBound``), and which
    resources this agent advertises: together they say which call hands a container
    its cards."""

    by_reservation: Mapping[str, Mapping[str, tuple[str, ...]]] = field(
        default_factory=lambda: _NO_ASKS
    )
    advertised: frozenset[str] = frozenset({GPU_MEM})

    def names(self, reservation_id: str, container: str) -> tuple[str, ...]:
        """What the container asked; ``()`` when unknown (an older binder's ``PodBound``)."""
        return self.by_reservation.get(reservation_id, {}).get(container, ())

    def keyed(self, reservation_id: str, container: str) -> str | None:
        return keyed_resource(self.names(reservation_id, container), self.advertised)

    def asked(self, reservation_id: str, container: str, resource: str) -> bool:
        """Whether the container asked ``resource``, to get cards from it or only to count."""
        names = self.names(reservation_id, container)
        return resource in names or self.keyed(reservation_id, container) == resource

    def aliyun(self, reservation_id: str, container: str) -> bool:
        """Whether the container asked ``aliyun.com/gpu-mem`` (or, unknown, is assumed to)."""
        names = self.names(reservation_id, container)
        return not names or GPU_MEM in names


LEGACY = Asks()
"""Every container asked ``aliyun.com/gpu-mem``, the only resource advertised."""


def containers_of(
    shares: Sequence[ContainerShare],
) -> Iterator[tuple[int, tuple[ContainerShare, ...]]]:
    """``(position of its first share, its shares)`` per container, in share order."""
    grouped: dict[str, list[ContainerShare]] = {}
    first: dict[str, int] = {}
    for position, share in enumerate(shares):
        grouped.setdefault(share.container, []).append(share)
        first.setdefault(share.container, position)
    for name, group in grouped.items():
        yield first[name], tuple(group)


@dataclass(frozen=True)
class PendingContainer:
    """A container the log placed on cards that has not got its devices yet."""

    allocation: PodAllocation
    shares: tuple[ContainerShare, ...]
    """One per card, in share order."""
    position: int
    """The place of its first share among the pod's shares (init containers come first)."""

    @property
    def share(self) -> ContainerShare:
        return self.shares[0]

    @property
    def name(self) -> str:
        return self.shares[0].container

    @property
    def claim(self) -> Claim:
        return (self.allocation.reservation_id, self.name)

    def order(self, started: Set[str]) -> tuple[bool, datetime, int, int]:
        """Pods whose admission has started (by reservation id) first, then by age."""
        created = self.allocation.pod_created_at or self.allocation.reserved_at
        first = self.allocation.reservation_id in started
        return (not first, created, self.allocation.reserved_seq, self.position)

    def demand(self, table: DeviceTable) -> dict[str, int]:
        """Card UUID → how many of the table's IDs this container takes there (nothing
        when one of its cards is not in the table: no call can be for it)."""
        if any(share.card_uuid not in table.by_uuid for share in self.shares):
            return {}
        return container_demand(table.resource, self.shares, table.by_uuid, table.memory_unit)

    def describe(self, table: DeviceTable) -> str:
        pod = self.allocation.pod
        state = "bound" if self.allocation.bound else "reserved, not bound yet"
        amounts = ", ".join(_share_amount(table, share) for share in self.shares)
        return f"{pod.key} container {self.name!r} ({amounts}, {state})"


@dataclass(frozen=True)
class Match:
    """The container an Allocate call is for, and the cards it gets."""

    allocation: PodAllocation
    shares: tuple[ContainerShare, ...]
    cards: tuple[Card, ...]
    """The container's cards, in share order."""

    @property
    def share(self) -> ContainerShare:
        return self.shares[0]

    @property
    def card(self) -> Card:
        return self.cards[0]

    @property
    def claim(self) -> Claim:
        return (self.allocation.reservation_id, self.share.container)

    def call(self, resource: str) -> Call:
        return (self.allocation.reservation_id, self.share.container, resource)


@dataclass(frozen=True)
class CountOnly:
    """The call is for a resource a container asked besides its keyed one: nothing to
    hand out (the keyed call does), only the kubelet's count to satisfy."""

    allocation: PodAllocation
    container: str
    keyed: str

    def call(self, resource: str) -> Call:
        return (self.allocation.reservation_id, self.container, resource)


@dataclass(frozen=True)
class NoMatch:
    """Why no container fits; the text goes back to the kubelet (and the pod's status)."""

    reason: str


def _unit(table: DeviceTable) -> str:
    return table.memory_unit if table.resource == GPU_MEM else table.resource


def _card_name(table: DeviceTable, uuid: str, index: int) -> str:
    card = table.card(uuid)
    return f"GPU{card.index if card else index} ({uuid})"


def _share_amount(table: DeviceTable, share: ContainerShare) -> str:
    card = table.card(share.card_uuid)
    amount = share_demand(table.resource, share, card, table.memory_unit) if card else "?"
    return f"{amount} {_unit(table)} on {_card_name(table, share.card_uuid, share.card_index)}"


def _amounts(table: DeviceTable, per_card: Mapping[str, int]) -> str:
    unit = _unit(table)
    return ", ".join(
        f"{count} {unit} on {_card_name(table, uuid, -1)}" for uuid, count in per_card.items()
    )


def started_admissions(
    node: NodeState, claimed: Set[Claim], answered: Set[Call] = NO_CALLS
) -> set[str]:
    """Reservations with a container assigned or claimed, or a call answered: the kubelet
    is admitting them."""
    started = {rid for rid, _ in claimed}
    started.update(call[0] for call in answered)
    started.update(a.reservation_id for a in node.pods.values() if a.assigned)
    return started


def waiting_containers(node: NodeState, claimed: Set[Claim]) -> list[PendingContainer]:
    """Every not-yet-assigned, unclaimed container on the node, bound or not, in order."""
    waiting = [
        PendingContainer(allocation=allocation, shares=shares, position=position)
        for allocation in node.pods.values()
        for position, shares in containers_of(allocation.shares)
        if shares[0].container not in allocation.assigned
        and (allocation.reservation_id, shares[0].container) not in claimed
    ]
    started = started_admissions(node, claimed)
    return sorted(waiting, key=lambda pending: pending.order(started))


def describe_waiting(waiting: Sequence[PendingContainer], table: DeviceTable) -> str:
    if not waiting:
        return "none"
    listed = [pending.describe(table) for pending in waiting[:MAX_LISTED]]
    more = len(waiting) - MAX_LISTED
    return "; ".join(listed) + (f"; and {more} more" if more > 0 else "")


def ids_per_card(table: DeviceTable, device_ids: Sequence[str]) -> dict[str, int] | NoMatch:
    """Card UUID → how many of the (distinct) IDs are on it, or why the IDs are not ours
    (an ``aliyun.com/gpu-mem`` container's IDs are on one card)."""
    if not device_ids:
        return NoMatch("the request names no device IDs")
    sorted_ids = table.sort_by_card(device_ids)
    if sorted_ids.unknown:
        listed = ", ".join(sorted_ids.unknown[:MAX_LISTED])
        return NoMatch(f"device IDs {listed} are not advertised")
    per_card = sorted_ids.per_card
    if table.resource == GPU_MEM and len(per_card) > 1:
        cards = [table.by_uuid[uuid] for uuid in per_card]
        names = ", ".join(f"GPU{card.index} ({card.uuid})" for card in cards)
        return NoMatch(f"the device IDs span cards {names}; a container's memory is on one card")
    return per_card


def _call_made(
    allocation: PodAllocation,
    name: str,
    resource: str,
    asks: Asks,
    *,
    claimed: Set[Claim],
    answered: Set[Call],
) -> tuple[bool, bool]:
    """``(made, started)`` by the log and this agent's memory: whether the container has
    had its call on ``resource``, and whether it has had any call."""
    rid = allocation.reservation_id
    assigned = name in allocation.assigned or (rid, name) in claimed
    mine = {call[2] for call in answered if call[0] == rid and call[1] == name}
    keyed = asks.keyed(rid, name) == resource
    return resource in mine or (keyed and assigned), assigned or bool(mine)


def calls_to_come(
    allocation: PodAllocation,
    resource: str,
    asks: Asks,
    claimed: Set[Claim],
    *,
    answered: Set[Call] = NO_CALLS,
    holding: Mapping[str, frozenset[str]] | None = None,
) -> list[PendingContainer]:
    """The pod's containers whose call on ``resource`` is still to come, in the kubelet's
    order: each asked ``resource`` (to get its cards or only to count) and has not had
    that call yet.

    Where the kubelet lists the container (``holding``: per container, the resources it
    holds IDs of, from pod-resources) the kubelet says: the call was made once the
    container holds the resource's IDs, whatever the log says (a kubelet that lost its
    device checkpoint allocates an assigned container again). Elsewhere (init containers,
    or no list) the log and this agent's memory say: assigned or claimed for the keyed
    resource, ``answered`` for any; and since the kubelet is done with a container before
    it starts the next, every call of a container before one that has had a call was made.
    """
    coming: list[PendingContainer] = []
    passed = False
    for position, shares in reversed(list(containers_of(allocation.shares))):
        name = shares[0].container
        if holding is not None and name in holding:
            made, started = resource in holding[name], bool(holding[name])
        else:
            made, started = _call_made(
                allocation, name, resource, asks, claimed=claimed, answered=answered
            )
            made = made or passed
        if not made and asks.asked(allocation.reservation_id, name, resource):
            coming.append(PendingContainer(allocation=allocation, shares=shares, position=position))
        passed = passed or started
    coming.reverse()
    return coming


def next_calls(
    node: NodeState,
    resource: str,
    asks: Asks,
    claimed: Set[Claim],
    answered: Set[Call] = NO_CALLS,
) -> list[PendingContainer]:
    """Every bound container whose call on ``resource`` is still to come, likeliest first:
    pods part-way through admission, then in admission order, keyed and counting calls
    alike. A pod the log shows fully assigned comes last unless this agent answered one of
    its calls: what it may still wait for is its last container's counting calls, which an
    agent that restarted since cannot tell made from not."""
    started = started_admissions(node, claimed, answered)
    served = {call[0] for call in answered}
    found = [
        pending
        for allocation in node.pods.values()
        if allocation.bound
        for pending in calls_to_come(allocation, resource, asks, claimed, answered=answered)
    ]

    def likeliest(pending: PendingContainer) -> tuple[bool, tuple[bool, datetime, int, int]]:
        allocation = pending.allocation
        stale = allocation.fully_assigned and allocation.reservation_id not in served
        return stale, pending.order(started)

    return sorted(found, key=likeliest)


def match_allocate(
    node: NodeState,
    table: DeviceTable,
    claimed: Set[Claim],
    device_ids: Sequence[str],
    asks: Asks = LEGACY,
    *,
    answered: Set[Call] = NO_CALLS,
) -> Match | CountOnly | NoMatch:
    """The first of :func:`next_calls` the IDs fit: a container keyed on the table's
    resource with exactly these IDs per card, or one that asked it only to count with
    this many IDs."""
    per_card = ids_per_card(table, device_ids)
    if isinstance(per_card, NoMatch):
        return NoMatch(f"on node {node.name}: {per_card.reason}")
    total = sum(per_card.values())
    for pending in next_calls(node, table.resource, asks, claimed, answered):
        demand = pending.demand(table)
        keyed_on = asks.keyed(*pending.claim) or ""
        if keyed_on == table.resource:
            if demand == per_card:
                cards = tuple(table.by_uuid[share.card_uuid] for share in pending.shares)
                return Match(allocation=pending.allocation, shares=pending.shares, cards=cards)
        elif sum(demand.values()) == total:
            return CountOnly(allocation=pending.allocation, container=pending.name, keyed=keyed_on)
    waiting = [
        pending
        for pending in waiting_containers(node, claimed)
        if asks.keyed(*pending.claim) == table.resource
    ]
    return NoMatch(
        f"no bound pod on node {node.name} waits for {_amounts(table, per_card)}; "
        f"pending: {describe_waiting(waiting, table)}"
    )


def offer_of(available: Iterable[str], must_include: Iterable[str]) -> frozenset[str]:
    """Every ID the kubelet offers for a container: the free ones and those it requires.
    Made once per ``GetPreferredAllocation`` and handed to each step (``offered=``):
    131,072 IDs for four 32 GiB cards of MiB IDs take 6 ms to put in a set. One pass:
    ``frozenset(available).union(must_include)`` copied the whole set once more."""
    return frozenset(itertools.chain(available, must_include))


FEW = 64
"""Up to this many IDs, :func:`offered_per_card` looks each one up."""


def offered_per_card(table: DeviceTable, offered: Set[str]) -> dict[str, int]:
    """How many of the offered IDs each card (by UUID) has: set intersections, since the
    kubelet offers every free ID of the node (131,072 for four 32 GiB cards of MiB IDs;
    looking each one up took 65 ms, at every ``GetPreferredAllocation``)."""
    given = offered if isinstance(offered, set | frozenset) else set(offered)
    counts: dict[str, int] = {}
    for card in table.cards:
        ids = table.id_set(card)
        # a few IDs (pinned, taken): look each up; the kubelet's offer: count what it
        # leaves out, the smaller set there (most IDs are free)
        held = len(ids & given) if len(given) <= FEW else len(ids) - len(ids - given)
        if held:
            counts[card.uuid] = held
    return counts


def _fits(
    demand: Mapping[str, int], room: Mapping[str, int], pinned: Mapping[str, int], size: int
) -> bool:
    """The demand is this size, has room on each of its cards, and keeps the pinned IDs."""
    if sum(demand.values()) != size or not demand:
        return False
    if any(room.get(uuid, 0) < count for uuid, count in demand.items()):
        return False
    return all(demand.get(uuid, 0) >= count for uuid, count in pinned.items())


def _preferred_demand(
    node: NodeState,
    table: DeviceTable,
    claimed: Set[Claim],
    *,
    asks: Asks,
    answered: Set[Call],
    offered: Set[str],
    pinned: Mapping[str, int],
    size: int,
) -> dict[str, int] | None:
    """Per card, the IDs of the first of :func:`next_calls` of ``size`` with room."""
    room = offered_per_card(table, offered)
    for pending in next_calls(node, table.resource, asks, claimed, answered):
        demand = pending.demand(table)
        if _fits(demand, room, pinned, size):
            return demand
    return None


def preferred_ids(
    node: NodeState,
    table: DeviceTable,
    claimed: Set[Claim],
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    asks: Asks = LEGACY,
    offered: Set[str] | None = None,
    answered: Set[Call] = NO_CALLS,
) -> tuple[str, ...] | None:
    """The IDs to advise for one container: ``must_include`` first, then its cards' IDs.

    ``None`` when no waiting container fits (the caller may wait for the log and ask
    again). IDs in ``must_include`` (reused from an init container) pin their cards;
    the kubelet requires those IDs whatever we advise.
    """
    offered = offer_of(available, must_include) if offered is None else offered
    if any(table.card_of(device) is None for device in must_include):
        return None
    pinned = offered_per_card(table, set(must_include))
    if table.resource == GPU_MEM and len(pinned) > 1:
        return None
    demand = _preferred_demand(
        node,
        table,
        claimed,
        asks=asks,
        answered=answered,
        offered=offered,
        pinned=pinned,
        size=size,
    )
    if demand is None:
        return None
    return _take_ids(table, demand, offered, must_include)


def _take_ids(
    table: DeviceTable,
    demand: Mapping[str, int],
    offered: Set[str],
    must_include: Sequence[str],
) -> tuple[str, ...]:
    """``must_include`` first, then each card's offered IDs in order, up to its demand."""
    chosen = list(dict.fromkeys(must_include))
    taken = set(chosen)
    have = offered_per_card(table, taken)
    for uuid, count in demand.items():
        card = table.card(uuid)
        wanted = count - have.get(uuid, 0)
        for device in table.ids_of(card) if card is not None else ():
            if wanted <= 0:
                break
            if device in offered and device not in taken:
                chosen.append(device)
                taken.add(device)
                wanted -= 1
    return tuple(chosen)


def fallback_ids(
    table: DeviceTable,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    offered: Set[str] | None = None,
) -> tuple[str, ...]:
    """Advice when the log names no container: keep the IDs on as few cards as possible.

    ``must_include`` first, then its card, then the cards with the most offered IDs;
    Allocate will still refuse a call the log cannot explain, but with a reason about
    one card.
    """
    offered = offer_of(available, must_include) if offered is None else offered
    room = offered_per_card(table, offered)
    pinned = offered_per_card(table, set(must_include))
    order = sorted(table.cards, key=lambda c: (c.uuid not in pinned, -room.get(c.uuid, 0)))
    if table.resource == GPU_MEM:  # one card: a gpu-mem container's memory is on one card
        order = order[:1]
    demand: dict[str, int] = {}
    left = size
    for card in order:
        if left <= 0:
            break
        take = min(left, room.get(card.uuid, 0))
        if take:
            demand[card.uuid] = take
            left -= take
    return _take_ids(table, demand, offered, must_include)


def match_container(
    pending: PendingContainer, table: DeviceTable, per_card: Mapping[str, int]
) -> Match | NoMatch:
    """The container the kubelet is admitting, given the IDs it handed out.

    The IDs are what the container runs with, so they win: when they are on another
    card than the log says (the kubelet did not follow our advice), the match carries
    the cards the IDs are on, and the pod-resources check moves the log after them.
    """
    demand = pending.demand(table)
    if demand == per_card:
        cards = tuple(table.by_uuid[share.card_uuid] for share in pending.shares)
        return Match(allocation=pending.allocation, shares=pending.shares, cards=cards)
    if sum(demand.values()) != sum(per_card.values()) or len(demand) != len(per_card):
        return NoMatch(
            f"{pending.describe(table)} is being admitted, but the kubelet handed it "
            f"{_amounts(table, per_card)}"
        )
    leaving = [uuid for uuid in demand if uuid not in per_card]
    arriving = [uuid for uuid in per_card if uuid not in demand]
    target = dict(zip(leaving, arriving, strict=True))
    shares = tuple(
        share
        if share.card_uuid not in target
        else msgspec.structs.replace(
            share,
            card_uuid=target[share.card_uuid],
            card_index=table.by_uuid[target[share.card_uuid]].index,
        )
        for share in pending.shares
    )
    cards = tuple(table.by_uuid[share.card_uuid] for share in shares)
    return Match(allocation=pending.allocation, shares=shares, cards=cards)


def preferred_for(
    pending: PendingContainer,
    table: DeviceTable,
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    offered: Set[str] | None = None,
) -> tuple[str, ...] | None:
    """The IDs of the container's own cards, ``must_include`` first; ``None`` when its
    cards do not have them free (or the kubelet pins IDs on other cards)."""
    offered = offer_of(available, must_include) if offered is None else offered
    if any(table.card_of(device) is None for device in must_include):
        return None
    pinned = offered_per_card(table, set(must_include))
    demand = pending.demand(table)
    if not _fits(demand, offered_per_card(table, offered), pinned, size):
        return None
    return _take_ids(table, demand, offered, must_include)


def exactly(
    table: DeviceTable,
    size: int,
    must_include: Sequence[str],
    chosen: Sequence[str],
    available: Sequence[str],
    *,
    offered: Set[str] | None = None,
) -> tuple[str, ...]:
    """What the kubelet may be answered: ``size`` distinct IDs with every ``must_include``
    one among them, the rest from ``chosen``, then from ``available`` on the cards
    already in the answer, then from any card; fewer only when fewer were offered, and
    never an ID that was not."""
    offered = offer_of(available, must_include) if offered is None else offered
    answer = list(dict.fromkeys(must_include))
    taken = set(answer)

    def add(devices: Iterable[str]) -> None:
        for device in devices:
            if len(answer) >= size:
                return
            if device in offered and device not in taken:
                answer.append(device)
                taken.add(device)

    add(chosen)
    if len(answer) < size:
        cards = table.sort_by_card(answer).per_card
        add(d for d in available if (card := table.card_of(d)) is not None and card.uuid in cards)
        add(available)
    return tuple(answer)
