"""``gpushare explain NS/NAME``: the whole story of one pod, and where it stands now.

It reads every allocation-log event about the pod and its extender decision records
(why each node was filtered out, the scores that chose its node), and lets
:func:`gpushare.core.history.tell_story` put them together per pod UID: a name reused
by a new pod is a new story. Only records whose bytes name the pod are decoded (a scan
of the log decodes little); an undecodable one among them is shown with its error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from contextlib import aclosing
from datetime import datetime
from typing import Any, TextIO, TypeVar

from gpushare.bus.nats_types import JetStreamContext
from gpushare.bus.provenance import decode_from
from gpushare.bus.reading import read_records
from gpushare.bus.subjects import (
    ALL_ALLOCATIONS,
    ALLOCATION_STREAM,
    DECISION_STREAM,
    decision_subject,
)
from gpushare.cli.rendering import (
    decoded,
    emit,
    format_time,
    json_text,
    open_bus,
    run_command,
    undecodable_json,
)
from gpushare.cli.target import add_target_flags, resolve_target
from gpushare.core.events import (
    AnyDecision,
    InventoryReported,
    NodesFiltered,
    decode_decision,
)
from gpushare.core.history import (
    LoggedDecision,
    LoggedEvent,
    PodLife,
    PodStory,
    describe_shares,
    pods_named,
    summarize,
    tell_story,
)

PROG = "gpushare explain"
T = TypeVar("T")


def _pod_key(text: str) -> tuple[str, str]:
    parts = text.split("/")
    if len(parts) > 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAMESPACE/NAME")
    return (parts[0], parts[1]) if len(parts) == 2 else ("default", parts[0])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tell one pod's story: the extender's decisions about it, its "
        "reservations and their cards, and where it stands now.",
    )
    parser.add_argument("pod", type=_pod_key, metavar="NS/NAME", help="the pod (NAME: default/)")
    add_target_flags(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_command(PROG, lambda: asyncio.run(_run(args)))


async def _run(args: argparse.Namespace) -> int:
    async with open_bus(resolve_target(args), "gpushare-explain") as js:
        return await explain(js, args, sys.stdout)


def decision_from(subject: str, data: bytes) -> AnyDecision:
    """A decision record (only allocators may publish them: the subject adds nothing)."""
    return decode_decision(data)


async def _scan(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    name: str,
    decode: Callable[[str, bytes], T],
    bad: list[dict[str, Any]],
) -> list[tuple[int, datetime, T]]:
    """The decoded records of ``subject`` that mention ``name``; undecodable ones to ``bad``."""
    mention = f'"{name}"'.encode()
    found: list[tuple[int, datetime, T]] = []
    records = (r async for r in read_records(js, stream, subject) if mention in r.data)
    async with aclosing(decoded(records, decode)) as stream_:
        async for record, value in stream_:
            if isinstance(value, str):
                bad.append(undecodable_json(record, value))
            else:
                found.append((record.seq, record.time, value))
    return found


async def gather(
    js: JetStreamContext, namespace: str, name: str
) -> tuple[PodStory, list[dict[str, Any]]]:
    """The pod's story, and the records about it that could not be read."""
    bad: list[dict[str, Any]] = []
    key = f"{namespace}/{name}"
    events = [
        LoggedEvent(seq=seq, time=time, event=event)
        for seq, time, event in await _scan(
            js, ALLOCATION_STREAM, ALL_ALLOCATIONS, name=name, decode=decode_from, bad=bad
        )
        if not isinstance(event, InventoryReported) and key in pods_named(event)
    ]
    subject = decision_subject(namespace, name)
    decisions = [
        LoggedDecision(seq=seq, time=time, decision=decision)
        for seq, time, decision in await _scan(
            js, DECISION_STREAM, subject, name=name, decode=decision_from, bad=bad
        )
    ]
    return tell_story(namespace, name, events, decisions), bad


async def explain(js: JetStreamContext, args: argparse.Namespace, out: TextIO) -> int:
    namespace, name = args.pod
    story, bad = await gather(js, namespace, name)
    if args.json:
        document = {"namespace": namespace, "name": name, "lives": story.lives}
        emit(out, json_text(document | {"undecodable": bad}))
    else:
        for line in story_lines(story, bad):
            emit(out, line)
    return 0 if story.lives else 1


def story_lines(story: PodStory, bad: list[dict[str, Any]]) -> list[str]:
    key = f"{story.namespace}/{story.name}"
    if not story.lives:
        lines = [f"{key}: no allocation event and no extender decision recorded about it"]
    else:
        lines = []
        for life in story.lives:
            lines += [*([""] if lines else []), *_life_lines(key, life)]
    for record in bad:
        where = f"{record['subject']} (seq {record['seq']})"
        lines.append(f"undecodable record on {where}: {record['error']}")
    return lines


def _life_lines(key: str, life: PodLife) -> list[str]:
    lines = [f"{key} (uid {life.uid})", f"  now: {life.status}: {life.why}"]
    for reservation in life.reservations:
        by = f", by {reservation.reserved_by}" if reservation.reserved_by else ""
        lines.append(
            f"  reservation {reservation.id} on {reservation.node} (log seq {reservation.seq}, "
            f"policy {reservation.policy}{by}): {reservation.state}"
        )
        for share in reservation.shares:
            cards = describe_shares([share])
            role = {"init": "init container", "sidecar": "sidecar"}.get(share.role, "container")
            lines.append(f"    {role} {share.container}: {cards} ({share.card_uuid})")
    lines.append("  history:")
    moments = [(d.time, 0, d.seq, _decision_lines(d.decision)) for d in life.decisions]
    moments += [(e.time, 1, e.seq, [_event_line(e)]) for e in life.events]
    for time, _, _, said in sorted(moments, key=lambda moment: moment[:3]):
        lines.append(f"    {format_time(time)}  {said[0]}")
        lines += [f"{'':26}{more}" for more in said[1:]]
    return lines


def _event_line(logged: LoggedEvent) -> str:
    kind, _, _, detail = summarize(logged.event)
    said = f"log seq {logged.seq}: {kind} on {logged.event.node}"
    return f"{said}: {detail}" if detail else said


def _decision_lines(decision: AnyDecision) -> list[str]:
    by = f" by {decision.allocator}" if decision.allocator else ""
    more = f" (+{decision.omitted} not recorded)" if decision.omitted else ""
    if isinstance(decision, NodesFiltered):
        passed = ", ".join(decision.passed) or "no node"
        head = f"filter{by}: request {decision.request}; passed {passed}{more}"
        if decision.chosen is not None:
            head += f"; answered {decision.chosen} alone, where the policy places it best"
        return [head, *(f"{node} filtered out: {why}" for node, why in decision.failed.items())]
    ranked = sorted(decision.scores.items(), key=lambda item: -item[1])
    scores = ", ".join(f"{node}={score}" for node, score in ranked)
    return [f"{decision.verb}{by}, policy {decision.policy}: {scores}{more}"]
