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
* A bound pod whose live allocation is on its node gets its annotations **repaired**
  when they say anything else than the log (:func:`annotation_repair`: the binding's
  builder on the allocation as it is now; one merge patch of what differs). A key that
  names other cards, another reservation, or cannot be read is also recorded as a
  ``DiscrepancyFound(annotation_mismatch)``; a missing key, or ``ASSIGNED`` not turned
  yet, is only restored. Adoption reads the same annotations, so it applies only to pods
  without a live allocation.
* A pod bound to another node than its live allocation, or whose annotation cannot be
  read while the log has none for it, is a ``DiscrepancyFound(annotation_mismatch)``:
  nothing is guessed.

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

from gpushare.core.annotations import (
    ALLOCATION,
    ASSIGNED,
    ASSUME_TIME,
    IDX,
    POD,
    RESERVATION,
    AllocationAnnotation,
    asked_resources,
    asks_mgpu,
    card_indices,
    current_annotations,
)
from gpushare.core.discrepancies import discrepancy
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
from gpushare.core.koordinator import DEVICE_ALLOCATED, allocated_difference
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.pods import TERMINAL_PHASES, Pod, phase_detail
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
    settling: frozenset[str] = frozenset()
    """Pods (by uid) the log moved to other cards a moment ago: the binder's rewrite of
    their annotations may be in flight, so stale ones are repaired without a record."""


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


class AnnotationRepair(msgspec.Struct, frozen=True, kw_only=True):
    """A bound pod's annotations set back to its live allocation: one merge patch."""

    pod: PodRef
    node: str
    reservation_id: str
    patch: dict[str, str]
    """Only the keys that are missing or say other than the log."""
    found: DiscrepancyFound | None = None
    """The disagreement to record; None when keys were only missing or behind the log
    (``ASSIGNED`` not turned yet, a move being rewritten: see ``Context.settling``)."""


class Corrections(msgspec.Struct, frozen=True, kw_only=True):
    adoptions: tuple[Adoption, ...] = ()
    releases: tuple[PodReleased, ...] = ()
    discrepancies: tuple[DiscrepancyFound, ...] = ()
    repairs: tuple[AnnotationRepair, ...] = ()

    @property
    def events(self) -> tuple[AllocationEvent, ...]:
        adopted = (event for adoption in self.adoptions for event in adoption.events)
        found = (repair.found for repair in self.repairs if repair.found is not None)
        return (*adopted, *self.releases, *self.discrepancies, *found)


def carries_claim(pod: Pod) -> bool:
    """Whether the pod has the annotations :func:`read_claim` reads (readable or not)."""
    annotations = pod.annotations
    return ALLOCATION in annotations or (IDX in annotations and POD in annotations)


