"""The replay builds the default policy with the cluster's capacity by card model."""

from __future__ import annotations

from gpushare.core.policies.fragmentation import FragmentationPolicy
from gpushare.tracebench.policies import build
from gpushare.tracebench.trace import TraceNode, TracePod


def test_the_replay_prices_the_model_constrained_pods_need() -> None:
    nodes = (
        TraceNode(name="g2", cpu_milli=96_000, memory_mib=1 << 20, gpus=8, model="G2"),
        TraceNode(name="t4", cpu_milli=96_000, memory_mib=1 << 20, gpus=2, model="T4"),
    )
    anywhere = TracePod(name="a", cpu_milli=4000, memory_mib=0, num_gpu=1, gpu_milli=1000)
    on_t4 = TracePod(
        name="t", cpu_milli=4000, memory_mib=0, num_gpu=1, gpu_milli=1000, gpu_spec=("T4",)
    )
    policy = build("fragmentation", [anywhere] * 7 + [on_t4] * 3, nodes)
    assert isinstance(policy, FragmentationPolicy)
    assert policy.fragmentation.workload.capacity == (("G2", 8000), ("T4", 2000))
    assert policy.scarcity == {"T4": 1.0}
    plain = build("fragmentation", [anywhere] * 10, nodes)
    assert isinstance(plain, FragmentationPolicy)
    assert plain.scarcity == {}
