"""Reading ``aliyun.com/gpu-mem`` from Kubernetes-shaped pods."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.errors import InvalidRequest
from gpushare.core.pods import pod_from_dict
from gpushare.core.requests import ALIYUN_GROUP, ContainerRequest, PodRequest, read_gpu_request
from tests.unit.core.factories import gpu_container, pod_dict

CPU_ONLY = {"name": "sidecar", "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}}
BARE = {"name": "bare"}


def app(name: str, memory_mib: int) -> ContainerRequest:
    return ContainerRequest(container=name, memory_mib=memory_mib, group=ALIYUN_GROUP)


def init(name: str, memory_mib: int) -> ContainerRequest:
    return ContainerRequest(container=name, memory_mib=memory_mib, init=True, group=ALIYUN_GROUP)


@pytest.mark.parametrize(
    ("pod", "unit", "containers", "memory_mib"),
    [
        pytest.param(pod_dict([CPU_ONLY, BARE]), "MiB", (), 0, id="no-gpu"),
        pytest.param(
            pod_dict([gpu_container("main", limit=1024)]),
            "MiB",
            (app("main", 1024),),
            1024,
            id="one-container-limit-only",
        ),
        pytest.param(
            pod_dict([gpu_container("main", request="8138")]),
            "MiB",
            (app("main", 8138),),
            8138,
            id="request-only",
        ),
        pytest.param(
            pod_dict([gpu_container("main", request="4069", limit=4069)]),
            "MiB",
            (app("main", 4069),),
            4069,
            id="request-equals-limit",
        ),
        pytest.param(
            pod_dict([gpu_container("main", limit="1Ki")]),
            "MiB",
            (app("main", 1024),),
            1024,
            id="binary-suffix",
        ),
        pytest.param(
            pod_dict(
                [
                    gpu_container("a", limit=3000),
                    CPU_ONLY,
                    gpu_container("b", limit=4000),
                    gpu_container("c", request=1000, limit=1000),
                ]
            ),
            "MiB",
            (app("a", 3000), app("b", 4000), app("c", 1000)),
            8000,
            id="several-containers-add-up",
        ),
        pytest.param(
            pod_dict(
                [gpu_container("a", limit=3000), gpu_container("b", limit=4000)],
                init_containers=[gpu_container("warmup", limit=10000)],
            ),
            "MiB",
            (init("warmup", 10000), app("a", 3000), app("b", 4000)),
            10000,
            id="init-larger-than-app-sum",
        ),
        pytest.param(
            pod_dict(
                [gpu_container("a", limit=8000), gpu_container("b", limit=4000)],
                init_containers=[
                    gpu_container("warmup", limit=10000),
                    gpu_container("fetch", limit=2000),
                ],
            ),
            "MiB",
            (init("warmup", 10000), init("fetch", 2000), app("a", 8000), app("b", 4000)),
            12000,
            id="app-sum-larger-than-init-and-inits-do-not-add",
        ),
        pytest.param(
            pod_dict([CPU_ONLY], init_containers=[gpu_container("warmup", limit=2048)]),
            "MiB",
            (init("warmup", 2048),),
            2048,
            id="only-an-init-container",
        ),
        pytest.param(
            pod_dict([gpu_container("main", limit=0), gpu_container("other", limit=512)]),
            "MiB",
            (app("other", 512),),
            512,
            id="zero-request-ignored",
        ),
        pytest.param(
            pod_dict([gpu_container("main", request="0", limit="0")]),
            "MiB",
            (),
            0,
            id="only-zero-request-wants-no-gpu",
        ),
        pytest.param(
            pod_dict([gpu_container("main", limit=2), gpu_container("side", limit="1")]),
            "GiB",
            (app("main", 2048), app("side", 1024)),
            3072,
            id="gib-unit",
        ),
        pytest.param(
            pod_dict(
                [
                    gpu_container(
                        "main", limit=1024, extra={"example.com/fpga": 1, "aliyun.com/gpu-count": 1}
                    )
                ]
            ),
            "MiB",
            (app("main", 1024),),
            1024,
            id="other-extended-resources-ignored",
        ),
    ],
)
def test_read_gpu_request(
    pod: dict[str, Any], unit: str, containers: tuple[ContainerRequest, ...], memory_mib: int
) -> None:
    request = read_gpu_request(pod_from_dict(pod), unit)
    assert request == PodRequest(containers=containers)
    assert request.memory_mib == memory_mib
    assert request.wants_gpu is bool(containers)


@pytest.mark.parametrize(
    ("pod", "rule", "names"),
    [
        pytest.param(
            pod_dict([gpu_container("main", request=4096, limit=8192)]),
            "requests-equal-limits",
            ("'main'", "4096", "8192"),
            id="request-differs-from-limit",
        ),
        pytest.param(
            pod_dict(
                [CPU_ONLY],
                init_containers=[gpu_container("warmup", request="1Ki", limit=1000)],
            ),
            "requests-equal-limits",
            ("'warmup'", "1024", "1000"),
            id="init-request-differs-from-limit",
        ),
        pytest.param(
            pod_dict([gpu_container("main", limit="lots")]),
            "quantity",
            ("'main'", "aliyun.com/gpu-mem", "lots"),
            id="not-a-quantity",
        ),
        pytest.param(
            pod_dict([gpu_container("main", limit="500m")]),
            "quantity",
            ("'main'", "whole count"),
            id="fractional",
        ),
        pytest.param(
            pod_dict([gpu_container("ok", limit=10), gpu_container("neg", request="-5")]),
            "quantity",
            ("'neg'", "whole count"),
            id="negative",
        ),
    ],
)
def test_read_gpu_request_rejects(pod: dict[str, Any], rule: str, names: tuple[str, ...]) -> None:
    with pytest.raises(InvalidRequest) as caught:
        read_gpu_request(pod_from_dict(pod))
    assert caught.value.rule == rule
    for name in names:
        assert name in caught.value.detail
    assert str(caught.value).startswith(f"{rule}: ")


def test_unknown_memory_unit_is_a_programming_error() -> None:
    with pytest.raises(KeyError):
        read_gpu_request(pod_from_dict(pod_dict([gpu_container("main", limit=1)])), "TiB")
