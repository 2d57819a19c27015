"""What one card and one node can hold bounds every request, in every dialect: beyond it a
rule is named, and no amount ever grows past what 64-bit integers (events, kubelet) hold."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.errors import InvalidRequest
from gpushare.core.pods import pod_from_dict
from gpushare.core.requests import (
    GPU_MEM,
    MAX_CARD_MEMORY_MIB,
    MAX_CARDS_PER_CONTAINER,
    MULTIPLE_GPU_ANNOTATION,
    NVIDIA_GPU,
    RULES,
    ContainerRequest,
    read_gpu_request,
)
from tests.unit.core.test_seed_requests import pod

CORE, MEMORY = "gpushare.io/gpu-core", "gpushare.io/gpu-memory"
RATIO = "gpushare.io/gpu-memory-ratio"
MGPU_CORE, MGPU_MEMORY = "vke.volcengine.com/mgpu-core", "vke.volcengine.com/mgpu-memory"
HUGE = "99999999999999999999"
"""The request found accepted by the webhook (20 digits: more than int64 holds)."""
INT64_MAX = 2**63 - 1


def test_the_new_rules_are_listed() -> None:
    assert "memory-over-card-maximum" in RULES
    assert "too-many-cards" in RULES
    assert MAX_CARD_MEMORY_MIB == 1024 * 1024
    assert MAX_CARDS_PER_CONTAINER == 64


@pytest.mark.parametrize(
    ("containers", "annotations", "unit", "rule", "said"),
    [
        pytest.param([{GPU_MEM: HUGE}], None, "MiB", "memory-over-card-maximum", HUGE, id="huge"),
        pytest.param(
            [{GPU_MEM: str(MAX_CARD_MEMORY_MIB + 1)}],
            None,
            "MiB",
            "memory-over-card-maximum",
            "1048577 MiB",
            id="1-TiB-and-1-MiB",
        ),
        pytest.param(
            [{GPU_MEM: "1025"}], None, "GiB", "memory-over-card-maximum", "1049600", id="gib"
        ),
        pytest.param(
            [{GPU_MEM: str(2**63)}], None, "GiB", "memory-over-card-maximum", "MiB", id="int64"
        ),
        pytest.param(
            [{GPU_MEM: "600000"}, {GPU_MEM: "600000"}],
            None,
            "MiB",
            "memory-over-card-maximum",
            "1200000 MiB together",
            id="shared-card",
        ),
        pytest.param(
            [{CORE: "50", MEMORY: "2Ti"}],
            None,
            "MiB",
            "memory-over-card-maximum",
            "2097152",
            id="memory",
        ),
        pytest.param(
            [{MGPU_CORE: "50", MGPU_MEMORY: "1e20"}],
            None,
            "MiB",
            "memory-over-card-maximum",
            "MiB on one card",
            id="mgpu-memory",
        ),
        pytest.param(
            [{MGPU_CORE: "200", MGPU_MEMORY: str(4 * MAX_CARD_MEMORY_MIB + 4)}],
            {MULTIPLE_GPU_ANNOTATION: "4"},
            "MiB",
            "memory-over-card-maximum",
            "1048577 MiB",
            id="mgpu-memory-per-card",
        ),
        pytest.param(
            [{GPU_MEM: "1024", CORE: "300"}],
            None,
            "MiB",
            "core-over-100-per-card",
            "300 %",
            id="gpu-mem-with-whole-cards-of-core",
        ),
        pytest.param(
            [{GPU_MEM: "1024", CORE: HUGE}], None, "MiB", "core-over-100-per-card", "%", id="core"
        ),
        pytest.param([{NVIDIA_GPU: "65"}], None, "MiB", "too-many-cards", "65 cards", id="nvidia"),
        pytest.param([{NVIDIA_GPU: HUGE}], None, "MiB", "too-many-cards", HUGE, id="nvidia-huge"),
        pytest.param([{CORE: "6500"}], None, "MiB", "too-many-cards", "65 cards", id="core-cards"),
        pytest.param([{RATIO: "1e22"}], None, "MiB", "too-many-cards", "cards", id="ratio-cards"),
        pytest.param(
            [{MGPU_CORE: "50", MGPU_MEMORY: "1000"}],
            {MULTIPLE_GPU_ANNOTATION: "65"},
            "MiB",
            "too-many-cards",
            "65 cards",
            id="annotation",
        ),
        pytest.param(
            [{MGPU_CORE: "50", MGPU_MEMORY: "1000"}],
            {MULTIPLE_GPU_ANNOTATION: "9" * 5000},
            "MiB",
            "too-many-cards",
            "…",
            id="annotation-of-5000-digits",
        ),
        pytest.param([{GPU_MEM: "9" * 5000}], None, "MiB", "quantity", "64 digits", id="digits"),
        pytest.param([{GPU_MEM: "1e400"}], None, "MiB", "quantity", "exponent", id="1e400"),
        pytest.param([{GPU_MEM: "-1e18"}], None, "MiB", "quantity", "whole count", id="negative"),
        pytest.param([{CORE: "-" + HUGE}], None, "MiB", "non-positive", "", id="negative-core"),
    ],
)
def test_a_request_no_card_or_node_can_hold_is_refused_naming_the_rule(
    containers: list[dict[str, str]],
    annotations: dict[str, str] | None,
    unit: str,
    rule: str,
    said: str,
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        read_gpu_request(pod(*containers, annotations=annotations), unit)
    assert caught.value.rule == rule
    assert rule in RULES
    assert said in caught.value.detail
    assert len(caught.value.detail) < 300  # a message, not the whole number back


def numbers(resources: dict[str, Any]) -> dict[str, Any]:
    """The same resources with JSON numbers where the pod gives numbers, not strings."""
    return {name: int(value) if value.isdigit() else value for name, value in resources.items()}


@pytest.mark.parametrize(
    ("resources", "annotations", "unit", "expected"),
    [
        pytest.param(
            {GPU_MEM: str(MAX_CARD_MEMORY_MIB)},
            None,
            "MiB",
            ContainerRequest(
                container="c0", memory_mib=MAX_CARD_MEMORY_MIB, group="aliyun.com/gpu-mem"
            ),
            id="1-TiB",
        ),
        pytest.param(
            {GPU_MEM: "1024"},
            None,
            "GiB",
            ContainerRequest(
                container="c0", memory_mib=MAX_CARD_MEMORY_MIB, group="aliyun.com/gpu-mem"
            ),
            id="1024-GiB",
        ),
        pytest.param(
            {NVIDIA_GPU: "64"},
            None,
            "MiB",
            ContainerRequest(container="c0", cards=64, exclusive=True),
            id="64-cards",
        ),
        pytest.param(
            {CORE: "6400"},
            None,
            "MiB",
            ContainerRequest(container="c0", cards=64, exclusive=True),
            id="64-cards-of-core",
        ),
        pytest.param(
            {GPU_MEM: "1024", CORE: "100"},
            None,
            "MiB",
            ContainerRequest(
                container="c0", memory_mib=1024, core_percent=100, group="aliyun.com/gpu-mem"
            ),
            id="gpu-mem-with-a-whole-core",
        ),
        pytest.param(
            {MGPU_CORE: "3200", MGPU_MEMORY: str(64 * 1024)},
            {MULTIPLE_GPU_ANNOTATION: "064"},
            "MiB",
            ContainerRequest(container="c0", cards=64, core_percent=50, memory_mib=1024),
            id="64-mgpu-cards",
        ),
    ],
)
def test_requests_at_the_bounds_are_read(
    resources: dict[str, str],
    annotations: dict[str, str] | None,
    unit: str,
    expected: ContainerRequest,
) -> None:
    for asked in (resources, numbers(resources)):
        (read,) = read_gpu_request(pod(asked, annotations=annotations), unit).containers
        assert read == expected


@settings(max_examples=300, deadline=None)
@given(
    resource=st.sampled_from([GPU_MEM, NVIDIA_GPU, CORE, MEMORY, RATIO, MGPU_MEMORY]),
    value=st.one_of(
        st.integers(min_value=-(10**70), max_value=10**70),
        st.integers(min_value=-(2**64), max_value=2**64).map(str),
        st.floats(allow_nan=False, allow_infinity=False),
        st.from_regex(r"\A[+-]?\d{1,70}(\.\d{0,3})?([KMGTPE]i?|[numkMGTPE]|[eE][+-]?\d{1,4})?\Z"),
    ),
    unit=st.sampled_from(["MiB", "GiB"]),
    with_core=st.booleans(),
)
def test_any_number_is_read_within_bounds_or_refused(
    resource: str, value: Any, unit: str, with_core: bool
) -> None:
    """Huge, tiny, negative, fractional, exponents: a request within what a card and a node
    hold (so within int64), or an InvalidRequest naming a known rule; nothing else."""
    asked: dict[str, Any] = {resource: value}
    if with_core and resource not in (NVIDIA_GPU, CORE):
        asked[MGPU_CORE if resource == MGPU_MEMORY else CORE] = "50"
    spec = pod_from_dict(
        {
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c0", "resources": {"limits": asked}}]},
        }
    )
    try:
        request = read_gpu_request(spec, unit)
    except InvalidRequest as error:
        refused: InvalidRequest | None = error
    else:
        refused = None
    if refused is not None:
        assert refused.rule in RULES
        assert len(str(refused)) < 400
        return
    for container in request.containers:
        assert 0 <= container.memory_mib <= MAX_CARD_MEMORY_MIB
        assert 0 <= container.core_percent <= 100
        assert 0 <= container.memory_ratio <= 100
        assert 1 <= container.cards <= MAX_CARDS_PER_CONTAINER
    assert 0 <= request.memory_mib <= INT64_MAX
