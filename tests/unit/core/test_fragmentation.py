"""FGD's fragmentation measure F_n(m), case by case as FGD.md §2.1 defines it, and the
policies built on it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from gpushare.core.placement import plan_pod
from gpushare.core.policies.fragmentation import (
    BestFitPolicy,
    FGDPolicy,
    Fragmentation,
    FragmentationPolicy,
    TaskClass,
    Workload,
    expected_leftover,
    fgd_points,
    free_milli,
    priced_leftover,
    request_class,
    sharing_share,
)
from gpushare.core.policies.workload import WorkloadEstimate, drift
from gpushare.core.requests import ContainerRequest, PodRequest
from gpushare.core.view import CardView, NodeView


def node(*free_milli: int, cpu: int | None = 32_000, model: str = "T4") -> NodeView:
    """Cards of 1000 "MiB" so that free memory and free core are the same milli-GPU."""
    return mixed_node([(free, model) for free in free_milli], cpu=cpu)


def mixed_node(cards: Sequence[tuple[int, str]], *, cpu: int | None = 32_000) -> NodeView:
    """Like :func:`node`, each card with its own model: (free milli-GPU, model)."""
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
            for i, (free, model) in enumerate(cards)
        ),
        free_cpu_milli=cpu,
    )


def only(task: TaskClass) -> Fragmentation:
    return Fragmentation(Workload(classes=(task,)))


@pytest.mark.parametrize(
    ("view", "task", "fragment"),
    [
        pytest.param(node(1000, 300), TaskClass(cpu_milli=1000), 1300, id="non-gpu-task-all-free"),
        pytest.param(
            node(1000, 300), TaskClass(gpus=1, gpu_milli=500, models=("A100",)), 1300, id="model"
        ),
        pytest.param(
            node(1000, 300, cpu=500),
            TaskClass(cpu_milli=1000, gpus=1, gpu_milli=500),
            1300,
            id="lacks-cpu",
        ),
        pytest.param(node(400, 300), TaskClass(gpus=1, gpu_milli=500), 700, id="lacks-gpu"),
        pytest.param(node(1000, 300), TaskClass(gpus=2, gpu_milli=1000), 1300, id="too-few-cards"),
        pytest.param(node(1000, 300, 600), TaskClass(gpus=1, gpu_milli=500), 300, id="fits-q3"),
        pytest.param(node(1000, 1000), TaskClass(gpus=2, gpu_milli=1000), 0, id="fits-whole"),
        pytest.param(
            node(1000, 300, cpu=None),
            TaskClass(cpu_milli=10**9, gpus=1, gpu_milli=200),
            0,
            id="unknown-cpu-never-lacks",
        ),
    ],
)
def test_fragment_of_one_task(view: NodeView, task: TaskClass, fragment: int) -> None:
    assert only(task).of(view) == pytest.approx(fragment)


def test_expected_fragment_is_the_popularity_weighted_sum() -> None:
    small = TaskClass(gpus=1, gpu_milli=200, weight=0.25)
    large = TaskClass(gpus=1, gpu_milli=800, weight=0.75)
    view = node(1000, 500, 100)
    # small: only the 100 card is a fragment; large: 500 and 100 are
    assert Fragmentation(Workload(classes=(small, large))).of(view) == pytest.approx(
        0.25 * 100 + 0.75 * 600
    )


def test_typical_workload_keeps_the_popular_classes_and_renormalises() -> None:
    a, b, c = TaskClass(gpus=1, gpu_milli=500), TaskClass(gpus=1, gpu_milli=1000), TaskClass()
    workload = Workload.typical([a] * 90 + [b] * 6 + [c] * 4, coverage=0.95)
    assert [(t.gpu_milli, round(t.weight, 4)) for t in workload.classes] == [
        (500, round(90 / 96, 4)),
        (1000, round(6 / 96, 4)),
    ]


def test_classes_as_popular_as_the_last_one_kept_are_all_kept() -> None:
    """Where the coverage ends inside a run of equally popular classes, every one of them
    is kept: which rare classes count (often the model-constrained ones) does not depend
    on the order they were seen in or on their fields."""
    common = TaskClass(gpus=1, gpu_milli=500)
    rare = [
        TaskClass(gpus=1, gpu_milli=1000),
        TaskClass(gpus=1, gpu_milli=1000, models=("T4",)),
        TaskClass(gpus=1, gpu_milli=1000, models=("V100",)),
    ]
    tasks = [common] * 94 + [task for task in rare for _ in range(2)]
    for order in (tasks, tasks[::-1]):
        workload = Workload.typical(order, coverage=0.95)
        whole = {t.models for t in workload.classes if t.gpu_milli == 1000}
        assert whole == {(), ("T4",), ("V100",)}
        assert sum(t.weight for t in workload.classes) == pytest.approx(1.0)


def test_fgd_points_are_the_simulators_sigmoid() -> None:
    assert fgd_points(0) == 50
    assert fgd_points(-1000) == 73  # int(sigmoid(1) × 100)
    assert fgd_points(40) == 49
    assert fgd_points(10_000) == 0


def share(percent: int, cpu: int = 0) -> PodRequest:
    return PodRequest(
        containers=(ContainerRequest(container="c", core_percent=percent, memory_ratio=percent),),
        cpu_milli=cpu,
    )


def test_fgd_puts_a_share_where_the_leftover_stays_useful() -> None:
    # half and whole cards are asked: a 50 % pod fills the half-used card, keeping one whole
    halves, wholes = (
        TaskClass(gpus=1, gpu_milli=500, weight=0.5),
        TaskClass(gpus=1, gpu_milli=1000, weight=0.5),
    )
    policy = FGDPolicy(Workload(classes=(halves, wholes)))
    plan = plan_pod(node(1000, 500), share(50), policy)
    assert plan is not None
    assert plan.assignment == ((1,),)


def test_fragmentation_counts_gpus_stranded_by_cpu() -> None:
    # Two alike nodes but for CPU: a CPU-heavy pod goes where it strands no GPU.
    workload = Workload(classes=(TaskClass(cpu_milli=8_000, gpus=1, gpu_milli=1000),))
    policy = FragmentationPolicy(workload)
    rich, tight = node(1000, 1000, cpu=64_000), node(1000, 1000, cpu=20_000)
    cpu_only = PodRequest(containers=(), cpu_milli=12_000)
    on_rich = plan_pod(rich, cpu_only, policy)
    on_tight = plan_pod(tight, cpu_only, policy)
    assert on_rich is not None
    assert on_tight is not None
    assert on_rich.score.node > on_tight.score.node
    assert policy.stranded(tight) == 0
    assert policy.stranded(node(1000, 1000, cpu=8_000)) == pytest.approx(1000)


@pytest.mark.parametrize(("cluster_cpu", "scarce"), [(24_000, True), (64_000, False)])
def test_cpu_only_pods_keep_off_free_gpus_when_cpu_is_scarce(
    cluster_cpu: int, scarce: bool
) -> None:
    # Half the pods are CPU-only: at full GPU the workload asks 16 milli-CPU per milli-GPU
    # (8 of them for the GPU pods). On a 2-card cluster that is 32 cores: scarce with 24,
    # not with 64. Only when scarce does c̄ count the CPU-only pods' CPU, and then a
    # CPU-only pod on the node with free GPUs strands some: it goes where they are used up.
    workload = Workload(
        classes=(
            TaskClass(cpu_milli=8_000, gpus=1, gpu_milli=1000, weight=0.5),
            TaskClass(cpu_milli=8_000, weight=0.5),
        ),
        capacity=(("T4", 2000),),
        cpu_capacity=cluster_cpu,
    )
    policy = FragmentationPolicy(workload)
    assert (policy.cpu_scarcity >= 1.0) is scarce
    assert policy.cpu_per_milli == pytest.approx(16.0 if scarce else 8.0)
    cpu_only = PodRequest(containers=(), cpu_milli=8_000)
    with_gpus = plan_pod(node(1000, 1000, cpu=32_000), cpu_only, policy)
    used_up = plan_pod(node(0, 0, cpu=16_000), cpu_only, policy)
    assert with_gpus is not None
    assert used_up is not None
    if scarce:
        assert used_up.score.node > with_gpus.score.node
    else:
        assert used_up.score.node == with_gpus.score.node


def test_bestfit_takes_the_tightest_card_and_the_fullest_node() -> None:
    plan = plan_pod(node(1000, 600, 500, cpu=10_000), share(50, cpu=1000), BestFitPolicy())
    assert plan is not None
    assert plan.assignment == ((2,),)


def test_request_class_of_each_shape() -> None:
    whole = PodRequest(containers=(ContainerRequest(container="w", exclusive=True, cards=2),))
    memory = PodRequest(containers=(ContainerRequest(container="m", memory_mib=4096),))
    assert request_class(whole) == TaskClass(gpus=2, gpu_milli=1000)
    assert request_class(share(30, cpu=500)) == TaskClass(cpu_milli=500, gpus=1, gpu_milli=300)
    assert request_class(memory) == TaskClass(gpus=1, memory_mib=4096)
    assert request_class(PodRequest(containers=(), cpu_milli=7)) == TaskClass(cpu_milli=7)


def test_the_live_estimate_stands_in_the_pod_at_hand_then_learns() -> None:
    estimate = WorkloadEstimate(window=3, refresh=1)
    assert estimate.policy("fragmentation", share(50)).name == "fragmentation"
    for percent in (10, 20, 30, 40):
        estimate.observe(share(percent))
    assert sorted(t.gpu_milli for t in estimate.workload().classes) == [200, 300, 400]
    assert isinstance(estimate.policy("fgd", share(50)), FGDPolicy)
    assert isinstance(estimate.policy("bestfit", share(50)), BestFitPolicy)


@pytest.mark.parametrize(
    ("shares", "free", "left"),
    [
        ((500,), 0, 0.0),
        ((500,), 1000, 0.0),  # two halves fill the card
        ((500,), 700, 200.0),  # one half, then 200 nobody fits
        ((500,), 499, 499.0),  # nothing fits
        ((470,), 1000, 60.0),  # two 470s leave 60
    ],
)
def test_expected_leftover_is_what_the_shares_cannot_fill(
    shares: tuple[int, ...], free: int, left: float
) -> None:
    workload = Workload(classes=tuple(TaskClass(gpus=1, gpu_milli=s) for s in shares))
    assert expected_leftover(workload)[free] == pytest.approx(left)


def test_leftover_term_adds_its_weight_times_the_change_of_expected_leftover() -> None:
    """Shares of 470 and 320: a 320 on the card with 790 free or on the empty one."""
    workload = Workload(
        classes=(TaskClass(gpus=1, gpu_milli=470), TaskClass(gpus=1, gpu_milli=320))
    )
    leftover = expected_leftover(workload)
    with_term = FragmentationPolicy(workload, stranding_weight=0.0)
    without = FragmentationPolicy(workload, stranding_weight=0.0, leftover_weight=0.0)
    before = node(790, 1000)
    for after in (node(470, 1000), node(790, 680)):
        change = sum(leftover[c.free_mib] for c in after.cards) - sum(
            leftover[c.free_mib] for c in before.cards
        )
        assert with_term.growth(before, after) == pytest.approx(
            without.growth(before, after) + with_term.leftover_weight * change
        )
    assert with_term.leftover_weight == 1.0  # shares are all of the demand
    assert leftover[150] == 150.0  # nothing fits in 150
    assert leftover[470] == pytest.approx((47 * 0 + 32 * 150) / 79)  # demand-weighted


@pytest.mark.parametrize(
    ("classes", "sharing", "weight"),
    [
        ((TaskClass(gpus=1, gpu_milli=500),), 1.0, 1.0),
        ((TaskClass(gpus=1, gpu_milli=1000),), 0.0, 0.2),
        ((TaskClass(cpu_milli=4000),), 0.0, 0.2),  # no GPU asked at all
        # 300 of 1300 milli asked as shares: 23 %
        ((TaskClass(gpus=1, gpu_milli=300), TaskClass(gpus=1, gpu_milli=1000)), 0.3 / 1.3, 0.2),
        # 600 of 1400: 43 %
        (
            (TaskClass(gpus=1, gpu_milli=600), TaskClass(gpus=2, gpu_milli=1000, weight=0.4)),
            0.6 / 1.4,
            1.0,
        ),
    ],
)
def test_leftover_weight_follows_the_share_of_demand_asked_as_shares(
    classes: tuple[TaskClass, ...], sharing: float, weight: float
) -> None:
    workload = Workload(classes=classes)
    assert sharing_share(workload) == pytest.approx(sharing)
    assert FragmentationPolicy(workload).leftover_weight == weight
    assert FragmentationPolicy(workload, leftover_weight=0.5).leftover_weight == 0.5


def test_drift_is_the_total_variation_between_class_mixes() -> None:
    half = TaskClass(gpus=1, gpu_milli=500)
    whole = TaskClass(gpus=1, gpu_milli=1000)
    mix = Workload(classes=(replace(half, weight=0.5), replace(whole, weight=0.5)))
    assert drift(mix, mix) == 0.0
    shifted = Workload(classes=(replace(half, weight=0.6), replace(whole, weight=0.4)))
    assert drift(mix, shifted) == pytest.approx(0.1)
    assert drift(Workload(classes=(half,)), Workload(classes=(whole,))) == pytest.approx(1.0)


def test_the_live_estimate_keeps_its_policy_while_the_mix_holds_still() -> None:
    """The policy object (and with it every memo keyed on it) lives until the observed
    mix has moved by ``rebuild_at``."""
    estimate = WorkloadEstimate(window=100, refresh=10, rebuild_at=0.05)
    for _ in range(100):
        estimate.observe(share(50))
    first = estimate.policy("fragmentation", share(50))
    for _ in range(50):
        estimate.observe(share(50))
    assert estimate.policy("fragmentation", share(50)) is first
    for _ in range(10):
        estimate.observe(share(30))  # 10 % of the window is now another class
    rebuilt = estimate.policy("fragmentation", share(50))
    assert rebuilt is not first
    assert isinstance(rebuilt, FragmentationPolicy)
    assert {t.gpu_milli for t in rebuilt.fragmentation.workload.classes} == {300, 500}


def test_the_live_estimate_rebuilds_when_the_cluster_capacity_changes() -> None:
    capacity = [(("T4", 4000),)]
    estimate = WorkloadEstimate(window=10, refresh=1, capacity=lambda: capacity[0])
    estimate.observe(share(50))
    first = estimate.policy("fragmentation", share(50))
    estimate.observe(share(50))
    assert estimate.policy("fragmentation", share(50)) is first
    capacity[0] = (("T4", 8000),)
    estimate.observe(share(50))
    assert estimate.policy("fragmentation", share(50)) is not first


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([10, 20, 30, 50, 100]), max_size=40), st.integers(1, 8))
def test_the_sliding_counts_are_the_windows_counts(percents: list[int], window: int) -> None:
    """The estimate counts its window as it slides: the workload it builds is the one
    counted afresh from the window's last ``window`` pods."""
    estimate = WorkloadEstimate(window=window, refresh=1)
    for percent in percents:
        estimate.observe(share(percent))
    recent = [request_class(share(percent)) for percent in percents[-window:]]
    assert estimate.workload() == Workload.typical(recent)


