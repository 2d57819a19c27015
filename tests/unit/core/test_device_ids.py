"""Device IDs written as runs in the log, and read back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.device_ids import compact_ids, expand_ids


@pytest.mark.parametrize(
    ("ids", "written"),
    [
        ([], ()),
        (["a1b2-0"], ("a1b2-0",)),
        (["a1b2-2", "a1b2-0", "a1b2-1"], ("a1b2-0..2",)),
        (["a1b2-0", "a1b2-1", "a1b2-3"], ("a1b2-0..1", "a1b2-3")),
        (["x-9", "GPU-ab-cd-1", "GPU-ab-cd-2"], ("GPU-ab-cd-1..2", "x-9")),
        (["GPU-5f1c", "odd"], ("GPU-5f1c", "odd")),  # whole-card IDs, other shapes
        (["c-07", "c-7"], ("c-7", "c-07")),  # a leading zero is not a number of ours
    ],
)
def test_runs_per_card(ids: list[str], written: tuple[str, ...]) -> None:
    assert compact_ids(ids) == written
    assert sorted(expand_ids(written)) == sorted(set(ids))


def test_a_whole_80_gb_card_in_mib_is_one_entry() -> None:
    ids = [f"5f1c2d3e-{n}" for n in range(81559)]

    assert compact_ids(ids) == ("5f1c2d3e-0..81558",)


ID = st.one_of(
    st.builds(
        lambda card, n: f"{card}-{n}", st.sampled_from(["a", "b-c", "GPU-1"]), st.integers(0, 300)
    ),
    st.text(alphabet="abc-0123456789", max_size=8),  # no "..": never in a device ID of ours
)


@given(st.lists(ID, max_size=200))
def test_expanding_what_was_compacted_gives_the_same_set(ids: list[str]) -> None:
    assert set(expand_ids(compact_ids(ids))) == set(ids)
