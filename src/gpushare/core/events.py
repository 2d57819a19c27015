"""Every fact gpushare records, as msgspec Structs.

Events are past-tense facts. They form one tagged union on ``type`` and carry a
``version``; decoders ignore unknown fields so that newer writers do not break
older readers. ``id`` is the idempotency key, sent as ``Nats-Msg-Id``.

Two streams carry them (subjects live in :mod:`gpushare.bus.subjects`):

* the inventory stream holds the last :class:`InventoryReported` per node;
* the allocation log holds every other :class:`Event`, one subject per node, forever;
* the decision stream holds the extender's reasoning about each pod
  (:class:`NodesFiltered`, :class:`NodesScored`) for ``gpushare explain``, for a while.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec

from gpushare.core.model import Card, CardLink, ClaimRef, ContainerShare, PodRef

SCHEMA_VERSION = 1

UtcTime = Annotated[datetime, msgspec.Meta(tz=True)]
"""A timestamp that names its zone; naive times are rejected on decode."""

FrontDoor = Literal["extender", "dra"]
"""The one way a node's cards are handed out (the node's ``gpushare.io/front-door`` label)."""

ReleaseReason = Literal[
    "deleted",
    "terminated",
    "bind_timeout",
    "assign_timeout",
    "node_removed",
    "reconciled",
    "deallocated",
]

DiscrepancyKind = Literal[
    "card_mismatch",
    "unknown_to_log",
    "missing_from_kubelet",
    "annotation_mismatch",
    "foreign_overlap",
    "assign_overdue",
]
"""``assign_overdue``: a bound pod that exists and has not finished, not fully assigned
within the binder's ``--assign-timeout``; its reservation is kept (the kubelet may hold
its cards)."""


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", gc=False):
    """Fields every event has."""

    id: str
    """Idempotency key (``Nats-Msg-Id``): the same decision always gets the same id."""
    at: UtcTime
    """When the writer decided, UTC."""
    node: str
    """The Kubernetes node the fact is about."""
    version: int = SCHEMA_VERSION


class InventoryReported(Event, frozen=True, kw_only=True, tag=True):
    """The reporter's view of a node's cards; also its heartbeat."""

    cards: tuple[Card, ...]
    source: Literal["nvml", "simulated", "fixture", "koordinator"]
    """``koordinator``: read from the node's Koordinator ``Device`` (:mod:`.koordinator`)."""
    heartbeat_seconds: float
    """The reporter publishes at least this often; silence for three periods means gone."""
    driver_version: str = ""
    links: tuple[CardLink, ...] = ()
    """How each pair of cards is connected (NVML topology); empty when unknown."""
    mps: bool = False
    """An MPS control daemon serves this node's cards, so core and memory limits are enforced."""
    front_door: FrontDoor = "extender"
    """How pods reach this node's cards: through the extender and device plugin, or
    through Dynamic Resource Allocation (never both: :mod:`gpushare.core.dra`)."""


class PodReserved(Event, frozen=True, kw_only=True, tag=True):
    """The allocator chose cards for a pod's containers; the binder has yet to bind it."""

    pod: PodRef
    shares: tuple[ContainerShare, ...]
    pod_created_at: UtcTime | None = None
    """The pod's creationTimestamp: the kubelet admits pods in this order."""
    policy: str = "binpack"
    reserved_by: str = ""
    """The allocator replica that decided."""


class PodBound(Event, frozen=True, kw_only=True, tag=True):
    """The Kubernetes API accepted the binding (with the allocation annotations)."""

    pod: PodRef
    reservation_id: str
    resources: dict[str, tuple[str, ...]] = {}
    """Container → the GPU resource names it asked, as the binder read them from the pod.

    The node agent answers each container's ``Allocate`` on one of them. Empty when the
    binder could not tell (or was older): the container is then served on
    ``aliyun.com/gpu-mem``."""


class BindFailed(Event, frozen=True, kw_only=True, tag=True):
    """The binding was refused; the reservation is void."""

    pod: PodRef
    reservation_id: str
    reason: str


class ContainerAssigned(Event, frozen=True, kw_only=True, tag=True):
    """The device plugin handed a container its card at kubelet admission."""

    pod: PodRef
    reservation_id: str
    container: str
    card_uuids: tuple[str, ...]
    device_ids: tuple[str, ...] = ()
    """The kubelet's device IDs for this container, runs of one card's consecutive IDs
    written ``<card>-<first>..<last>`` (:mod:`gpushare.core.device_ids`)."""


class PodReleased(Event, frozen=True, kw_only=True, tag=True):
    """A reservation's memory is free again."""

    pod: PodRef
    reservation_id: str
    reason: ReleaseReason
    detail: str = ""


