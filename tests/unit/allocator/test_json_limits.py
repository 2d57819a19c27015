"""The nesting-depth check run before any body is decoded."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpushare.allocator.json_limits import (
    MAX_JSON_DEPTH,
    VECTOR_FROM,
    TooDeep,
    check_depth,
    exceeds_depth,
    json_depth,
    steps_exceed,
)
from gpushare.allocator.wire import ExtenderArgs, WireError, decode
from tests.unit.allocator.builders import fixture, fixture_names
from tests.unit.allocator.test_admission import admission_review, body_of, stored_pod


def nested(depth: int, opener: bytes = b"[", closer: bytes = b"]") -> bytes:
    return opener * depth + closer * depth


def deep_object(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        pytest.param(b"", 0, id="empty"),
        pytest.param(b"1", 0, id="scalar"),
        pytest.param(b'"[[[{{{"', 0, id="brackets-in-a-string"),
        pytest.param(b"[]", 1, id="empty-array"),
        pytest.param(b"{}", 1, id="empty-object"),
        pytest.param(b'{"a": [1, {"b": []}]}', 4, id="mixed"),
        pytest.param(b"[[], [[]], []]", 3, id="siblings"),
        pytest.param(b'["]]]]", ["[[[["]]', 2, id="strings-with-brackets"),
        pytest.param(b'["a\\"[[[", []]', 2, id="escaped-quote-then-brackets"),
        pytest.param(b'["a\\\\", [[]]]', 3, id="escaped-backslash-ends-the-string"),
        pytest.param(b'["\\\\\\"[", []]', 2, id="backslash-then-escaped-quote"),
        pytest.param(b'[""[]]', 2, id="empty-string-beside-brackets"),
        pytest.param(b'{"": {"": ""}}', 2, id="empty-keys"),
        pytest.param(b"[[[", 3, id="unclosed"),
        pytest.param(b'["[[[', 1, id="unterminated-string"),
        pytest.param(b"]]][[", 0, id="closers-first"),
        pytest.param(nested(50_000), 50_000, id="50k-deep"),
        pytest.param(deep_object(100), 100, id="deep-object"),
    ],
)
def test_json_depth(body: bytes, depth: int) -> None:
    assert json_depth(body) == depth
    assert exceeds_depth(body, depth) is False
    if depth > 0:
        assert exceeds_depth(body, depth - 1) is True


@pytest.mark.parametrize("name", fixture_names(".request.json"))
def test_kube_scheduler_calls_are_far_within_the_limit(name: str) -> None:
    body = fixture(name)
    assert json_depth(body) <= 12
    check_depth(body)


def test_an_admission_review_is_far_within_the_limit() -> None:
    body = body_of(admission_review(stored_pod("p", 1024), operation="UPDATE"))
    assert json_depth(body) < MAX_JSON_DEPTH // 4
    check_depth(body)


@pytest.mark.parametrize(
    ("body", "too_deep"),
    [
        (nested(MAX_JSON_DEPTH), False),
        (nested(MAX_JSON_DEPTH + 1), True),
        (deep_object(MAX_JSON_DEPTH), False),
        (deep_object(MAX_JSON_DEPTH + 1), True),
        (b"[" * (MAX_JSON_DEPTH + 1), True),  # cut short: the decoder would still recurse
        (b'["' + b"[" * 100_000 + b'"]', False),  # all inside a string
        (b"[" + b"[]," * 10_000 + b"[]]", False),  # many openers, shallow
    ],
    ids=["at-limit", "over", "object-at-limit", "object-over", "unclosed", "string", "wide"],
)
def test_check_depth(body: bytes, too_deep: bool) -> None:
    if too_deep:
        with pytest.raises(TooDeep, match=f"deeper than {MAX_JSON_DEPTH} levels"):
            check_depth(body)
    else:
        check_depth(body)


def test_a_50k_deep_body_is_a_wire_error_not_a_recursion_error() -> None:
    for body in (nested(50_000), b'{"Pod":' + nested(50_000) + b"}", deep_object(50_000)):
        with pytest.raises(WireError, match="nested deeper than"):
            decode(body, ExtenderArgs)


def test_the_check_is_cheap_on_a_large_shallow_body() -> None:
    """A 16 MiB filter body of full Node objects is scanned in well under a second."""
    document = json.loads(fixture("filter.request.json"))
    node = document["Nodes"]["items"][0]
    document["Nodes"]["items"] = [node] * 7000
    body = json.dumps(document).encode()
    assert len(body) > 15 * 2**20
    started = time.perf_counter()
    assert not exceeds_depth(body)
    assert time.perf_counter() - started < 1.0


def reference_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(reference_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(reference_depth, value), default=0)
    return 0


tricky_text = st.text(alphabet='[]{}"\\ab', max_size=6) | st.text(max_size=4)
"""Strings full of what the scan must not count: brackets, quotes, backslashes."""
documents = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
    max_leaves=40,
)


@pytest.mark.slow
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@example(document=[["[["], {"]]": [[["\\"]]]}], ascii_only=True, limit=3)
@given(document=documents, ascii_only=st.booleans(), limit=st.integers(0, 8))
def test_the_depth_of_any_document_is_its_nesting(
    document: Any, ascii_only: bool, limit: int
) -> None:
    body = json.dumps(document, ensure_ascii=ascii_only).encode()
    depth = reference_depth(document)
    assert json_depth(body) == depth
    assert exceeds_depth(body, limit) is (depth > limit)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200) | st.text(alphabet='[]{}"\\ ,:1', max_size=200).map(str.encode))
def test_any_bytes_are_judged_by_their_exact_depth(body: bytes) -> None:
    """Well-formed or not, ``exceeds_depth`` agrees with the exact count."""
    for limit in (0, 1, 3, 10):
        assert exceeds_depth(body, limit) is (json_depth(body) > limit)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.sampled_from([0, 2]), max_size=300).map(bytes),
    limit=st.integers(0, 12),
)
def test_numpy_and_python_sum_alike(steps: bytes, limit: int) -> None:
    assert steps_exceed(steps, limit, vector_from=0) is steps_exceed(steps, limit)


@pytest.mark.parametrize(("deepest", "too_deep"), [(64, False), (65, True)])
def test_a_body_of_millions_of_brackets_is_summed_across_chunks(
    deepest: int, too_deep: bool
) -> None:
    """Shallow chains for over a million brackets, then the deepest one."""
    body = (b"[" * 40 + b"]" * 40) * (VECTOR_FROM // 60) + b"[" * deepest + b"]" * deepest
    started = time.perf_counter()
    assert exceeds_depth(body) is too_deep
    assert time.perf_counter() - started < 2.0
