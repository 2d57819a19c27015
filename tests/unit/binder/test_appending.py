"""The binder's appends ride out short NATS outages, waiting longer each time."""

from __future__ import annotations

import pytest

from gpushare.binder import appending
from gpushare.binder.appending import append_event
from gpushare.bus.nats_types import NatsError
from gpushare.core.events import AllocationEvent, PodBound
from tests.fakes import MemoryLog
from tests.unit.core.factories import T0, pod_ref


def bound() -> PodBound:
    return PodBound(id="b1", at=T0, node="n", pod=pod_ref("p"), reservation_id="r1")


class FailingFirst(MemoryLog):
    """Raises ``errors`` in turn, then appends."""

    def __init__(self, *errors: Exception) -> None:
        super().__init__()
        self.errors = list(errors)
        self.tries = 0

    async def append(self, event: AllocationEvent, expected_last_seq: int | None = None) -> int:
        self.tries += 1
        if self.errors:
            raise self.errors.pop(0)
        return await super().append(event, expected_last_seq)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    monkeypatch.setattr(appending.asyncio, "sleep", sleep)
    return waited


async def test_an_append_that_succeeds_waits_for_nothing(sleeps: list[float]) -> None:
    log = FailingFirst()
    assert await append_event(log, bound()) == 1
    assert (log.tries, sleeps) == (1, [])


async def test_nats_errors_and_timeouts_are_retried_after_growing_waits(
    sleeps: list[float],
) -> None:
    log = FailingFirst(NatsError("gone"), TimeoutError(), NatsError("still gone"))
    assert await append_event(log, bound(), attempts=5, delay=0.5) == 1
    assert log.tries == 4
    assert sleeps == [0.5, 1.0, 1.5]
    assert [event for _, event in log.entries] == [bound()]


async def test_the_last_error_is_raised_after_the_attempts(sleeps: list[float]) -> None:
    log = FailingFirst(*(TimeoutError() for _ in range(3)))
    with pytest.raises(TimeoutError):
        await append_event(log, bound(), attempts=3, delay=1.0)
    assert (log.tries, sleeps, log.entries) == (3, [1.0, 2.0], [])


async def test_other_errors_are_not_retried(sleeps: list[float]) -> None:
    log = FailingFirst(ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        await append_event(log, bound())
    assert (log.tries, sleeps) == (1, [])
