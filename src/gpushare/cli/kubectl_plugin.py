"""``kubectl gpushare [NODE] [-d]``: kubectl-inspect-gpushare's tables, over the allocation log.

kubectl runs any ``kubectl-gpushare`` on the PATH as ``kubectl gpushare``; the wheel installs
one (``pyproject.toml``), and it is ``gpushare inspect`` under another name that also takes
kubectl's flags (``--kubeconfig``, ``--context``, ``--cluster``, ``--user``, ``--server``,
``-n``/``--namespace``, ``-A``/``--all-namespaces``): the allocations come from NATS, each
node's IPADDRESS (its ``InternalIP``) from the Kubernetes API those flags name
(:mod:`gpushare.kube.kubectl`). ``-n`` keeps only that namespace's pods in ``-d``'s rows
(the cards' totals stay the node's: memory is shared across namespaces); by default, and
with ``-A``, every namespace's pods are shown, as Aliyun's plugin shows them. The tables are
laid out here, as seed 000's plugin lays them out (its ``cmd/inspect/display.go``): per node
each card's ``allocated/total`` MiB and the node's sum, or with ``-d`` each pod's MiB per card,
then the cluster's total. A card that only the log names (gone from today's inventory) is
marked ``*`` and its total shown as ``?``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

from gpushare.cli.rendering import table
from gpushare.core.state import NodeState, PodAllocation, memory_by_card
from gpushare.kube.kubectl import (
    KubeconfigError,
    KubectlFlags,
    connect_like_kubectl,
    node_addresses,
)

PROG = "kubectl gpushare"
UNKNOWN_ADDRESS = "unknown"
KUBE_FLAGS = ("kubeconfig", "context", "cluster", "user", "server")
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
        """Shaped like ``inspect_node``'s devs, for a card that only the log names."""
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


Addresses = str | Mapping[str, str]
"""One address for every node, or each node's by name (a node left out: ``unknown``)."""


def address_of(addresses: Addresses, node: str) -> str:
    if isinstance(addresses, str):
        return addresses
    return addresses.get(node) or UNKNOWN_ADDRESS


def summary_lines(nodes: list[NodeState], address: Addresses) -> list[str]:
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
        rows.append([node.name, address_of(address, node.name), *cells, f"{used}/{total}"])
    lines = table(header, rows)
    if any(use.total is None for cards in uses.values() for use in cards):
        lines.append(MISSING_NOTE)
    return [*lines, "-" * max(len(line) for line in lines)]


def _state(allocation: PodAllocation) -> str:
    if not allocation.bound:
        return "reserved"
    return "assigned" if allocation.fully_assigned else "bound"


def _node_rows(
    node: NodeState, cards: list[CardUse], namespace: str | None = None
) -> list[list[str]]:
    rows = []
    for allocation in sorted(node.pods.values(), key=lambda a: a.reserved_seq):
        if namespace is not None and allocation.pod.namespace != namespace:
            continue
        mib = memory_by_card(allocation.shares)
        cells = [str(mib.get(use.uuid, 0)) for use in cards]
        pod = allocation.pod
        rows.append([pod.name, pod.namespace, *cells, _state(allocation)])
    for held in sorted(node.claims.values(), key=lambda claim: claim.allocated_seq):
        if namespace is not None and held.claim.namespace != namespace:
            continue
        claimed = {use.uuid: 0 for use in cards}
        for share in held.shares:
            claimed[share.card_uuid] = claimed.get(share.card_uuid, 0) + share.memory_mib
        names = ", ".join(pod.name for pod in held.pods) or "-"
        cells = [str(claimed[use.uuid]) for use in cards]
        rows.append([names, held.claim.namespace, *cells, f"dra claim {held.claim.name}"])
    totals = {use.uuid: use.total or 0 for use in cards}
    for hold in node.foreign:
        cells = [str(totals[use.uuid]) if use.uuid == hold.card_uuid else "0" for use in cards]
        rows.append([", ".join(hold.pods) or "-", "-", *cells, f"held via {hold.resource}"])
    return rows


