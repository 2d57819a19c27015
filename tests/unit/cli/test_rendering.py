"""What the operator commands share: reading times, writing times and tables."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest

from gpushare.cli.rendering import (
    format_time,
    parse_at,
    parse_time,
    table,
    table_row,
    time_flag,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

TIMES = [
    ("90s", NOW - timedelta(seconds=90)),
    ("10m", NOW - timedelta(minutes=10)),
    ("2h", NOW - timedelta(hours=2)),
    ("3d", NOW - timedelta(days=3)),
    ("1.5h", NOW - timedelta(minutes=90)),
    (" 5m ", NOW - timedelta(minutes=5)),
    ("2026-01-01T12:00:00Z", datetime(2026, 1, 1, 12, tzinfo=UTC)),
    ("2026-01-01T14:00:00+02:00", datetime(2026, 1, 1, 12, tzinfo=UTC)),
    ("2026-01-01T12:00:00.250Z", datetime(2026, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC)),
    ("2026-01-01T12:00:00", datetime(2026, 1, 1, 12, tzinfo=UTC)),
]


@pytest.mark.parametrize(("text", "expected"), TIMES, ids=[t[0] for t in TIMES])
def test_parse_time(text: str, expected: datetime) -> None:
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "10", "10w", "-5m", "2026-13-01T00:00:00Z"])
def test_parse_time_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match="neither an RFC 3339 time nor a duration"):
        parse_time(text, NOW)


def test_parse_at_reads_a_sequence_or_a_time() -> None:
    assert parse_at("42", NOW) == 42
    assert parse_at("10m", NOW) == NOW - timedelta(minutes=10)
    assert parse_at("2026-01-01T12:00:00Z", NOW) == datetime(2026, 1, 1, 12, tzinfo=UTC)


def test_time_flag_is_an_argparse_type() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--since", type=time_flag(parse_time))
    before = datetime.now(UTC)
    since = parser.parse_args(["--since", "1h"]).since
    assert before - timedelta(hours=1) <= since <= datetime.now(UTC) - timedelta(hours=1)
    with pytest.raises(SystemExit):
        parser.parse_args(["--since", "soon"])


def test_format_time_is_utc_to_the_second() -> None:
    local = datetime(2026, 1, 1, 14, 0, 5, 999_999, tzinfo=UTC).astimezone(
        datetime.now().astimezone().tzinfo
    )
    assert format_time(local) == "2026-01-01T14:00:05Z"


def test_table_aligns_on_the_widest_cell_and_never_pads_the_last_column() -> None:
    lines = table(("A", "BB", "C"), [("long", "x", "end"), ("s", "", "")])
    assert lines == ["A     BB  C", "long  x   end", "s"]


def test_table_row_lets_a_longer_cell_overflow() -> None:
    assert table_row(("toolong", "x"), [3, 1]) == "toolong  x"
