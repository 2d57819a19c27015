"""Every test has exactly one tier marker, so ``-m unit`` or ``-m "not e2e"`` selects truly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TESTS, TIER_OF_DIRECTORY, TIERS


def test_every_collected_test_has_exactly_one_tier(request: pytest.FixtureRequest) -> None:
    wrong = {
        item.nodeid: tiers
        for item in request.session.items
        if len(tiers := sorted({mark.name for mark in item.iter_markers()} & set(TIERS))) != 1
    }
    assert not wrong


def test_every_test_directory_has_a_tier() -> None:
    directories = {path.relative_to(TESTS).parts[0] for path in TESTS.glob("*/**/test_*.py")}
    assert directories <= set(TIER_OF_DIRECTORY), directories - set(TIER_OF_DIRECTORY)
    assert set(TIER_OF_DIRECTORY.values()) == set(TIERS)


def test_this_test_is_a_unit_test(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None
    assert Path(request.node.path).is_relative_to(TESTS / "unit")
