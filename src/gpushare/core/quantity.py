"""Kubernetes resource quantities (``resource.Quantity``) to exact numbers."""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

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
MAX_DIGITS = 64
"""Most digits a quantity's number may have; it stays below 1e64 and no finer than 1e-64.

Kubernetes caps a quantity at 2^63 - 1 (19 digits), so nothing longer is a quantity it
stores; the bound also keeps every number far from Python's 4300-digit limit on int and
string conversions (a ``ValueError`` of its own, and slow well before that)."""
MAX_MAGNITUDE = 10**MAX_DIGITS
_SHOWN = 40
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))$"
)


@lru_cache(maxsize=4096, typed=True)
def parse_quantity(value: str | int | float) -> Fraction:
    """Parse ``"1024"``, ``"1Ki"``, ``"1.5G"``, ``"1e3"`` or a JSON number exactly.

    Raises :class:`ValueError` with the offending text (cut short) when it is not a
    quantity, or not below ``1e64`` in magnitude, or finer than ``1e-64``
    (:data:`MAX_DIGITS`). Remembered (a ``Fraction`` is immutable): each extender call
    parses the pod's quantities again, and building fractions was a tenth of a call.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return _bounded(value, Fraction(value if isinstance(value, int) else str(value)))
    text = value.strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"not a quantity: {_shown(value)}")
    if len(match["number"]) > MAX_DIGITS + 1:  # a decimal point may come with them
        raise ValueError(f"not a quantity: {_shown(value)} (more than {MAX_DIGITS} digits)")
    number = Fraction(match["number"])
    if match["binary"]:
        number *= _BINARY[match["binary"]]
    elif match["exp"]:
        digits = match["exp"][1:]
        exponent = int(digits) if len(digits.lstrip("+-")) <= 3 else MAX_EXPONENT + 1
        if abs(exponent) > MAX_EXPONENT:
            raise ValueError(f"not a quantity: {_shown(value)} (exponent beyond {MAX_EXPONENT})")
        number *= Fraction(10) ** exponent
    else:
        number *= _DECIMAL[match["decimal"] or ""]
    return _bounded(value, -number if match["sign"] == "-" else number)


def _shown(value: str | int | float) -> str:
    """``value`` for an error message, cut short: a message must not be a megabyte."""
    if isinstance(value, int) and abs(value) >= MAX_MAGNITUDE:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[: _SHOWN - 1]}…"


def _bounded(value: str | int | float, number: Fraction) -> Fraction:
    """``number``, if it is below 1e64 in magnitude and no finer than 1e-64."""
    if abs(number) >= MAX_MAGNITUDE:
        raise ValueError(f"not a quantity: {_shown(value)} (not below 1e{MAX_DIGITS})")
    if number.denominator > MAX_MAGNITUDE:
        raise ValueError(f"not a quantity: {_shown(value)} (finer than 1e-{MAX_DIGITS})")
    return number


def parse_count(value: str | int | float) -> int:
    """A quantity that must be a non-negative whole number (extended resources are counts)."""
    number = parse_quantity(value)
    if number.denominator != 1:
        raise ValueError(f"extended resources must be whole numbers, got {_shown(value)}")
    if number < 0:
        raise ValueError(f"resource quantities cannot be negative, got {_shown(value)}")
    return int(number)
