"""Koordinator compatibility, pure: its ``Device`` object as a node's inventory, and its
``scheduling.koordinator.sh/device-allocated`` pod annotation from an allocation.

The shapes are Koordinator's own (koordinator-sh/koordinator):

* ``apis/scheduling/v1alpha1/device_types.go``: ``Device`` (``scheduling.koordinator.sh/
  v1alpha1``, cluster-scoped, one per node, named after it) with ``spec.devices[]`` of
  ``{type, id, minor, moduleID, health, resources, topology, labels, conditions}``. The
  UUID's JSON name is ``id``; ``topology`` is ``{socketID, nodeID, pcieID, busID}``;
  ``resources`` is a ``ResourceList`` (``koordinator.sh/gpu-core: 100``,
  ``koordinator.sh/gpu-memory: 16Gi`` in bytes, ``koordinator.sh/gpu-memory-ratio: 100``).
  Seed 002's proposal spells them ``kubernetes.io/gpu-core``, ``kubernetes.io/gpu-memory``
  (``15472384Ki``) and ``kubernetes.io/gpu-memory-ratio``. Only the memory sizes a card
  (core and ratio are 100 on every whole card), read under either name
  (:data:`MEMORY_NAMES`). koordlet labels the Device
  ``node.koordinator.sh/gpu-model`` and ``-driver-version``.
* ``apis/extension/device_share.go``: ``DeviceAllocations``, a map of device type to a list
  of ``{minor, resources, id?, extension?}``; pod-level (every container gets the pod's
  devices). The scheduler's ``memoryBytesToRatio``
  (``pkg/scheduler/plugins/deviceshare/utils.go``) truncates the ratio to a whole percent.

:func:`read_device` never raises on a malformed entry: the entry is left out (or its card
reported unhealthy, when it can still be named) and the reason goes to ``problems``. Only
an object that is not a Device at all raises :class:`KoordinatorDeviceError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from gpushare.core.errors import GpushareError
from gpushare.core.model import Card, CardLink, ContainerShare, LinkPath
from gpushare.core.quantity import parse_quantity
from gpushare.core.requests import (
    KOORDINATOR_CORE,
    KOORDINATOR_MEMORY,
    KOORDINATOR_RATIO,
    KUBERNETES_MEMORY,
    MAX_CARD_MEMORY_MIB,
)
from gpushare.core.state import core_by_card, memory_by_card

GROUP = "scheduling.koordinator.sh"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Device"
PLURAL = "devices"
DEVICE_ALLOCATED = f"{GROUP}/device-allocated"
"""The pod annotation Koordinator's scheduler writes at PreBind and koordlet reads."""
GPU = "gpu"
"""``DeviceType`` of GPUs; ``rdma``, ``fpga`` and ``xpu`` entries are not ours to read."""
MODEL_LABEL = "node.koordinator.sh/gpu-model"
DRIVER_VERSION_LABEL = "node.koordinator.sh/gpu-driver-version"
MEMORY_NAMES = (KOORDINATOR_MEMORY, KUBERNETES_MEMORY)
"""A card's memory in bytes, under Koordinator's name or seed 002's; both may be given,
and then must say the same amount."""
MIB = 2**20
_BINARY_SUFFIXES = ("Mi", "Gi", "Ti", "Pi", "Ei")


class KoordinatorDeviceError(GpushareError, ValueError):
    """The object is not a Koordinator Device at all (wrong kind, no readable spec)."""


class DeviceTopology(msgspec.Struct, frozen=True, kw_only=True):
    """Where a device sits: CPU socket, NUMA node, PCIe switch, PCI address."""

    socket_id: int = msgspec.field(name="socketID", default=-1)
    node_id: int = msgspec.field(name="nodeID", default=-1)
    pcie_id: str = msgspec.field(name="pcieID", default="")
    bus_id: str = msgspec.field(name="busID", default="")


class DeviceCondition(msgspec.Struct, frozen=True, kw_only=True):
    """A ``metav1.Condition`` of one device; only what explains ill health is read."""

    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""


class DeviceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of ``spec.devices`` (``DeviceInfo``); unknown fields are ignored."""

    type: str = ""
    id: str = ""
    """The device's UUID (Go field ``UUID``, JSON ``id``)."""
    minor: int | None = None
    module_id: int | None = msgspec.field(name="moduleID", default=None)
    health: bool = False
    resources: dict[str, str | int | float] = {}
    topology: DeviceTopology | None = None
    labels: dict[str, str] = {}
    conditions: tuple[DeviceCondition, ...] = ()


class KoordinatorInventory(msgspec.Struct, frozen=True, kw_only=True):
    """A node's GPUs as its Koordinator Device describes them."""

    node: str
    cards: tuple[Card, ...]
    """Ordered by index (the device's minor)."""
    links: tuple[CardLink, ...] = ()
    """From the devices' topology; empty unless every card has one."""
    driver_version: str = ""
    problems: tuple[str, ...] = ()
    """Entries left out or reported unhealthy, and why; empty when the Device is clean."""


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise KoordinatorDeviceError(f"{where} is not an object ({type(value).__name__})")
    return value


def _labels(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = metadata.get("labels")
    return labels if isinstance(labels, Mapping) else {}


def _label(labels: Mapping[str, Any], key: str) -> str:
    value = labels.get(key)
    return value if isinstance(value, str) else ""


def read_device(obj: object) -> KoordinatorInventory:
    """The inventory in a Koordinator ``Device`` (the decoded JSON of the object).

    Raises :class:`KoordinatorDeviceError` when ``obj`` is no Device (another kind or
    API version, no name, ``spec.devices`` not a list); a bad entry goes to ``problems``.
    """
    device = _mapping(obj, "the Device")
    if device.get("apiVersion", API_VERSION) != API_VERSION or device.get("kind", KIND) != KIND:
        raise KoordinatorDeviceError(
            f"expected {KIND} {API_VERSION}, got {device.get('kind')!r} "
            f"{device.get('apiVersion')!r}"
        )
    metadata = _mapping(device.get("metadata") or {}, "metadata")
    node = metadata.get("name")
    if not isinstance(node, str) or not node:
        raise KoordinatorDeviceError("the Device has no metadata.name (its node)")
    spec = _mapping(device.get("spec") or {}, "spec")
    entries = spec.get("devices")
    entries = [] if entries is None else entries
    if not isinstance(entries, list):
        raise KoordinatorDeviceError(f"spec.devices is not a list ({type(entries).__name__})")
    labels = _labels(metadata)
    model = _label(labels, MODEL_LABEL)
    cards, topologies, problems = _gpu_cards(entries, model)
    links = links_from_topology(topologies) if len(topologies) == len(cards) else ()
    return KoordinatorInventory(
        node=node,
        cards=cards,
        links=links,
        driver_version=_label(labels, DRIVER_VERSION_LABEL),
        problems=tuple(problems),
    )


def _gpu_cards(
    entries: list[Any], model: str
) -> tuple[tuple[Card, ...], dict[int, DeviceTopology], list[str]]:
    cards: dict[int, Card] = {}
    topologies: dict[int, DeviceTopology] = {}
    problems: list[str] = []
    uuids: set[str] = set()
    for position, entry in enumerate(entries):
        where = f"spec.devices[{position}]"
        try:
            info = msgspec.convert(entry, DeviceInfo)
        except msgspec.ValidationError as error:
            problems.append(f"{where}: {error}")
            continue
        if info.type != GPU:
            continue
        problem = _unnamed(info, uuids, cards)
        if problem:
            problems.append(f"{where}: {problem}; left out")
            continue
        card, problem = _card(info, model)
        if problem:
            problems.append(f"{where} ({card.uuid}): {problem}; reported unhealthy")
        uuids.add(card.uuid)
        cards[card.index] = card
        if info.topology is not None:
            topologies[card.index] = info.topology
    return tuple(cards[index] for index in sorted(cards)), topologies, problems


def _unnamed(info: DeviceInfo, uuids: set[str], cards: Mapping[int, Card]) -> str:
    """Why the entry cannot be a card (no UUID, no minor, a repeat), or ``""``."""
    if not info.id:
        return "no id (the device's UUID)"
    if info.minor is None or info.minor < 0:
        return f"no minor number (got {info.minor})"
    if info.id in uuids:
        return f"UUID {info.id} is listed twice"
    if info.minor in cards:
        return f"minor {info.minor} is listed twice"
    return ""


def _card(info: DeviceInfo, model: str) -> tuple[Card, str]:
    """The card, and what is wrong with its memory ("" when nothing)."""
    memory, problem = _card_memory(info.resources)
    assert info.minor is not None  # _unnamed checked it
    reason = problem or ("" if info.health else _ill_health(info.conditions))
    card = Card(
        index=info.minor,
        uuid=info.id,
        model=info.labels.get(MODEL_LABEL, model),
        memory_mib=memory,
        healthy=info.health and not problem,
        health_reason=reason,
    )
    return card, problem


def _card_memory(resources: Mapping[str, str | int | float]) -> tuple[int, str]:
    """Whole MiB of the card's memory, or 0 and what is wrong with it (naming the resource).

    koordlet writes ``koordinator.sh/gpu-memory``, seed 002's Device
    ``kubernetes.io/gpu-memory``: either sizes the card. An entry that gives both is
    believed only when they agree to the byte; which of two different sizes is the card's
    is not ours to guess, so the card is reported unhealthy rather than sized wrong."""
    given = {name: resources[name] for name in MEMORY_NAMES if name in resources}
    if not given:
        return 0, f"{KOORDINATOR_MEMORY}: missing (and no {KUBERNETES_MEMORY})"
    memory = 0
    for name, value in given.items():
        memory, problem = _memory_mib(value)
        if problem:
            return 0, f"{name}: {problem}"
    if len({parse_quantity(value) for value in given.values()}) > 1:
        said = " and ".join(f"{name} {value!r}" for name, value in given.items())
        return 0, f"{said} disagree"
    return memory, ""


def _memory_mib(value: str | int | float) -> tuple[int, str]:
    """Whole MiB of a byte quantity, or 0 and what is wrong with it."""
    try:
        number = parse_quantity(value)
    except ValueError as error:
        return 0, str(error)
    mib = int(number // MIB)
    if mib <= 0:
        return 0, f"{value!r} is less than 1 MiB"
    if mib > MAX_CARD_MEMORY_MIB:
        return 0, f"{value!r} is more than any card holds (1 TiB)"
    return mib, ""


def _ill_health(conditions: Iterable[DeviceCondition]) -> str:
    for condition in conditions:
        if condition.status != "True" and (condition.message or condition.reason):
            return f"Koordinator: {condition.message or condition.reason}"
    return "Koordinator: health false"


def link_path(a: DeviceTopology, b: DeviceTopology) -> LinkPath:
    """How two devices reach each other, in ``nvidia-smi topo -m``'s words, as far as the
    topology tells: one PCIe switch (``PXB``: the switch's bridges, not the host's), one
    NUMA node (``NODE``), else across the interconnect (``SYS``). NVLink is not in it."""
    if a.node_id != b.node_id or a.socket_id != b.socket_id:
        return "SYS"
    if a.pcie_id and a.pcie_id == b.pcie_id:
        return "PXB"
    return "NODE"


def links_from_topology(topologies: Mapping[int, DeviceTopology]) -> tuple[CardLink, ...]:
    """One link per pair of cards (by index, ``a < b``)."""
    indices = sorted(topologies)
    return tuple(
        CardLink(a=a, b=b, path=link_path(topologies[a], topologies[b]))
        for position, a in enumerate(indices)
        for b in indices[position + 1 :]
    )


# --- the pod annotation --------------------------------------------------------------------


def memory_quantity(mib: int) -> str:
    """``mib`` MiB as Kubernetes writes a binary byte quantity: ``8Gi``, ``16276Mi``, ``0``."""
    if mib == 0:
        return "0"
    suffix = 0
    while mib % 1024 == 0 and suffix < len(_BINARY_SUFFIXES) - 1:
        mib //= 1024
        suffix += 1
    return f"{mib}{_BINARY_SUFFIXES[suffix]}"


class DeviceAllocation(msgspec.Struct, frozen=True, kw_only=True):
    """One device of ``DeviceAllocations``: its minor and what the pod holds on it."""

    minor: int
    resources: dict[str, str]


def device_allocations(
    shares: Sequence[ContainerShare], card_memory_mib: int
) -> dict[str, list[DeviceAllocation]]:
    """The pod's cards, Koordinator's way: per card (minor = our card index, in order),
    the core percent (left out when only memory was asked), the memory in bytes, and the
    memory ratio against ``card_memory_mib`` (left out while that is unknown, 0).

    Koordinator assumes one GPU model per node, so one card size serves every card."""
    memory = memory_by_card(shares)
    core = core_by_card(shares)
    indices = {share.card_uuid: share.card_index for share in shares}
    allocations = []
    for uuid, index in sorted(indices.items(), key=lambda item: item[1]):
        resources: dict[str, str] = {}
        if core[uuid] > 0:
            resources[KOORDINATOR_CORE] = str(core[uuid])
        resources[KOORDINATOR_MEMORY] = memory_quantity(memory[uuid])
        if card_memory_mib > 0:
            resources[KOORDINATOR_RATIO] = str(memory[uuid] * 100 // card_memory_mib)
        allocations.append(DeviceAllocation(minor=index, resources=resources))
    return {GPU: allocations}


def device_allocated(shares: Sequence[ContainerShare], card_memory_mib: int) -> str:
    """The value of :data:`DEVICE_ALLOCATED`: :func:`device_allocations` as JSON, keys
    sorted as Go writes a map."""
    return msgspec.json.encode(device_allocations(shares, card_memory_mib), order="sorted").decode()


class _RawAllocation(msgspec.Struct, frozen=True):
    minor: int
    resources: dict[str, str | int] = {}


def read_device_allocated(text: str) -> dict[str, list[DeviceAllocation]] | None:
    """A ``device-allocated`` annotation read back; ``None`` when it is not one. Numbers
    in ``resources`` (Koordinator's examples write ``100`` as well as ``"100"``) come back
    as strings."""
    try:
        raw = msgspec.json.decode(text, type=dict[str, list[_RawAllocation]])
    except (msgspec.MsgspecError, UnicodeError):
        return None
    return {
        kind: [
            DeviceAllocation(
                minor=entry.minor,
                resources={name: str(value) for name, value in entry.resources.items()},
            )
            for entry in entries
        ]
        for kind, entries in raw.items()
    }


def _minors(allocations: Mapping[str, list[DeviceAllocation]]) -> list[int]:
    return sorted(entry.minor for entry in allocations.get(GPU, ()))


def _entries(allocations: Mapping[str, list[DeviceAllocation]]) -> set[tuple[int, str, str]]:
    return {
        (entry.minor, name, value)
        for entry in allocations.get(GPU, ())
        for name, value in entry.resources.items()
    }


def allocated_difference(have: str, want: str) -> tuple[bool, str]:
    """Whether a pod's ``device-allocated`` (``have``) must become the log's (``want``),
    and how it contradicts the log (other minors, or unreadable; ``""`` when it does not).

    Amounts the log does not know (the memory ratio while the card's size is unknown) are
    not taken away; amounts it knows better are written without a contradiction."""
    had = read_device_allocated(have)
    wanted = read_device_allocated(want)
    if had is None:
        return True, f"unreadable {DEVICE_ALLOCATED}: {have[:80]!r}"
    if wanted is None:
        return False, ""
    if _minors(had) != _minors(wanted):
        return True, f"{DEVICE_ALLOCATED} names minors {_minors(had)}, the log {_minors(wanted)}"
    return not _entries(wanted) <= _entries(had), ""
