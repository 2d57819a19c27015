"""Comparing the allocation log with the Kubernetes API, and the events that set it right.

The binder's reconciler (:mod:`gpushare.binder.reconciling`) snapshots its fold, *then*
lists pods and nodes (at start and every ``--reconcile-interval``), and asks
:func:`reconcile` what to append. Pure: the fold, the API's pods and node names and the
clock in, events out.

* A bound, live pod that carries our allocation (``gpushare.io/allocation``, or only seed
  000's ``ALIYUN_COM_GPU_MEM_IDX``/``_POD``) but holds no live allocation in the log is
  **adopted**: ``PodReserved`` (policy ``adopted``), ``PodBound`` and, when it already
  runs, ``ContainerAssigned`` per container (the kubelet admitted it: no ``Allocate``
  will come, and nothing should wait for one).
* A live allocation whose pod is gone is **released** (``reconciled``); one of a finished
  pod too (``terminated``); one on a node the API no longer has and whose reporter has
  gone silent (``node_removed``).
* A pod whose annotation names another node or reservation than its live allocation, or
  cannot be read, is a ``DiscrepancyFound(annotation_mismatch)``: nothing is guessed.

Only what is settled is decided: a reservation not bound yet and younger than the bind
timeout may have its bind in flight; a node whose reporter still heartbeats is not gone.
Every id is derived from the facts (pod uid, reservation id, finding), so a second
reconciler's identical correction is deduplicated by ``Nats-Msg-Id``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

import msgspec

from gpushare.core.annotations import ALLOCATION, IDX, POD, AllocationAnnotation, asked_resources
from gpushare.core.errors import InvalidRequest
from gpushare.core.events import (
    AllocationEvent,
    ContainerAssigned,
    DiscrepancyFound,
    PodBound,
    PodReleased,
    PodReserved,
    ReleaseReason,
)
from gpushare.core.fit import is_stale
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.pods import TERMINAL_PHASES, Pod
from gpushare.core.requests import MEMORY_UNITS_MIB, read_gpu_request
from gpushare.core.state import ClusterState, NodeState, PodAllocation

ADOPTED_POLICY = "adopted"
"""``PodReserved.policy`` of a reservation the reconciler made for a pod it found bound."""
RECONCILER = "reconciler"
"""``PodReserved.reserved_by`` of an adoption."""


def bound_id(reservation_id: str) -> str:
    """Also the binder's own ``PodBound`` id: a bind racing an adoption deduplicates."""
    return f"{reservation_id}.bound"


def released_id(reservation_id: str) -> str:
    """One release per reservation, whoever notices first (watch, sweep or reconcile)."""
    return f"{reservation_id}.released"


def adopted_id(uid: str, reservation: str) -> str:
    """The reservation id of an adoption: the pod and what its annotation names."""
    return f"adopted-{uid}-{reservation}"


def pod_released(
    node: str, allocation: PodAllocation, at: datetime, reason: ReleaseReason, detail: str = ""
) -> PodReleased:
    return PodReleased(
        id=released_id(allocation.reservation_id),
        at=at,
        node=node,
        pod=allocation.pod,
        reservation_id=allocation.reservation_id,
        reason=reason,
        detail=detail,
    )


class Context(msgspec.Struct, frozen=True, kw_only=True):
    """What a pass decides with besides the fold and the API's answers."""

    now: datetime
    bind_timeout: timedelta
    memory_unit: str = "MiB"
    """The unit of seed 000's ``ALIYUN_COM_GPU_MEM_POD``."""
    reporter: str = RECONCILER


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """The allocation a pod's annotations say it holds."""

    node: str
    reservation: str
    """The reservation id it names; for seed 000's keys, ``idx<card index>``."""
    shares: tuple[ContainerShare, ...] = ()
    legacy_index: int | None = None
    """Seed 000's ``ALIYUN_COM_GPU_MEM_IDX`` (the shares come from the node's cards)."""
    legacy_mib: int = 0


class Adoption(msgspec.Struct, frozen=True, kw_only=True):
    reserved: PodReserved
    """Appended with compare-and-set on its node; the others follow it."""
    bound: PodBound
    assigned: tuple[ContainerAssigned, ...] = ()

    @property
    def events(self) -> tuple[AllocationEvent, ...]:
        return (self.reserved, self.bound, *self.assigned)


