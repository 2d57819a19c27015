"""Model-aware placement: the default policy keeps the card models that constrained
classes need (``model_scarcity``) for them, and only when such demand exists."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.placement import plan_pod
from gpushare.core.policies.fragmentation import (
    Fragmentation,
    FragmentationPolicy,
    TaskClass,
    Workload,
    model_capacity,
    model_scarcity,
)
from gpushare.core.policies.workload import WorkloadEstimate, cluster_capacity
from gpushare.core.requests import ContainerRequest, PodRequest
from gpushare.core.view import CardView, NodeView

CAPACITY = (("G2", 8000), ("T4", 2000))
"""Eight G2 cards, two T4."""
ANYWHERE = TaskClass(cpu_milli=4000, gpus=1, gpu_milli=1000, weight=0.7)
ON_T4 = TaskClass(cpu_milli=4000, gpus=1, gpu_milli=1000, models=("T4",), weight=0.3)
ON_G2 = TaskClass(cpu_milli=4000, gpus=1, gpu_milli=1000, models=("G2",), weight=0.3)


def node(model: str, *free_milli: int, cpu: int = 32_000) -> NodeView:
    return NodeView(
        cards=tuple(
            CardView(
                index=i,
                memory_mib=1000,
                free_mib=free,
                free_core=free // 10,
                containers=0 if free == 1000 else 1,
                model=model,
            )
            for i, free in enumerate(free_milli)
        ),
        free_cpu_milli=cpu,
    )


def whole(models: tuple[str, ...] = ()) -> PodRequest:
    return PodRequest(
        containers=(ContainerRequest(container="c", exclusive=True),),
        cpu_milli=4000,
        models=models,
    )


def node_points(policy: FragmentationPolicy, view: NodeView, request: PodRequest) -> float:
    plan = plan_pod(view, request, policy)
    assert plan is not None
    return plan.score.node


def test_capacity_by_model() -> None:
    assert model_capacity(["T4", "G2", "T4"]) == (("G2", 1000), ("T4", 2000))
    assert cluster_capacity([node("T4", 1000, 0), node("G2", 500)]) == (
        ("G2", 1000),
        ("T4", 2000),
    )


@pytest.mark.parametrize(
    ("classes", "scarcity"),
    [
        pytest.param((ANYWHERE,), {}, id="no-constrained-demand"),
        # 30 % of the demand (10,000 milli) wants T4, which holds 2,000: all of it is needed
        pytest.param((ANYWHERE, ON_T4), {"T4": 1.0}, id="t4-oversubscribed"),
        # the same 3,000 on G2's 8,000
        pytest.param((ANYWHERE, ON_G2), {"G2": 0.375}, id="g2-partly-needed"),
        # a class that takes either model spreads over both by capacity: 30 % of each
        pytest.param(
            (ANYWHERE, TaskClass(gpus=1, gpu_milli=1000, models=("G2", "T4"), weight=0.3)),
            {"G2": pytest.approx(0.3), "T4": pytest.approx(0.3)},
            id="either-model",
        ),
    ],
)
def test_model_scarcity(classes: tuple[TaskClass, ...], scarcity: dict[str, float]) -> None:
    assert model_scarcity(Workload(classes=classes, capacity=CAPACITY)) == scarcity


@pytest.mark.parametrize(
    ("classes", "avoids_t4"),
    [
        pytest.param((ANYWHERE, ON_T4), True, id="t4-demand-keeps-t4-free"),
        pytest.param((ANYWHERE,), False, id="no-constrained-demand-no-preference"),
        pytest.param((ANYWHERE, ON_G2), False, id="g2-demand-steers-toward-t4"),
    ],
)
def test_an_unconstrained_pod_avoids_the_scarce_model(
    classes: tuple[TaskClass, ...], avoids_t4: bool
) -> None:
    policy = FragmentationPolicy(Workload(classes=classes, capacity=CAPACITY))
    on_t4 = node_points(policy, node("T4", 1000, 1000), whole())
    on_g2 = node_points(policy, node("G2", 1000, 1000), whole())
    if avoids_t4:
        assert on_g2 > on_t4
    elif ON_G2 in classes:
        assert on_t4 > on_g2
    else:
        assert on_t4 == on_g2


def test_a_pod_that_needs_the_scarce_model_still_gets_it() -> None:
    policy = FragmentationPolicy(Workload(classes=(ANYWHERE, ON_T4), capacity=CAPACITY))
    plan = plan_pod(node("T4", 1000, 1000), whole(("T4",)), policy)
    assert plan is not None


def test_the_measure_leaves_out_classes_that_cannot_use_the_node() -> None:
    # FGD counts a G2 node's free GPU as a T4-only class's fragment; ours does not
    workload = Workload(classes=(ANYWHERE, ON_T4))
    g2 = node("G2", 1000, 1000)
    assert Fragmentation(workload).of(g2) == pytest.approx(0.3 * 2000)
    assert Fragmentation(workload, own_models=True).of(g2) == pytest.approx(0.0)


def test_the_live_estimate_prices_models_by_the_clusters_capacity() -> None:
    estimate = WorkloadEstimate(refresh=1, capacity=lambda: CAPACITY)
    for _ in range(7):
        estimate.observe(whole())
    for _ in range(3):
        estimate.observe(whole(("T4",)))
    assert estimate.workload().capacity == CAPACITY
    policy = estimate.policy("fragmentation", whole())
    assert isinstance(policy, FragmentationPolicy)
    assert policy.scarcity == {"T4": 1.0}
    on_t4 = node_points(policy, node("T4", 1000, 1000), whole())
    assert node_points(policy, node("G2", 1000, 1000), whole()) > on_t4


models = st.sampled_from(("A10", "G2", "T4", "V100"))
classes = st.builds(
    TaskClass,
    cpu_milli=st.integers(0, 16_000),
    gpus=st.integers(0, 4),
    gpu_milli=st.sampled_from((250, 500, 1000)),
    models=st.lists(models, max_size=3, unique=True).map(tuple),
    weight=st.floats(0.01, 1.0),
)
capacities = st.dictionaries(models, st.integers(1, 64).map(lambda n: n * 1000), min_size=1).map(
    lambda found: tuple(sorted(found.items()))
)


@given(st.lists(classes, min_size=1, max_size=6), capacities)
def test_scarcity_is_a_share_of_models_constrained_classes_ask(
    tasks: list[TaskClass], capacity: tuple[tuple[str, int], ...]
) -> None:
    scarcity = model_scarcity(Workload(classes=tuple(tasks), capacity=capacity))
    asked = {m for t in tasks if t.gpus for m in t.models}
    assert set(scarcity) <= asked & {model for model, _ in capacity}
    assert all(0 < s <= 1 for s in scarcity.values())


@given(
    st.lists(classes.map(lambda t: msgspec.structs.replace(t, models=())), min_size=1),
    capacities,
    st.lists(st.sampled_from((0, 250, 500, 1000)), min_size=1, max_size=4),
)
def test_without_constrained_demand_the_model_changes_nothing(
    tasks: list[TaskClass], capacity: tuple[tuple[str, int], ...], free: list[int]
) -> None:
    policy = FragmentationPolicy(Workload(classes=tuple(tasks), capacity=capacity))
    assert policy.scarcity == {}
    before = {model: node(model, *free) for model in ("G2", "T4")}
    after = {model: node(model, 0, *free[1:], cpu=28_000) for model in ("G2", "T4")}
    growth = {model: policy.growth(before[model], after[model]) for model in before}
    assert growth["G2"] == pytest.approx(growth["T4"])
