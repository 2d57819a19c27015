"""A compromised node and a compromised auditor, tried against a real nats-server running
the generated users and permissions over TLS: each test is one attack from the threat
model (docs/security.md), and says what the attacker gets.

Node A's user may publish on its own subjects, so NATS lets its forgeries into the log;
the point is that nothing folds, binds from or shows them as facts about node B.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError, BadRequestError

from gpushare.binder.binding import consumer_config
from gpushare.binder.settings import BinderSettings
from gpushare.bus.follow import LogFollower
from gpushare.bus.log import AllocationLog, publish_inventory
from gpushare.bus.permissions import BINDER_CONSUMER
from gpushare.bus.streams import ALLOCATION_MAX_MSG_BYTES, ensure_streams
from gpushare.bus.subjects import (
    ALL_ALLOCATIONS,
    ALLOCATION_STREAM,
    BINDER_QUEUE_STREAM,
    BINDER_WORK,
    allocation_subject,
    inventory_subject,
)
from gpushare.core.events import (
    AllocationCorrected,
    AnyEvent,
    ContainerAssigned,
    ForeignCardsHeld,
    ForeignHold,
    InventoryReported,
    PodBound,
    PodReleased,
    PodReserved,
    encode_event,
)
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.core.reconciliation import ADOPTED_POLICY
from tests.integration.kube.waiting import eventually
from tests.security.conftest import NODE_A, NODE_B, SecureNats

AT = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
VICTIM = PodRef(namespace="ns", name="victim", uid="uid-victim")
CARD_B = Card(index=0, uuid="GPU-b0", model="A100", memory_mib=16384)
HELD = (ContainerShare(container="c", card_index=0, card_uuid="GPU-b0", memory_mib=12000),)
WAIT_S = 1.0


def inventory(node: str, card: Card) -> InventoryReported:
    return InventoryReported(
        id=f"inv-{node}-{card.memory_mib}-{card.healthy}",
        at=AT,
        node=node,
        cards=(card,),
        source="fixture",
        heartbeat_seconds=3600,
    )


def forgeries() -> dict[str, AnyEvent]:
    """What node A's user writes about node B, each as A's agent would write its own."""
    common = {"at": AT, "node": NODE_B, "pod": VICTIM, "reservation_id": "reserve-victim"}
    tiny = (ContainerShare(container="c", card_index=0, card_uuid="GPU-b0", memory_mib=1),)
    return {
        "release": PodReleased(id="forged-release", reason="deleted", **common),
        "assign": ContainerAssigned(
            id="forged-assign", container="c", card_uuids=("GPU-b0",), **common
        ),
        "correct": AllocationCorrected(
            id="forged-correct", shares=tiny, reason="kubelet", **common
        ),
        "foreign": ForeignCardsHeld(
            id="forged-foreign",
            at=AT,
            node=NODE_B,
            holds=(ForeignHold(card_uuid="GPU-b0", resource="nvidia.com/gpu", pods=("x/y",)),),
        ),
        "reserve": PodReserved(
            id="forged-reserve",
            at=AT,
            node=NODE_B,
            pod=PodRef(namespace="ns", name="pending", uid="uid-pending"),
            shares=tiny,
            policy=ADOPTED_POLICY,
        ),
        "bind": PodBound(id="forged-bind", **common),
    }


@pytest.fixture
async def victim_on_b(secure_nats: SecureNats, admin: Client) -> AsyncIterator[None]:
    """Node B reported by its own user, its pod reserved by the allocator and bound."""
    node_b = await secure_nats.connect(f"node-{NODE_B}")
    allocator = await secure_nats.connect("allocator")
    binder = await secure_nats.connect("binder")
    try:
        await publish_inventory(node_b.jetstream(), inventory(NODE_B, CARD_B))
        reserved = PodReserved(id="reserve-victim", at=AT, node=NODE_B, pod=VICTIM, shares=HELD)
        await AllocationLog(allocator.jetstream()).append(reserved, expected_last_seq=0)
        bound = PodBound(
            id="bind-victim", at=AT, node=NODE_B, pod=VICTIM, reservation_id=reserved.id
        )
        await AllocationLog(binder.jetstream()).append(bound)
        yield
    finally:
        for client in (node_b, allocator, binder):
            await client.close()


async def folded(admin: Client) -> LogFollower:
    follower = LogFollower(admin.jetstream(), use_snapshots=False, keep_snapshots=False)
    await follower.start()
    await follower.stop()
    return follower


@pytest.mark.parametrize("attack", sorted(forgeries()))
async def test_node_a_cannot_change_node_b_through_its_own_subjects(
    attack: str, secure_nats: SecureNats, admin: Client, victim_on_b: None
) -> None:
    before = (await folded(admin)).state.node(NODE_B)
    attacker = await secure_nats.connect(f"node-{NODE_A}")
    try:
        event = forgeries()[attack]
        ack = await attacker.jetstream().publish(
            allocation_subject(NODE_A, "agent"), encode_event(event)
        )
    finally:
        await attacker.close()

    follower = await folded(admin)
    after = follower.state.node(NODE_B)
    assert ack.seq > 0  # NATS took it: A may publish there
    assert after.pods == before.pods
    assert after.used_mib == before.used_mib == {"GPU-b0": 12000}
    assert after.foreign == before.foreign
    assert follower.bad_messages == 1
    assert follower.state.node(NODE_A).pods == {}


async def test_node_a_cannot_shrink_node_b_through_its_inventory_subject(
    secure_nats: SecureNats, admin: Client, victim_on_b: None
) -> None:
    shrunk = Card(index=0, uuid="GPU-b0", model="A100", memory_mib=2048, healthy=False)
    attacker = await secure_nats.connect(f"node-{NODE_A}")
    try:
        forged = encode_event(inventory(NODE_B, shrunk))
        await attacker.jetstream().publish(inventory_subject(NODE_A), forged)
    finally:
        await attacker.close()

    follower = await folded(admin)
    assert follower.state.node(NODE_B).cards == (CARD_B,)
    assert follower.bad_messages >= 1  # read at catch-up, and again live


async def test_a_forgery_does_not_jam_the_forgers_own_node(
    secure_nats: SecureNats, admin: Client, victim_on_b: None
) -> None:
    """The compare-and-set counts every message on A's subjects, forged ones too: the
    fold steps over a refused message, so the next decision on A expects the right
    sequence and goes through."""
    attacker = await secure_nats.connect(f"node-{NODE_A}")
    allocator = await secure_nats.connect("allocator")
    try:
        forged = encode_event(forgeries()["release"])
        await attacker.jetstream().publish(allocation_subject(NODE_A, "agent"), forged)
        await attacker.jetstream().publish(allocation_subject(NODE_A, "agent"), b"\x00junk")
        follower = await folded(admin)
        expected = follower.state.node(NODE_A).last_seq
        share = ContainerShare(container="c", card_index=0, card_uuid="GPU-a0", memory_mib=10)
        pod = PodRef(namespace="ns", name="legit", uid="uid-legit")
        legit = PodReserved(id="reserve-legit", at=AT, node=NODE_A, pod=pod, shares=(share,))
        seq = await AllocationLog(allocator.jetstream()).append(legit, expected_last_seq=expected)
    finally:
        await attacker.close()
        await allocator.close()

    assert seq == expected + 1
    assert follower.bad_messages == 2


async def test_node_a_cannot_write_a_message_bigger_than_the_largest_legitimate_one(
    secure_nats: SecureNats, admin: Client
) -> None:
    attacker = await secure_nats.connect(f"node-{NODE_A}")
    try:
        junk = b"x" * (ALLOCATION_MAX_MSG_BYTES + 1)
        with pytest.raises(APIError, match=r"(?i)maximum"):
            await attacker.jetstream().publish(allocation_subject(NODE_A, "agent"), junk)
    finally:
        await attacker.close()

    info = await admin.jetstream().stream_info(ALLOCATION_STREAM)
    assert info.state.messages == 0


@pytest.fixture
async def binders_consumer(secure_nats: SecureNats, admin: Client) -> AsyncIterator[Client]:
    """The binders' durable consumer, created by a binder, one reservation waiting on it."""
    binder = await secure_nats.connect("binder")
    allocator = await secure_nats.connect("allocator")
    try:
        config = consumer_config(BinderSettings())
        await ensure_streams(admin.jetstream())
        await binder.jetstream().pull_subscribe(
            ALL_ALLOCATIONS, durable=BINDER_CONSUMER, stream=BINDER_QUEUE_STREAM, config=config
        )
        share = ContainerShare(container="c", card_index=0, card_uuid="GPU-b0", memory_mib=10)
        waiting = PodReserved(id="reserve-w", at=AT, node=NODE_B, pod=VICTIM, shares=(share,))
        await AllocationLog(allocator.jetstream()).append(waiting)
        yield binder
    finally:
        await allocator.close()
        await binder.close()


