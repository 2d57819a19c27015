"""When the reporter publishes, and under which id, with an in-memory publisher and clock."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import msgspec
import nats.errors
import pytest

from gpushare.core.events import InventoryReported
from gpushare.core.model import CardLink
from gpushare.reporter.publishing import (
    NodeReporter,
    heartbeat_tick,
    inventory_digest,
    inventory_event_id,
)
from gpushare.reporter.simulated import SimulatedBackend
from tests.fakes import FakeClock


class Published:
    """Collects what the reporter publishes; can be told to fail like an absent NATS."""

    def __init__(self) -> None:
        self.events: list[InventoryReported] = []
        self.attempted_ids: list[str] = []
        self.failing = False

    async def __call__(self, event: InventoryReported) -> int:
        self.attempted_ids.append(event.id)
        if self.failing:
            raise nats.errors.NoRespondersError
        self.events.append(event)
        return len(self.events)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def published() -> Published:
    return Published()


@pytest.fixture
def backend() -> SimulatedBackend:
    return SimulatedBackend("gpu-a", (16276, 32510))


@pytest.fixture
def reporter(backend: SimulatedBackend, published: Published, clock: FakeClock) -> NodeReporter:
    return NodeReporter("gpu-a", backend, published, clock=clock, heartbeat_seconds=5)


async def test_the_first_report_goes_out_at_once(
    reporter: NodeReporter, published: Published, clock: FakeClock
) -> None:
    event = await reporter.report_once()
    assert event is not None
    assert published.events == [event]
    assert (event.node, event.source, event.heartbeat_seconds) == ("gpu-a", "simulated", 5)
    assert [card.memory_mib for card in event.cards] == [16276, 32510]
    assert event.at == clock.now()


async def test_nothing_more_until_a_change_or_a_heartbeat(
    reporter: NodeReporter, published: Published, clock: FakeClock
) -> None:
    await reporter.report_once()
    clock.advance(4.9)
    assert await reporter.report_once() is None
    assert len(published.events) == 1


async def test_a_change_goes_out_at_once(
    reporter: NodeReporter, backend: SimulatedBackend, published: Published, clock: FakeClock
) -> None:
    await reporter.report_once()
    clock.advance(0.1)
    backend.mark_unhealthy(1, "XID 79")
    event = await reporter.report_once()
    assert event is not None
    assert [(card.healthy, card.health_reason) for card in event.cards] == [
        (True, ""),
        (False, "XID 79"),
    ]


async def test_a_heartbeat_repeats_the_inventory_with_a_new_time_and_id(
    reporter: NodeReporter, published: Published, clock: FakeClock
) -> None:
    first = await reporter.report_once()
    clock.advance(5)
    heartbeat = await reporter.report_once()
    assert first is not None
    assert heartbeat is not None
    assert heartbeat.cards == first.cards
    assert heartbeat.at > first.at
    assert heartbeat.id != first.id


async def test_the_same_report_gets_the_same_id_from_any_reporter(
    backend: SimulatedBackend, clock: FakeClock
) -> None:
    """Two reporter pods of one node during a rollout: JetStream keeps one copy."""
    one, two = Published(), Published()
    await NodeReporter("gpu-a", backend, one, clock=clock).report_once()
    await NodeReporter("gpu-a", backend, two, clock=clock).report_once()
    assert one.events[0].id == two.events[0].id


async def test_content_flapping_back_within_a_period_gets_a_fresh_id(
    reporter: NodeReporter, backend: SimulatedBackend, published: Published, clock: FakeClock
) -> None:
    await reporter.report_once()
    backend.mark_unhealthy(0)
    await reporter.report_once()
    backend.mark_healthy(0)
    await reporter.report_once()
    ids = [event.id for event in published.events]
    assert len(ids) == len(set(ids)) == 3
    assert published.events[2].cards == published.events[0].cards


async def test_a_wall_clock_stepping_back_does_not_reuse_an_id(
    reporter: NodeReporter, published: Published, clock: FakeClock
) -> None:
    await reporter.report_once()
    clock.advance(5)
    await reporter.report_once()
    clock.step_wall_clock(-5)  # NTP: back into the first period
    clock.advance(5)
    await reporter.report_once()
    ids = [event.id for event in published.events]
    assert len(set(ids)) == 3


async def test_a_failed_publish_is_retried_with_the_same_id(
    reporter: NodeReporter, published: Published
) -> None:
    """If the first attempt did land after all, JetStream drops the retry as a duplicate."""
    published.failing = True
    assert await reporter.report_once() is None
    published.failing = False
    event = await reporter.report_once()
    assert event is not None
    assert published.attempted_ids == [event.id, event.id]
    assert published.events == [event]


def test_event_ids_name_node_content_and_period() -> None:
    assert inventory_event_id("gpu.a", "abc", 7) == "inventory:gpu.a:abc:7"
    assert inventory_event_id("gpu.a", "abc", 7, attempt=2) == "inventory:gpu.a:abc:7:2"


def test_heartbeat_periods_count_from_the_epoch() -> None:
    at = datetime(1970, 1, 1, 0, 0, 12, tzinfo=UTC)
    assert heartbeat_tick(at, 5) == 2
    assert heartbeat_tick(at, 0.5) == 24


async def test_a_backend_that_raises_skips_the_round(
    published: Published, clock: FakeClock
) -> None:
    class Broken(SimulatedBackend):
        def read_cards(self) -> tuple:  # type: ignore[type-arg]
            raise RuntimeError("bug")

    reporter = NodeReporter("gpu-a", Broken("gpu-a", (1,)), published, clock=clock)
    assert await reporter.report_once() is None
    assert published.events == []


class MpsSwitch(SimulatedBackend):
    """A simulated node whose MPS daemon a test starts and stops."""

    mps = False

    def mps_enabled(self) -> bool:
        return self.mps


async def test_links_and_mps_are_published(published: Published, clock: FakeClock) -> None:
    backend = SimulatedBackend("gpu-a", (1000,) * 4, topology="nvlink-pairs", mps="on")
    event = await NodeReporter("gpu-a", backend, published, clock=clock).report_once()
    assert event is not None
    assert event.mps
    assert event.links == backend.read_links()
    assert CardLink(a=2, b=3, path="NVLINK", nvlinks=4) in event.links


async def test_an_mps_daemon_starting_is_published_at_once(
    published: Published, clock: FakeClock
) -> None:
    backend = MpsSwitch("gpu-a", (1000,))
    reporter = NodeReporter("gpu-a", backend, published, clock=clock)
    await reporter.report_once()
    assert await reporter.report_once() is None
    backend.mps = True
    event = await reporter.report_once()
    assert event is not None
    assert event.mps
    assert event.id != published.events[0].id


def test_the_digest_of_an_inventory_without_links_or_mps_is_unchanged() -> None:
    """A reporter that knew neither gives the same ids during a rolling update."""
    cards = SimulatedBackend("gpu-a", (1000, 2000)).read_cards()
    before = hashlib.sha256(msgspec.json.encode(("simulated", "", cards))).hexdigest()[:16]
    assert inventory_digest("simulated", "", cards) == before
    assert inventory_digest("simulated", "", cards, (), False) == before
    link = CardLink(a=0, b=1, path="PHB")
    changed = {
        inventory_digest("simulated", "", cards, (link,), False),
        inventory_digest("simulated", "", cards, (), True),
        inventory_digest("simulated", "", cards, (link,), True),
        inventory_digest("simulated", "", cards, front_door="dra"),
    }
    assert before not in changed
    assert len(changed) == 4
