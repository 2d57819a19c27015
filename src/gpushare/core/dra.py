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
a card is never handed out by both. This module names the driver's objects and renders a
node's ResourceSlice; :mod:`.dra_claims` reads claims into the ledger and into requests,
:mod:`.cdi` writes what a prepared claim gives a container. Pure: plain JSON in and out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpushare.core.events import FrontDoor
from gpushare.core.model import Card, CardLink
from gpushare.core.requests import WHOLE

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
