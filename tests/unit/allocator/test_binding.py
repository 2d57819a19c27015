"""The bind flow over an in-memory log: reserve with compare-and-set, then wait for the verdict."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from gpushare.allocator.binding import BindFlow, reservation_id
from gpushare.allocator.metrics import AllocatorMetrics
from gpushare.allocator.pod_cache import PodCache, remembered
from gpushare.allocator.settings import AllocatorSettings
from gpushare.allocator.wire import ExtenderBindingArgs
from gpushare.clock import SYSTEM_CLOCK
from gpushare.core.events import AnyEvent, BindFailed, PodBound, PodReserved
from gpushare.core.pods import pod_from_dict
from gpushare.core.ports import PodSource
from gpushare.core.requests import read_gpu_request
from gpushare.core.state import NodeState
from tests.fakes import MemoryLog, memory_log, offline_follower
from tests.unit.allocator.builders import (
    V100,
    card,
    gpu_pod,
    node_events,
    now,
    occupant,
    seed_000_bind_node,
)
from tests.unit.allocator.fakes import DictPodSource

Verdict = Callable[[PodReserved], str | None]
"""What the stand-in binder does with a reservation: ``None`` binds, a string fails it."""


class Harness:
    def __init__(
        self,
        events: Iterable[Any],
        *,
        wait: float = 5.0,
        attempts: int = 8,
        pod_source: PodSource | None = None,
    ) -> None:
        self.follower = offline_follower(events)
        self.log: MemoryLog = memory_log(self.follower)
        self.pods = PodCache(100)
        self.metrics = AllocatorMetrics()
        settings = AllocatorSettings(bind_wait_seconds=wait, bind_attempts=attempts, replica_id="t")
        self.flow = BindFlow(
            self.follower,
            settings,
            log=self.log,  # type: ignore[arg-type]
            pods=self.pods,
            metrics=self.metrics,
            clock=SYSTEM_CLOCK,
            pod_source=pod_source,
        )

    def known(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Remember ``pod`` as filter would have."""
        decoded = pod_from_dict(pod)
        self.pods.remember(remembered(decoded, read_gpu_request(decoded)))
        return pod

    def binder(self, verdict: Verdict = lambda _: None) -> None:
        """A stand-in binder: answers each new reservation on the next loop turn."""

        def on_event(seq: int, event: AnyEvent, node: NodeState) -> None:
            if isinstance(event, PodReserved) and event.reserved_by == "t":
                asyncio.get_running_loop().call_soon(self._answer, event, verdict(event))

        self.follower.listen(on_event)

    def _answer(self, event: PodReserved, reason: str | None) -> None:
        common = {"at": now(), "node": event.node, "pod": event.pod, "reservation_id": event.id}
        if reason is None:
            self.log.write(PodBound(id=f"bound-{event.id}", **common), deliver=True)
        else:
            failed = BindFailed(id=f"failed-{event.id}", reason=reason, **common)
            self.log.write(failed, deliver=True)

    async def bind(self, pod: dict[str, Any], node: str) -> str:
        meta = pod["metadata"]
        args = ExtenderBindingArgs(
            pod_name=meta["name"], pod_namespace=meta["namespace"], pod_uid=meta["uid"], node=node
        )
        return (await self.flow.bind(args)).error

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_seed_000_bind_example_reserves_card_1_and_answers_once_bound() -> None:
    harness = Harness(seed_000_bind_node())
    harness.binder()
    pod = harness.known(gpu_pod("p", 8138))
    assert await harness.bind(pod, "N1") == ""
    [reserved] = [r for r in harness.log.of_type(PodReserved) if r.pod.name == "p"]
    assert reserved.shares[0].card_index == 1
    assert reserved.reserved_by == "t"
    assert reserved.id == reservation_id("uid-p", "N1", 3)
    assert harness.follower.state.allocation("uid-p") is not None
    assert harness.sample("gpushare_bind_outcomes_total", outcome="bound") == 1


async def test_bind_failed_is_answered_with_the_binders_reason() -> None:
    harness = Harness(node_events("n1", [0]))
    harness.binder(lambda _: "409: pod already bound to node n9")
    pod = harness.known(gpu_pod("p", 1024))
    assert await harness.bind(pod, "n1") == "409: pod already bound to node n9"
    assert harness.follower.state.allocation("uid-p") is None


async def test_no_binder_means_a_timeout_error_and_the_reservation_stays() -> None:
    harness = Harness(node_events("n1", [0]), wait=0.05)
    pod = harness.known(gpu_pod("p", 1024))
    error = await harness.bind(pod, "n1")
    assert "not bound within 0.05s" in error
    assert harness.follower.state.allocation("uid-p") is not None
    assert harness.sample("gpushare_bind_outcomes_total", outcome="timeout") == 1


async def test_a_lost_race_is_re_decided_on_the_new_state() -> None:
    # GPU0 has 8138 free and GPU1 16276: binpack picks GPU0, but another writer fills it first.
    events = node_events("n1", [8138, 0])
    harness = Harness(events)
    harness.binder()
    gpu0 = card("n1", 0)
    harness.log.before_append.append(occupant("n1", gpu0, 8138, "racer"))
    pod = harness.known(gpu_pod("p", 8138))
    assert await harness.bind(pod, "n1") == ""
    mine = [r for r in harness.log.of_type(PodReserved) if r.pod.name == "p"]
    assert [r.shares[0].card_index for r in mine] == [1]
    node = harness.follower.state.node("n1")
    assert node.used_mib == {gpu0.uuid: V100, card("n1", 1).uuid: 8138}
    assert harness.sample("gpushare_append_conflicts_total") == 1


