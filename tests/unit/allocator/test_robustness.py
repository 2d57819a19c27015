"""No body makes the verbs crash: they answer, or refuse with a WireError (HTTP 400)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.allocator.extender import create_app
from gpushare.allocator.settings import AllocatorSettings
from gpushare.allocator.verbs import ExtenderVerbs
from gpushare.allocator.wire import WireError
from gpushare.clock import SYSTEM_CLOCK
from tests.fakes import offline_follower
from tests.unit.allocator.builders import gpu_pod, seed_000_filter_cluster

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
quantities = json_values | st.from_regex(r"\A[+-]?\d{1,6}(\.\d{0,3})?([KMGT]i?|m|e\d)?\Z")


def verbs() -> ExtenderVerbs:
    app = create_app(
        offline_follower(seed_000_filter_cluster()), AllocatorSettings(), clock=SYSTEM_CLOCK
    )
    found: ExtenderVerbs = app.state.allocator.verbs
    return found


VERBS = verbs()


def answer_or_refuse(body: bytes) -> None:
    for verb in (VERBS.filter, VERBS.prioritize):
        with contextlib.suppress(WireError):
            json.loads(verb(body))


@pytest.mark.slow
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(limit=quantities, request=quantities, names=st.lists(st.text(max_size=6), max_size=4))
def test_any_gpu_memory_quantity_is_answered_or_refused(
    limit: Any, request: Any, names: list[str]
) -> None:
    pod = gpu_pod("p", 1)
    resources = pod["spec"]["containers"][0]["resources"]
    resources["limits"]["aliyun.com/gpu-mem"] = limit
    resources["requests"]["aliyun.com/gpu-mem"] = request
    answer_or_refuse(json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode())


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(document=json_values)
def test_any_json_document_is_answered_or_refused(document: Any) -> None:
    answer_or_refuse(json.dumps(document).encode())


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=64))
def test_any_bytes_are_answered_or_refused(body: bytes) -> None:
    answer_or_refuse(body)
