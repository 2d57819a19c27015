"""What one source says a container holds: the cards it names, and the MiB on each.

A :class:`Reading` per container, from each of the four sources :mod:`tools.chaos_truth`
compares: the runtime's environment (:func:`env_reading`), the kubelet's device IDs
(:func:`device_reading`; every ID names its card, ``<8 hex of the card's UUID>-<n>``),
the log's allocation (:func:`log_reading`) and the pod's annotations
(:func:`annotation_readings`). A source that contradicts itself (``ALIYUN_COM_GPU_MEM_IDX``
naming another card than ``NVIDIA_VISIBLE_DEVICES``, a device ID of no card, an
annotation index that is not the card's) says so in :attr:`Reading.note`. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from gpushare.core.annotations import GPU_INDEX_CONTAINER, IDX, read_allocation
from gpushare.core.environment import MEMORY_LIMIT, VISIBLE_DEVICES
from gpushare.core.model import Card
from gpushare.core.requests import GPU_MEM, MGPU_MEMORY, ContainerRequest
from gpushare.core.state import PodAllocation, memory_by_card
from gpushare.node_agent.device_table import short_card_ids
from tools.chaos_facts import ApiPod

ALIYUN_IDX_ENV = "ALIYUN_COM_GPU_MEM_IDX"


@dataclass(frozen=True)
class NodeCards:
    """One node's cards, by UUID and by the short id its device IDs start with."""

    by_uuid: Mapping[str, Card]
    by_short: Mapping[str, str]

    @classmethod
    def of(cls, cards: Iterable[Card]) -> NodeCards:
        listed = tuple(cards)
        shorts = short_card_ids(listed)
        return cls(
            by_uuid=MappingProxyType({card.uuid: card for card in listed}),
            by_short=MappingProxyType({short: uuid for uuid, short in shorts.items()}),
        )

    def card_of_device(self, device: str) -> str | None:
        short, sep, number = device.rpartition("-")
        return self.by_short.get(short) if sep and number.isdigit() else None

    def memory(self, uuid: str) -> int:
        card = self.by_uuid.get(uuid)
        return card.memory_mib if card else 0

    def name(self, uuid: str) -> str:
        card = self.by_uuid.get(uuid)
        return str(card.index) if card else f"?{uuid}"


@dataclass(frozen=True)
class Reading:
    """What one source says one container (or pod) holds: MiB per card UUID."""

    mib: Mapping[str, int]
    note: str = ""
    """Where the source contradicts itself."""

    @property
    def cards(self) -> frozenset[str]:
        return frozenset(self.mib)


def _mib(ask: ContainerRequest | None, card_mib: int) -> int:
    return ask.memory_on(card_mib) if ask is not None else 0


def _env_limits(env: Mapping[str, str], count: int) -> list[int]:
    """``GPUSHARE_MEMORY_LIMIT_MIB`` per card (one number for all, or one per card)."""
    parts = [part for part in env.get(MEMORY_LIMIT, "").split(",") if part.strip().isdigit()]
    if len(parts) == 1:
        parts *= count
    return [int(part) for part in parts] if len(parts) == count else [0] * count


def env_reading(env: Mapping[str, str], ask: ContainerRequest | None, cards: NodeCards) -> Reading:
    """The cards the runtime's ``NVIDIA_VISIBLE_DEVICES`` names, and the MiB on each."""
    uuids = list(dict.fromkeys(u.strip() for u in env.get(VISIBLE_DEVICES, "").split(",")))
    uuids = [uuid for uuid in uuids if uuid]
    notes = [f"{VISIBLE_DEVICES} names unknown card {u}" for u in uuids if u not in cards.by_uuid]
    index = env.get(ALIYUN_IDX_ENV)
    first = cards.name(uuids[0]) if uuids and uuids[0] in cards.by_uuid else None
    if index is not None and first is not None and first != index.strip():
        notes.append(f"{ALIYUN_IDX_ENV}={index} but {VISIBLE_DEVICES} names card {first}")
    limits = _env_limits(env, len(uuids))
    mib = {
        uuid: _mib(ask, cards.memory(uuid)) if ask is not None else limit
        for uuid, limit in zip(uuids, limits, strict=True)
    }
    return Reading(mib, "; ".join(notes))


def device_reading(
    ids: Mapping[str, Sequence[str]], ask: ContainerRequest | None, cards: NodeCards, unit_mib: int
) -> Reading:
    """The cards a container's device IDs name; MiB by counting memory IDs, else its ask."""
    per_card: dict[str, int] = {}
    unknown: list[str] = []
    counted = False
    factors = {GPU_MEM: unit_mib, MGPU_MEMORY: 1}
    for resource, devices in sorted(ids.items()):
        factor = factors.get(resource, 0)
        counted = counted or factor > 0
        for device in devices:
            uuid = cards.card_of_device(device)
            if uuid is None:
                unknown.append(device)
                continue
            per_card[uuid] = per_card.get(uuid, 0) + factor
    if not counted:
        per_card = {uuid: _mib(ask, cards.memory(uuid)) for uuid in per_card}
    note = f"device IDs {', '.join(sorted(unknown)[:3])} name no card" if unknown else ""
    return Reading(per_card, note)


def log_reading(allocation: PodAllocation, container: str | None = None) -> Reading:
    """What the log holds for one container (or, without ``container``, the whole pod)."""
    shares = [s for s in allocation.shares if container is None or s.container == container]
    return Reading(memory_by_card(shares))


def annotation_readings(pod: ApiPod, cards: NodeCards) -> dict[str, Reading] | None:
    """Each container's cards as the pod's annotations say; ``None`` without gpushare's."""
    annotations = dict(pod.facts.annotations)
    annotated = read_allocation(annotations)
    if annotated is None:
        return None
    readings: dict[str, Reading] = {}
    for position, (container, shares) in enumerate(annotated.containers.items()):
        notes = [
            f"{share.card_uuid} is card {cards.name(share.card_uuid)}, not {share.card_index}"
            for share in shares
            if share.card_uuid in cards.by_uuid
            and cards.name(share.card_uuid) != str(share.card_index)
        ]
        indices = ",".join(str(share.card_index) for share in shares)
        listed = annotations.get(GPU_INDEX_CONTAINER + container)
        if listed is not None and listed != indices:
            notes.append(f"allocation JSON {indices}, {GPU_INDEX_CONTAINER}{container} {listed}")
        first = indices.split(",")[0]
        if position == 0 and annotations.get(IDX, first) != first:
            notes.append(f"allocation JSON {first}, {IDX} {annotations[IDX]}")
        if annotated.node != pod.node:
            notes.append(f"annotated for node {annotated.node}")
        readings[container] = Reading(memory_by_card(shares), "; ".join(notes))
    return readings