async def test_a_lost_race_that_leaves_no_room_is_a_bind_error() -> None:
    harness = Harness(node_events("n1", [8138]))
    harness.log.before_append.append(occupant("n1", card("n1", 0), 8138, "racer"))
    pod = harness.known(gpu_pod("p", 8138))
    error = await harness.bind(pod, "n1")
    assert error.startswith("cannot reserve a GPU on n1: needs 8138 MiB")
    assert harness.follower.state.node("n1").used_mib == {card("n1", 0).uuid: V100}


async def test_gives_up_after_the_bounded_number_of_lost_races() -> None:
    harness = Harness(node_events("n1", [0]), attempts=3)
    for index in range(3):
        harness.log.before_append.append(occupant("n1", card("n1", 0), 1, f"racer{index}"))

    original = harness.log.append

    async def keep_racing(event: Any, expected_last_seq: int | None = None) -> int:
        harness.log.before_append.append(occupant("n1", card("n1", 0), 1, f"r-{event.id}"))
        return await original(event, expected_last_seq)

    harness.log.append = keep_racing  # type: ignore[method-assign]
    pod = harness.known(gpu_pod("p", 1024))
    error = await harness.bind(pod, "n1")
    assert "changed under 3 decisions" in error
    assert harness.sample("gpushare_append_conflicts_total") == 3
    assert not [r for r in harness.log.of_type(PodReserved) if r.pod.name == "p"]


async def test_a_pod_with_a_live_reservation_is_not_reserved_twice() -> None:
    harness = Harness(node_events("n1", [0]))
    pod = harness.known(gpu_pod("p", 1024))
    reserved = asyncio.Event()
    harness.follower.listen(
        lambda seq, event, node: reserved.set() if isinstance(event, PodReserved) else None
    )
    first = asyncio.create_task(harness.bind(pod, "n1"))
    await reserved.wait()
    second = asyncio.create_task(harness.bind(pod, "n1"))
    await asyncio.sleep(0.01)
    [reserved] = harness.log.of_type(PodReserved)[-1:]
    harness.log.write(
        PodBound(id="b", at=now(), node="n1", pod=reserved.pod, reservation_id=reserved.id),
        deliver=True,
    )
    assert await first == ""
    assert await second == ""
    assert len([r for r in harness.log.of_type(PodReserved) if r.pod.name == "p"]) == 1
    # Once bound, a repeated bind answers at once.
    assert await harness.bind(pod, "n1") == ""


async def test_a_pod_reserved_on_another_node_is_refused() -> None:
    harness = Harness([*node_events("n1", [0]), *node_events("n2", [0])])
    pod = harness.known(gpu_pod("p", 1024))
    harness.log.write(occupant("n1", card("n1", 0), 1024, "p"), deliver=True)
    error = await harness.bind(pod, "n2")
    assert "already holds reservation reserve-p on node n1" in error


async def test_an_unknown_pod_without_a_pod_source_is_an_error() -> None:
    harness = Harness(node_events("n1", [0]))
    error = await harness.bind(gpu_pod("p", 1024), "n1")
    assert "was not seen by this allocator's filter" in error
    assert harness.sample("gpushare_bind_outcomes_total", outcome="unknown_pod") == 1


async def test_an_unknown_pod_is_read_from_the_pod_source() -> None:
    pod = gpu_pod("p", 1024)
    source = DictPodSource(pod)
    harness = Harness(node_events("n1", [0]), pod_source=source)
    harness.binder()
    assert await harness.bind(pod, "n1") == ""
    assert source.reads == 1
    assert harness.pods.get("uid-p") is not None


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (None, "does not exist"),
        (gpu_pod("p", 1024, uid="other"), "was replaced: it has uid other"),
        (gpu_pod("p"), "asks for no GPU"),
        (gpu_pod("p", "1.5"), 'gpushare: rule "quantity"'),
    ],
)
async def test_pod_source_answers_that_cannot_be_bound(
    stored: dict[str, Any] | None, expected: str
) -> None:
    source = DictPodSource(*([stored] if stored else []))
    harness = Harness(node_events("n1", [0]), pod_source=source)
    assert expected in await harness.bind(gpu_pod("p", 1024), "n1")


async def test_a_pod_source_failure_is_an_error_not_a_crash() -> None:
    class Broken:
        async def read_pod(self, namespace: str, name: str, uid: str = "") -> None:
            raise ConnectionError("apiserver unreachable")

    harness = Harness(node_events("n1", [0]), pod_source=Broken())
    error = await harness.bind(gpu_pod("p", 1024), "n1")
    assert "internal error: apiserver unreachable" in error
    assert harness.sample("gpushare_bind_outcomes_total", outcome="error") == 1


async def test_no_card_fits_is_a_bind_error_with_the_reason() -> None:
    harness = Harness(node_events("n1", [12207]))
    pod = harness.known(gpu_pod("p", 8138))
    error = await harness.bind(pod, "n1")
    assert "the most free on any card is 4069 MiB" in error
    assert harness.log.of_type(PodReserved)[-1].pod.name != "p"


async def test_not_ready_is_an_error() -> None:
    harness = Harness(node_events("n1", [0]))
    harness.follower.ready.clear()
    assert "still replaying" in await harness.bind(harness.known(gpu_pod("p", 1)), "n1")
