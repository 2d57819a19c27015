"""Quantities beyond any Kubernetes quantity are refused, cheaply and with a short reason."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.quantity import MAX_DIGITS, parse_count, parse_quantity


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("99999999999999999999", Fraction(10**20 - 1), id="20-digits"),
        pytest.param(str(2**63), Fraction(2**63), id="past-int64"),
        pytest.param("9" * MAX_DIGITS, Fraction(10**MAX_DIGITS - 1), id="64-digits"),
        pytest.param("1e30", Fraction(10**30), id="largest-exponent"),
        pytest.param("1e-30", Fraction(1, 10**30), id="smallest-exponent"),
        pytest.param("1Ei", Fraction(2**60), id="exbi"),
        pytest.param(2**200, Fraction(2**200), id="a-json-int-of-61-digits"),
        pytest.param(1e63, Fraction(10**63), id="a-json-float"),
        pytest.param(-0.0, Fraction(0), id="negative-zero"),
    ],
)
def test_large_quantities_are_read_exactly(value: str | int | float, expected: Fraction) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        pytest.param("9" * 65 + "0", "more than 64 digits", id="66-digits"),
        pytest.param("9" * 5000, "more than 64 digits", id="5000-digits"),
        pytest.param("9" * 64 + "e30", "not below 1e64", id="64-digits-e30"),
        pytest.param("9" * 60 + "Ei", "not below 1e64", id="60-digits-exbi"),
        pytest.param("1e31", "exponent beyond 30", id="1e31"),
        pytest.param("1e400", "exponent beyond 30", id="1e400"),
        pytest.param("1e-400", "exponent beyond 30", id="1e-400"),
        pytest.param("1e" + "9" * 5000, "exponent beyond 30", id="exponent-of-5000-digits"),
        pytest.param(10**64, "not below 1e64", id="json-int"),
        pytest.param(-(10**5000), "about 5001 digits", id="json-int-of-5000-digits"),
        pytest.param(1e300, "not below 1e64", id="json-float"),
        pytest.param(5e-324, "finer than 1e-64", id="json-float-tiny"),
        pytest.param("0." + "0" * 63 + "1", "more than 64 digits", id="many-decimals"),
    ],
)
def test_quantities_beyond_64_digits_are_refused(value: str | int | float, reason: str) -> None:
    with pytest.raises(ValueError, match="not a quantity") as caught:
        parse_quantity(value)
    assert reason in str(caught.value)
    assert len(str(caught.value)) < 120


def test_a_count_is_refused_with_a_short_message() -> None:
    with pytest.raises(ValueError, match="whole numbers") as caught:
        parse_count("1" * 60 + ".5")
    assert len(str(caught.value)) < 120


@settings(max_examples=300, deadline=None)
@given(
    value=st.one_of(
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.from_regex(r"\A[+-]?\d{0,200}(\.\d{0,80})?([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d{1,6})?\Z"),
        st.text(max_size=30),
    )
)
def test_any_value_is_a_bounded_quantity_or_a_value_error(value: str | int | float) -> None:
    try:
        number = parse_quantity(value)
    except ValueError as error:
        refused: ValueError | None = error
    else:
        refused = None
    if refused is not None:
        assert len(str(refused)) < 200
        return
    assert abs(number) < 10**MAX_DIGITS
    assert number.denominator <= 10**MAX_DIGITS
