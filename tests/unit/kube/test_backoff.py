"""The wait between failed list-and-watch rounds: doubling, capped, reset after quiet."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.kube.backoff import RelistBackoff


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("initial", "cap", "failures_apart", "expected"),
    [
        (0.8, 30.0, [1.0] * 8, [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]),
        (2.0, 30.0, [1.0] * 6, [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]),
        # two minutes without a failure: from the start again
        (0.8, 30.0, [1.0, 1.0, 1.0, 120.0, 1.0], [0.8, 1.6, 3.2, 0.8, 1.6]),
        (0.8, 30.0, [1.0, 119.0, 1.0], [0.8, 1.6, 3.2]),
        # a cap below the first wait: the first wait, always
        (5.0, 1.0, [1.0] * 3, [5.0, 5.0, 5.0]),
    ],
)
def test_waits_double_up_to_the_cap_and_start_again_after_quiet(
    initial: float, cap: float, failures_apart: list[float], expected: list[float]
) -> None:
    clock = Clock()
    backoff = RelistBackoff(initial, cap_s=cap, jitter=0.0, clock=clock)
    waits = []
    for apart in failures_apart:
        clock.now += apart
        waits.append(backoff.after_failure())
    assert waits == pytest.approx(expected)


@given(
    draws=st.lists(st.floats(min_value=0.0, max_value=1.0, exclude_max=True), min_size=1),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)
def test_jitter_only_lengthens_a_wait_by_at_most_its_share(
    draws: list[float], jitter: float
) -> None:
    clock, pending = Clock(), iter(draws)
    jittered = RelistBackoff(jitter=jitter, clock=clock, draw=lambda: next(pending))
    plain = RelistBackoff(jitter=0.0, clock=clock)
    for _ in draws:
        clock.now += 1.0
        base, wait = plain.after_failure(), jittered.after_failure()
        assert base <= wait <= base * (1 + jitter)
