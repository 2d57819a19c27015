"""The fold: allocation and inventory events in, per-node, per-card state out.

``apply_allocation`` and ``apply_inventory`` are pure transitions of one node's frozen
:class:`NodeState`. :class:`ClusterState` is only an index from node name to the latest
:class:`NodeState`; replaying the same events always gives the same states.

Every allocation event is applied at most once per node, in stream order: a node
remembers the stream sequence of the last event it applied (``last_seq``), and an
event at or below it is skipped. That is what lets a live subscription and an
explicit catch-up read race harmlessly.

A message on a node's allocation subjects that is not folded (it did not decode, or it
was refused for where it came from: :mod:`gpushare.bus.provenance`) is folded as
:class:`Unfolded`: it changes nothing but the node's ``last_seq``, since the
compare-and-set counts every message on the node's subjects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from types import MappingProxyType

import msgspec

from gpushare.core.events import (
    AllocationCorrected,
    AllocationEvent,
    AnyEvent,
    ClaimAllocated,
    ClaimReleased,
    ClaimShare,
    ContainerAssigned,
    DiscrepancyFound,
    ForeignCardsHeld,
    ForeignHold,
    FrontDoor,
    InventoryReported,
    PodBound,
    PodReserved,
)
from gpushare.core.model import Card, CardLink, ClaimRef, ContainerShare, PodRef
from gpushare.core.peaks import peak_by_key
from gpushare.core.view import FULL_CORE, NodeView, affinity_matrix, build_view


class Unfolded(msgspec.Struct, frozen=True, kw_only=True):
    """A message on ``node``'s allocation subjects that is not an event to fold."""

    node: str


Folded = AnyEvent | Unfolded
"""What the fold takes: events, and the places of messages it must step over."""

_EMPTY: Mapping[str, int] = MappingProxyType({})
_EMPTY_RESOURCES: Mapping[str, tuple[str, ...]] = MappingProxyType({})


def _by_card(
    shares: Iterable[ContainerShare], amount: Callable[[ContainerShare], int]
) -> dict[str, int]:
    """What a pod holds on each card at its peak (:func:`~gpushare.core.peaks.peak_by_key`):
    ``shares`` are in the pod's order (init containers and sidecars in spec order, then
    the app containers), as placement writes them."""
    return peak_by_key((share.card_uuid, share.init, amount(share)) for share in shares)


def memory_by_card(shares: Iterable[ContainerShare]) -> dict[str, int]:
    """Memory (MiB) a pod holds on each card."""
    return _by_card(shares, lambda share: share.memory_mib)


def core_by_card(shares: Iterable[ContainerShare]) -> dict[str, int]:
    """Compute (percent) a pod holds on each card."""
    return _by_card(shares, lambda share: share.core_percent)


