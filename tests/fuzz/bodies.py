"""What the fuzzers send: well-formed pods and node lists, mutations of the recorded
kube-scheduler calls, odd quantities and annotations, and bytes that are not JSON at all.

Everything here is a Hypothesis strategy of JSON-shaped values (or of raw bytes for the
last kind); the tests encode them with :func:`encode`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from gpushare.core.requests import (
    GPU_COUNT,
    GPU_MEM,
    MODEL_ANNOTATION,
    MULTIPLE_GPU_ANNOTATION,
    NVIDIA_GPU,
    POLICY_ANNOTATION,
    SHARE_RESOURCES,
)
from tests.fuzz.generation import any_json, timestamps

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "kube-scheduler"

ODD_QUANTITIES = (
    "1e9", "-5", "0.5Gi", "1024", "0", "-0", "+1", "1.", ".5", "0.5", "1e-3", "1e18", "1e30",
    "1e31", "1E3", "1Ki", "1Ei", "1E", "1Mi", "8138", "16276", "16277", "99999999999999999999",
    "0x10", "1_024", "", " ", " 1024 ", "1024\n", "NaN", "Infinity", "-Infinity", "1e", "e3",
    "١٠٢٤", "²", "1/2", "100m", "2500m", "1k", "6k", "50", "100", "150", "200", "256", "255",
    "1048576", "1048577", "1024Gi", "1Ti", "2Ti", "1Pi", "64", "65", "6400", "6500", "101",
    "9223372036854775807", "9223372036854775808", "18446744073709551616", "-9223372036854775809",
    "1e400", "-1e400", "1e-400", "1E+308", "9" * 64, "9" * 65, "9" * 5000, "1" + "0" * 400,
    "0." + "0" * 70 + "1", "1e" + "9" * 50, "99999999999999999999Ei", "-99999999999999999999",
)  # fmt: skip
"""Quantities that are valid, almost valid, out of range or not numbers at all."""
quantities: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(ODD_QUANTITIES),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-(10**80), max_value=10**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.from_regex(r"\A[+-]?\d{1,20}(\.\d{0,3})?([KMGTPE]i?|[numk]|[eE][+-]?\d{1,3})?\Z"),
    st.from_regex(r"\A[+-]?\d{15,90}([KMGTPE]i|[eE][+-]?\d{1,4})?\Z"),
    st.text(max_size=8),
)

resource_names = st.sampled_from(sorted(SHARE_RESOURCES | {GPU_COUNT, "cpu", "memory"}))

ODD_TEXT = (
    "", " ", "0", "1", "2", "-1", "1,1", "1,2,3", "a", "²", "١", "९", "1e3", "|", "||",
    "Tesla V100-SXM2-16GB", "binpack", "spread", "fgd", "no-such-policy", "\u0000", "🎮",
    "x" * 300,
)  # fmt: skip
"""Annotation values: counts, separators, unicode digits, known and unknown words."""
annotation_values = st.sampled_from(ODD_TEXT) | st.text(max_size=12)
count_tokens = st.sampled_from(["1", "2", "3", "0", "-1", " 2", "1.5", "", "a", "9" * 20]) | (
    st.sampled_from(["²", "³", "①", "١", "९", "２"])
)
"""Parts of a ``container-multiple-gpu`` list: counts, what is not one, and what only looks
like one (unicode digits that ``str.isdigit`` accepts)."""
names = st.sampled_from(["main", "c0", "init0", "a" * 63, "ü", "🎮", ""]) | st.text(max_size=12)


@st.composite
def pod_annotations(draw: st.DrawFn, containers: int) -> dict[str, str]:
    """gpushare's and mGPU's annotations with odd values, a multiple-GPU list usually giving
    one part per container (else only the count is checked), and unknown keys."""
    chosen = {**draw(st.dictionaries(st.text(max_size=10), annotation_values, max_size=2))}
    for key in draw(st.sets(st.sampled_from([POLICY_ANNOTATION, MODEL_ANNOTATION]))):
        chosen[key] = draw(annotation_values)
    if draw(st.booleans()):
        parts = containers if draw(st.integers(0, 4)) else draw(st.integers(0, 4))
        tokens = draw(st.lists(count_tokens, min_size=parts, max_size=parts))
        chosen[MULTIPLE_GPU_ANNOTATION] = ",".join(tokens)
    return chosen


plausible_asks = st.one_of(
    st.fixed_dictionaries({GPU_MEM: st.integers(1, 20_000).map(str)}),
    st.fixed_dictionaries({NVIDIA_GPU: st.sampled_from(["1", "2", 1])}),
    st.fixed_dictionaries(
        {"gpushare.io/gpu-core": st.sampled_from(["10", "30", "50", "100", "200", 25])},
        optional={"gpushare.io/gpu-memory": st.sampled_from(["256Mi", "1Gi", "4Gi", "20Gi"])},
    ),
    st.fixed_dictionaries({"gpushare.io/gpu-memory-ratio": st.sampled_from(["10", "50", "200"])}),
)
"""Requests that are valid and may fit the cards, so that filter passes and bind reserves."""


@st.composite
def containers(
    draw: st.DrawFn, asks: st.SearchStrategy[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A container asking for any GPU resources (or ``asks``), in limits, requests or both."""
    if asks is None:
        asked = plausible_asks | st.dictionaries(resource_names, quantities, max_size=3)
        where = draw(st.sampled_from(["limits", "requests", "equal", "both", "none"]))
    else:
        asked, where = asks, draw(st.sampled_from(["limits", "equal"]))
    limits = draw(asked)
    resources: dict[str, Any] = {
        "limits": {"limits": limits},
        "requests": {"requests": limits},
        "equal": {"limits": limits, "requests": dict(limits)},  # as the API server defaults
        "both": {"limits": limits, "requests": draw(asked)},
        "none": {},
    }[where]
    return {"name": draw(names), "image": "example.invalid/cuda:none", "resources": resources}