ATTACKERS = [f"node-{NODE_A}", "auditor", "allocator"]
API = "$JS.API"


async def answer_or_refusal(client: Client, subject: str, body: bytes) -> dict[str, object]:
    """The JetStream API's JSON answer, or ``{"refused": ...}`` for a permissions violation."""
    try:
        reply = await client.request(subject, body, timeout=WAIT_S)
    except NatsTimeout:
        assert "permissions violation" in str(client.last_error).lower()
        return {"refused": str(client.last_error)}
    answer: dict[str, object] = json.loads(reply.data)
    return answer


@pytest.mark.parametrize("user", ATTACKERS)
async def test_nobody_but_a_binder_pulls_from_the_binders_consumer(
    user: str, secure_nats: SecureNats, binders_consumer: Client, admin: Client
) -> None:
    attacker = await secure_nats.connect(user)
    try:
        next_ = f"{API}.CONSUMER.MSG.NEXT.{BINDER_QUEUE_STREAM}.{BINDER_CONSUMER}"
        answer = await answer_or_refusal(attacker, next_, b'{"batch": 1, "expires": 500000000}')
    finally:
        await attacker.close()

    assert "refused" in answer
    info = await admin.jetstream().consumer_info(BINDER_QUEUE_STREAM, BINDER_CONSUMER)
    assert info.num_pending == 1  # still the binders'
    assert info.num_ack_pending == 0


