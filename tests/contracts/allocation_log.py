"""The allocation log's contract (:class:`gpushare.core.ports.AllocationLog`).

A test module subclasses :class:`AllocationLogContract` and provides ``under_test``: a
:class:`LogUnderTest` (the log, and a follower of it). ``tests.fakes.MemoryLog`` and the
JetStream log on a real nats-server both run it; what JetStream does is the specification.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from gpushare.bus.follow import LogFollower
from gpushare.core.errors import AppendConflict
from gpushare.core.events import AllocationEvent, PodReleased, PodReserved
from gpushare.core.model import ContainerShare, PodRef
from gpushare.core.ports import AllocationLog
from gpushare.core.state import Folded, fold_events
from tests.integration.kube.waiting import eventually

AT = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class LogUnderTest:
    log: AllocationLog
    follower: LogFollower
    """Follows the log live (the fake's is fed at each append)."""


def reserved(uid: str, node: str = "node-a", mib: int = 1000) -> PodReserved:
    share = ContainerShare(container="c", card_index=0, card_uuid="GPU-0", memory_mib=mib)
    pod = PodRef(namespace="ns", name=uid, uid=uid)
    return PodReserved(id=f"reserve-{uid}", at=AT, node=node, pod=pod, shares=(share,))


def released(event: PodReserved) -> PodReleased:
    return PodReleased(
        id=f"release-{event.pod.uid}",
        at=AT,
        node=event.node,
        pod=event.pod,
        reason="deleted",
        reservation_id=event.id,
    )


async def read_all(log: AllocationLog, *nodes: str) -> list[tuple[int, Folded]]:
    pairs = [pair for node in nodes async for pair in log.read_node_folded(node, 0)]
    return sorted(pairs, key=lambda pair: pair[0])


class AllocationLogContract:
    async def test_appends_read_back_in_order(self, under_test: LogUnderTest) -> None:
        log = under_test.log
        events: list[AllocationEvent] = [reserved("a"), reserved("b", mib=2000)]
        events.append(released(reserved("a")))
        seqs = [await log.append(event) for event in events]
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == 3
        assert [pair async for pair in log.read_node("node-a", 0)] == list(
            zip(seqs, events, strict=True)
        )
        assert [pair async for pair in log.read_node("node-a", seqs[0])] == list(
            zip(seqs[1:], events[1:], strict=True)
        )
        assert await log.last_seq() == seqs[-1]

    async def test_an_empty_log(self, under_test: LogUnderTest) -> None:
        assert [pair async for pair in under_test.log.read_node("node-a", 0)] == []
        assert await under_test.log.last_seq() == 0

    async def test_compare_and_set_is_per_node(self, under_test: LogUnderTest) -> None:
        log = under_test.log
        first = await log.append(reserved("a"), expected_last_seq=0)
        with pytest.raises(AppendConflict):
            await log.append(reserved("b"), expected_last_seq=0)
        other = await log.append(reserved("c", node="node-b"), expected_last_seq=0)
        with pytest.raises(AppendConflict):  # the global last sequence is not the node's
            await log.append(reserved("b"), expected_last_seq=other)
        second = await log.append(reserved("b"), expected_last_seq=first)
        assert second > other > first
        assert [seq async for seq, _ in log.read_node("node-b", 0)] == [other]

    async def test_a_repeated_id_is_appended_once(self, under_test: LogUnderTest) -> None:
        log = under_test.log
        first = await log.append(reserved("a"), expected_last_seq=0)
        await log.append(reserved("b"))
        assert await log.append(reserved("a")) == first
        # the sequence is checked before the id: a compare-and-set retry conflicts
        with pytest.raises(AppendConflict):
            await log.append(reserved("a"), expected_last_seq=0)
        assert len([pair async for pair in log.read_node("node-a", 0)]) == 2

    async def test_replay_is_deterministic(self, under_test: LogUnderTest) -> None:
        log = under_test.log
        a, b, c = reserved("a"), reserved("b", node="node-b"), reserved("c", mib=3000)
        for event in (a, b, c, released(a)):
            await log.append(event)
        once = fold_events(await read_all(log, "node-a", "node-b"))
        twice = fold_events(await read_all(log, "node-a", "node-b"))
        assert dict(once.nodes) == dict(twice.nodes)
        assert once.node("node-a").used_mib == {"GPU-0": 3000}
        assert once.node("node-b").used_mib == {"GPU-0": 1000}

    async def test_a_follower_folds_every_append(self, under_test: LogUnderTest) -> None:
        log, follower = under_test.log, under_test.follower
        a = reserved("a")
        await log.append(a)
        await log.append(reserved("b", node="node-b", mib=500))
        last = await log.append(released(a))
        await eventually(lambda: follower.applied_seq == last)
        replayed = fold_events(await read_all(log, "node-a", "node-b"))
        for node in ("node-a", "node-b"):
            assert follower.state.node(node).used_mib == replayed.node(node).used_mib
            assert follower.state.node(node).last_seq == replayed.node(node).last_seq
