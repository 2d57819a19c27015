"""Kubernetes resource quantities (``resource.Quantity``) to exact numbers."""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
MAX_EXPONENT = 30
"""Kubernetes quantities stop at exa (1e18); a larger exponent is an error, not a hang."""
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))$"
)


def parse_quantity(value: str | int | float) -> Fraction:
    """Parse ``"1024"``, ``"1Ki"``, ``"1.5G"``, ``"1e3"`` or a JSON number exactly.

    Raises :class:`ValueError` with the offending text when it is not a quantity.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    text = value.strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number = Fraction(match["number"])
    if match["binary"]:
        number *= _BINARY[match["binary"]]
    elif match["exp"]:
        exponent = int(match["exp"][1:])
        if abs(exponent) > MAX_EXPONENT:
            raise ValueError(f"not a quantity: {value!r} (exponent beyond {MAX_EXPONENT})")
        number *= Fraction(10) ** exponent
    else:
        number *= _DECIMAL[match["decimal"] or ""]
    return -number if match["sign"] == "-" else number


def parse_count(value: str | int | float) -> int:
    """A quantity that must be a non-negative whole number (extended resources are counts)."""
    number = parse_quantity(value)
    if number.denominator != 1:
        raise ValueError(f"extended resources must be whole numbers, got {value!r}")
    if number < 0:
        raise ValueError(f"resource quantities cannot be negative, got {value!r}")
    return int(number)
