"""Which extended resources the agent advertises, how many device IDs each card gives, and
which of a container's resources hands it its cards. Pure: the node agent's device plugin
advertises what this decides; the resource names are :mod:`gpushare.core.requests`'.

The kubelet learns a device-plugin resource's capacity by counting device IDs, and a
container gets exactly as many IDs as its request's *value*; so every resource a pod
may ask must be advertised as one ID per unit of that value, per card:

=================================  ==========================  ===========================
resource                           IDs per card                dialect (``--dialect``)
=================================  ==========================  ===========================
``aliyun.com/gpu-mem``             memory / unit (MiB, GiB)    ``aliyun`` (seeds 000/001)
``gpushare.io/gpu-core``           100 (percent)               ``gpushare`` (seed 002)
``gpushare.io/gpu-memory-ratio``   100 (percent)               ``gpushare``
``gpushare.io/gpu``                100 (percent)               ``gpushare``
``koordinator.sh/gpu-core``        100                         ``koordinator``
``koordinator.sh/gpu-memory-ratio``  100                       ``koordinator``
``vke.volcengine.com/mgpu-core``   100                         ``vke`` (seed 003)
``vke.volcengine.com/mgpu-memory`` memory in MiB               ``vke``
``nvidia.com/gpu``                 1                           ``nvidia`` (only without
                                                               NVIDIA's own plugin)
=================================  ==========================  ===========================

Not advertisable by a device plugin: ``gpushare.io/gpu-memory`` and
``koordinator.sh/gpu-memory`` are byte quantities (``4Gi`` would need 4,294,967,296 IDs),
and ``kubernetes.io/*`` is a namespace the kubelet keeps for itself (it refuses such a
registration). See ``docs/design/pod-results.md``.

One plugin socket serves one resource. The kubelet calls ``Allocate`` once per
container *and resource*, so a container asking ``gpu-core`` and ``gpu-memory-ratio``
causes two calls; exactly one of them, on its *keyed* resource (the first of
:data:`KEYING_ORDER` it asked), hands it its cards, the others only count.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from math import ceil

from gpushare.core.model import Card, ContainerShare
from gpushare.core.requests import (
    GPU_MEM,
    GPUSHARE_CORE,
    GPUSHARE_GPU,
    GPUSHARE_MEMORY,
    GPUSHARE_RATIO,
    KOORDINATOR_CORE,
    KOORDINATOR_MEMORY,
    KOORDINATOR_RATIO,
    MEMORY_UNITS_MIB,
    MGPU_CORE,
    MGPU_MEMORY,
    NVIDIA_GPU,
    WHOLE,
)

CORE_RESOURCES = frozenset({GPUSHARE_CORE, KOORDINATOR_CORE, MGPU_CORE, GPUSHARE_GPU})
"""One ID per percent of a card's compute (the ``gpu`` shorthand counts core and ratio
alike)."""
RATIO_RESOURCES = frozenset({GPUSHARE_RATIO, KOORDINATOR_RATIO})
"""One ID per percent of a card's memory."""

DIALECTS: dict[str, tuple[str, ...]] = {
    "aliyun": (GPU_MEM,),
    "gpushare": (GPUSHARE_CORE, GPUSHARE_RATIO, GPUSHARE_GPU),
    "koordinator": (KOORDINATOR_CORE, KOORDINATOR_RATIO),
    "vke": (MGPU_CORE, MGPU_MEMORY),
    "nvidia": (NVIDIA_GPU,),
}
DEFAULT_DIALECTS = ("aliyun", "gpushare")

SOCKETS: dict[str, str] = {
    GPU_MEM: "gpushare-gpu-mem.sock",
    GPUSHARE_CORE: "gpushare-core.sock",
    GPUSHARE_RATIO: "gpushare-memory-ratio.sock",
    GPUSHARE_GPU: "gpushare-gpu.sock",
    KOORDINATOR_CORE: "gpushare-koord-core.sock",
    KOORDINATOR_RATIO: "gpushare-koord-memory-ratio.sock",
    MGPU_CORE: "gpushare-mgpu-core.sock",
    MGPU_MEMORY: "gpushare-mgpu-memory.sock",
    NVIDIA_GPU: "gpushare-nvidia-gpu.sock",
}
"""The plugin socket of each resource, inside the kubelet's device-plugins directory."""