@pytest.mark.parametrize(
    ("prices", "free", "left"),
    [
        ({500: 500.0}, 1000, 0.0),  # two halves, each worth half a card
        ({500: 500.0}, 999, 499.0),  # one half, then 499 nobody fits
        ({500: 500.0}, 499, 499.0),
        ({810: 1000.0, 160: 0.0}, 190, 190.0),  # the 160 beside an 810 is worth nothing
        ({810: 1000.0, 160: 0.0}, 810, -190.0),  # an 810 makes the rest of its card useless
        ({470: 500.0, 320: 1000 / 3}, 790, 790 - 500 - 1000 / 3),
        ({}, 300, 300.0),
    ],
)
def test_priced_leftover_is_what_the_best_priced_fill_leaves(
    prices: dict[int, float], free: int, left: float
) -> None:
    assert priced_leftover(prices)[free] == pytest.approx(left)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.integers(1, 100).map(lambda n: n * 10), st.floats(0, 1000), max_size=6))
def test_priced_leftover_grows_at_most_one_milli_per_milli(prices: dict[int, float]) -> None:
    """Any fill of R also fits in R + 1: one more free milli leaves at most one more."""
    table = priced_leftover(prices)
    assert table[0] == 0.0
    assert all(table[r + 1] <= table[r] + 1 + 1e-9 for r in range(1000))


