"""How deeply a JSON body may nest, checked before any decoder recurses into it.

msgspec decodes nested arrays and objects recursively: a body of 50,000 ``[`` raises
``RecursionError`` (not a ``msgspec.DecodeError``), which the extender answered with a
200 "internal error". The scan here keeps a body's brackets outside strings with bytes
methods (C loops over the whole body), then measures how deep they go, so that a deeper
body is refused with a reason before it reaches a decoder. It costs about 4 ms a MiB of
real Kubernetes JSON (escapes and strings are most of it), roughly what decoding costs.

The bound: what kube-scheduler and the kube-apiserver send is far shallower. The deepest
recorded kube-scheduler call (``filter`` with full Node objects, ``managedFields``
included) nests 12 levels; a Pod in an AdmissionReview nests about 17 at most (the
``managedFields`` of an ephemeral volume's claim template). :data:`MAX_JSON_DEPTH`
leaves more than three times that.
"""

from __future__ import annotations

from itertools import accumulate, repeat
from operator import sub

MAX_JSON_DEPTH = 64
"""Deepest nesting of JSON arrays and objects a body may have (the root counts 1)."""

_KEPT = b'[]{}"'
_DROPPED = bytes(range(256)).translate(None, _KEPT)
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_STEPS = bytes.maketrans(b"()", b"\x02\x00")
VECTOR_FROM = 1 << 20
"""Brackets from which the depth is summed with numpy (a legitimate 16 MiB body has
fewer than a million: JSON objects are about 5 % brackets)."""
_VECTOR_CHUNK = 1 << 20


class TooDeep(ValueError):
    """The body nests arrays and objects deeper than allowed."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"JSON nested deeper than {limit} levels of arrays and objects")
        self.limit = limit


def _brackets(body: bytes) -> bytes:
    """The body's ``[ { ] }`` outside strings, as ``(`` and ``)``.

    Escapes first: ``\\\\`` and then ``\\"`` go, so every quote left opens or closes a
    string. Then everything but brackets and quotes goes; a string without brackets is
    now ``""`` and goes too (dropping two adjacent quotes keeps every other byte on the
    same side of the strings). Only strings holding brackets are left to split out.
    """
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = body.translate(_BRACKETS, _DROPPED).replace(b'""', b"")
    if b'"' in kept:
        kept = b"".join(kept.split(b'"')[::2])
    return kept


def json_depth(body: bytes) -> int:
    """How many arrays and objects deep ``body`` goes at its deepest (``0`` for a scalar).

    Counts brackets outside strings, left to right, as a decoder meets them; a body
    that is not JSON gets the depth its brackets reach before anything else goes wrong.
    """
    steps = _brackets(body).translate(_STEPS)
    return max(0, max(accumulate(map(sub, steps, repeat(1))), default=0))


def exceeds_depth(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``body`` nests deeper than ``limit`` (as :func:`json_depth` counts).

    With no more openers than the limit outside strings it cannot. Otherwise matched
    ``()`` pairs are peeled off, innermost first, one level a pass, for as long as a pass
    takes away an eighth of what is left (JSON is mostly leaves: a 14 MiB filter call of
    full Node objects, 650,000 brackets 12 levels deep, is gone in 12 passes, 5 ms); a
    body within the limit is then empty. What is left (deep, unbalanced, or built to make
    peeling slow) is summed exactly, with numpy past :data:`VECTOR_FROM` brackets: 16 MiB
    of nothing but brackets holds the event loop a fifth of a second, not seconds.
    """
    brackets = _brackets(body)
    if brackets.count(b"(") <= limit:
        return False
    remaining = brackets
    for _ in range(limit):
        peeled = remaining.replace(b"()", b"")
        if not peeled:
            return False
        if len(peeled) * 8 > len(remaining) * 7:
            break
        remaining = peeled
    return steps_exceed(brackets.translate(_STEPS), limit)


def steps_exceed(steps: bytes, limit: int, vector_from: int | None = None) -> bool:
    """Whether the running sum of ``steps`` (``2`` for an opener, ``0`` for a closer, so
    each byte minus one) ever passes ``limit``."""
    if len(steps) < (VECTOR_FROM if vector_from is None else vector_from):
        running = accumulate(map(sub, steps, repeat(1)))
        return next(filter(limit.__lt__, running), None) is not None
    import numpy as np  # only for bodies no real object comes near

    depth = 0
    for start in range(0, len(steps), _VECTOR_CHUNK):
        chunk = np.frombuffer(steps[start : start + _VECTOR_CHUNK], dtype=np.uint8)
        depths = np.cumsum(chunk.astype(np.int32) - 1) + depth
        if int(depths.max()) > limit:
            return True
        depth = int(depths[-1])
    return False


def check_depth(body: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise :class:`TooDeep` when ``body`` nests deeper than ``limit``."""
    if exceeds_depth(body, limit):
        raise TooDeep(limit)