KEYING_ORDER: tuple[str, ...] = (
    GPU_MEM,
    NVIDIA_GPU,
    MGPU_MEMORY,
    MGPU_CORE,
    GPUSHARE_RATIO,
    GPUSHARE_GPU,
    GPUSHARE_CORE,
    KOORDINATOR_RATIO,
    KOORDINATOR_CORE,
)
"""Which of a container's resources hands it its cards: the first it asked."""

NOT_ADVERTISABLE: dict[str, str] = {
    GPUSHARE_MEMORY: "a byte quantity; one device ID per byte is impossible",
    KOORDINATOR_MEMORY: "a byte quantity; one device ID per byte is impossible",
}


def resources_of(dialects: Iterable[str]) -> tuple[str, ...]:
    """The resources advertised for ``dialects``, in :data:`KEYING_ORDER`; raises
    ``ValueError`` naming an unknown dialect."""
    wanted: set[str] = set()
    for dialect in dialects:
        if dialect not in DIALECTS:
            known = ", ".join(DIALECTS)
            raise ValueError(f"unknown dialect {dialect!r} (known: {known})")
        wanted.update(DIALECTS[dialect])
    return tuple(name for name in KEYING_ORDER if name in wanted)


def check_resource(resource: str) -> None:
    """Raises ``ValueError`` for a resource no device plugin can advertise."""
    if resource in NOT_ADVERTISABLE:
        raise ValueError(f"{resource} cannot be advertised: {NOT_ADVERTISABLE[resource]}")
    if resource.partition("/")[0].endswith("kubernetes.io"):
        raise ValueError(f"{resource}: the kubelet keeps kubernetes.io names for itself")
    if resource not in SOCKETS:
        raise ValueError(f"{resource} is not a resource gpushare serves")


def devices_per_card(resource: str, card: Card, memory_unit: str) -> int:
    """How many device IDs ``card`` contributes to ``resource``."""
    if resource == GPU_MEM:
        return card.memory_mib // MEMORY_UNITS_MIB[memory_unit]
    if resource == MGPU_MEMORY:
        return card.memory_mib
    if resource == NVIDIA_GPU:
        return 1
    if resource in CORE_RESOURCES or resource in RATIO_RESOURCES:
        return WHOLE
    raise ValueError(f"{resource} is not a resource gpushare serves")


def advertised_resources(
    cards: Iterable[Card], memory_unit: str, resources: Sequence[str]
) -> dict[str, int]:
    """Resource name → how many device IDs the node advertises for it (unhealthy included)."""
    listed = tuple(cards)
    return {
        resource: sum(devices_per_card(resource, card, memory_unit) for card in listed)
        for resource in resources
    }


def keyed_resource(asked: Sequence[str], advertised: Collection[str]) -> str | None:
    """The resource whose ``Allocate`` hands a container its cards.

    The first of :data:`KEYING_ORDER` the container asked and the agent advertises.
    A container whose names are unknown (``()``: a ``PodBound`` from an older binder)
    asked ``aliyun.com/gpu-mem``, the only resource there was. ``None``: it asked
    nothing this agent advertises, so no ``Allocate`` can hand it cards.
    """
    if not asked:
        return GPU_MEM if GPU_MEM in advertised else None
    return next((name for name in KEYING_ORDER if name in asked and name in advertised), None)


def share_demand(resource: str, share: ContainerShare, card: Card, memory_unit: str) -> int:
    """How many of ``resource``'s IDs on ``card`` the kubelet hands a container for ``share``."""
    if resource == GPU_MEM:
        return share.memory_mib // MEMORY_UNITS_MIB[memory_unit]
    if resource == MGPU_MEMORY:
        return share.memory_mib
    if resource == NVIDIA_GPU:
        return 1
    if resource in CORE_RESOURCES:
        return share.core_percent
    if resource in RATIO_RESOURCES:
        # the allocator rounded the ratio's MiB down; rounding up gives the ratio back
        return min(WHOLE, ceil(share.memory_mib * WHOLE / card.memory_mib))
    raise ValueError(f"{resource} is not a resource gpushare serves")


def container_demand(
    resource: str,
    shares: Iterable[ContainerShare],
    cards: Mapping[str, Card],
    memory_unit: str,
) -> dict[str, int]:
    """Card UUID → how many of ``resource``'s IDs a container holds there (cards it has)."""
    demand: dict[str, int] = {}
    for share in shares:
        card = cards.get(share.card_uuid)
        if card is not None:
            amount = share_demand(resource, share, card, memory_unit)
            demand[share.card_uuid] = demand.get(share.card_uuid, 0) + amount
    return demand