def test_a_priced_policy_keeps_a_remainder_for_the_share_that_packs_best_into_it() -> None:
    """In the tightest packing of 470s, 650s and 320s, 470s pair with each other: a 320
    goes beside another 320 (680 free), not beside the 470 (530 free, which the next 470
    fills to 60), where the demand-weighted expectation put it."""
    workload = Workload(
        classes=tuple(TaskClass(gpus=1, gpu_milli=s, weight=1 / 3) for s in (470, 650, 320))
    )
    prices = {470: 500.0, 650: 2000 / 3, 320: 1000 / 3}
    priced = FragmentationPolicy(workload, stranding_weight=0.0, share_prices=prices)
    expected = FragmentationPolicy(workload, stranding_weight=0.0)
    assert priced.leftover == priced_leftover(prices)
    assert priced.leftover_weight == 10.0
    beside_the_320, beside_the_470 = (
        plan_pod(node(530, 680), share(32), priced),
        plan_pod(node(530, 680), share(32), expected),
    )
    assert beside_the_320 is not None
    assert beside_the_470 is not None
    assert (beside_the_320.assignment, beside_the_470.assignment) == (((1,),), ((0,),))


def test_the_live_estimate_prices_the_workload_it_built_its_policy_on() -> None:
    asked: list[Workload] = []

    def prices(workload: Workload) -> dict[int, float]:
        asked.append(workload)
        return {500: 500.0}

    estimate = WorkloadEstimate(refresh=1, prices=prices)
    estimate.observe(share(50))
    policy = estimate.policy("fragmentation", share(50))
    assert isinstance(policy, FragmentationPolicy)
    assert policy.leftover == priced_leftover({500: 500.0})
    assert [task.gpu_milli for task in asked[-1].classes] == [500]
    assert estimate.policy("fgd", share(50)) is not policy


