"""What the operator commands (``audit``, ``inspect``, ``explain``) share.

Times in (``--since``, ``--at``: RFC 3339 or a duration ago) and out, aligned text tables,
JSON lines, reaching NATS without hanging when it is not there, and reading a stream's
records decoded, an undecodable one handed on with its error instead of raising.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO, TypeVar

import msgspec

from gpushare.bus.connection import NatsUnreachable, close_client, open_client
from gpushare.bus.credentials import NatsCredentials
from gpushare.bus.nats_types import JetStreamContext, NotFoundError
from gpushare.bus.reading import Record
from gpushare.cli.target import NoStack, Target

T = TypeVar("T")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, now: datetime) -> datetime:
    """RFC 3339 (``2026-01-01T12:00:00Z``; no offset means UTC) or a duration before ``now``
    (``90s``, ``10m``, ``2h``, ``3d``); raises ``ValueError`` for anything else."""
    match = _DURATION.match(text.strip())
    if match:
        return now - timedelta(seconds=float(match[1]) * _UNITS[match[2]])
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an RFC 3339 time nor a duration like 90s, 10m, 2h or 3d"
        ) from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def parse_at(text: str, now: datetime) -> int | datetime:
    """A stream sequence (an integer) or a time, as :func:`parse_time` reads it."""
    if text.strip().isdigit():
        return int(text)
    return parse_time(text, now)


def time_flag(parse: Callable[[str, datetime], T]) -> Callable[[str], T]:
    """An argparse ``type=`` that reads times relative to the moment of parsing."""

    def read(text: str) -> T:
        try:
            return parse(text, datetime.now(UTC))
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return read


def format_time(when: datetime) -> str:
    """UTC to the second, as the tables show it."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def column_widths(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]


def table(header: Sequence[str], rows: Sequence[Sequence[str]], gap: int = 2) -> list[str]:
    """Columns aligned on the widest cell (the last column is never padded)."""
    widths = column_widths(header, rows)
    return [table_row(row, widths, gap) for row in (header, *rows)]


def table_row(row: Sequence[str], widths: Sequence[int], gap: int = 2) -> str:
    cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
    return (" " * gap).join([*cells, row[-1]]).rstrip()


def json_text(value: Any) -> str:
    """One line of JSON (msgspec: Structs, datetimes as RFC 3339)."""
    return msgspec.json.encode(value).decode()


def emit(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


@contextlib.asynccontextmanager
async def open_bus(target: Target | str, name: str) -> AsyncIterator[JetStreamContext]:
    """JetStream on ``target`` (a URL: credentials from the environment); raises
    ``ConnectionError`` with why, within the target's connect timeout, if NATS does not
    answer (for a stack's data directory: that no stack runs there)."""
    if isinstance(target, str):
        target = Target(target, NatsCredentials.from_env())
    try:
        nc = await open_client(target.url, name, target.credentials, target.options)
    except NatsUnreachable as error:
        if target.stack_dir is None:
            raise
        raise NoStack(
            f"no gpushare stack is running in {target.stack_dir}: {error} "
            "(its stack.json is left from a stack that stopped?)"
        ) from None
    try:
        yield nc.jetstream()
    finally:
        await close_client(nc)


async def decoded(
    records: AsyncIterable[Record], decode: Callable[[str, bytes], T]
) -> AsyncGenerator[tuple[Record, T | str], None]:
    """Each record with its value decoded from its subject and bytes, or the reason it
    could not be (undecodable, or refused for where it came from)."""
    async for record in records:
        try:
            yield record, decode(record.subject, record.data)
        except msgspec.MsgspecError as error:
            yield record, str(error) or type(error).__name__


def undecodable_json(record: Record, error: str) -> dict[str, Any]:
    return {"seq": record.seq, "time": record.time, "subject": record.subject, "error": error}


def run_command(prog: str, work: Callable[[], int]) -> int:
    """Run a command: Ctrl-C ends it cleanly (0), and so does a closed pipe (``| head``);
    NATS not answering, or answering without gpushare's streams, is 1 with one line."""
    try:
        return work()
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        # Python's advice: point stdout at /dev/null so that exiting does not flush into
        # the closed pipe and complain again.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ConnectionError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 1
    except NotFoundError as error:
        print(
            f"{prog}: not a gpushare NATS: {error.description or 'stream not found'}",
            file=sys.stderr,
        )
        return 1
