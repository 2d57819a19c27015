"""Comparing the kubelet's device assignments with the allocation log (pure).

The kubelet's pod-resources API tells which device IDs each container really holds;
the IDs name their card (:mod:`.devices`). Three disagreements are worth an operator's
attention:

* ``card_mismatch``: a container holds IDs on other cards than the log gave it, so
  the log's accounting for those cards is wrong (the failure of anchors complaint 1).
  Only the IDs of the container's keyed resource are compared: those of a resource it
  asked only to count may sit on any card (:mod:`.matching`);
* ``unknown_to_log``: a container holds IDs but the log has no live reservation for it
  (released too early, or admitted around the scheduler);
* ``missing_from_kubelet``: the log says an app container was assigned but the kubelet
  does not list it (a pod gone without ``PodReleased``: a ghost that blocks memory).
  Init containers are not checked: pod-resources lists app containers only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpushare.core.requests import GPU_MEM
from gpushare.core.state import NodeState, PodAllocation
from gpushare.node_agent.device_table import DeviceTable
from gpushare.node_agent.foreign import card_named
from gpushare.node_agent.matching import LEGACY, Asks

FindingKind = Literal["card_mismatch", "unknown_to_log", "missing_from_kubelet"]
FINDING_KINDS: tuple[FindingKind, ...] = ("card_mismatch", "unknown_to_log", "missing_from_kubelet")


@dataclass(frozen=True)
class KubeletContainer:
    """One container's device IDs of one of our resources, as the kubelet reports them."""

    namespace: str
    pod: str
    container: str
    device_ids: tuple[str, ...]
    resource: str = GPU_MEM


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    pod: str
    """``namespace/name``."""
    container: str
    detail: str
    allocation: PodAllocation | None = None
    """The log's live allocation of the pod (``None`` for ``unknown_to_log``)."""
    kubelet_cards: tuple[str, ...] = ()
    """``card_mismatch``: the UUIDs of the cards the kubelet's IDs are on, by index;
    empty when an ID names no card of this node (nothing to correct to)."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.pod, self.container)


def _cards_of(table: DeviceTable, device_ids: Sequence[str]) -> set[str]:
    """The UUIDs of the cards the IDs are on: ours by the table; another ID by a card
    whose UUID it contains (seed 000's plugin named its IDs ``<card UUID>-_-<n>``: pods
    it served keep them after a migration), else ``unknown ID <id>``."""
    sorted_ids = table.sort_by_card(device_ids)
    cards = set(sorted_ids.per_card)
    for device in sorted_ids.unknown:
        card = card_named(table.cards, table.resource, device)
        cards.add(card.uuid if card is not None else f"unknown ID {device}")
    return cards


def _known_cards(table: DeviceTable, cards: set[str]) -> tuple[str, ...]:
    """The cards in index order, or ``()`` when one of them is an unknown ID."""
    known = [card for uuid in cards if (card := table.card(uuid)) is not None]
    if len(known) != len(cards):
        return ()
    return tuple(card.uuid for card in sorted(known, key=lambda card: card.index))


def _check_container(
    allocation: PodAllocation | None,
    held: KubeletContainer,
    tables: Mapping[str, DeviceTable],
    asks: Asks,
) -> Finding | None:
    key = f"{held.namespace}/{held.pod}"
    shares = [s for s in (allocation.shares if allocation else ()) if s.container == held.container]
    if allocation is None or not shares:
        detail = f"holds {len(held.device_ids)} device IDs but the log has no live reservation"
        return Finding("unknown_to_log", key, held.container, detail)
    table = tables.get(held.resource)
    if table is None or asks.keyed(allocation.reservation_id, held.container) != held.resource:
        return None
    cards = _cards_of(table, held.device_ids)
    given = {share.card_uuid for share in shares}
    if cards != given:
        detail = (
            f"the log gave it {', '.join(sorted(given))}, the kubelet's device IDs are on "
            f"{', '.join(sorted(cards))}"
        )
        found = _known_cards(table, cards)
        return Finding("card_mismatch", key, held.container, detail, allocation, found)
    return None


def compare_with_log(
    node: NodeState,
    tables: DeviceTable | Mapping[str, DeviceTable],
    held: Sequence[KubeletContainer],
    asks: Asks = LEGACY,
) -> list[Finding]:
    """Every disagreement between the kubelet's view (``held``) and the node's fold.

    ``tables``: the device table of each resource ``held`` may name (or the one table).
    """
    if isinstance(tables, DeviceTable):
        tables = {tables.resource: tables}
    by_name = {allocation.pod.key: allocation for allocation in node.pods.values()}
    findings: list[Finding] = []
    listed: set[tuple[str, str]] = set()
    for container in held:
        key = f"{container.namespace}/{container.pod}"
        seen = (key, container.container) in listed
        listed.add((key, container.container))
        finding = _check_container(by_name.get(key), container, tables, asks)
        if finding is not None and not (seen and finding.kind == "unknown_to_log"):
            findings.append(finding)
    for key, allocation in sorted(by_name.items()):
        # pod-resources lists app containers only; an init container's IDs are not shown
        app = {share.container for share in allocation.shares if not share.init}
        for name in sorted(allocation.assigned & app):
            if (key, name) not in listed:
                detail = "assigned in the log, but the kubelet lists no devices for it"
                findings.append(Finding("missing_from_kubelet", key, name, detail, allocation))
    return findings