def _f_by_definition(workload: Workload, view: NodeView, *, own_models: bool) -> float:
    """F_n(M) of FGD.md §2.1 summed class by class, as a check on the memoised profiles."""
    cards = [(free_milli(card), card.free_mib, card.model) for card in view.cards]
    total = sum(free for free, _, _ in cards)
    value = 0.0
    for task in workload.classes:
        accepted = [
            not task.models or any(m.lower() in model.lower() for m in task.models)
            for _, _, model in cards
        ]
        if own_models and task.gpus and not any(accepted):
            continue  # a class the node's models cannot serve is left out
        usable = [
            free
            for (free, free_mib, _), accepts in zip(cards, accepted, strict=True)
            if accepts and free > 0 and free >= task.gpu_milli and free_mib >= task.memory_mib
        ]
        cpu_fits = view.free_cpu_milli is None or task.cpu_milli <= view.free_cpu_milli
        runs = task.gpus > 0 and cpu_fits and len(usable) >= task.gpus
        value += task.weight * (total - sum(usable) if runs else total)
    return value


_task_classes = st.builds(
    TaskClass,
    cpu_milli=st.sampled_from([0, 1000, 4000, 16_000]),
    gpus=st.integers(1, 3),
    gpu_milli=st.sampled_from([100, 250, 500, 1000]),
    memory_mib=st.sampled_from([0, 200, 700]),
    models=st.sampled_from([(), ("T4",), ("A100",)]),
    weight=st.floats(0.01, 1.0),
)
_card_states = st.tuples(st.integers(0, 1000), st.sampled_from(["T4", "A100"]))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_task_classes, min_size=1, max_size=6),
    st.lists(st.lists(_card_states, min_size=1, max_size=4), min_size=1, max_size=6),
    st.sampled_from([None, 0, 2000, 64_000]),
    st.booleans(),
)
def test_profiles_remembered_by_card_give_f_as_defined(
    classes: list[TaskClass],
    nodes: list[list[tuple[int, str]]],
    cpu: int | None,
    own_models: bool,
) -> None:
    """Profiles are built from per-card parts shared between nodes; whatever order the
    nodes come in, each one's F_n(M) is the definition's."""
    workload = Workload(classes=tuple(classes))
    fragmentation = Fragmentation(workload, own_models=own_models)
    for cards in nodes:
        view = mixed_node(cards, cpu=cpu)
        expected = _f_by_definition(workload, view, own_models=own_models)
        assert fragmentation.of(view) == pytest.approx(expected, abs=1e-6)
