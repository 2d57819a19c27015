"""The records behind ``gpushare explain``: what the allocator's filter and prioritize record.

Built with the allocator's real verbs over an offline follower; the recorder is our own
seam (:class:`gpushare.bus.decisions.Recorder`), here a list of the builders it was handed.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any, cast

import pytest
from nats.aio.client import Client

from gpushare.allocator.extender import create_app
from gpushare.allocator.settings import AllocatorSettings
from gpushare.allocator.verbs import ExtenderVerbs
from gpushare.bus.decisions import (
    Builder,
    DecisionRecorder,
    nodes_filtered,
    nodes_scored,
)
from gpushare.bus.subjects import decision_subject
from gpushare.clock import SYSTEM_CLOCK
from gpushare.core.events import NodesFiltered, NodesScored
from gpushare.core.model import PodRef
from tests.fakes import offline_follower
from tests.unit.allocator.builders import gpu_pod, names_args, now, seed_000_filter_cluster

POD = PodRef(namespace="default", name="p", uid="uid-p")
NAMES = ["N1", "N2", "N3"]


class Recorded:
    def __init__(self) -> None:
        self.builders: list[Builder] = []

    def record(self, build: Builder) -> None:
        self.builders.append(build)

    def built(self) -> list[Any]:
        return [build() for build in self.builders]


def verbs_over(recorded: Recorded, *, ready: bool = True) -> ExtenderVerbs:
    follower = offline_follower(seed_000_filter_cluster())
    if not ready:
        follower.ready.clear()
    settings = AllocatorSettings(replica_id="allocator-a", policy="binpack")
    app = create_app(follower, settings, clock=SYSTEM_CLOCK, decisions=recorded)
    found: ExtenderVerbs = app.state.allocator.verbs
    return found


def test_filter_records_what_passed_and_why_the_others_failed() -> None:
    recorded = Recorded()
    verbs_over(recorded).filter(names_args(gpu_pod("p", 8138), NAMES))
    (record,) = recorded.built()
    assert isinstance(record, NodesFiltered)
    assert (record.pod, record.allocator, record.request) == (POD, "allocator-a", "main0: 8138 MiB")
    assert record.passed == ("N3",)
    assert set(record.failed) == {"N1", "N2"}
    assert "the most free on any card is 4069 MiB" in record.failed["N2"]
    assert record.omitted == 0
    assert record.id.startswith("filtered:")


def test_an_invalid_request_is_recorded_with_its_reason() -> None:
    recorded = Recorded()
    verbs_over(recorded).filter(names_args(gpu_pod("p", "lots"), NAMES))
    (record,) = recorded.built()
    assert record.request.startswith('gpushare: rule "quantity": ')
    assert record.passed == ()
    assert set(record.failed) == set(NAMES)


def test_prioritize_records_the_scores_by_policy() -> None:
    recorded = Recorded()
    verbs_over(recorded).prioritize(names_args(gpu_pod("p", 8138), NAMES))
    (record,) = recorded.built()
    assert isinstance(record, NodesScored)
    assert (record.pod, record.allocator, record.policy) == (POD, "allocator-a", "binpack")
    assert set(record.scores) == set(NAMES)
    assert record.scores["N3"] == max(record.scores.values())


@pytest.mark.parametrize("ready", [True, False])
def test_pods_without_gpus_and_unready_answers_record_nothing(ready: bool) -> None:
    recorded = Recorded()
    verbs = verbs_over(recorded, ready=ready)
    verbs.filter(names_args(gpu_pod("plain"), NAMES))
    verbs.prioritize(names_args(gpu_pod("plain"), NAMES))
    if not ready:
        verbs.filter(names_args(gpu_pod("p", 8138), NAMES))
    assert recorded.builders == []


def test_a_filter_record_names_at_most_the_limit_and_counts_the_rest() -> None:
    record = nodes_filtered(
        id="d",
        at=now(),
        pod=POD,
        allocator="a",
        request="r",
        passed=[f"p{i}" for i in range(5)],
        failed=({f"f{i}": "full" for i in range(3)}, {f"u{i}": "stale" for i in range(4)}),
        limit=3,
    )
    assert record.passed == ("p0", "p1", "p2")
    assert record.failed == {"f0": "full", "f1": "full", "f2": "full"}
    assert record.omitted == 2 + 4


def test_a_score_record_keeps_the_best_scores() -> None:
    record = nodes_scored(
        id="s",
        at=now(),
        pod=POD,
        allocator="a",
        policy="binpack",
        names=["a", "b", "c", "d"],
        scores=[3, 9, 3, 7],
        limit=3,
    )
    assert list(record.scores.items()) == [("b", 9), ("d", 7), ("a", 3)]
    assert record.omitted == 1


async def test_a_full_queue_drops_and_counts_without_raising() -> None:
    recorder = DecisionRecorder(cast(Client, None), queue_size=2)  # never started: never sends
    for _ in range(5):
        recorder.record(
            lambda: nodes_scored(
                id="s", at=now(), pod=POD, allocator="a", policy="p", names=[], scores=[]
            )
        )
    assert recorder.dropped == 3
    assert recorder.published == 0


class Publishes:
    """A NATS client that keeps the subjects published."""

    def __init__(self) -> None:
        self.subjects: list[str] = []
        self.changed = asyncio.Event()

    async def publish(self, subject: str, payload: bytes, headers: object = None) -> None:
        self.subjects.append(subject)
        self.changed.set()

    async def wait_for(self, count: int) -> None:
        while len(self.subjects) < count:
            self.changed.clear()
            await self.changed.wait()


def scored(name: str) -> NodesScored:
    pod = PodRef(namespace="default", name=name, uid=f"uid-{name}")
    return nodes_scored(id=name, at=now(), pod=pod, allocator="a", policy="p", names=[], scores=[])


async def test_records_wait_for_their_batch_and_a_stop_publishes_the_waiting_batch() -> None:
    nc = Publishes()
    recorder = DecisionRecorder(cast(Client, nc), batch_wait_s=30)
    await recorder.start()
    for name in ("a", "b", "c"):
        recorder.record(partial(scored, name))
    await asyncio.sleep(0.05)
    assert nc.subjects == []  # the batch waits for more records
    await recorder.stop()
    assert nc.subjects == [decision_subject("default", name) for name in ("a", "b", "c")]
    assert recorder.published == 3


async def test_a_batch_is_published_once_its_wait_is_over() -> None:
    nc = Publishes()
    recorder = DecisionRecorder(cast(Client, nc), batch_wait_s=0.01)
    await recorder.start()
    recorder.record(partial(scored, "a"))
    recorder.record(partial(scored, "b"))
    await asyncio.wait_for(nc.wait_for(2), 10)
    assert recorder.published == 2
    await recorder.stop()
