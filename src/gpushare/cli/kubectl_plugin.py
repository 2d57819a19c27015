"""``kubectl gpushare [NODE] [-d]``: kubectl-inspect-gpushare's tables, over the allocation log.

kubectl runs any ``kubectl-gpushare`` on the PATH as ``kubectl gpushare``; the wheel installs
one (``pyproject.toml``), and it is ``gpushare inspect`` under another name. The tables are
laid out here, as seed 000's plugin lays them out (its ``cmd/inspect/display.go``): per node
each card's ``allocated/total`` MiB and the node's sum, or with ``-d`` each pod's MiB per card,
then the cluster's total. A card that only the log names (gone from today's inventory) is
marked ``*`` and its total shown as ``?``.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

from gpushare.cli.rendering import table
from gpushare.core.state import NodeState, PodAllocation, memory_by_card

PROG = "kubectl gpushare"
MISSING_MARK = "*"
MISSING_NOTE = f"{MISSING_MARK} a card the log names that today's inventory does not list"


class CardUse(NamedTuple):
    """One card of a node as the tables show it."""

    card_index: int
    uuid: str
    total: int | None
    """``None``: the card is not in the node's inventory (any more)."""
    used: int

    @property
    def label(self) -> str:
        return f"GPU{self.card_index}{MISSING_MARK if self.total is None else ''}"

    @property
    def cell(self) -> str:
        return f"{self.used}/{'?' if self.total is None else self.total}"

    def json(self) -> dict[str, Any]:
        """Shaped like ``inspect_node``'s cards, for a card that only the log names."""
        return {
            "index": self.card_index,
            "uuid": self.uuid,
            "total_mib": None,
            "used_mib": self.used,
            "in_inventory": False,
        }


def card_uses(node: NodeState) -> list[CardUse]:
    """The node's inventoried cards by index, then the cards only its allocations name."""
    listed = sorted(node.cards, key=lambda card: card.index)
    uses = [CardUse(c.index, c.uuid, c.memory_mib, node.used_mib.get(c.uuid, 0)) for c in listed]
    known = {card.uuid for card in listed}
    for allocation in sorted(node.pods.values(), key=lambda a: a.reserved_seq):
        for share in allocation.shares:
            if share.card_uuid not in known:
                known.add(share.card_uuid)
                used = node.used_mib.get(share.card_uuid, 0)
                uses.append(CardUse(share.card_index, share.card_uuid, None, used))
    return uses


def _totals(nodes: list[NodeState]) -> tuple[int, int]:
    used = sum(sum(node.used_mib.values()) for node in nodes)
    return used, sum(card.memory_mib for node in nodes for card in node.cards)


def _percent(used: int, total: int) -> int:
    return used * 100 // total if total else 0


def summary_lines(nodes: list[NodeState], address: str) -> list[str]:
    """NAME, IPADDRESS, GPUi(Allocated/Total)..., GPU Memory(MiB): one row per node."""
    uses = {node.name: card_uses(node) for node in nodes}
    width = max((len(cards) for cards in uses.values()), default=0)
    header = ["NAME", "IPADDRESS"]
    header += [f"GPU{i}(Allocated/Total)" for i in range(width)] + ["GPU Memory(MiB)"]
    rows = []
    for node in nodes:
        cards = uses[node.name]
        cells = [use.cell for use in cards] + ["0/0"] * (width - len(cards))
        used, total = _totals([node])
        rows.append([node.name, address, *cells, f"{used}/{total}"])
    lines = table(header, rows)
    if any(use.total is None for cards in uses.values() for use in cards):
        lines.append(MISSING_NOTE)
    return [*lines, "-" * max(len(line) for line in lines)]


def _state(allocation: PodAllocation) -> str:
    if not allocation.bound:
        return "reserved"
    return "assigned" if allocation.fully_assigned else "bound"


def _node_rows(node: NodeState, cards: list[CardUse]) -> list[list[str]]:
    rows = []
    for allocation in sorted(node.pods.values(), key=lambda a: a.reserved_seq):
        mib = memory_by_card(allocation.shares)
        cells = [str(mib.get(use.uuid, 0)) for use in cards]
        pod = allocation.pod
        rows.append([pod.name, pod.namespace, *cells, _state(allocation)])
    totals = {use.uuid: use.total or 0 for use in cards}
    for hold in node.foreign:
        cells = [str(totals[use.uuid]) if use.uuid == hold.card_uuid else "0" for use in cards]
        rows.append([", ".join(hold.pods) or "-", "-", *cells, f"held via {hold.resource}"])
    return rows


def detail_lines(nodes: list[NodeState], address: str) -> list[str]:
    """Per node: its name and address, each pod's MiB on each card, allocated and total."""
    lines: list[str] = []
    for node in nodes:
        cards = card_uses(node)
        header = ["NAME", "NAMESPACE", *[f"{use.label}(Allocated)" for use in cards], "STATE"]
        body = table(header, _node_rows(node, cards))
        used, total = _totals([node])
        lines += ["", f"NAME:       {node.name}", f"IPADDRESS:  {address}", "", *body]
        lines += [f"Allocated :  {used} ({_percent(used, total)}%)", f"Total :      {total}"]
        if any(use.total is None for use in cards):
            lines.append(MISSING_NOTE)
        lines.append("-" * max(len(line) for line in body))
    return [*lines, ""]


def cluster_lines(nodes: list[NodeState]) -> list[str]:
    used, total = _totals(nodes)
    return ["Allocated/Total GPU Memory In Cluster:", f"{used}/{total} ({_percent(used, total)}%)"]


def main(argv: list[str] | None = None) -> int:
    """The ``kubectl-gpushare`` executable: ``gpushare inspect`` named as kubectl shows it."""
    from gpushare.cli import inspect

    return inspect.main(sys.argv[1:] if argv is None else argv, prog=PROG)