@st.composite
def pods(draw: st.DrawFn, plausible: bool = False) -> dict[str, Any]:
    """A pod as kube-scheduler or the API server sends it, asking for anything of the GPUs
    (``plausible``: only valid requests, no annotations, so that it may well fit)."""
    container = containers(plausible_asks if plausible else None)
    spec: dict[str, Any] = {"containers": draw(st.lists(container, max_size=4))}
    if draw(st.integers(0, 3)) == 0:
        spec["initContainers"] = draw(st.lists(container, max_size=2))
    metadata: dict[str, Any] = {
        "name": draw(names),
        "namespace": draw(st.sampled_from(["default", "ml", "ü"]) | st.text(max_size=8)),
        "uid": draw(st.uuids().map(str) | st.text(max_size=8)),
        "annotations": {} if plausible else draw(pod_annotations(len(spec["containers"]))),
    }
    if draw(st.booleans()):
        metadata["creationTimestamp"] = draw(timestamps)
    return {"metadata": metadata, "spec": spec, "status": {"phase": "Pending"}}


def sample(name: str) -> Any:
    """A recorded kube-scheduler body, decoded."""
    return json.loads((SAMPLES / name).read_bytes())


def encode(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False).encode()


# -- mutations ------------------------------------------------------------------------------

Path_ = tuple[str | int, ...]