class CorrectedShares(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One reservation's shares as a correction leaves them."""

    pod: PodRef
    reservation_id: str
    shares: tuple[ContainerShare, ...]


class AllocationCorrected(Event, frozen=True, kw_only=True, tag=True):
    """A reconciler found a live reservation's containers on other cards than the log says
    (the kubelet's pod-resources is the truth): from here on its shares are these."""

    pod: PodRef
    reservation_id: str
    shares: tuple[ContainerShare, ...]
    reason: str
    also: tuple[CorrectedShares, ...] = ()
    """Other reservations of the node corrected at the same instant: when the kubelet swaps
    the cards of two same-size pods, both halves travel in one event, so no fold ever holds
    one card twice and the other not at all."""

    def corrected(self) -> tuple[CorrectedShares, ...]:
        """Every reservation this event corrects, its own first."""
        own = CorrectedShares(pod=self.pod, reservation_id=self.reservation_id, shares=self.shares)
        return (own, *self.also)


class ForeignHold(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One card held by pods that another device plugin served (e.g. ``nvidia.com/gpu``)."""

    card_uuid: str
    resource: str
    pods: tuple[str, ...] = ()
    """``namespace/name`` of the pods holding it."""


class ForeignCardsHeld(Event, frozen=True, kw_only=True, tag=True):
    """The cards of this node that other device plugins' pods hold, as the node agent read
    them from the kubelet; the fold counts each as wholly used. Replaces the node's
    previous list (an empty ``holds`` frees them all)."""

    holds: tuple[ForeignHold, ...]


class ClaimShare(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one allocation result of a claim consumes on one card."""

    request: str
    """The claim's request the device was allocated for."""
    device: str
    """The device's name in the node's ResourceSlice (``gpu-<index>``)."""
    card_index: int
    card_uuid: str
    memory_mib: int
    core_percent: int = 0
    share_id: str = ""
    """kube-scheduler's ``shareID`` of this allocation of a shared device."""


class ClaimAllocated(Event, frozen=True, kw_only=True, tag=True):
    """kube-scheduler allocated a ResourceClaim on this node's cards (Dynamic Resource
    Allocation); the binder read it from the API. Replaces an earlier allocation of the
    same claim: the binder appends one again, the same shares with other ``pods``, when
    only the claim's ``status.reservedFor`` changed (a pod joined or left a shared claim),
    so the log names every pod using the cards and the claim still counts once."""

    claim: ClaimRef
    shares: tuple[ClaimShare, ...]
    pods: tuple[PodRef, ...] = ()
    """The pods the claim is reserved for, as far as the binder saw: all of them."""
    left: tuple[PodRef, ...] = ()
    """Pods the allocation this one replaces was reserved for and this one is not: they
    no longer use the cards. Named so that their own history shows when they stopped."""


class ClaimReleased(Event, frozen=True, kw_only=True, tag=True):
    """A claim's allocation on this node ended (claim deleted or deallocated)."""

    claim: ClaimRef
    allocation_id: str
    """The ``ClaimAllocated`` it ends."""
    reason: ReleaseReason
    pods: tuple[PodRef, ...] = ()
    """The pods the allocation was reserved for."""


class DiscrepancyFound(Event, frozen=True, kw_only=True, tag=True):
    """A reconciler found the log and the world disagreeing in a way it cannot correct
    itself; recorded for operators and auditors. Changes no allocation."""

    kind: DiscrepancyKind
    detail: str
    pod: PodRef | None = None
    reservation_id: str = ""
    reporter: str = ""
    """The service replica that found it."""


AllocationEvent = (
    PodReserved
    | PodBound
    | BindFailed
    | ContainerAssigned
    | PodReleased
    | AllocationCorrected
    | ForeignCardsHeld
    | DiscrepancyFound
    | ClaimAllocated
    | ClaimReleased
)
AnyEvent = InventoryReported | AllocationEvent

ALL_EVENT_TYPES: tuple[type[Event], ...] = (
    InventoryReported,
    PodReserved,
    PodBound,
    BindFailed,
    ContainerAssigned,
    PodReleased,
    AllocationCorrected,
    ForeignCardsHeld,
    DiscrepancyFound,
    ClaimAllocated,
    ClaimReleased,
)


class Decision(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Fields every extender decision record has (the decision stream, not the log)."""

    id: str
    at: UtcTime
    pod: PodRef
    allocator: str = ""
    """The allocator replica that answered."""
    version: int = SCHEMA_VERSION


class NodesFiltered(Decision, frozen=True, kw_only=True, tag=True):
    """One filter call: the nodes that passed and, for each that did not, why."""

    request: str
    """The pod's request as the allocator read it (``describe()``), or why it is invalid."""
    passed: tuple[str, ...]
    failed: dict[str, str]
    """Node → reason."""
    omitted: int = 0
    """Nodes left out of ``passed``/``failed`` to keep the record small."""
    chosen: str | None = None
    """The one node the answer named, when filter chose among those that passed (the
    allocator's ``--choose-in-filter``); the others passed but the policy placed the pod
    worse there. None: the answer named every node that passed."""


class NodesScored(Decision, frozen=True, kw_only=True, tag=True):
    """One prioritize call: the score (0-10) of each node, by the named policy."""

    policy: str
    scores: dict[str, int]
    omitted: int = 0
    verb: str = "prioritize"
    """``filter`` when filter chose the node (``NodesFiltered.chosen``) and these are the
    scores it chose by."""


AnyDecision = NodesFiltered | NodesScored
ALL_DECISION_TYPES: tuple[type[Decision], ...] = (NodesFiltered, NodesScored)

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)
_decision_decoder: msgspec.json.Decoder[AnyDecision] = msgspec.json.Decoder(AnyDecision)


def encode_event(event: AnyEvent) -> bytes:
    return _encoder.encode(event)


def decode_event(data: bytes) -> AnyEvent:
    """Decode one event; raises :class:`msgspec.ValidationError` or ``DecodeError`` on bad input."""
    return _decoder.decode(data)


def encode_decision(decision: AnyDecision) -> bytes:
    return _encoder.encode(decision)


def decode_decision(data: bytes) -> AnyDecision:
    """Decode one decision record; raises like :func:`decode_event` on bad input."""
    return _decision_decoder.decode(data)
