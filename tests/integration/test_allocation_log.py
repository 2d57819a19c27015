"""The allocation log on a real nats-server: compare-and-set, idempotency, retention."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from gpushare.bus.follow import LogFollower
from gpushare.bus.log import AllocationLog, AppendConflict, publish_inventory
from gpushare.bus.subjects import ALLOCATION_STREAM
from gpushare.core.events import InventoryReported, PodReleased, PodReserved
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.embedded.nats_server import NatsServer
from tests.integration.kube.waiting import eventually

AT = datetime(2026, 1, 1, tzinfo=UTC)
CARD = Card(index=0, uuid="GPU-0", model="T4", memory_mib=16000)


def reservation(uid: str, node: str = "node.a", mib: int = 1000) -> PodReserved:
    return PodReserved(
        id=f"reserve-{uid}",
        at=AT,
        node=node,
        pod=PodRef(namespace="ns", name=uid, uid=uid),
        shares=(ContainerShare(container="c", card_index=0, card_uuid="GPU-0", memory_mib=mib),),
    )


async def test_append_is_compare_and_set_per_node(js: JetStreamContext) -> None:
    log = AllocationLog(js)
    first = await log.append(reservation("a"), expected_last_seq=0)
    with pytest.raises(AppendConflict):
        await log.append(reservation("b"), expected_last_seq=0)
    # Another node's subject has its own sequence.
    await log.append(reservation("c", node="node-b"), expected_last_seq=0)
    second = await log.append(reservation("b"), expected_last_seq=first)
    assert second > first


async def test_same_id_is_appended_once(js: JetStreamContext) -> None:
    log = AllocationLog(js)
    first = await log.append(reservation("a"))
    again = await log.append(reservation("a"))
    assert again == first
    assert await log.last_seq() == 1


async def test_log_cannot_be_purged_or_have_messages_deleted(js: JetStreamContext) -> None:
    log = AllocationLog(js)
    seq = await log.append(reservation("a"))
    with pytest.raises(APIError):
        await js.purge_stream(ALLOCATION_STREAM)
    with pytest.raises(APIError):
        await js.delete_msg(ALLOCATION_STREAM, seq)
    assert await log.last_seq() == seq


async def test_follower_folds_history_then_live_events(js: JetStreamContext) -> None:
    log = AllocationLog(js)
    await publish_inventory(
        js,
        InventoryReported(
            id="inv-1", at=AT, node="node.a", cards=(CARD,), source="fixture", heartbeat_seconds=5
        ),
    )
    await log.append(reservation("a", mib=3000))
    follower = LogFollower(js)
    await follower.start()
    await asyncio.wait_for(follower.ready.wait(), 5)
    assert follower.state.node("node.a").used_mib == {"GPU-0": 3000}
    assert follower.state.node("node.a").max_free_mib == 13000

    await log.append(
        PodReleased(
            id="release-a",
            at=AT,
            node="node.a",
            pod=PodRef(namespace="ns", name="a", uid="a"),
            reservation_id="reserve-a",
            reason="deleted",
        )
    )
    for _ in range(100):
        if follower.state.node("node.a").max_free_mib == 16000:
            break
        await asyncio.sleep(0.02)
    assert follower.state.node("node.a").max_free_mib == 16000
    await follower.stop()


async def test_a_follower_resumes_at_once_after_nats_server_restarts(
    js: JetStreamContext, nats_server: NatsServer
) -> None:
    """The ordered consumers die with the server; nats-py would notice only after two
    missed heartbeats (10 s). The follower subscribes again as soon as it reconnects."""
    log = AllocationLog(js)
    follower = LogFollower(js)
    await follower.start()
    await log.append(reservation("before", mib=1000))
    await eventually(lambda: "before" in follower.state.node("node.a").pods)

    nats_server.stop()
    nats_server.start()
    await eventually(lambda: follower.resumed >= 1, within=5)
    inventory = InventoryReported(
        id="inv-after", at=AT, node="node.a", cards=(CARD,), source="fixture", heartbeat_seconds=5
    )
    await publish_inventory(js, inventory)
    await log.append(reservation("after", mib=2000))

    await eventually(lambda: "after" in follower.state.node("node.a").pods, within=3)
    # the inventory comes on its own subscription: it may trail the reservation published
    # after it (a make test on 2 busy cores folded "after" first, cards still empty)
    await eventually(lambda: follower.state.node("node.a").cards == (CARD,), within=3)
    assert follower.state.node("node.a").used_mib == {"GPU-0": 3000}
    await follower.stop()


async def test_a_follower_starts_again_when_jetstream_times_out_while_it_starts(
    js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 node agents starting at once on two cores: a consumer's creation timed out and
    the agent exited. The follower now drops what it subscribed and starts again."""
    log = AllocationLog(js)
    await log.append(reservation("before", mib=1000))
    subscribe = js.subscribe
    calls: list[str] = []

    async def slow_bus(subject: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(subject)
        if len(calls) == 2:  # reading the inventory, after reading the log
            raise NatsTimeoutError
        return await subscribe(subject, *args, **kwargs)

    monkeypatch.setattr(js, "subscribe", slow_bus)
    follower = LogFollower(js, use_snapshots=False, keep_snapshots=False)
    await asyncio.wait_for(follower.start(retry_s=0.01), 5)
    assert calls[2:4] == calls[:2]  # from the start again
    assert set(follower.state.node("node.a").pods) == {"before"}
    await log.append(reservation("after", mib=2000))
    await eventually(lambda: "after" in follower.state.node("node.a").pods)
    assert follower.state.node("node.a").used_mib == {"GPU-0": 3000}
    await follower.stop()


async def test_catch_up_reads_a_node_after_a_lost_race(js: JetStreamContext) -> None:
    writer = AllocationLog(js)
    follower = LogFollower(js, node="node.a")
    await follower.start()
    await asyncio.wait_for(follower.ready.wait(), 5)
    await follower.stop()  # stop listening: only catch_up may learn of the next append
    await writer.append(reservation("a"))
    node = await follower.catch_up("node.a")
    assert set(node.pods) == {"a"}
    assert node.last_seq == 1


async def test_reading_skips_a_malformed_message(js: JetStreamContext) -> None:
    log = AllocationLog(js)
    await js.publish("gpushare.alloc.node~a.agent", b"{not json")
    seq = await log.append(reservation("a"))
    events = [pair async for pair in log.read_node("node.a", 0)]
    assert [s for s, _ in events] == [seq]