class Corrections(msgspec.Struct, frozen=True, kw_only=True):
    adoptions: tuple[Adoption, ...] = ()
    releases: tuple[PodReleased, ...] = ()
    discrepancies: tuple[DiscrepancyFound, ...] = ()

    @property
    def events(self) -> tuple[AllocationEvent, ...]:
        adopted = (event for adoption in self.adoptions for event in adoption.events)
        return (*adopted, *self.releases, *self.discrepancies)


def read_claim(pod: Pod, memory_unit: str = "MiB") -> Claim | str | None:
    """What the pod's annotations claim; ``None`` without our keys, a string saying why
    when they cannot be read."""
    annotations = pod.annotations
    node = pod.spec.node_name or ""
    raw = annotations.get(ALLOCATION)
    if raw is not None:
        try:
            document = msgspec.json.decode(raw, type=AllocationAnnotation)
        except msgspec.MsgspecError as error:
            return f"unreadable {ALLOCATION}: {error}"
        shares = tuple(share for group in document.containers.values() for share in group)
        if not shares:
            return f"{ALLOCATION} names no container"
        return Claim(node=document.node, reservation=document.reservation, shares=shares)
    if IDX not in annotations or POD not in annotations:
        return None
    try:
        index, units = int(annotations[IDX]), int(annotations[POD])
    except ValueError:
        return f"unreadable {IDX}={annotations[IDX]!r} / {POD}={annotations[POD]!r}"
    if index < 0 or units < 0:
        return f"negative {IDX}={index} / {POD}={units}"
    mib = units * MEMORY_UNITS_MIB.get(memory_unit, 1)
    return Claim(node=node, reservation=f"idx{index}", legacy_index=index, legacy_mib=mib)


def _card_at(node: NodeState, index: int) -> Card | None:
    return next((card for card in node.cards if card.index == index), None)


def _legacy_shares(pod: Pod, total_mib: int, card: Card, unit: str) -> tuple[ContainerShare, ...]:
    """Seed 000's keys name a card and a pod total: each container keeps what it asked
    (the whole total on the first container when the request cannot be read)."""
    try:
        wanted = [
            (c.container, c.memory_mib, c.init) for c in read_gpu_request(pod, unit).containers
        ]
    except InvalidRequest:
        wanted = []
    wanted = [entry for entry in wanted if entry[1] > 0]
    if not wanted:
        first = pod.spec.containers[0].name if pod.spec.containers else "main"
        wanted = [(first, total_mib, False)]
    return tuple(
        ContainerShare(
            container=name, card_index=card.index, card_uuid=card.uuid, memory_mib=mib, init=init
        )
        for name, mib, init in wanted
    )


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def discrepancy(
    node: str, pod: Pod, detail: str, context: Context, reservation_id: str = ""
) -> DiscrepancyFound:
    ref = pod_ref(pod)
    return DiscrepancyFound(
        id=f"discrepancy-annotation_mismatch-{ref.uid}-{_digest(detail)}",
        at=context.now,
        node=node,
        kind="annotation_mismatch",
        detail=detail,
        pod=ref,
        reservation_id=reservation_id,
        reporter=context.reporter,
    )


def pod_ref(pod: Pod) -> PodRef:
    meta = pod.metadata
    return PodRef(namespace=meta.namespace, name=meta.name, uid=meta.uid)


def node_gone(node: NodeState, nodes: Collection[str] | None, now: datetime) -> bool:
    """The API no longer has the node and its reporter is silent (``nodes`` None: unknown)."""
    return nodes is not None and node.name not in nodes and is_stale(node, now)


def _settled(allocation: PodAllocation, context: Context) -> bool:
    """Bound, or unbound for longer than a bind may take."""
    return allocation.bound or context.now - allocation.reserved_at > context.bind_timeout


def _agrees(claim: Claim, node: str, live_node: str, live: PodAllocation) -> bool:
    """The annotation names the live allocation (or the one adopted from it)."""
    if live_node != node:
        return False
    if claim.legacy_index is not None:
        return True  # seed 000's keys name no reservation
    adopted = adopted_id(live.pod.uid, claim.reservation)
    return claim.node == node and live.reservation_id in (claim.reservation, adopted)