class PodAllocation(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One pod's reservation on one node, and how far it has come."""

    pod: PodRef
    reservation_id: str
    shares: tuple[ContainerShare, ...]
    reserved_seq: int
    reserved_at: datetime
    pod_created_at: datetime | None = None
    policy: str = "binpack"
    bound: bool = False
    bound_at: datetime | None = None
    assigned: frozenset[str] = frozenset()
    """Containers the device plugin has handed their cards to."""
    resources: Mapping[str, tuple[str, ...]] = _EMPTY_RESOURCES
    """Container → the GPU resource names it asked (from ``PodBound``; empty before)."""
    corrected: bool = False
    """A reconciler rewrote the shares to what the kubelet really handed out."""

    @property
    def fully_assigned(self) -> bool:
        return all(share.container in self.assigned for share in self.shares)

    @property
    def memory_mib(self) -> int:
        return sum(memory_by_card(self.shares).values())


class ClaimAllocation(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One ResourceClaim's allocation on one node (Dynamic Resource Allocation)."""

    claim: ClaimRef
    allocation_id: str
    """The ``ClaimAllocated`` event's id."""
    shares: tuple[ClaimShare, ...]
    pods: tuple[PodRef, ...]
    allocated_seq: int
    allocated_at: datetime

    @property
    def memory_mib(self) -> int:
        return sum(share.memory_mib for share in self.shares)


class NodeState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A node's cards, what is allocated on them, and how fresh the inventory is."""

    name: str
    cards: tuple[Card, ...] = ()
    inventory_at: datetime | None = None
    heartbeat_seconds: float = 0.0
    pods: Mapping[str, PodAllocation] = MappingProxyType({})
    """Allocations by pod UID."""
    used_mib: Mapping[str, int] = _EMPTY
    """Reserved memory by card UUID."""
    used_core: Mapping[str, int] = _EMPTY
    """Reserved compute (percent) by card UUID."""
    containers: Mapping[str, int] = _EMPTY
    """Number of containers placed, by card UUID."""
    max_free_mib: int = 0
    """The most free memory on any one healthy card: the filter's whole question."""
    last_seq: int = 0
    """Stream sequence of the last allocation event applied to this node."""
    links: tuple[CardLink, ...] = ()
    mps: bool = False
    busiest_card: int = 0
    """The most containers on any one card."""
    foreign: tuple[ForeignHold, ...] = ()
    """Cards held by other device plugins' pods: wholly used, whatever the log says."""
    view: NodeView = NodeView()
    """What placement sees: free core, memory and tenants per card (built by the fold)."""
    claims: Mapping[str, ClaimAllocation] = MappingProxyType({})
    """DRA claims allocated on the node's cards, by claim UID."""
    front_door: FrontDoor = "extender"
    """How pods reach the node's cards (from its inventory): :mod:`gpushare.core.dra`."""

    def free_mib(self, card: Card) -> int:
        return card.memory_mib - self.used_mib.get(card.uuid, 0)

    def card(self, uuid: str) -> Card | None:
        return next((card for card in self.cards if card.uuid == uuid), None)


def _max_free(cards: tuple[Card, ...], used: Mapping[str, int]) -> int:
    return max(
        (card.memory_mib - used.get(card.uuid, 0) for card in cards if card.healthy),
        default=0,
    )


def _refresh(node: NodeState, **changes: object) -> NodeState:
    """``node`` with ``changes`` and the derived fields (max free, view) rebuilt."""
    updated = msgspec.structs.replace(node, **changes)
    return msgspec.structs.replace(
        updated,
        max_free_mib=_max_free(updated.cards, updated.used_mib)
        if updated.front_door == "extender"
        else 0,  # the extender places nothing on a DRA node
        busiest_card=max(updated.containers.values(), default=0),
        view=build_view(
            updated.cards,
            updated.used_mib,
            updated.used_core,
            updated.containers,
            affinity=affinity_matrix(updated.cards, updated.links),
            mps=updated.mps,
        ),
    )


def with_pods(
    node: NodeState,
    pods: dict[str, PodAllocation],
    seq: int,
    foreign: tuple[ForeignHold, ...] | None = None,
    claims: Mapping[str, ClaimAllocation] | None = None,
) -> NodeState:
    """``node`` holding exactly ``pods`` (and ``foreign`` and ``claims``), with every total
    recomputed."""
    foreign = node.foreign if foreign is None else foreign
    claims = node.claims if claims is None else claims
    used: dict[str, int] = {}
    core: dict[str, int] = {}
    containers: dict[str, int] = {}
    totals = {card.uuid: card.memory_mib for card in node.cards}
    for hold in foreign:
        used[hold.card_uuid] = used.get(hold.card_uuid, 0) + totals.get(hold.card_uuid, 0)
        core[hold.card_uuid] = core.get(hold.card_uuid, 0) + FULL_CORE
        containers[hold.card_uuid] = containers.get(hold.card_uuid, 0) + 1
    for allocation in pods.values():
        for uuid, mib in memory_by_card(allocation.shares).items():
            used[uuid] = used.get(uuid, 0) + mib
        for uuid, percent in core_by_card(allocation.shares).items():
            core[uuid] = core.get(uuid, 0) + percent
        for share in allocation.shares:
            containers[share.card_uuid] = containers.get(share.card_uuid, 0) + 1
    for claim in claims.values():
        for held in claim.shares:
            used[held.card_uuid] = used.get(held.card_uuid, 0) + held.memory_mib
            core[held.card_uuid] = core.get(held.card_uuid, 0) + held.core_percent
            containers[held.card_uuid] = containers.get(held.card_uuid, 0) + 1
    return _refresh(
        node,
        pods=MappingProxyType(pods),
        used_mib=MappingProxyType(used),
        used_core=MappingProxyType(core),
        containers=MappingProxyType(containers),
        last_seq=seq,
        foreign=foreign,
        claims=claims if isinstance(claims, MappingProxyType) else MappingProxyType(dict(claims)),
    )


def _is_older(node: NodeState, event: InventoryReported) -> bool:
    return node.inventory_at is not None and event.at < node.inventory_at


def _inventory_changes(event: InventoryReported) -> dict[str, object]:
    return {
        "cards": tuple(sorted(event.cards, key=lambda card: card.index)),
        "inventory_at": event.at,
        "heartbeat_seconds": event.heartbeat_seconds,
        "links": event.links,
        "mps": event.mps,
        "front_door": event.front_door,
    }


def apply_inventory(node: NodeState, event: InventoryReported) -> NodeState:
    """A newer inventory replaces the cards; allocations stay, keyed by card UUID."""
    if _is_older(node, event):
        return node
    updated = msgspec.structs.replace(node, **_inventory_changes(event))
    if node.foreign or node.claims:  # a held card's size may have changed: recount
        return with_pods(updated, dict(node.pods), node.last_seq)
    return _refresh(updated)


def _step(pods: dict[str, PodAllocation], event: AllocationEvent, seq: int) -> bool:
    """Apply ``event`` (at sequence ``seq``) to the mutable ``pods``; True when what the
    cards hold changed. The one transition table, for the incremental and bulk folds alike
    (checks ordered by how common each event is: this is the fold's hot path).
    """
    if isinstance(event, PodReserved):
        pods[event.pod.uid] = PodAllocation(
            pod=event.pod,
            reservation_id=event.id,
            shares=event.shares,
            reserved_seq=seq,
            reserved_at=event.at,
            pod_created_at=event.pod_created_at,
            policy=event.policy,
        )
        return True
    if isinstance(event, ForeignCardsHeld | DiscrepancyFound | ClaimAllocated | ClaimReleased):
        return False  # node-wide facts, findings, claims (:func:`_claim_step`)
    if isinstance(event, AllocationCorrected):
        changed = False
        for correction in event.corrected():
            found = pods.get(correction.pod.uid)
            if found is not None and found.reservation_id == correction.reservation_id:
                pods[correction.pod.uid] = msgspec.structs.replace(
                    found, shares=correction.shares, corrected=True
                )
                changed = True
        return changed
    uid = event.pod.uid
    allocation = pods.get(uid)
    if allocation is None or allocation.reservation_id != event.reservation_id:
        return False
    if isinstance(event, ContainerAssigned):
        assigned = allocation.assigned | {event.container}
        pods[uid] = msgspec.structs.replace(allocation, assigned=assigned)
        return False
    if isinstance(event, PodBound):
        resources = MappingProxyType(dict(event.resources)) if event.resources else None
        pods[uid] = msgspec.structs.replace(
            allocation,
            bound=True,
            bound_at=event.at,
            resources=resources or allocation.resources,
        )
        return False
    del pods[uid]  # BindFailed, PodReleased
    return True


ClaimEvent = ClaimAllocated | ClaimReleased


def _claim_step(claims: dict[str, ClaimAllocation], event: ClaimEvent, seq: int) -> bool:
    """Apply a claim's event to the mutable ``claims``; True when the cards' load changed."""
    if isinstance(event, ClaimAllocated):
        claims[event.claim.uid] = ClaimAllocation(
            claim=event.claim,
            allocation_id=event.id,
            shares=event.shares,
            pods=event.pods,
            allocated_seq=seq,
            allocated_at=event.at,
        )
        return True
    held = claims.get(event.claim.uid)
    if held is None or held.allocation_id != event.allocation_id:
        return False
    del claims[event.claim.uid]
    return True


def _pod_uid(event: AllocationEvent) -> str | None:
    """The pod an event is about; ``None`` for node-wide facts and claims."""
    if isinstance(event, ForeignCardsHeld | ClaimAllocated | ClaimReleased):
        return None
    if isinstance(event, DiscrepancyFound):
        return event.pod.uid if event.pod is not None else None
    return event.pod.uid


def apply_allocation(node: NodeState, event: AllocationEvent | Unfolded, seq: int) -> NodeState:
    """Apply one allocation event found at stream sequence ``seq``.

    Every event on the node's subject moves ``last_seq`` (the allocator's compare-and-set
    expects the subject's last sequence), whether or not it changes an allocation.
    """
    if seq <= node.last_seq:
        return node
    if isinstance(event, Unfolded):
        return msgspec.structs.replace(node, last_seq=seq)
    if isinstance(event, ForeignCardsHeld):
        return with_pods(node, dict(node.pods), seq, foreign=event.holds)
    if isinstance(event, ClaimAllocated | ClaimReleased):
        claims = dict(node.claims)
        if _claim_step(claims, event, seq):
            return with_pods(node, dict(node.pods), seq, claims=claims)
        return msgspec.structs.replace(node, last_seq=seq)
    pods = dict(node.pods)
    if _step(pods, event, seq):
        return with_pods(node, pods, seq)
    return msgspec.structs.replace(node, pods=MappingProxyType(pods), last_seq=seq)


class ClusterState:
    """The latest :class:`NodeState` of every node, built by folding events.

    The index itself is the only mutable thing here; every value in it is frozen.
    """

    __slots__ = ("nodes", "pod_nodes")

    def __init__(self, nodes: Mapping[str, NodeState] | None = None) -> None:
        self.nodes: dict[str, NodeState] = dict(nodes or {})
        self.pod_nodes: dict[str, tuple[str, ...]] = {}
        """The nodes holding each pod's reservations: the bound one first, then the latest
        reservation. Usually one; two for a while when a bind is retried elsewhere before
        the first reservation ends."""
        for node in self.nodes.values():
            for uid in node.pods:
                self._index_pod(uid, node.name, node)

    def node(self, name: str) -> NodeState:
        return self.nodes.get(name) or NodeState(name=name)

    def apply(self, event: Folded, seq: int = 0) -> NodeState:
        """Fold one event (``seq`` is its allocation-stream sequence) and return the new node."""
        node = self.node(event.node)
        if isinstance(event, InventoryReported):
            updated = apply_inventory(node, event)
        else:
            updated = apply_allocation(node, event, seq)
            uid = None if isinstance(event, Unfolded) else _pod_uid(event)
            if updated is not node and uid is not None:
                self.nodes[event.node] = updated
                self._index_pod(uid, event.node, updated)
        self.nodes[event.node] = updated
        return updated

    def _index_pod(self, uid: str, name: str, updated: NodeState) -> None:
        holders = [holder for holder in self.pod_nodes.get(uid, ()) if holder != name]
        if uid in updated.pods:
            holders.append(name)
        if not holders:
            self.pod_nodes.pop(uid, None)
            return
        if len(holders) > 1:
            holders.sort(key=lambda holder: _precedence(self.node(holder).pods[uid]))
        self.pod_nodes[uid] = tuple(holders)

    def node_of(self, uid: str) -> str | None:
        """The node of the pod's latest live reservation."""
        holders = self.pod_nodes.get(uid)
        return holders[0] if holders else None

    def allocation(self, uid: str) -> PodAllocation | None:
        """The live allocation of a pod, on whichever node holds it (the latest)."""
        name = self.node_of(uid)
        return None if name is None else self.nodes[name].pods.get(uid)


def _precedence(allocation: PodAllocation) -> tuple[bool, int]:
    return (not allocation.bound, -allocation.reserved_seq)


class _Draft:
    """One node's state while a bulk fold runs: plain mutable fields, no totals."""

    __slots__ = ("claims", "foreign", "inventories", "last_seq", "node", "pods")

    def __init__(self, node: NodeState) -> None:
        self.node = node
        self.pods = dict(node.pods)
        self.claims = dict(node.claims)
        self.last_seq = node.last_seq
        self.foreign: tuple[ForeignHold, ...] | None = None
        self.inventories: list[InventoryReported] = []

    def finish(self) -> NodeState:
        node = self.node
        for inventory in self.inventories:
            if not _is_older(node, inventory):
                node = msgspec.structs.replace(node, **_inventory_changes(inventory))
        if node is self.node and self.last_seq == node.last_seq:
            return node
        return with_pods(node, self.pods, self.last_seq, foreign=self.foreign, claims=self.claims)


def fold_events(
    events: Iterable[tuple[int, Folded]], state: ClusterState | None = None
) -> ClusterState:
    """Fold ``(sequence, event)`` pairs onto ``state`` (empty by default) in bulk.

    The same result as :meth:`ClusterState.apply` on each pair in turn, several times
    faster: a node's totals and placement view are computed once at the end instead of
    after every event. This is how services catch up with the log at start-up.
    """
    base = state or ClusterState()
    drafts: dict[str, _Draft] = {}
    for seq, event in events:
        draft = drafts.get(event.node)
        if draft is None:
            draft = drafts[event.node] = _Draft(base.node(event.node))
        if isinstance(event, InventoryReported):
            draft.inventories.append(event)
        elif seq > draft.last_seq:
            draft.last_seq = seq
            if isinstance(event, ForeignCardsHeld):
                draft.foreign = event.holds
            elif isinstance(event, ClaimAllocated | ClaimReleased):
                _claim_step(draft.claims, event, seq)
            elif not isinstance(event, Unfolded):
                _step(draft.pods, event, seq)
    nodes = dict(base.nodes)
    for name, draft in drafts.items():
        nodes[name] = draft.finish()
    return ClusterState(nodes)
