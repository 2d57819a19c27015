"""DRA claims as gpushare reads them: what kube-scheduler allocated on our devices (the
ledger's ``ClaimAllocated``/``ClaimReleased``) and what a pod's claims ask of our
DeviceClass (a request the extender can score). Pure: API objects (plain JSON mappings)
and the fold in, events and requests out.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import msgspec

from gpushare.core.dra import CORES, DEVICE_CLASS, DRIVER, MEMORY, card_index_of
from gpushare.core.events import ClaimAllocated, ClaimReleased, ClaimShare
from gpushare.core.model import Card, ClaimRef, PodRef
from gpushare.core.pods import Pod
from gpushare.core.quantity import parse_quantity
from gpushare.core.requests import WHOLE, ContainerRequest, PodRequest
from gpushare.core.state import ClaimAllocation, ClusterState

MIB = 1024 * 1024


def _mib(quantity: object, *, default: int) -> int:
    if not isinstance(quantity, str | int | float):
        return default
    return math.ceil(parse_quantity(quantity) / MIB)


def _count(quantity: object, *, default: int) -> int:
    if not isinstance(quantity, str | int | float):
        return default
    return math.ceil(parse_quantity(quantity))


def claim_ref(claim: Mapping[str, Any]) -> ClaimRef:
    meta = claim.get("metadata") or {}
    return ClaimRef(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
    )


def claim_node(claim: Mapping[str, Any]) -> str | None:
    """The node a claim's allocation is bound to (its node selector's ``metadata.name``
    field term, as kube-scheduler writes it); ``None`` when it is not allocated."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        return None
    selector = allocation.get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or ():
        fields = [*(term.get("matchFields") or ()), *(term.get("matchExpressions") or ())]
        for field in fields:
            values = list(field.get("values") or ())
            named = field.get("key") in ("metadata.name", "kubernetes.io/hostname")
            if named and field.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return None


class UnknownDevice(ValueError):
    """An allocation result names a device the node's inventory does not have."""


def claim_shares(claim: Mapping[str, Any], cards: Sequence[Card]) -> tuple[ClaimShare, ...]:
    """What ``claim``'s allocation consumes of our driver's devices on ``cards``.

    A result without ``consumedCapacity`` (a claim that took a device exclusively)
    consumes the whole card. Raises :class:`UnknownDevice` for a device not among
    ``cards``; results of other drivers are not ours and are left out.
    """
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    by_index = {card.index: card for card in cards}
    shares: list[ClaimShare] = []
    for result in results:
        if result.get("driver") != DRIVER:
            continue
        device = str(result.get("device", ""))
        index = card_index_of(device)
        card = by_index.get(index) if index is not None else None
        if card is None:
            raise UnknownDevice(f"device {device!r} is not a card of this node")
        consumed = result.get("consumedCapacity")
        exclusive = not isinstance(consumed, Mapping)
        consumed = consumed if isinstance(consumed, Mapping) else {}
        shares.append(
            ClaimShare(
                request=str(result.get("request", "")),
                device=device,
                card_index=card.index,
                card_uuid=card.uuid,
                memory_mib=min(
                    card.memory_mib,
                    _mib(consumed.get(MEMORY), default=card.memory_mib if exclusive else 0),
                ),
                core_percent=min(
                    WHOLE, _count(consumed.get(CORES), default=WHOLE if exclusive else 0)
                ),
                share_id=str(result.get("shareID") or ""),
            )
        )
    return tuple(shares)


def reserved_for(claim: Mapping[str, Any]) -> tuple[PodRef, ...]:
    """The pods a claim is reserved for (``status.reservedFor`` entries of pods)."""
    namespace = claim_ref(claim).namespace
    return tuple(
        PodRef(namespace=namespace, name=str(entry.get("name", "")), uid=str(entry.get("uid", "")))
        for entry in (claim.get("status") or {}).get("reservedFor") or ()
        if entry.get("resource") == "pods"
    )


def allocation_id(
    claim_uid: str,
    node: str,
    shares: tuple[ClaimShare, ...],
    pods: tuple[PodRef, ...] = (),
    replaces: str = "",
) -> str:
    """The same record of a claim always gets the same event id: its allocation, the pods
    it is reserved for, and the record it replaces (``""``: none). Replicas recording the
    same change from the same fold are deduplicated by the stream; the id it replaces
    keeps a pod's return (reserved for a, then a and b, then a again) from reusing the
    first record's id, which the stream would drop as a duplicate."""
    recorded = (node, shares, pods, replaces)
    digest = hashlib.sha256(msgspec.json.encode(recorded)).hexdigest()[:12]
    return f"claim-{claim_uid}-{digest}"


class LedgerChanges(NamedTuple):
    events: list[ClaimAllocated | ClaimReleased]
    problems: list[str]
    """Allocations that cannot be recorded (a device the node does not report)."""