def _adopt(
    pod: Pod, shares: tuple[ContainerShare, ...], claimed: str, node: str, context: Context
) -> Adoption:
    ref, now = pod_ref(pod), context.now
    rid = adopted_id(ref.uid, claimed)
    reserved = PodReserved(
        id=rid,
        at=now,
        node=node,
        pod=ref,
        shares=shares,
        pod_created_at=pod.metadata.creation_timestamp,
        policy=ADOPTED_POLICY,
        reserved_by=context.reporter,
    )
    bound = PodBound(
        id=bound_id(rid),
        at=now,
        node=node,
        pod=ref,
        reservation_id=rid,
        resources=asked_resources(pod),
    )
    cards: dict[str, list[str]] = {}
    if pod.phase == "Running":  # admitted by the kubelet already: no Allocate will come
        for share in shares:
            cards.setdefault(share.container, []).append(share.card_uuid)
    assigned = tuple(
        ContainerAssigned(
            id=f"assigned-{rid}-{container}",
            at=now,
            node=node,
            pod=ref,
            reservation_id=rid,
            container=container,
            card_uuids=tuple(dict.fromkeys(uuids)),
        )
        for container, uuids in cards.items()
    )
    return Adoption(reserved=reserved, bound=bound, assigned=assigned)


def decide_pod(
    state: ClusterState, pod: Pod, nodes: Collection[str] | None, context: Context
) -> Adoption | DiscrepancyFound | None:
    """What one listed pod needs: adoption, a recorded discrepancy, or nothing."""
    name = pod.spec.node_name
    if not name or pod.phase in TERMINAL_PHASES or pod.metadata.deletion_timestamp:
        return None
    claim = read_claim(pod, context.memory_unit)
    if claim is None:
        return None
    if isinstance(claim, str):
        return discrepancy(name, pod, claim, context)
    live = state.allocation(pod.metadata.uid)
    if live is not None:
        live_node = state.node_of(pod.metadata.uid) or ""
        if not live.bound or _agrees(claim, name, live_node, live):
            return None  # agreeing, or a bind in flight
        detail = (
            f"the pod is bound to {name} and its annotation names reservation "
            f"{claim.reservation} on {claim.node}; the log's live allocation is "
            f"{live.reservation_id} on {live_node}"
        )
        return discrepancy(name, pod, detail, context, live.reservation_id)
    node = state.node(name)
    if node_gone(node, nodes, context.now):
        return None  # released with its node, not adopted
    if claim.node != name:
        return discrepancy(name, pod, f"bound to {name}, annotated for {claim.node}", context)
    shares = claim.shares
    if claim.legacy_index is not None:
        card = _card_at(node, claim.legacy_index)
        if card is None and node.cards:
            return discrepancy(name, pod, f"{IDX}={claim.legacy_index}: no such card", context)
        if card is None:
            return None  # no inventory yet: the card index cannot be resolved
        shares = _legacy_shares(pod, claim.legacy_mib, card, context.memory_unit)
    return _adopt(pod, shares, claim.reservation, name, context)


def _release_reason(
    node: NodeState,
    allocation: PodAllocation,
    pod: Pod | None,
    nodes: Collection[str] | None,
    now: datetime,
) -> tuple[ReleaseReason, str] | None:
    if pod is None:
        return "reconciled", "pod not found when listing pods"
    if pod.phase in TERMINAL_PHASES:
        return "terminated", pod.phase
    if node_gone(node, nodes, now):
        return "node_removed", "the node is not in the Kubernetes API"
    return None


def stale_releases(
    state: ClusterState, pods: Sequence[Pod], nodes: Collection[str] | None, context: Context
) -> tuple[PodReleased, ...]:
    """Releases for settled allocations of ``state`` (a snapshot taken *before* listing:
    each of its pods existed then, so one the list lacks is gone)."""
    by_uid = {pod.metadata.uid: pod for pod in pods}
    releases: list[PodReleased] = []
    for node in list(state.nodes.values()):
        for allocation in node.pods.values():
            if not _settled(allocation, context):
                continue
            pod = by_uid.get(allocation.pod.uid)
            found = _release_reason(node, allocation, pod, nodes, context.now)
            if found is not None:
                releases.append(pod_released(node.name, allocation, context.now, *found))
    return tuple(releases)


def reconcile(
    state: ClusterState, pods: Sequence[Pod], nodes: Collection[str] | None, context: Context
) -> Corrections:
    """Every correction a pass makes: ``state`` is the fold as of before ``pods`` and
    ``nodes`` (``None`` when the node list could not be read) were listed."""
    adoptions: list[Adoption] = []
    found: list[DiscrepancyFound] = []
    for pod in pods:
        decided = decide_pod(state, pod, nodes, context)
        if isinstance(decided, Adoption):
            adoptions.append(decided)
        elif decided is not None:
            found.append(decided)
    return Corrections(
        adoptions=tuple(adoptions),
        releases=stale_releases(state, pods, nodes, context),
        discrepancies=tuple(found),
    )
