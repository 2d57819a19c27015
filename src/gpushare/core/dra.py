"""Dynamic Resource Allocation (``resource.k8s.io/v1``): gpushare's second front door.

A node is served through exactly one front door, chosen by its ``gpushare.io/front-door``
label and carried in the node's inventory (:attr:`InventoryReported.front_door`):

* ``extender`` (the default): pods ask ``aliyun.com/gpu-mem`` & co., the extender places
  them and the device plugin hands the cards out;
* ``dra``: the node's cards are published as one ``ResourceSlice`` of devices that many
  claims may share (consumable capacity, KEP-5075), kube-scheduler allocates claims from
  it, the binder records each allocation in the allocation log (``ClaimAllocated``) and
  the node agent's DRA kubelet plugin prepares it.

The extender refuses ``dra`` nodes and no slice is published for ``extender`` nodes, so
a card is never handed out by both. Everything here is pure: API objects (plain JSON
mappings) and events in, API objects, events and CDI specs out.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import msgspec

from gpushare.core.environment import container_environment
from gpushare.core.events import ClaimAllocated, ClaimReleased, ClaimShare, FrontDoor
from gpushare.core.model import Card, CardLink, ClaimRef, ContainerShare, PodRef
from gpushare.core.pods import Pod
from gpushare.core.quantity import parse_quantity
from gpushare.core.requests import WHOLE, ContainerRequest, PodRequest
from gpushare.core.state import ClaimAllocation, ClusterState

DRIVER = "gpu.gpushare.io"
"""The DRA driver's name: ResourceSlices' ``spec.driver``, the DeviceClass's selector,
the kubelet plugin's registration name and the CDI vendor."""
DEVICE_CLASS = "gpu.gpushare.io"
"""The DeviceClass claims name to get a share of one of our cards."""
FRONT_DOOR_LABEL = "gpushare.io/front-door"
"""The node label that chooses a node's front door (``extender`` or ``dra``)."""
FRONT_DOORS: tuple[FrontDoor, ...] = ("extender", "dra")
MEMORY = "memory"
"""The capacity of a device in bytes; a claim consumes whole MiB of it."""
CORES = "cores"
"""The capacity of a device in percent of its compute (100 per card)."""
CDI_KIND = f"{DRIVER}/gpu"
"""The CDI kind of the devices the kubelet plugin prepares (``vendor/class``)."""
CDI_VERSION = "0.6.0"
MIB = 1024 * 1024

JSON = dict[str, Any]


def device_name(index: int) -> str:
    """A card's device name in its node's slice (a DNS label)."""
    return f"gpu-{index}"


def card_index_of(device: str) -> int | None:
    """The card index a device name stands for; ``None`` for a name not ours."""
    prefix, _, number = device.partition("-")
    if prefix != "gpu" or not number.isdigit():
        return None
    return int(number)


def pool_name(node: str) -> str:
    """One pool per node, named after it."""
    return node


def slice_name(node: str) -> str:
    """The node's ResourceSlice (one per node: the pool's only slice)."""
    return f"{node}-{DRIVER}"


def _nvlink_peers(index: int, links: Sequence[CardLink]) -> str:
    """The indices of the cards ``index`` reaches over NVLink, comma-separated (DRA
    attributes hold no lists)."""
    peers = sorted(
        link.b if link.a == index else link.a
        for link in links
        if link.path == "NVLINK" and index in (link.a, link.b)
    )
    return ",".join(str(peer) for peer in peers)


def mib_quantity(mib: int) -> str:
    """``mib`` MiB as the apiserver writes the quantity back (the largest binary suffix
    that divides it), so a slice read back compares equal to the one rendered."""
    for suffix, size in (("Ti", 1024 * 1024), ("Gi", 1024)):
        if mib and mib % size == 0:
            return f"{mib // size}{suffix}"
    return f"{mib}Mi"


