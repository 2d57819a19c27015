"""A short chaos run (``tools.chaos``): load, SIGKILLed services and NATS restarts, and
afterwards every invariant holds and every live allocator agrees with a replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.chaos import ChaosConfig, render, run_chaos


@pytest.mark.timeout(180)
def test_twenty_seconds_of_chaos_leave_every_invariant_intact(short_tmp: Path) -> None:
    config = ChaosConfig(
        duration_s=20,
        seed=2,
        data_dir=short_tmp,
        fault_every_s=2.5,
        settle_timeout_s=30,
        # the binder's periodic pass heals what a fault made it miss; shorten it to fit
        env={"GPUSHARE_RECONCILE_INTERVAL": "5"},
    )

    summary = run_chaos(config)

    assert summary.violations == [], render(summary)
    assert sum(summary.faults.values()) >= 4, render(summary)
    assert summary.pods.get("scheduled", 0) >= 10, render(summary)
    assert summary.final["bound"] > 0, render(summary)
