"""The device IDs the plugin advertises per resource, named after their card.

The kubelet counts an extended resource by device IDs and hands a container as many
IDs as it asks units: one ID per memory unit for ``aliyun.com/gpu-mem``, one per percent
for ``gpu-core``, and so on (:mod:`.resources`). Naming every ID after its card
(``<short card id>-<n>``) is what lets Allocate, which carries nothing but IDs, say which
card the kubelet picked. Every resource names its IDs the same way. The
short id is the first 8 hex digits of the card's UUID after ``GPU-``; two cards whose
UUIDs share that prefix are named ``gpu<index>`` instead (``card<position>`` if even that
clashes). IDs stay the same as long as the node's set of cards does.

Everything here is pure: inventory in, IDs and a protobuf message out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from gpushare.core.model import Card
from gpushare.core.plugin_resources import check_resource, devices_per_card
from gpushare.core.requests import GPU_MEM, MEMORY_UNITS_MIB
from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

KUBELET_MAX_RECEIVE_BYTES = 4 * 1024 * 1024
"""The kubelet dials plugins with grpc-go's default 4 MiB limit on a received message."""

SHORT_ID_LENGTH = 8

_NOT_ALNUM = re.compile(r"[^0-9a-z]")


class DeviceListTooLarge(ValueError):
    """The device list would not fit into one ListAndWatch message the kubelet accepts."""

    def __init__(self, size: int, devices: int, memory_unit: str, resource: str = GPU_MEM) -> None:
        advice = (
            "; set GPUSHARE_MEMORY_UNIT=GiB (--memory-unit GiB) cluster-wide, which "
            "advertises 1024 times fewer device IDs"
            if memory_unit == "MiB" and resource == GPU_MEM
            else ""
        )
        what = memory_unit if resource == GPU_MEM else resource
        super().__init__(
            f"the ListAndWatch message for {devices} device IDs ({what}) is {size} "
            f"bytes, over the kubelet's {KUBELET_MAX_RECEIVE_BYTES}-byte gRPC receive "
            f"limit{advice}"
        )
        self.resource = resource
        self.size = size
        self.devices = devices
        self.memory_unit = memory_unit


def _uuid_prefix(uuid: str) -> str:
    rest = uuid[4:] if uuid.upper().startswith("GPU-") else uuid
    return _NOT_ALNUM.sub("", rest.lower())[:SHORT_ID_LENGTH]


def short_card_ids(cards: Iterable[Card]) -> dict[str, str]:
    """Card UUID → the short id its device IDs start with (unique on the node)."""
    ordered = sorted(cards, key=lambda card: (card.index, card.uuid))
    prefixes = [_uuid_prefix(card.uuid) for card in ordered]
    names: dict[str, str] = {}
    taken: set[str] = set()
    for position, (card, prefix) in enumerate(zip(ordered, prefixes, strict=True)):
        candidates = [f"gpu{card.index}", f"card{position}"]
        if prefix and prefixes.count(prefix) == 1:
            candidates.insert(0, prefix)
        name = next(c for c in candidates if c not in taken)
        names[card.uuid] = name
        taken.add(name)
    return names


def device_id(short_id: str, number: int) -> str:
    return f"{short_id}-{number}"


@dataclass(frozen=True)
class IdsByCard:
    """Device IDs sorted by card: :meth:`DeviceTable.sort_by_card`."""

    per_card: dict[str, int]
    """Card UUID → how many of the IDs are on it, in the table's card order."""
    unknown: tuple[str, ...]
    """The IDs no card of the table has, sorted."""