def _device(card: Card, links: Sequence[CardLink], memory_step_mib: int) -> JSON:
    step = mib_quantity(memory_step_mib)
    return {
        "name": device_name(card.index),
        "allowMultipleAllocations": True,
        "attributes": {
            "index": {"int": card.index},
            "uuid": {"string": card.uuid},
            "model": {"string": card.model},
            "healthy": {"bool": card.healthy},
            "nvlinkPeers": {"string": _nvlink_peers(card.index, links)},
        },
        "capacity": {
            MEMORY: {
                "value": mib_quantity(card.memory_mib),
                "requestPolicy": {
                    "default": mib_quantity(card.memory_mib),
                    "validRange": {"min": step, "step": step},
                },
            },
            CORES: {
                "value": str(WHOLE),
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": str(WHOLE), "step": "1"},
                },
            },
        },
    }


def resource_slice(
    node: str,
    cards: Iterable[Card],
    links: Sequence[CardLink] = (),
    *,
    generation: int = 1,
    memory_step_mib: int = 1,
) -> JSON:
    """The ResourceSlice that publishes ``node``'s healthy cards, each shareable by memory
    (in steps of ``memory_step_mib``) and cores. An unhealthy card leaves the slice."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": pool_name(node), "generation": generation, "resourceSliceCount": 1},
            "devices": [
                _device(card, links, memory_step_mib)
                for card in sorted(cards, key=lambda card: card.index)
                if card.healthy
            ],
        },
    }


def slice_devices(body: Mapping[str, Any]) -> list[Any]:
    """The devices of a ResourceSlice body, for comparing a published slice with a wanted one."""
    spec = body.get("spec") or {}
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    return list(devices) if isinstance(devices, list) else []


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


def cdi_device_name(claim_uid: str, share: ClaimShare) -> str:
    """The CDI device of one prepared share: unique per claim and request."""
    return f"{claim_uid}-{share.request}-{share.device}"


def cdi_device_id(claim_uid: str, share: ClaimShare) -> str:
    """The fully qualified CDI name the kubelet hands the runtime."""
    return f"{CDI_KIND}={cdi_device_name(claim_uid, share)}"


def cdi_spec(
    claim_uid: str, shares: Sequence[ClaimShare], cards: Mapping[str, Card], *, mps: bool = False
) -> JSON:
    """The CDI spec that gives a container each share: the card by UUID and the limits
    the extender path's containers get (:func:`container_environment`). ``cards`` maps
    card UUID to the node's card; raises ``KeyError`` for a share on another card."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {
                "name": cdi_device_name(claim_uid, share),
                "containerEdits": {
                    "env": [
                        f"{key}={value}"
                        for key, value in sorted(_environment(share, cards, mps).items())
                    ]
                },
            }
            for share in shares
        ],
    }


def _environment(share: ClaimShare, cards: Mapping[str, Card], mps: bool) -> dict[str, str]:
    as_container = ContainerShare(
        container=share.request,
        card_index=share.card_index,
        card_uuid=share.card_uuid,
        memory_mib=share.memory_mib,
        core_percent=share.core_percent,
    )
    return container_environment(
        [as_container],
        cards,
        pod_memory_mib=share.memory_mib,
        memory_unit="MiB",
        mps=mps,
        aliyun=False,
    )


def allocation_id(claim_uid: str, node: str, shares: tuple[ClaimShare, ...]) -> str:
    """The same allocation of a claim always gets the same event id."""
    digest = hashlib.sha256(msgspec.json.encode((node, shares))).hexdigest()[:12]
    return f"claim-{claim_uid}-{digest}"


class LedgerChanges(NamedTuple):
    events: list[ClaimAllocated | ClaimReleased]
    problems: list[str]
    """Allocations that cannot be recorded (a device the node does not report)."""


def ledger_changes(
    claims: Mapping[str, Mapping[str, Any]], state: ClusterState, now: datetime
) -> LedgerChanges:
    """What the log must append to hold exactly the allocations of ``claims`` (the API's,
    by UID) on DRA nodes: ``ClaimAllocated`` for one it lacks or holds differently,
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
        held = node.claims.get(uid)
        if held is not None and held.shares == shares:
            continue
        events.append(
            ClaimAllocated(
                id=allocation_id(uid, node.name, shares),
                at=now,
                node=node.name,
                claim=claim_ref(claim),
                shares=shares,
                pods=reserved_for(claim),
            )
        )
    for node in state.nodes.values():
        for uid, held in sorted(node.claims.items()):
            if (node.name, uid) not in seen:
                events.append(_released(node.name, held, now, claims.get(uid)))
    return LedgerChanges(events, problems)


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
