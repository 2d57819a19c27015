"""``--max-body-bytes`` / ``GPUSHARE_MAX_BODY_BYTES``: the allocator's largest request body."""

from __future__ import annotations

import pytest

from gpushare.allocator.__main__ import parse_settings
from gpushare.allocator.settings import DEFAULT_MAX_BODY_BYTES, AllocatorSettings


def test_the_default_is_16_mib() -> None:
    assert DEFAULT_MAX_BODY_BYTES == 16 * 1024 * 1024
    assert parse_settings([], {}).max_body_bytes == DEFAULT_MAX_BODY_BYTES
    assert AllocatorSettings().max_body_bytes == DEFAULT_MAX_BODY_BYTES


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["--max-body-bytes", "33554432"], {}, 32 * 2**20),
        (["--max-body-bytes", "32Mi"], {}, 32 * 2**20),
        (["--max-body-bytes", "64Ki"], {}, 64 * 2**10),
        ([], {"GPUSHARE_MAX_BODY_BYTES": "1Gi"}, 2**30),
        (["--max-body-bytes", "8Mi"], {"GPUSHARE_MAX_BODY_BYTES": "1Gi"}, 8 * 2**20),
    ],
    ids=["bytes", "quantity", "smallest", "environment", "flag-over-environment"],
)
def test_the_limit_is_read_from_flags_then_environment(
    argv: list[str], environ: dict[str, str], expected: int
) -> None:
    assert parse_settings(argv, environ).max_body_bytes == expected


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--max-body-bytes", "1Ki"], {}),
        (["--max-body-bytes", "0"], {}),
        (["--max-body-bytes", "-1"], {}),
        (["--max-body-bytes", "1.5"], {}),
        (["--max-body-bytes", "lots"], {}),
        ([], {"GPUSHARE_MAX_BODY_BYTES": "16MB"}),
    ],
)
def test_a_bad_limit_exits_with_usage(argv: list[str], environ: dict[str, str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse_settings(argv, environ)
    assert stopped.value.code == 2