@dataclass(frozen=True)
class DeviceTable:
    """The IDs a node advertises for one resource, and which card each belongs to."""

    memory_unit: str
    cards: tuple[Card, ...] = ()
    resource: str = GPU_MEM
    short_ids: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Card UUID → short id."""
    _by_short_id: Mapping[str, Card] = field(default_factory=lambda: MappingProxyType({}))
    _ids: dict[tuple[str, int], tuple[tuple[str, ...], frozenset[str]]] = field(
        default_factory=dict, compare=False, repr=False
    )
    """(short id, units) → a card's IDs in order, and as a set: made once per table (a
    card of MiB IDs is 32,768 strings, asked for at every ``GetPreferredAllocation``)."""

    def card_of(self, device: str) -> Card | None:
        """The card an ID belongs to, or ``None`` for an ID this table never advertised."""
        short, sep, number = device.rpartition("-")
        card = self._by_short_id.get(short) if sep else None
        if card is None or not number.isdigit() or int(number) >= self.units(card):
            return None
        return card

    def sort_by_card(self, devices: Iterable[str]) -> IdsByCard:
        """How many of the distinct ``devices`` each card holds, and which IDs this table
        never advertised. Set operations against each card's ID set, one lookup per card
        found: a container of MiB IDs holds thousands of them, and looking each one up
        took 0.3-0.6 µs (40 ms for the 131,072 IDs of four full 32 GiB cards, at every
        pod-resources check)."""
        left = set(devices)
        found: dict[str, int] = {}
        unknown: list[str] = []
        while left:
            device = left.pop()
            card = self.card_of(device)
            if card is None:
                unknown.append(device)
                continue
            ids = self.id_set(card)
            if left <= ids:  # the rest is on this card too: a container's usual case
                found[card.uuid] = len(left) + 1
                break
            same_card = left & ids
            left -= same_card
            found[card.uuid] = len(same_card) + 1
        per_card = {card.uuid: found[card.uuid] for card in self.cards if card.uuid in found}
        return IdsByCard(per_card=per_card, unknown=tuple(sorted(unknown)))

    def units(self, card: Card) -> int:
        """How many IDs ``card`` contributes to this table's resource."""
        return devices_per_card(self.resource, card, self.memory_unit)

    @cached_property
    def by_uuid(self) -> Mapping[str, Card]:
        """Card UUID → card."""
        return MappingProxyType({card.uuid: card for card in self.cards})

    def card(self, uuid: str) -> Card | None:
        short = self.short_ids.get(uuid)
        return None if short is None else self._by_short_id[short]

    def ids_of(self, card: Card) -> tuple[str, ...]:
        return self._card_ids(card)[0]

    def id_set(self, card: Card) -> frozenset[str]:
        """:meth:`ids_of` as a set."""
        return self._card_ids(card)[1]

    def _card_ids(self, card: Card) -> tuple[tuple[str, ...], frozenset[str]]:
        short = self.short_ids.get(card.uuid)
        if short is None:
            return (), frozenset()
        key = (short, self.units(card))
        known = self._ids.get(key)
        if known is None:
            ids = tuple(device_id(short, n) for n in range(key[1]))
            known = self._ids[key] = (ids, frozenset(ids))
        return known

    def devices(self) -> Iterator[tuple[str, bool]]:
        """Every advertised ``(ID, healthy)``, card by card."""
        for card in self.cards:
            for device in self.ids_of(card):
                yield device, card.healthy

    @property
    def count(self) -> int:
        return sum(self.units(card) for card in self.cards)


def build_device_table(
    cards: Iterable[Card], memory_unit: str, resource: str = GPU_MEM
) -> DeviceTable:
    """The table for a node's inventory; raises ``ValueError`` for an unknown unit or resource."""
    if memory_unit not in MEMORY_UNITS_MIB:
        raise ValueError(f"memory unit must be one of {sorted(MEMORY_UNITS_MIB)}: {memory_unit!r}")
    check_resource(resource)
    ordered = tuple(sorted(cards, key=lambda card: (card.index, card.uuid)))
    short_ids = short_card_ids(ordered)
    by_short = {short_ids[card.uuid]: card for card in ordered}
    return DeviceTable(
        memory_unit=memory_unit,
        cards=ordered,
        resource=resource,
        short_ids=MappingProxyType(short_ids),
        _by_short_id=MappingProxyType(by_short),
    )


def list_and_watch_response(table: DeviceTable) -> api_pb2.ListAndWatchResponse:
    """The complete device list, as ListAndWatch sends it (unhealthy cards' IDs included)."""
    return api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(ID=device, health=HEALTHY if healthy else UNHEALTHY)
            for device, healthy in table.devices()
        ]
    )


def check_message_size(
    response: api_pb2.ListAndWatchResponse,
    memory_unit: str,
    limit: int = KUBELET_MAX_RECEIVE_BYTES,
    resource: str = GPU_MEM,
) -> int:
    """The encoded size of ``response``; raises :class:`DeviceListTooLarge` over ``limit``."""
    size = int(response.ByteSize())
    if size > limit:
        raise DeviceListTooLarge(size, len(response.devices), memory_unit, resource)
    return size
