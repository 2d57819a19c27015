"""``validate_pod``: the one judgement of a pod that the webhook, filter and bind share."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.errors import InvalidRequest
from gpushare.core.pods import pod_from_dict
from gpushare.core.requests import (
    MULTIPLE_GPU_ANNOTATION,
    POLICY_ANNOTATION,
    RULES,
    PodRequest,
    validate_pod,
    violation_message,
)

CORE = "gpushare.io/gpu-core"
RATIO = "gpushare.io/gpu-memory-ratio"
KOORD_RATIO = "koordinator.sh/gpu-memory-ratio"
MGPU_CORE = "vke.volcengine.com/mgpu-core"
ALIYUN = "aliyun.com/gpu-mem"


def pod(*limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    containers = [
        {"name": f"c{i}", "resources": {"limits": dict(lim), "requests": dict(lim)}}
        for i, lim in enumerate(limits)
    ]
    return {
        "metadata": {"name": "p", "namespace": "d", "uid": "u", "annotations": annotations or {}},
        "spec": {"containers": containers},
    }


@pytest.mark.parametrize(
    ("limits", "annotations", "rule"),
    [
        # (a) a policy no one knows: every verb refuses it, not only filter
        pytest.param([{ALIYUN: "1024"}], {POLICY_ANNOTATION: "nope"}, "unknown-policy", id="a"),
        # (b) core 200 with a memory ratio of one card is no longer 2 whole cards
        pytest.param([{CORE: "200", RATIO: "100"}], {}, "core-ratio-mismatch", id="b"),
        pytest.param([{CORE: "200", KOORD_RATIO: "100"}], {}, "core-ratio-mismatch", id="b-koord"),
        pytest.param([{CORE: "300", RATIO: "200"}], {}, "core-ratio-mismatch", id="b-300-200"),
        pytest.param([{CORE: "200", RATIO: "50"}], {}, "core-ratio-mismatch", id="b-share"),
        # (c) mGPU's card counts on an Aliyun pod are refused, not ignored
        pytest.param(
            [{ALIYUN: "1024"}], {MULTIPLE_GPU_ANNOTATION: "2"}, "multiple-gpu-with-aliyun", id="c"
        ),
        pytest.param(
            [{ALIYUN: "1024"}], {MULTIPLE_GPU_ANNOTATION: "1"}, "multiple-gpu-with-aliyun",
            id="c-one",
        ),
        pytest.param(
            [{MGPU_CORE: "100"}, {ALIYUN: "1024"}],
            {MULTIPLE_GPU_ANNOTATION: "2,1"},
            "multiple-gpu-with-aliyun",
            id="c-mixed",
        ),
    ],
)  # fmt: skip
def test_bad_combinations_name_their_rule(
    limits: list[dict[str, str]], annotations: dict[str, str], rule: str
) -> None:
    judged = validate_pod(pod_from_dict(pod(*limits, annotations=annotations)))
    assert isinstance(judged, InvalidRequest)
    assert judged.rule == rule
    assert rule in RULES
    assert violation_message(judged).startswith(f'gpushare: rule "{rule}": ')


@pytest.mark.parametrize(
    ("limits", "annotations", "cards"),
    [
        pytest.param([{CORE: "200"}], {}, 2, id="core-200-alone"),
        pytest.param([{CORE: "200", RATIO: "200"}], {}, 2, id="core-and-ratio-200"),
        pytest.param([{CORE: "100", RATIO: "100"}], {}, 1, id="one-whole-card"),
        pytest.param([{ALIYUN: "1024"}], {POLICY_ANNOTATION: "spread"}, 1, id="known-policy"),
        pytest.param([{MGPU_CORE: "100"}], {MULTIPLE_GPU_ANNOTATION: "2"}, 2, id="mgpu"),
    ],
)
def test_good_combinations_pass(
    limits: list[dict[str, str]], annotations: dict[str, str], cards: int
) -> None:
    judged = validate_pod(pod_from_dict(pod(*limits, annotations=annotations)))
    assert isinstance(judged, PodRequest)
    assert judged.card_count == cards


def test_the_policies_default_to_every_known_one_and_can_be_narrowed() -> None:
    spread = pod_from_dict(pod({ALIYUN: "1024"}, annotations={POLICY_ANNOTATION: "spread"}))
    assert isinstance(validate_pod(spread), PodRequest)
    narrowed = validate_pod(spread, policies=frozenset({"binpack"}))
    assert isinstance(narrowed, InvalidRequest)
    assert narrowed.rule == "unknown-policy"
