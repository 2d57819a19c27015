"""The allocation log's contract against the fake (``tests.fakes.MemoryLog``) and against
the JetStream log on a real nats-server (one per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.js import JetStreamContext

from gpushare.bus.follow import LogFollower
from tests.contracts.allocation_log import AllocationLogContract, LogUnderTest
from tests.fakes import memory_log, offline_follower


@pytest.fixture
def memory_under_test() -> LogUnderTest:
    follower = offline_follower()
    return LogUnderTest(memory_log(follower), follower)


@pytest.fixture
async def jetstream_under_test(js: JetStreamContext) -> AsyncIterator[LogUnderTest]:
    follower = LogFollower(js, use_snapshots=False, keep_snapshots=False)
    await follower.start()
    try:
        yield LogUnderTest(follower.log, follower)
    finally:
        await follower.stop()


@pytest.fixture(params=["memory", "jetstream"])
def under_test(request: pytest.FixtureRequest) -> LogUnderTest:
    found: LogUnderTest = request.getfixturevalue(f"{request.param}_under_test")
    return found


class TestAllocationLog(AllocationLogContract):
    pass