@pytest.mark.parametrize("user", ATTACKERS)
async def test_nobody_but_a_binder_acknowledges_for_the_binders(
    user: str, secure_nats: SecureNats, binders_consumer: Client, admin: Client
) -> None:
    attacker = await secure_nats.connect(user)
    try:
        ack = f"$JS.ACK.{BINDER_QUEUE_STREAM}.{BINDER_CONSUMER}.1.1.1.0.0"
        await attacker.publish(ack, b"+ACK")
        await attacker.flush()
        await eventually(lambda: "permissions violation" in str(attacker.last_error).lower())
    finally:
        await attacker.close()


def rewritten(name_in: str) -> bytes:
    """A consumer create/update request that would point the binders' consumer nowhere."""
    config = {"deliver_policy": "all", "ack_policy": "explicit", "filter_subject": "nowhere"}
    config[name_in] = BINDER_CONSUMER
    return json.dumps({"stream_name": BINDER_QUEUE_STREAM, "config": config}).encode()


@pytest.mark.parametrize("user", ATTACKERS)
@pytest.mark.parametrize(
    "route",
    [
        (f"{API}.CONSUMER.DURABLE.CREATE.{BINDER_QUEUE_STREAM}.{BINDER_CONSUMER}", "durable_name"),
        (f"{API}.CONSUMER.CREATE.{BINDER_QUEUE_STREAM}.{BINDER_CONSUMER}", "name"),
        (f"{API}.CONSUMER.CREATE.{BINDER_QUEUE_STREAM}.{BINDER_CONSUMER}.nowhere", "name"),
        (f"{API}.CONSUMER.CREATE.{BINDER_QUEUE_STREAM}", "name"),
        (f"{API}.CONSUMER.CREATE.{BINDER_QUEUE_STREAM}", "durable_name"),
    ],
)
async def test_nobody_but_a_binder_changes_the_binders_consumer(
    user: str,
    route: tuple[str, str],
    secure_nats: SecureNats,
    binders_consumer: Client,
    admin: Client,
) -> None:
    subject, name_in = route
    attacker = await secure_nats.connect(user)
    try:
        answer = await answer_or_refusal(attacker, subject, rewritten(name_in))
    finally:
        await attacker.close()

    assert "refused" in answer or "error" in answer, answer
    info = await admin.jetstream().consumer_info(BINDER_QUEUE_STREAM, BINDER_CONSUMER)
    assert info.config.filter_subjects == list(BINDER_WORK)


async def test_a_binder_still_pulls_acknowledges_and_recreates_its_consumer(
    binders_consumer: Client, admin: Client
) -> None:
    js = binders_consumer.jetstream()
    again = await js.pull_subscribe(
        ALL_ALLOCATIONS,
        durable=BINDER_CONSUMER,
        stream=BINDER_QUEUE_STREAM,
        config=consumer_config(BinderSettings()),
    )
    (message,) = await again.fetch(1, timeout=5)
    await message.ack_sync()

    info = await admin.jetstream().consumer_info(BINDER_QUEUE_STREAM, BINDER_CONSUMER)
    assert info.num_pending == 0
    assert info.num_ack_pending == 0


async def test_a_node_cannot_delete_the_binders_consumer(
    secure_nats: SecureNats, binders_consumer: Client, admin: Client
) -> None:
    attacker = await secure_nats.connect(f"node-{NODE_A}")
    try:
        with pytest.raises((NatsTimeout, BadRequestError)):
            await attacker.jetstream(timeout=WAIT_S).delete_consumer(
                BINDER_QUEUE_STREAM, BINDER_CONSUMER
            )
    finally:
        await attacker.close()

    assert (await admin.jetstream().consumer_info(BINDER_QUEUE_STREAM, BINDER_CONSUMER)).name
