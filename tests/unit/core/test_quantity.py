"""Kubernetes quantities: exact values, and what is not a count."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpushare.core.quantity import parse_count, parse_quantity


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("1024", Fraction(1024), id="plain-string"),
        pytest.param(1024, Fraction(1024), id="json-int"),
        pytest.param(2.5, Fraction(5, 2), id="json-float"),
        pytest.param("1Ki", Fraction(1024), id="binary-Ki"),
        pytest.param("1.5Gi", Fraction(3 * 2**29), id="binary-fraction-Gi"),
        pytest.param("1e3", Fraction(1000), id="exponent"),
        pytest.param("1E3", Fraction(1000), id="exponent-upper"),
        pytest.param("5e-1", Fraction(1, 2), id="negative-exponent"),
        pytest.param("2k", Fraction(2000), id="decimal-k"),
        pytest.param("500m", Fraction(1, 2), id="milli"),
        pytest.param(".5", Fraction(1, 2), id="leading-dot"),
        pytest.param("+7", Fraction(7), id="plus-sign"),
        pytest.param("-1", Fraction(-1), id="negative"),
        pytest.param(" 16276 ", Fraction(16276), id="surrounding-space"),
    ],
)
def test_parse_quantity(value: str | int | float, expected: Fraction) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("abc", id="letters"),
        pytest.param("", id="empty"),
        pytest.param(True, id="bool"),
        pytest.param("1KiB", id="unit-with-B"),
        pytest.param("1.2.3", id="two-dots"),
        pytest.param("Gi", id="suffix-only"),
    ],
)
def test_parse_quantity_rejects(value: str | int | float) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("1024", 1024, id="plain-string"),
        pytest.param(1024, 1024, id="json-int"),
        pytest.param("1Ki", 1024, id="binary-Ki"),
        pytest.param("1.5Gi", 1610612736, id="binary-fraction-Gi"),
        pytest.param("1e3", 1000, id="exponent"),
        pytest.param("0", 0, id="zero"),
        pytest.param(8138.0, 8138, id="whole-float"),
    ],
)
def test_parse_count(value: str | int | float, expected: int) -> None:
    count = parse_count(value)
    assert count == expected
    assert type(count) is int


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("500m", "whole numbers", id="milli-is-not-a-count"),
        pytest.param(0.5, "whole numbers", id="half-float"),
        pytest.param("15e-1", "whole numbers", id="negative-exponent-fraction"),
        pytest.param("-1", "negative", id="negative"),
        pytest.param("abc", "not a quantity", id="letters"),
        pytest.param("", "not a quantity", id="empty"),
        pytest.param(True, "not a quantity", id="bool"),
    ],
)
def test_parse_count_rejects(value: str | int | float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_count(value)


@pytest.mark.parametrize("text", ["1e999999999", "1e-999999999", "5e31"])
def test_huge_exponents_are_refused_not_computed(text: str) -> None:
    with pytest.raises(ValueError, match="exponent"):
        parse_quantity(text)
