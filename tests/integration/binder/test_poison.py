"""Poison messages on the allocation log, for real: a real nats-server, the binder, the API.

A message the binder cannot decode, or cannot handle however often it is delivered, is
terminated (never redelivered) and recorded once in ``GPUSHARE_REJECTED`` with where it
came from and why; the valid messages around it are handled as if it were not there, and
a fresh fold of the log skips and counts it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from nats.js import JetStreamContext
from prometheus_client import REGISTRY

from gpushare.binder.asking import Asked, AskedResources
from gpushare.bus.follow import LogFollower
from gpushare.bus.permissions import BINDER_CONSUMER
from gpushare.bus.rejected import Rejected, read_rejected, record_rejected
from gpushare.bus.subjects import ALLOCATION_STREAM, BINDER_QUEUE_STREAM, allocation_subject
from gpushare.core.events import PodBound, PodReserved
from gpushare.core.model import PodRef
from gpushare.embedded.kube_api import KubeApiServer
from tests.fakes import FakeClock
from tests.integration.binder.conftest import StartBinder
from tests.integration.binder.test_binder import (
    NODE,
    create_pod,
    logged,
    report_cards,
    reservation,
)

ACK_WAIT_S = 1.0
"""The consumer's ack wait here: JetStream would redeliver an unacknowledged message
after this long, so the checks for "never redelivered" look after twice as long."""
GARBAGE = b"\x00\xff{not json at all"
UNKNOWN_TYPE = msgspec.json.encode(
    {"type": "PodEvicted", "id": "evict-1", "at": "2026-03-01T12:00:00Z", "node": NODE}
)


async def publish_raw(js: JetStreamContext, data: bytes) -> int:
    ack = await js.publish(allocation_subject(NODE), data)
    return int(ack.seq)


async def append(js: JetStreamContext, event: PodReserved) -> int:
    ack = await js.publish(allocation_subject(NODE), msgspec.json.encode(event))
    return int(ack.seq)


async def rejected(js: JetStreamContext) -> list[Rejected]:
    return [record async for record in read_rejected(js, ALLOCATION_STREAM)]


async def bound_uids(js: JetStreamContext) -> set[str]:
    return {event.pod.uid for event in await logged(js) if isinstance(event, PodBound)}


async def consumer_state(js: JetStreamContext) -> tuple[int, int, int]:
    info = await js.consumer_info(BINDER_QUEUE_STREAM, BINDER_CONSUMER)
    return info.num_pending, info.num_ack_pending, info.num_redelivered


def rejections_counted() -> float:
    labels = {"stream": ALLOCATION_STREAM, "recorded": "yes"}
    return REGISTRY.get_sample_value("gpushare_rejected_messages_total", labels) or 0.0


async def settle(js: JetStreamContext, records: int) -> list[Rejected]:
    """Once ``records`` are in the rejected stream and the consumer is idle, watch for twice
    the ack wait (what is watched for, redelivery, can only show up after it), then return
    the records. Asserts nothing was redelivered or left unacknowledged."""
    found: list[Rejected] = []

    async def recorded() -> bool:
        found[:] = await rejected(js)
        return len(found) >= records and (await consumer_state(js))[:2] == (0, 0)

    for _ in range(500):
        if await recorded():
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(2 * ACK_WAIT_S)  # a redelivery would come within one ack wait
    assert await consumer_state(js) == (0, 0, 0)
    return await rejected(js)


async def test_undecodable_messages_are_terminated_recorded_and_skipped(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    before = rejections_counted()
    await start_binder(ack_wait_s=ACK_WAIT_S)
    await report_cards(js, clock)
    first, second = create_pod(kube_api, "p1"), create_pod(kube_api, "p2")
    sequences: dict[str, int] = {}
    sequences["first"] = await append(js, reservation(clock, first))
    sequences["garbage"] = await publish_raw(js, GARBAGE)
    sequences["unknown"] = await publish_raw(js, UNKNOWN_TYPE)
    sequences["second"] = await append(js, reservation(clock, second))

    records = await settle(js, 2)

    assert await bound_uids(js) == {first.uid, second.uid}
    assert [(r.seq, r.data) for r in records] == [
        (sequences["garbage"], GARBAGE),
        (sequences["unknown"], UNKNOWN_TYPE),
    ]
    for record in records:
        assert record.stream == ALLOCATION_STREAM
        assert record.subject == allocation_subject(NODE)
        assert record.error.startswith("undecodable: ")
    assert "PodEvicted" in records[1].error  # msgspec names the unknown tag
    assert rejections_counted() == before + 2

    follower = LogFollower(js)
    await follower.start()
    try:
        await asyncio.wait_for(follower.ready.wait(), 10)
        assert follower.bad_messages == 2
        for pod in (first, second):
            allocation = follower.state.allocation(pod.uid)
            assert allocation is not None
            assert allocation.bound
    finally:
        await follower.stop()


async def test_a_reservation_that_fails_every_delivery_is_rejected_with_the_error(
    js: JetStreamContext,
    kube_api: KubeApiServer,
    clock: FakeClock,
    start_binder: StartBinder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    binder = await start_binder(ack_wait_s=ACK_WAIT_S)
    await report_cards(js, clock)
    cursed, fine = create_pod(kube_api, "cursed"), create_pod(kube_api, "fine")
    lookup = AskedResources.lookup

    async def failing_lookup(self: AskedResources, pod: PodRef) -> Asked:
        if pod.uid == cursed.uid:
            raise RuntimeError("the pod lookup broke")
        return await lookup(self, pod)

    monkeypatch.setattr(AskedResources, "lookup", failing_lookup)
    seq = await append(js, reservation(clock, cursed))
    await append(js, reservation(clock, fine))

    records = await settle(js, 1)

    assert [(r.seq, r.subject) for r in records] == [(seq, allocation_subject(NODE))]
    attempts = binder.settings.bind_attempts
    assert records[0].error == (
        f"handling failed on {attempts} deliveries, last: RuntimeError('the pod lookup broke')"
    )
    assert msgspec.json.decode(records[0].data, type=PodReserved).pod == cursed
    assert await bound_uids(js) == {fine.uid}


async def test_a_message_is_recorded_once_however_often_it_is_rejected(
    js: JetStreamContext,
) -> None:
    """Two replicas, or a redelivery that raced the term: one record (``Nats-Msg-Id``)."""
    seq = await publish_raw(js, GARBAGE)
    where: dict[str, Any] = {
        "stream": ALLOCATION_STREAM,
        "seq": seq,
        "subject": allocation_subject(NODE),
    }
    first = await record_rejected(js, **where, data=GARBAGE, error="undecodable:\nline two é")
    again = await record_rejected(js, **where, data=GARBAGE, error="undecodable, again")
    assert again == first
    records = await rejected(js)
    assert len(records) == 1
    assert records[0].error == "undecodable: line two \\xe9"  # one printable ASCII line
