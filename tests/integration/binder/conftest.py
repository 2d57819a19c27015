"""The binder on a real nats-server (``js``) and the Kubernetes API stand-in."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from nats.js import JetStreamContext

from gpushare.binder.service import Binder
from gpushare.binder.settings import BinderSettings
from gpushare.kube.client import KubeClient
from tests.fakes import FakeClock

FAST = BinderSettings(
    sweep_interval_s=0.05,
    retry_delay_s=0.05,
    relist_delay_s=0.05,
    fold_wait_s=2.0,
    fetch_wait_s=0.1,
    bind_attempts=3,
    watch_timeout_s=5,
    reconcile_interval_s=0,
)
"""Short pauses so tests never wait for long; the timeouts themselves move with the clock.
Reconciliation passes run with the pod list (at start) and when a test asks for one."""

StartBinder = Callable[..., Awaitable[Binder]]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def start_binder(
    js: JetStreamContext, kube: KubeClient, clock: FakeClock
) -> AsyncIterator[StartBinder]:
    """Start a binder when the test is ready for it (``await start_binder(**settings)``)."""
    started: list[Binder] = []

    async def start(**overrides: Any) -> Binder:
        settings = dataclasses.replace(FAST, **overrides)
        binder = await Binder(js, kube, settings, clock).start()
        started.append(binder)
        return binder

    try:
        yield start
    finally:
        for binder in started:
            await binder.stop()


@pytest.fixture
async def binder(start_binder: StartBinder) -> Binder:
    return await start_binder()
