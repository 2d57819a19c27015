"""Which of this node's cards other device plugins' pods hold (pure).

Migrating a live cluster means pods already hold whole cards through another device
plugin, most often NVIDIA's ``nvidia.com/gpu``; the log knows nothing of them. The
kubelet does: its pod-resources API (or, where that is unavailable, its device
checkpoint, :mod:`.checkpoint`) lists each container's device IDs per resource. An ID
of a resource this agent does not serve names a card when:

* it *is* a card UUID (``GPU-5f1c…``: NVIDIA's plugin with the default ``uuid`` strategy),
  compared without case;
* it *contains* one: time-sliced replicas (``GPU-5f1c…::3``), old-style MIG devices
  (``MIG-GPU-5f1c…/1/0``), or any plugin that prefixes or suffixes the card's UUID;
* for ``nvidia.com/*`` resources only, it is a card index (``DEVICE_ID_STRATEGY=index``:
  ``"1"``) or a MIG index pair (``"1:0"``, the card first).

New-style MIG UUIDs (``MIG-<uuid of the instance>``) name no card and are left
unmatched (reported, never guessed). Each matched card counts as wholly used
(``ForeignCardsHeld``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpushare.core.events import ForeignHold
from gpushare.core.model import Card
from gpushare.core.state import NodeState, PodAllocation

NVIDIA_DOMAIN = "nvidia.com/"
_INDEX = re.compile(r"^(\d+)(?::\d+)?$")


@dataclass(frozen=True)
class ForeignDevices:
    """One container's IDs of a resource this agent does not serve."""

    pod: str
    """``namespace/name`` (pod-resources), or the pod UID (the checkpoint names no pod)."""
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ForeignMatch:
    holds: tuple[ForeignHold, ...]
    """By card index; each card once."""
    unmatched: tuple[str, ...]
    """``resource:ID`` of the IDs that name no card of this node."""


def card_named(cards: Sequence[Card], resource: str, device_id: str) -> Card | None:
    """The card ``device_id`` of ``resource`` names, if any (see the module's rules)."""
    lowered = device_id.lower()
    for card in cards:
        if card.uuid.lower() == lowered:
            return card
    for card in sorted(cards, key=lambda card: -len(card.uuid)):
        if card.uuid and card.uuid.lower() in lowered:
            return card
    index = _INDEX.match(device_id)
    if index is not None and resource.startswith(NVIDIA_DOMAIN):
        return next((card for card in cards if card.index == int(index.group(1))), None)
    return None


def match_foreign(cards: Sequence[Card], devices: Iterable[ForeignDevices]) -> ForeignMatch:
    """The cards ``devices`` hold: which resources and pods hold each."""
    resources: dict[str, set[str]] = {}
    pods: dict[str, set[str]] = {}
    unmatched: list[str] = []
    for entry in devices:
        for device in entry.device_ids:
            card = card_named(cards, entry.resource, device)
            if card is None:
                unmatched.append(f"{entry.resource}:{device}")
                continue
            resources.setdefault(card.uuid, set()).add(entry.resource)
            pods.setdefault(card.uuid, set()).add(entry.pod)
    by_uuid = {card.uuid: card for card in cards}
    holds = tuple(
        ForeignHold(
            card_uuid=uuid, resource=",".join(sorted(names)), pods=tuple(sorted(pods[uuid]))
        )
        for uuid, names in sorted(resources.items(), key=lambda item: by_uuid[item[0]].index)
    )
    return ForeignMatch(holds=holds, unmatched=tuple(sorted(set(unmatched))))


def overlaps(
    node: NodeState, holds: Iterable[ForeignHold]
) -> list[tuple[ForeignHold, PodAllocation]]:
    """Each foreign-held card that also carries a live reservation of ours, with it."""
    held: Mapping[str, ForeignHold] = {hold.card_uuid: hold for hold in holds}
    found: list[tuple[ForeignHold, PodAllocation]] = []
    for allocation in node.pods.values():
        cards = dict.fromkeys(share.card_uuid for share in allocation.shares)
        found.extend((held[uuid], allocation) for uuid in cards if uuid in held)
    return found