def paths(document: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every path to a value inside ``document`` (the root excluded)."""
    found: list[Path_] = []
    children: list[tuple[str | int, Any]] = []
    if isinstance(document, dict):
        children = list(document.items())
    elif isinstance(document, list):
        children = list(enumerate(document))
    for key, value in children:
        found.append((*prefix, key))
        found.extend(paths(value, (*prefix, key)))
    return found


replacements: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.sampled_from([[], {}, "", 0, -1, True, False, 2**63, 2**64, -(2**63) - 1, 10**30, 1e308]),
    quantities,
    names,
    any_json,
)
"""What a value may become: null, a wrong type, a huge number, an odd quantity or name."""


def _parent(document: Any, path: Path_) -> Any:
    for key in path[:-1]:
        document = document[key]
    return document


def _mutate(document: Any, path: Path_, action: str, value: Any) -> None:
    """Drop the value at ``path``, recase its key (an object's), or replace it by ``value``."""
    parent, key = _parent(document, path), path[-1]
    if action == "drop":
        del parent[key]
    elif action == "replace":
        parent[key] = value
    elif isinstance(key, str):  # recase: Go reads extender/v1 keys case-insensitively
        parent[key.lower() if key != key.lower() else key.upper()] = parent.pop(key)


@st.composite
def mutated(draw: st.DrawFn, original: Any, max_mutations: int = 3) -> Any:
    """``original`` with one to ``max_mutations`` fields dropped, renamed or replaced."""
    document = copy.deepcopy(original)
    for _ in range(draw(st.integers(1, max_mutations))):
        where = paths(document)
        if not where:
            break
        path = draw(st.sampled_from(where))
        action = draw(st.sampled_from(["drop", "recase", "replace", "replace"]))
        _mutate(document, path, action, draw(replacements) if action == "replace" else None)
    return document


non_json = st.one_of(
    st.binary(max_size=80),
    st.sampled_from(
        [b"", b"null", b"[]", b"{", b"}", b'"Pod"', b"\xff\xfe", b"{'Pod': {}}", b"NaN", b"\x00"]
    ),
    st.text(max_size=40).map(str.encode),
)
"""Bodies that are not a JSON object (the odd one that is, e.g. ``{}``, is told apart)."""


# -- nesting, size and numbers the JSON encoder would not write -----------------------------

LEVELS = (
    (b"[", b"]"),
    (b'{"a": ', b"}"),
    (b'["]]]}}", ', b"]"),
    (b'{"k\\"[{": ', b"}"),
    (b'{"\\\\": [1, "[[", ', b"]}"),
)
"""One level of nesting each: an array, an object, and the same with strings full of
brackets, escaped quotes and backslashes, which a depth check must not count."""


def nesting(value: Any) -> int:
    """How many arrays and objects deep a decoded JSON value goes."""
    children = value.values() if isinstance(value, dict) else value
    if isinstance(value, dict | list):
        return 1 + max(map(nesting, children), default=0)
    return 0


LEVELS_DEEP = tuple(nesting(json.loads(opener + b"0" + closer)) for opener, closer in LEVELS)
"""How many levels of arrays and objects each of :data:`LEVELS` opens."""


@dataclass(frozen=True)
class Nested:
    """Raw JSON nested ``depth`` levels deep; its repr stays short in a failure report."""

    raw: bytes = field(repr=False)
    depth: int
    pattern: tuple[int, ...]
    leaf: bytes


@st.composite
def nested(draw: st.DrawFn, depth: st.SearchStrategy[int]) -> Nested:
    """Raw JSON nesting levels of :data:`LEVELS` (in a repeating pattern, so that 50,000
    levels cost no more draws than 5), with its exact depth."""
    pattern = tuple(draw(st.lists(st.integers(0, len(LEVELS) - 1), min_size=1, max_size=4)))
    levels = draw(depth)
    chosen = [pattern[i % len(pattern)] for i in range(levels)]
    leaf = draw(st.sampled_from([b"0", b'"leaf"', b"null", b"[]", b"{}", b'"]]]"']))
    opened = b"".join(LEVELS[i][0] for i in chosen)
    closed = b"".join(LEVELS[i][1] for i in reversed(chosen))
    extra = 1 if leaf in (b"[]", b"{}") else 0
    total = sum(LEVELS_DEEP[i] for i in chosen) + extra
    return Nested(raw=opened + leaf + closed, depth=total, pattern=pattern, leaf=leaf)


def deep_array(depth: int) -> Nested:
    return Nested(raw=b"[" * depth + b"]" * depth, depth=depth, pattern=(0,), leaf=b"")


depths = st.one_of(
    st.integers(0, 80),
    st.sampled_from([60, 61, 62, 63, 64, 65, 66, 1000, 5000, 50_000]),
)
"""Depths around the limit (64, the root included), and far beyond."""

PLACEHOLDER = "\u0000placeholder\u0000"


def place(document: Any, path: tuple[str | int, ...]) -> Any:
    """``document`` with :data:`PLACEHOLDER` at ``path`` (objects on the way added when
    absent)."""
    copied = copy.deepcopy(document)
    parent = copied
    for key in path[:-1]:
        parent = parent.setdefault(key, {}) if isinstance(key, str) else parent[key]
    parent[path[-1]] = PLACEHOLDER
    return copied


def fill(document: Any, raw: bytes) -> bytes:
    """The encoded ``document`` with its :data:`PLACEHOLDER` replaced by raw JSON."""
    body = encode(document)
    marker = json.dumps(PLACEHOLDER, ensure_ascii=False).encode()
    assert body.count(marker) == 1
    return body.replace(marker, raw)


RAW_NUMBERS = (
    b"1e400", b"-1e400", b"1E+400", b"1e-400", b"-1e-400", b"99999999999999999999",
    b"-99999999999999999999", b"9223372036854775807", b"9223372036854775808",
    b"-9223372036854775809", b"18446744073709551615", b"18446744073709551616",
    b"1" + b"0" * 400, b"9" * 5000, b"-" + b"9" * 5000, b"-0", b"0.0", b"-0.0", b"1.5",
    b"1e18", b"1e308", b"1.7976931348623157e309", b"4.9e-325", b"123456789.123456789e300",
    b"0.000000000000000000000000000001", b"1048577", b"65", b"101",
)  # fmt: skip
"""Numbers a JSON encoder would not write for a float or int64: overflowing, underflowing,
longer than Python converts (4300 digits), negative zero."""
raw_numbers: st.SearchStrategy[bytes] = st.one_of(
    st.sampled_from(RAW_NUMBERS),
    st.integers(min_value=-(10**100), max_value=10**100).map(lambda n: str(n).encode()),
    st.from_regex(rb"\A-?(0|[1-9]\d{0,30})(\.\d{1,30})?([eE][+-]?\d{1,5})?\Z"),
)


@st.composite
def padded(draw: st.DrawFn, body: bytes, limit: int) -> tuple[bytes, str]:
    """``body`` (a JSON object) grown to a size around ``limit``: with whitespace before its
    last brace, or with an unknown string field; and how it grew."""
    size = draw(
        st.one_of(
            st.sampled_from([limit - 1, limit, limit + 1, 2 * limit, 10 * limit]),
            st.integers(limit - 4096, limit + 4096),
            st.integers(len(body), 3 * limit),
        )
    )
    size = max(size, len(body) + len(b', "x": ""'))
    how = draw(st.sampled_from(["space", "field"]))
    if how == "space":
        return body[:-1] + b" " * (size - len(body)) + b"}", how
    field = b', "x-padding": "' + b"p" * (size - len(body) - len(b', "x-padding": ""')) + b'"'
    return body[:-1] + field + b"}", how


def chunked(body: bytes, sizes: list[int]) -> Iterator[bytes]:
    """``body`` in chunks of the given sizes (cycled), as a chunked request sends it."""
    start, turn = 0, 0
    while start < len(body):
        step = max(1, sizes[turn % len(sizes)])
        yield body[start : start + step]
        start, turn = start + step, turn + 1
