"""``gpushare audit``: the allocation log as a table (or JSON lines), optionally followed.

A node's events are picked at the server (its subject); a pod's and a start time's by
:class:`gpushare.core.history.Selection`. A message that does not decode is shown as an
``undecodable`` row with the error, never skipped in silence and never fatal. With
``--follow`` the command prints what is logged from then on until Ctrl-C (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, TextIO

from gpushare.bus.nats_types import JetStreamContext
from gpushare.bus.provenance import decode_from
from gpushare.bus.reading import Record, read_records
from gpushare.bus.subjects import (
    ALL_ALLOCATIONS,
    ALLOCATION_STREAM,
    node_allocations,
    node_of_allocation,
)
from gpushare.cli.rendering import (
    column_widths,
    decoded,
    emit,
    format_time,
    json_text,
    open_bus,
    parse_time,
    run_command,
    table_row,
    time_flag,
    undecodable_json,
)
from gpushare.cli.target import add_target_flags, resolve_target
from gpushare.core.events import AnyEvent, InventoryReported
from gpushare.core.history import LoggedEvent, Selection, summarize

PROG = "gpushare audit"
HEADER = ("SEQ", "TIME", "NODE", "EVENT", "POD", "RESERVATION", "DETAIL")
UNDECODABLE = "undecodable"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Show the allocation log (stream GPUSHARE_ALLOCATIONS)."
    )
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    parser.add_argument("--node", help="only this node's events")
    parser.add_argument("--pod", metavar="NS/NAME", help="only events about this pod")
    parser.add_argument(
        "--since",
        type=time_flag(parse_time),
        metavar="T",
        help="stored at or after T: RFC 3339, or a duration ago (90s, 10m, 2h, 3d)",
    )
    add_target_flags(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_command(PROG, lambda: asyncio.run(_run(args)))


async def _run(args: argparse.Namespace) -> int:
    async with open_bus(resolve_target(args), "gpushare-audit") as js:
        await audit(js, args, sys.stdout)
    return 0


def _row(record: Record, event: AnyEvent | str) -> tuple[str, ...]:
    time = format_time(record.time)
    if isinstance(event, str):
        node = node_of_allocation(record.subject)
        return (str(record.seq), time, node, UNDECODABLE, "", "", event)
    if isinstance(event, InventoryReported):  # never written here: shown, not trusted
        return (str(record.seq), time, event.node, UNDECODABLE, "", "", "an inventory report")
    kind, pod, reservation, detail = summarize(event)
    return (str(record.seq), time, event.node, kind, pod, reservation, detail)


def _json(record: Record, event: AnyEvent | str) -> dict[str, Any]:
    if isinstance(event, str):
        return undecodable_json(record, event)
    return {"seq": record.seq, "time": record.time, "subject": record.subject, "event": event}


async def _matching(
    js: JetStreamContext, args: argparse.Namespace, **reading: Any
) -> AsyncGenerator[tuple[Record, AnyEvent | str], None]:
    """The records asked for (an undecodable one always: nobody can tell whose it is)."""
    selection = Selection(node=args.node, pod=args.pod, since=args.since)
    subject = node_allocations(args.node) if args.node else ALL_ALLOCATIONS
    records = read_records(js, ALLOCATION_STREAM, subject, **reading)
    async with aclosing(decoded(records, decode_from)) as stream:
        async for record, event in stream:
            if isinstance(event, str | InventoryReported) or selection.admits(
                LoggedEvent(seq=record.seq, time=record.time, event=event)
            ):
                yield record, event


async def audit(js: JetStreamContext, args: argparse.Namespace, out: TextIO) -> None:
    """Print what was logged (aligned), then with ``--follow`` each new event as it comes."""
    end = int((await js.stream_info(ALLOCATION_STREAM)).state.last_seq)
    rows: list[tuple[str, ...]] = []
    async with aclosing(_matching(js, args, start_time=args.since, until_seq=end)) as backlog:
        async for record, event in backlog:
            if args.json:
                emit(out, json_text(_json(record, event)))
            else:
                rows.append(_row(record, event))
    widths = column_widths(HEADER, rows)
    if not args.json:
        for row in (HEADER, *rows):
            emit(out, table_row(row, widths))
    if args.follow:
        await _follow(js, args, out, end + 1, widths)


async def _follow(
    js: JetStreamContext, args: argparse.Namespace, out: TextIO, start: int, widths: list[int]
) -> None:
    async with aclosing(_matching(js, args, start_seq=start, follow=True)) as new:
        async for record, event in new:
            line = json_text(_json(record, event)) if args.json else None
            emit(out, line or table_row(_row(record, event), widths))
