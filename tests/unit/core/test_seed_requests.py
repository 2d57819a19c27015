"""Seeds 002 and 003 as tables: every dialect's worked request, and every admission rule
of seed 003 (in each dialect it applies to), each rejection naming its rule."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.errors import InvalidRequest
from gpushare.core.pods import pod_from_dict
from gpushare.core.requests import RULES, ContainerRequest, read_gpu_request

MULTIPLE = "vke.volcengine.com/container-multiple-gpu"


def pod(*containers: dict[str, str], annotations: dict[str, str] | None = None) -> Any:
    """A pod whose containers ``c0, c1, ...`` ask these resources (requests = limits)."""
    return pod_from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "p",
                "namespace": "default",
                "uid": "u",
                "annotations": annotations or {},
            },
            "spec": {
                "containers": [
                    {
                        "name": f"c{i}",
                        "image": "x",
                        "resources": {"requests": dict(r), "limits": dict(r)},
                    }
                    for i, r in enumerate(containers)
                ]
            },
        }
    )


def one(**fields: Any) -> tuple[ContainerRequest, ...]:
    return (ContainerRequest(container="c0", **fields),)


@pytest.mark.parametrize(
    ("resources", "annotations", "expected"),
    [
        pytest.param({"gpushare.io/gpu-core": "30"}, None, one(core_percent=30), id="core-share"),
        pytest.param(
            {"gpushare.io/gpu-core": "50", "gpushare.io/gpu-memory": "4Gi"},
            None,
            one(core_percent=50, memory_mib=4096),
            id="core-and-memory",
        ),
        pytest.param(
            {"gpushare.io/gpu-memory-ratio": "25"}, None, one(memory_ratio=25), id="ratio"
        ),
        pytest.param(
            {"gpushare.io/gpu": "50"}, None, one(core_percent=50, memory_ratio=50), id="shorthand"
        ),
        pytest.param(
            {"gpushare.io/gpu-core": "200"}, None, one(cards=2, exclusive=True), id="whole-core"
        ),
        pytest.param(
            {"gpushare.io/gpu": "300"}, None, one(cards=3, exclusive=True), id="shorthand-whole"
        ),
        pytest.param({"nvidia.com/gpu": "2"}, None, one(cards=2, exclusive=True), id="nvidia"),
        pytest.param(
            {"koordinator.sh/gpu-core": "40", "koordinator.sh/gpu-memory-ratio": "40"},
            None,
            one(core_percent=40, memory_ratio=40),
            id="koordinator-alias",
        ),
        pytest.param(
            {"vke.volcengine.com/mgpu-core": "30", "vke.volcengine.com/mgpu-memory": "6k"},
            None,
            one(core_percent=30, memory_mib=6000),
            id="mgpu",
        ),
        pytest.param(
            {"vke.volcengine.com/mgpu-core": "100", "vke.volcengine.com/mgpu-memory": "6k"},
            {MULTIPLE: "2"},
            one(cards=2, core_percent=50, memory_mib=3000),
            id="seed-003-two-cards-at-50",
        ),
    ],
)
def test_each_dialect_reads_as_a_per_card_share(
    resources: dict[str, str], annotations: dict[str, str] | None, expected: object
) -> None:
    assert read_gpu_request(pod(resources, annotations=annotations)).containers == expected


def test_seed_003_container_multiple_gpu_example() -> None:
    """``"2,1,3"``: two cards at 50 %, one whole card, three cards at a third each."""
    request = read_gpu_request(
        pod(
            {"vke.volcengine.com/mgpu-core": "100", "vke.volcengine.com/mgpu-memory": "4k"},
            {"vke.volcengine.com/mgpu-core": "100"},
            {"vke.volcengine.com/mgpu-core": "99", "vke.volcengine.com/mgpu-memory": "3k"},
            annotations={MULTIPLE: "2,1,3"},
        )
    )
    c0, c1, c2 = request.containers
    assert (c0.cards, c0.core_percent, c0.memory_mib) == (2, 50, 2000)
    assert (c1.cards, c1.exclusive) == (1, True)
    assert (c2.cards, c2.core_percent, c2.memory_mib) == (3, 33, 1000)
    assert request.card_count == 6


CORE = "vke.volcengine.com/mgpu-core"
MEMORY = "vke.volcengine.com/mgpu-memory"


@pytest.mark.parametrize(
    ("containers", "annotations", "rule"),
    [
        # seed 003, normal mGPU pods
        pytest.param([{CORE: "-20", MEMORY: "6k"}], None, "non-positive", id="003-1-negative-core"),
        pytest.param([{CORE: "0", MEMORY: "6k"}], None, "non-positive", id="003-1-zero-core"),
        pytest.param([{CORE: "20", MEMORY: "128"}], None, "memory-below-minimum", id="003-2"),
        pytest.param([{CORE: "120"}], None, "core-not-whole-cards", id="003-3"),
        pytest.param([{CORE: "200", MEMORY: "6k"}], None, "redundant-memory", id="003-4"),
        # seed 003, multiple mGPU pods
        pytest.param(
            [{CORE: "200", MEMORY: "6k"}], {MULTIPLE: "3,2"}, "gpu-count-mismatch", id="003-m1"
        ),
        pytest.param(
            [{CORE: "200", MEMORY: "6k"}, {CORE: "200", MEMORY: "6k"}],
            {MULTIPLE: "-1,2"},
            "invalid-gpu-count",
            id="003-m2",
        ),
        pytest.param(
            [{CORE: "200", MEMORY: "6k"}], {MULTIPLE: "2"}, "redundant-memory", id="003-m3"
        ),
        pytest.param(
            [{CORE: "130", MEMORY: "6k"}], {MULTIPLE: "3"}, "not-divisible", id="003-m4-2"
        ),
        pytest.param(
            [{CORE: "30", MEMORY: "600"}], {MULTIPLE: "3"}, "memory-below-minimum", id="003-m4-1"
        ),
        pytest.param(
            [{CORE: "300", MEMORY: "6k"}], {MULTIPLE: "2"}, "core-over-100-per-card", id="003-m4-3"
        ),
        pytest.param(
            [{CORE: "100", MEMORY: "6k"}, {"cpu": "1"}],
            {MULTIPLE: "2,2"},
            "multiple-gpu-without-share",
            id="no-share",
        ),
        # the same rules in gpushare's own names, and the rules between dimensions
        pytest.param([{"gpushare.io/gpu-core": "150"}], None, "core-not-whole-cards", id="gs-core"),
        pytest.param(
            [{"gpushare.io/gpu-memory-ratio": "150"}], None, "ratio-not-whole-cards", id="ratio"
        ),
        pytest.param(
            [{"gpushare.io/gpu-core": "200", "gpushare.io/gpu-memory": "4Gi"}],
            None,
            "redundant-memory",
            id="gs-redundant",
        ),
        pytest.param(
            [{"gpushare.io/gpu-core": "200", "gpushare.io/gpu-memory-ratio": "300"}],
            None,
            "core-ratio-mismatch",
            id="core-ratio",
        ),
        pytest.param(
            [{"gpushare.io/gpu-memory": "4Gi", "gpushare.io/gpu-memory-ratio": "50"}],
            None,
            "conflicting-memory",
            id="conflicting",
        ),
        pytest.param(
            [{"gpushare.io/gpu-core": "50", "koordinator.sh/gpu-core": "50"}],
            None,
            "duplicate-dimension",
            id="duplicate",
        ),
        pytest.param(
            [{"gpushare.io/gpu": "50", "gpushare.io/gpu-core": "50"}],
            None,
            "shorthand-with-dimension",
            id="shorthand",
        ),
        pytest.param(
            [{"nvidia.com/gpu": "1", "gpushare.io/gpu-core": "50"}],
            None,
            "whole-cards-with-share",
            id="nvidia-and-share",
        ),
        pytest.param([{"gpushare.io/gpu-core": "lots"}], None, "quantity", id="quantity"),
        pytest.param(
            [{"gpushare.io/gpu-core": "50"}],
            {"gpushare.io/policy": "nope"},
            "unknown-policy",
            id="policy",
        ),
        pytest.param(
            [{"gpushare.io/gpu-core": "20", "gpushare.io/gpu-memory": "100Mi"}],
            None,
            "memory-below-minimum",
            id="min",
        ),
    ],
)
def test_every_seed_003_rule_rejects_naming_itself(
    containers: list[dict[str, str]], annotations: dict[str, str] | None, rule: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        read_gpu_request(pod(*containers, annotations=annotations), policies=frozenset({"binpack"}))
    assert caught.value.rule == rule
    assert rule in RULES


def test_requests_equal_limits_applies_to_every_dialect() -> None:
    spec = pod_from_dict(
        {
            "metadata": {"name": "p", "namespace": "d", "uid": "u"},
            "spec": {
                "containers": [
                    {
                        "name": "c0",
                        "resources": {
                            "requests": {"gpushare.io/gpu-core": "30"},
                            "limits": {"gpushare.io/gpu-core": "40"},
                        },
                    }
                ]
            },
        }
    )
    with pytest.raises(InvalidRequest) as caught:
        read_gpu_request(spec)
    assert caught.value.rule == "requests-equal-limits"


def test_seed_002_kubernetes_io_names_are_refused_until_the_mutating_webhook_renames_them() -> None:
    """Nothing serves ``kubernetes.io/gpu-core`` as asked (no device plugin may, and
    kube-scheduler counts it itself); renamed ``gpushare.io/gpu-core`` it reads as the seed
    means it."""
    with pytest.raises(InvalidRequest) as caught:
        read_gpu_request(pod({"kubernetes.io/gpu-core": "10", "kubernetes.io/gpu-memory": "1Gi"}))
    assert caught.value.rule == "kubernetes-io-names-need-the-mutating-webhook"
    assert "gpushare.io/gpu-core, gpushare.io/gpu-memory" in caught.value.detail
    renamed = pod({"gpushare.io/gpu-core": "10", "gpushare.io/gpu-memory": "1Gi"})
    assert read_gpu_request(renamed).containers == one(core_percent=10, memory_mib=1024)
