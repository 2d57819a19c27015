"""The shares' packing prices: the cutting-stock LP's duals, checked against packings
worked out by hand and against LP duality on random mixes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.policies.fragmentation import TaskClass, Workload, priced_leftover
from gpushare.packing import share_demand, share_prices
from gpushare.tracebench.trace import read_pods

TRACE = Path(__file__).parents[2] / "benchmarks" / "traces" / "alibaba-gpu-v2023"


def mix(*shares: tuple[int, float]) -> Workload:
    return Workload(
        classes=tuple(TaskClass(gpus=1, gpu_milli=size, weight=w) for size, w in shares)
    )


def test_halves_each_cost_half_a_card() -> None:
    assert share_prices(mix((500, 1.0))) == pytest.approx({500: 500.0})


def test_a_share_too_big_for_a_partner_costs_a_whole_card() -> None:
    assert share_prices(mix((600, 1.0))) == pytest.approx({600: 1000.0})


def test_whole_cards_cpu_only_pods_and_memory_amounts_are_not_shares() -> None:
    workload = Workload(
        classes=(
            TaskClass(gpus=2, gpu_milli=1000),
            TaskClass(cpu_milli=4000),
            TaskClass(gpus=1, memory_mib=4096),
            TaskClass(gpus=2, gpu_milli=250, weight=0.5),
        )
    )
    assert share_demand(workload) == {250: 1.0}
    assert share_prices(workload) == pytest.approx({250: 250.0})
    assert share_prices(Workload(classes=(TaskClass(gpus=1, gpu_milli=1000),))) == {}


def test_a_pair_that_fills_a_card_shares_its_price() -> None:
    """As many 810s as 160s: every card holds one of each, so the two prices sum to one
    card (how they split it is the LP's choice)."""
    prices = share_prices(mix((810, 0.5), (160, 0.5)))
    assert prices[810] + prices[160] == pytest.approx(1000.0)


def test_on_the_alibaba_default_list_810_costs_a_card_and_470_half_of_one() -> None:
    pods = read_pods(TRACE / "openb_pod_list_default.csv")
    prices = share_prices(Workload.typical(pod.task_class for pod in pods))
    assert prices[810] == pytest.approx(1000.0)
    assert prices[470] == pytest.approx(500.0)
    assert prices[320] == pytest.approx(1000 / 3)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.integers(1, 99).map(lambda n: n * 10), st.floats(0.05, 1.0), min_size=1, max_size=6
    )
)
def test_prices_are_dual_feasible_and_cover_the_shares_volume(shares: dict[int, float]) -> None:
    """No card's worth of shares is priced above one card (the best fill of an empty card
    is at most 1000), and the priced demand, the LP's optimum in cards, is at least the
    demand's volume in cards."""
    workload = mix(*shares.items())
    prices = share_prices(workload)
    assert set(prices) == set(shares)
    assert priced_leftover(prices)[1000] >= -1e-6
    priced = sum(prices[size] * weight for size, weight in shares.items())
    volume = sum(size * weight for size, weight in shares.items())
    assert priced >= volume - 1e-6
