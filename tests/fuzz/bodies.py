"""What the fuzzers send: well-formed pods and node lists, mutations of the recorded
kube-scheduler calls, odd quantities and annotations, and bytes that are not JSON at all.

Everything here is a Hypothesis strategy of JSON-shaped values (or of raw bytes for the
last kind); the tests encode them with :func:`encode`.
"""

from __future__ import annotations

import copy
import json
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
)  # fmt: skip
"""Quantities that are valid, almost valid, out of range or not numbers at all."""
quantities: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(ODD_QUANTITIES),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.from_regex(r"\A[+-]?\d{1,20}(\.\d{0,3})?([KMGTPE]i?|[numk]|[eE][+-]?\d{1,3})?\Z"),
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