def ledger_changes(
    claims: Mapping[str, Mapping[str, Any]], state: ClusterState, now: datetime
) -> LedgerChanges:
    """What the log must append to hold exactly the allocations of ``claims`` (the API's,
    by UID) on DRA nodes and the pods each is reserved for: ``ClaimAllocated`` for one it
    lacks or holds differently (other shares, or other pods in ``status.reservedFor``),
    ``ClaimReleased`` for one it holds that the API no longer has allocated there."""
    events: list[ClaimAllocated | ClaimReleased] = []
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for uid, claim in sorted(claims.items()):
        node_name = claim_node(claim)
        node = state.nodes.get(node_name) if node_name else None
        if node is None or node.front_door != "dra" or not node.cards:
            continue
        try:
            shares = claim_shares(claim, node.cards)
        except UnknownDevice as error:
            problems.append(f"claim {claim_ref(claim).key} on {node.name}: {error}")
            continue
        if not shares:
            continue  # another driver's devices
        seen.add((node.name, uid))
        recorded = _claim_recorded(claim, node.name, shares, node.claims.get(uid), now)
        if recorded is not None:
            events.append(recorded)
    for node in state.nodes.values():
        for uid, held in sorted(node.claims.items()):
            if (node.name, uid) not in seen:
                events.append(_released(node.name, held, now, claims.get(uid)))
    return LedgerChanges(events, problems)


def _claim_recorded(
    claim: Mapping[str, Any],
    node: str,
    shares: tuple[ClaimShare, ...],
    held: ClaimAllocation | None,
    now: datetime,
) -> ClaimAllocated | None:
    """The ``ClaimAllocated`` that makes the log say what ``claim`` says (its ``shares``
    on ``node``, the pods in its ``reservedFor``), replacing ``held``, what the fold holds
    of it; ``None`` when the fold says it already.

    A pod joining or leaving a shared claim changes ``reservedFor`` alone; recording it
    is what lets ``audit`` and ``explain`` name every pod on the cards. The replacement
    counts once: the fold keeps one allocation per claim."""
    uid = claim_ref(claim).uid
    pods = reserved_for(claim)
    if held is not None and held.shares == shares and held.pods == pods:
        return None
    replaces = held.allocation_id if held is not None else ""
    return ClaimAllocated(
        id=allocation_id(uid, node, shares, pods, replaces),
        at=now,
        node=node,
        claim=claim_ref(claim),
        shares=shares,
        pods=pods,
        left=tuple(pod for pod in held.pods if pod not in pods) if held is not None else (),
    )


def _released(
    node: str, held: ClaimAllocation, now: datetime, claim: Mapping[str, Any] | None
) -> ClaimReleased:
    return ClaimReleased(
        id=f"{held.allocation_id}-released",
        at=now,
        node=node,
        claim=held.claim,
        allocation_id=held.allocation_id,
        reason="deleted" if claim is None else "deallocated",
        pods=held.pods,
    )


ClaimSpecs = Callable[[str, str, str], Mapping[str, Any] | None]
"""``(kind, namespace, name)`` → the ``spec`` of a ``ResourceClaim`` or the
``spec.spec`` of a ``ResourceClaimTemplate`` (``kind`` says which), ``None`` if unknown."""
TEMPLATE = "ResourceClaimTemplate"
CLAIM = "ResourceClaim"


def claim_request(pod: Pod, specs: ClaimSpecs) -> PodRequest | None:
    """What ``pod``'s DRA claims ask of our DeviceClass, as a request placement can plan:
    one single-card container per device asked (memory in MiB, cores in percent; a
    request without a memory capacity takes the whole card's memory). ``None`` when the
    pod asks nothing of ours, or a claim it names is not known (yet)."""
    containers: list[ContainerRequest] = []
    namespace = pod.metadata.namespace
    for entry in pod.spec.resource_claims or ():
        if entry.resource_claim_template_name:
            spec = specs(TEMPLATE, namespace, entry.resource_claim_template_name)
        elif entry.resource_claim_name:
            spec = specs(CLAIM, namespace, entry.resource_claim_name)
        else:
            continue
        if spec is None:
            return None
        containers.extend(_asked(entry.name, spec))
    return PodRequest(containers=tuple(containers)) if containers else None


def _asked(claim: str, spec: Mapping[str, Any]) -> list[ContainerRequest]:
    asked = []
    for request in (spec.get("devices") or {}).get("requests") or ():
        exactly = request.get("exactly") or {}
        if exactly.get("deviceClassName") != DEVICE_CLASS:
            continue
        capacity = (exactly.get("capacity") or {}).get("requests") or {}
        memory = capacity.get(MEMORY)
        count = int(exactly.get("count") or 1) if exactly.get("allocationMode") != "All" else 1
        for number in range(count):
            asked.append(
                ContainerRequest(
                    container=f"{claim}/{request.get('name', '')}/{number}",
                    memory_mib=_mib(memory, default=0) if memory is not None else 0,
                    memory_ratio=0 if memory is not None else WHOLE,
                    core_percent=min(WHOLE, _count(capacity.get(CORES), default=0)),
                )
            )
    return asked