def read_claim(pod: Pod, memory_unit: str = "MiB") -> Claim | str | None:
    """What the pod's annotations claim; ``None`` without our keys, a string saying why
    when they cannot be read."""
    if not carries_claim(pod):
        return None
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
            (c.container, c.memory_mib, c.init, c.sidecar)
            for c in read_gpu_request(pod, unit).containers
        ]
    except InvalidRequest:
        wanted = []
    wanted = [entry for entry in wanted if entry[1] > 0]
    if not wanted:
        first = pod.spec.containers[0].name if pod.spec.containers else "main"
        wanted = [(first, total_mib, False, False)]
    return tuple(
        ContainerShare(
            container=name,
            card_index=card.index,
            card_uuid=card.uuid,
            memory_mib=mib,
            init=init,
            sidecar=sidecar,
        )
        for name, mib, init, sidecar in wanted
    )


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def annotation_mismatch(
    node: str, pod: Pod, detail: str, context: Context, reservation_id: str = ""
) -> DiscrepancyFound:
    """The pod's annotations contradict the log in a way the reconciler may not repair."""
    ref = pod_ref(pod)
    return discrepancy(
        kind="annotation_mismatch",
        identity=f"{ref.uid}-{_digest(detail)}",
        node=node,
        at=context.now,
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


def first_card_memory_mib(node: NodeState, shares: Sequence[ContainerShare]) -> int:
    """Total memory of the first share's card (0 when the inventory does not list it)."""
    card = node.card(shares[0].card_uuid) if shares else None
    return card.memory_mib if card is not None else 0


def reservation_names(allocation: PodAllocation) -> frozenset[str]:
    """The reservation ids a pod's annotations may name for ``allocation``: its own and,
    for an adoption, the one its annotation named when it was adopted."""
    prefix = adopted_id(allocation.pod.uid, "")
    own = allocation.reservation_id
    return frozenset({own, own.removeprefix(prefix)} if own.startswith(prefix) else {own})


def _summary(document: AllocationAnnotation) -> str:
    cards = "; ".join(
        f"{container}: {card_indices(shares)}" for container, shares in document.containers.items()
    )
    return f"{document.reservation} on {document.node} ({cards})"


def _allocation_contradiction(have: str, want: str, names: frozenset[str]) -> str | None:
    try:
        document = msgspec.json.decode(have, type=AllocationAnnotation)
    except msgspec.MsgspecError as error:
        return f"unreadable {ALLOCATION}: {error}"
    expected = msgspec.json.decode(want, type=AllocationAnnotation)
    if (
        document.node == expected.node
        and document.reservation in names
        and document.containers == expected.containers
    ):
        return None
    return f"{ALLOCATION} names {_summary(document)}, the log {_summary(expected)}"


def _compare(key: str, have: str | None, want: str, names: frozenset[str]) -> tuple[bool, str]:
    """Whether the pod's ``have`` for ``key`` must become the log's ``want``, and how it
    contradicts the log ("" when it does not: equal, missing, or only behind)."""
    if have == want:
        return False, ""
    if have is None:
        return True, ""  # restored; a missing key names no other card
    if key == ASSUME_TIME:
        return False, ""  # the reservation's time (an adoption keeps the original one)
    if key == ASSIGNED:
        if want == "true":
            return True, ""  # the marker's next write
        return True, f"{ASSIGNED}={have!r}, the log: not every container assigned"
    if key == RESERVATION and have in names:
        return False, ""
    if key == ALLOCATION:
        contradiction = _allocation_contradiction(have, want, names)
        return contradiction is not None, contradiction or ""
    if key == DEVICE_ALLOCATED:
        return allocated_difference(have, want)
    return True, f"{key}={have!r}, the log {want!r}"


def annotation_repair(
    pod: Pod, node: NodeState, allocation: PodAllocation, context: Context
) -> AnnotationRepair | None:
    """The patch that makes ``pod``'s annotations say what its live, bound ``allocation``
    on ``node`` is (the binding's builder, the pod's own asked resources for the dialect
    keys); None when they already do. A key naming something else is a disagreement,
    recorded unless the pod is ``settling``."""
    want = current_annotations(
        allocation,
        node.name,
        first_card_memory_mib(node, allocation.shares),
        context.memory_unit,
        mgpu=asks_mgpu(asked_resources(pod)),
    )
    names = reservation_names(allocation)
    have = pod.annotations
    patch: dict[str, str] = {}
    contradictions: list[str] = []
    for key, value in want.items():
        write, contradiction = _compare(key, have.get(key), value, names)
        if write:
            patch[key] = value
        if contradiction:
            contradictions.append(contradiction)
    if not patch:
        return None
    found = None
    if contradictions and pod.metadata.uid not in context.settling:
        detail = (
            f"the annotations disagree with the log's allocation {allocation.reservation_id}"
            f" on {node.name}: " + "; ".join(contradictions)
        )
        found = annotation_mismatch(node.name, pod, detail, context, allocation.reservation_id)
    return AnnotationRepair(
        pod=pod_ref(pod),
        node=node.name,
        reservation_id=allocation.reservation_id,
        patch=patch,
        found=found,
    )


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
) -> Adoption | AnnotationRepair | DiscrepancyFound | None:
    """What one listed pod needs: adoption, its annotations repaired, a recorded
    discrepancy, or nothing."""
    name = pod.spec.node_name
    if not name or pod.phase in TERMINAL_PHASES or pod.metadata.deletion_timestamp:
        return None
    live = state.allocation(pod.metadata.uid)
    if live is not None and not live.bound:
        return None  # a bind in flight
    live_node = state.node_of(pod.metadata.uid) or ""
    if live is not None and live_node == name:
        return annotation_repair(pod, state.node(name), live, context)
    claim = read_claim(pod, context.memory_unit)
    if claim is None:
        return None
    if isinstance(claim, str):
        return annotation_mismatch(name, pod, claim, context)
    if live is not None:
        detail = (
            f"the pod is bound to {name} and its annotation names reservation "
            f"{claim.reservation} on {claim.node}; the log's live allocation is "
            f"{live.reservation_id} on {live_node}"
        )
        return annotation_mismatch(name, pod, detail, context, live.reservation_id)
    node = state.node(name)
    if node_gone(node, nodes, context.now):
        return None  # released with its node, not adopted
    if claim.node != name:
        return annotation_mismatch(
            name, pod, f"bound to {name}, annotated for {claim.node}", context
        )
    shares = claim.shares
    if claim.legacy_index is not None:
        card = _card_at(node, claim.legacy_index)
        if card is None and node.cards:
            return annotation_mismatch(
                name, pod, f"{IDX}={claim.legacy_index}: no such card", context
            )
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
        return "terminated", phase_detail(pod)
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
    repairs: list[AnnotationRepair] = []
    found: list[DiscrepancyFound] = []
    for pod in pods:
        decided = decide_pod(state, pod, nodes, context)
        if isinstance(decided, Adoption):
            adoptions.append(decided)
        elif isinstance(decided, AnnotationRepair):
            repairs.append(decided)
        elif decided is not None:
            found.append(decided)
    return Corrections(
        adoptions=tuple(adoptions),
        releases=stale_releases(state, pods, nodes, context),
        discrepancies=tuple(found),
        repairs=tuple(repairs),
    )
