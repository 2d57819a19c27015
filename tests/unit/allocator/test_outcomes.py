"""Bind waits on futures that the follower's events settle, keyed by reservation id."""

from __future__ import annotations

import asyncio

from gpushare.allocator.outcomes import BindOutcome, OutcomeWaiters
from gpushare.core.events import BindFailed, PodBound, PodReleased
from gpushare.core.model import PodRef
from gpushare.core.state import NodeState
from tests.unit.allocator.builders import now

POD = PodRef(namespace="ns", name="p", uid="u")
NODE = NodeState(name="n1")


async def test_pod_bound_settles_every_waiter_of_that_reservation() -> None:
    waiters = OutcomeWaiters()
    first, second = waiters.expect("r1"), waiters.expect("r1")
    other = waiters.expect("r2")
    bound = PodBound(id="b1", at=now(), node="n1", pod=POD, reservation_id="r1")
    waiters.on_event(7, bound, NODE)
    assert await waiters.wait("r1", first, 1) == BindOutcome(bound=True)
    assert await waiters.wait("r1", second, 1) == BindOutcome(bound=True)
    assert not other.done()
    assert len(waiters) == 1
    waiters.forget("r2", other)
    assert len(waiters) == 0


async def test_bind_failed_and_release_carry_the_reason() -> None:
    waiters = OutcomeWaiters()
    failed, released = waiters.expect("r1"), waiters.expect("r2")
    waiters.on_event(
        1,
        BindFailed(id="f", at=now(), node="n1", pod=POD, reservation_id="r1", reason="pod gone"),
        NODE,
    )
    waiters.on_event(
        2,
        PodReleased(
            id="x", at=now(), node="n1", pod=POD, reservation_id="r2", reason="bind_timeout"
        ),
        NODE,
    )
    assert await waiters.wait("r1", failed, 1) == BindOutcome(bound=False, reason="pod gone")
    outcome = await waiters.wait("r2", released, 1)
    assert outcome is not None
    assert not outcome.bound
    assert "bind_timeout" in outcome.reason


async def test_wait_gives_up_after_the_timeout_and_forgets() -> None:
    waiters = OutcomeWaiters()
    future = waiters.expect("r1")
    assert await waiters.wait("r1", future, 0.01) is None
    assert len(waiters) == 0
    await asyncio.sleep(0)