def detail_lines(
    nodes: list[NodeState], address: Addresses, namespace: str | None = None
) -> list[str]:
    """Per node: its name and address, each pod's MiB on each card (only ``namespace``'s
    pods when given), allocated and total."""
    lines: list[str] = []
    for node in nodes:
        cards = card_uses(node)
        header = ["NAME", "NAMESPACE", *[f"{use.label}(Allocated)" for use in cards], "STATE"]
        body = table(header, _node_rows(node, cards, namespace))
        used, total = _totals([node])
        shown = address_of(address, node.name)
        lines += ["", f"NAME:       {node.name}", f"IPADDRESS:  {shown}", "", *body]
        lines += [f"Allocated :  {used} ({_percent(used, total)}%)", f"Total :      {total}"]
        if any(use.total is None for use in cards):
            lines.append(MISSING_NOTE)
        lines.append("-" * max(len(line) for line in body))
    return [*lines, ""]


def cluster_lines(nodes: list[NodeState]) -> list[str]:
    used, total = _totals(nodes)
    return ["Allocated/Total GPU Memory In Cluster:", f"{used}/{total} ({_percent(used, total)}%)"]


def add_kubectl_flags(parser: argparse.ArgumentParser, *, plugin: bool) -> None:
    """kubectl's global flags that mean something here. ``plugin``: run as
    ``kubectl gpushare``, which always reads addresses from the API kubectl would use;
    ``gpushare inspect`` reads them only when one of the connection flags is given."""
    group = parser.add_argument_group(
        "Kubernetes (as kubectl reads them; for IPADDRESS and -n)",
    )
    group.add_argument("--kubeconfig", default="", metavar="FILE", help="default: KUBECONFIG")
    group.add_argument("--context", default="", help="the kubeconfig context to use")
    group.add_argument("--cluster", default="", help="the kubeconfig cluster to use")
    group.add_argument("--user", default="", help="the kubeconfig user to use")
    group.add_argument("-s", "--server", default="", help="the API server's address")
    group.add_argument("-n", "--namespace", default="", help="with -d: only this namespace's pods")
    group.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="with -d: every namespace's pods (the default)",
    )
    parser.set_defaults(kubectl_plugin=plugin)


def shown_namespace(args: argparse.Namespace) -> str | None:
    """The namespace ``-d`` keeps (None: all of them)."""
    namespace: str = getattr(args, "namespace", "") or ""
    return None if getattr(args, "all_namespaces", False) or not namespace else namespace


def wants_addresses(args: argparse.Namespace) -> bool:
    plugin = bool(getattr(args, "kubectl_plugin", False))
    return plugin or any(getattr(args, name, "") for name in KUBE_FLAGS)


async def addresses_for(args: argparse.Namespace, prog: str) -> Addresses:
    """Each node's ``InternalIP`` from the API ``args`` name, or ``unknown`` for all, with
    one line on stderr saying why (the allocations, from NATS, are still shown)."""
    if not wants_addresses(args):
        return UNKNOWN_ADDRESS
    flags = KubectlFlags(
        kubeconfig=args.kubeconfig,
        context=args.context,
        cluster=args.cluster,
        user=args.user,
        server=args.server,
        namespace=args.namespace,
    )
    try:
        kube, _ = connect_like_kubectl(flags, timeout_s=args.connect_timeout)
    except KubeconfigError as error:
        print(f"{prog}: IPADDRESS unknown: {error}", file=sys.stderr)
        return UNKNOWN_ADDRESS
    try:
        return await node_addresses(kube)
    except Exception as error:  # KubeError, or urllib3's own when nothing answers
        why = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(
            f"{prog}: IPADDRESS unknown: cannot list nodes at {kube.host}: {why}", file=sys.stderr
        )
        return UNKNOWN_ADDRESS
    finally:
        kube.close()


def main(argv: list[str] | None = None) -> int:
    """The ``kubectl-gpushare`` executable: ``gpushare inspect`` named as kubectl shows it,
    with kubectl's flags."""
    from gpushare.cli import inspect

    return inspect.main(sys.argv[1:] if argv is None else argv, prog=PROG, plugin=True)
