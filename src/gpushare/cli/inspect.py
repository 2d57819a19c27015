"""``gpushare inspect [NODE] [--at TIME|SEQ] [-d]`` (also ``kubectl gpushare``): per-card use.

The table of kubectl-inspect-gpushare (seed 000), computed the way every service computes
it: fold the allocation log (``core.state.fold_events``) and each node's newest inventory.
``--at`` replays the log only up to a stream sequence or a time. The inventory stream keeps
only each node's newest report, so a past view shows today's cards; a card that a past
allocation names but today's inventory lacks is still shown, marked ``*``, total unknown.
The node's address is not in any gpushare event: IPADDRESS is each node's ``InternalIP``
read from the Kubernetes API when kubectl's flags name one (``--kubeconfig``,
``--context``...; ``kubectl gpushare`` always asks the API kubectl would use), else
``unknown``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any, NamedTuple, TextIO

from gpushare.allocator.inspection import inspect_node
from gpushare.bus.nats_types import JetStreamContext
from gpushare.bus.provenance import decode_from
from gpushare.bus.reading import read_records
from gpushare.bus.subjects import (
    ALL_ALLOCATIONS,
    ALL_INVENTORY,
    ALLOCATION_STREAM,
    INVENTORY_STREAM,
)
from gpushare.cli.kubectl_plugin import (
    UNKNOWN_ADDRESS,
    Addresses,
    add_kubectl_flags,
    addresses_for,
    card_uses,
    cluster_lines,
    detail_lines,
    shown_namespace,
    summary_lines,
)
from gpushare.cli.rendering import (
    decoded,
    emit,
    format_time,
    json_text,
    open_bus,
    parse_at,
    run_command,
    time_flag,
)
from gpushare.cli.target import add_target_flags, resolve_target
from gpushare.core.events import AnyEvent, InventoryReported
from gpushare.core.state import ClusterState, NodeState, fold_events

PROG = "gpushare inspect"
PAST_NOTE = (
    "the inventory stream keeps only each node's newest report: a past view shows today's "
    "cards (a card only the past allocations name is marked *)"
)


class AsOf(NamedTuple):
    """How far the log was replayed."""

    seq: int
    time: datetime | None
    undecodable: int


def parse_args(
    argv: list[str] | None, prog: str = PROG, *, plugin: bool = False
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Show GPU memory allocated per card, folded from the allocation log.",
        epilog=f"--at: {PAST_NOTE}.",
    )
    parser.add_argument("node", nargs="?", metavar="NODE", help="only this node")
    parser.add_argument(
        "--at",
        type=time_flag(parse_at),
        metavar="TIME|SEQ",
        help="replay the log only up to a stream sequence, or a time (RFC 3339 or a "
        "duration ago: 90s, 10m, 2h, 3d); cards are still today's",
    )
    parser.add_argument(
        "-d", "--details", action="store_true", help="each node's pods and their MiB per card"
    )
    add_target_flags(parser)
    add_kubectl_flags(parser, plugin=plugin)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, prog: str = PROG, *, plugin: bool = False) -> int:
    args = parse_args(argv, prog, plugin=plugin)
    return run_command(prog, lambda: asyncio.run(_run(args, prog)))


async def _run(args: argparse.Namespace, prog: str) -> int:
    async with open_bus(resolve_target(args), "gpushare-inspect") as js:
        addresses = await addresses_for(args, prog)
        return await inspect(js, args, sys.stdout, prog, addresses)


async def _allocations(
    js: JetStreamContext, at: int | datetime | None
) -> tuple[list[tuple[int, AnyEvent]], AsOf]:
    """The log's events up to ``at`` (a sequence, or the last stored at or before a time)."""
    events: list[tuple[int, AnyEvent]] = []
    seq, time, bad = 0, None, 0
    until = at if isinstance(at, int) else None
    records = read_records(js, ALLOCATION_STREAM, ALL_ALLOCATIONS, until_seq=until)
    async with aclosing(decoded(records, decode_from)) as stream:
        async for record, event in stream:
            if isinstance(at, datetime) and record.time > at:
                break
            seq, time = record.seq, record.time
            if isinstance(event, str | InventoryReported):
                bad += 1
            else:
                events.append((record.seq, event))
    return events, AsOf(seq, time, bad)


async def _inventories(js: JetStreamContext) -> list[tuple[int, AnyEvent]]:
    found: list[tuple[int, AnyEvent]] = []
    records = read_records(js, INVENTORY_STREAM, ALL_INVENTORY)
    async with aclosing(decoded(records, decode_from)) as stream:
        async for _, event in stream:
            if isinstance(event, InventoryReported):
                found.append((0, event))
    return found


async def load_state(js: JetStreamContext, at: int | datetime | None) -> tuple[ClusterState, AsOf]:
    """The fold of the log up to ``at``, with today's inventory of every node."""
    events, as_of = await _allocations(js, at)
    return fold_events([*events, *await _inventories(js)]), as_of


def _shown(state: ClusterState, node: str | None) -> list[NodeState] | None:
    if node is not None:
        found = state.nodes.get(node)
        return None if found is None else [found]
    nodes = (state.nodes[name] for name in sorted(state.nodes))
    return [node for node in nodes if node.cards or node.pods]


async def inspect(
    js: JetStreamContext,
    args: argparse.Namespace,
    out: TextIO,
    prog: str,
    addresses: Addresses = UNKNOWN_ADDRESS,
) -> int:
    state, as_of = await load_state(js, args.at)
    nodes = _shown(state, args.node)
    if nodes is None:
        print(f"{prog}: node {args.node} is unknown to gpushare", file=sys.stderr)
        return 1
    if args.json:
        document = inspect_json(nodes, as_of, past=args.at is not None, addresses=addresses)
        emit(out, json_text(document))
        return 0
    if args.at is not None:
        when = format_time(as_of.time) if as_of.time else "the start"
        emit(out, f"# allocation log up to seq {as_of.seq} ({when}); {PAST_NOTE}")
    if args.details:
        lines = detail_lines(nodes, addresses, shown_namespace(args))
    else:
        lines = summary_lines(nodes, addresses)
    for line in [*lines, *cluster_lines(nodes)]:
        emit(out, line)
    if as_of.undecodable:
        print(f"{prog}: {as_of.undecodable} undecodable log record(s) skipped", file=sys.stderr)
    return 0


def inspect_json(
    nodes: list[NodeState], as_of: AsOf, *, past: bool, addresses: Addresses = UNKNOWN_ADDRESS
) -> dict[str, Any]:
    """``GET /inspect``'s shape per node, plus cards only the log names, and what it is as of."""
    entries = []
    for node in nodes:
        entry = inspect_node(node, datetime.now(UTC))
        if not isinstance(addresses, str):
            entry["address"] = addresses.get(node.name)
        for card in entry["devs"]:
            card["in_inventory"] = True
        entry["devs"] += [use.json() for use in card_uses(node) if use.total is None]
        entries.append(entry)
    return {
        "as_of": {
            "seq": as_of.seq,
            "time": as_of.time,
            "past": past,
            "undecodable": as_of.undecodable,
            "cards": "each node's newest inventory",
        },
        "total_mib": sum(entry["total_mib"] for entry in entries),
        "used_mib": sum(entry["used_mib"] for entry in entries),
        "nodes": entries,
    }
