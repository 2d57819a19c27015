"""The generated users and permissions, enforced by a real nats-server over TLS."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime

import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError

from gpushare.binder.gating import AgentGate
from gpushare.bus.log import AllocationLog, AppendConflict, publish_inventory
from gpushare.bus.permissions import inbox_prefix
from gpushare.bus.streams import allocation_config
from gpushare.bus.subjects import (
    AGENT_READY,
    ALL_ALLOCATIONS,
    ALLOCATION_STREAM,
    agent_ready_subject,
    allocation_subject,
    inventory_subject,
    node_allocations,
)
from gpushare.core.events import ContainerAssigned, InventoryReported, PodBound, PodReserved
from gpushare.core.model import Card, ContainerShare, PodRef
from gpushare.node_agent.readiness import ReadinessResponder
from tests.integration.kube.waiting import eventually
from tests.security.conftest import NODE_A, NODE_B, SecureNats

AT = datetime(2026, 1, 1, tzinfo=UTC)
POD = PodRef(namespace="ns", name="web", uid="uid-web")
REFUSAL_WAIT_S = 1.0
"""How long a refused request waits for the answer the server never sends."""


def reservation(node: str, uid: str = "uid-web") -> PodReserved:
    share = ContainerShare(container="c", card_index=0, card_uuid="GPU-0", memory_mib=1000)
    pod = PodRef(namespace="ns", name=uid, uid=uid)
    return PodReserved(id=f"reserve-{uid}", at=AT, node=node, pod=pod, shares=(share,))


def inventory(node: str) -> InventoryReported:
    card = Card(index=0, uuid="GPU-0", model="T4", memory_mib=16000)
    return InventoryReported(
        id=f"inv-{node}", at=AT, node=node, cards=(card,), source="fixture", heartbeat_seconds=5
    )


async def refused(client: Client, call: Awaitable[object]) -> None:
    """``call`` gets no answer, and the server says why: a permissions violation."""
    with pytest.raises(NatsTimeout):
        await call
    assert "permissions violation" in str(client.last_error).lower()


async def subjects_of(admin: Client, subject: str) -> list[str]:
    log = AllocationLog(admin.jetstream())
    return [type(event).__name__ async for _, event in log.read(subject)]


async def test_a_node_cannot_write_another_nodes_subjects(
    secure_nats: SecureNats, admin: Client
) -> None:
    node_a = await secure_nats.connect(f"node-{NODE_A}")
    js = node_a.jetstream()
    try:
        assert await publish_inventory(js, inventory(NODE_A)) == 1
        await refused(node_a, js.publish(inventory_subject(NODE_B), b"{}", timeout=REFUSAL_WAIT_S))
        other = allocation_subject(NODE_B, "agent")
        await refused(node_a, js.publish(other, b"{}", timeout=REFUSAL_WAIT_S))
    finally:
        await node_a.close()
    assert await subjects_of(admin, node_allocations(NODE_B)) == []
    info = await admin.jetstream().stream_info("GPUSHARE_INVENTORY")
    assert info.state.messages == 1


async def test_a_node_agent_appends_its_events_but_never_a_reservation(
    secure_nats: SecureNats, admin: Client
) -> None:
    node_a = await secure_nats.connect(f"node-{NODE_A}")
    log = AllocationLog(node_a.jetstream(timeout=REFUSAL_WAIT_S))
    assigned = ContainerAssigned(
        id="assigned-1", at=AT, node=NODE_A, pod=POD, reservation_id="r", container="c",
        card_uuids=("GPU-0",),
    )  # fmt: skip
    try:
        assert await log.append(assigned) == 1
        forged = log.append(reservation(NODE_A))  # an allocator's subject
        await refused(node_a, forged)
        as_binder = AllocationLog(node_a.jetstream(timeout=REFUSAL_WAIT_S), writer="binder")
        await refused(node_a, as_binder.append(reservation(NODE_A, uid="other")))
    finally:
        await node_a.close()
    assert await subjects_of(admin, node_allocations(NODE_A)) == ["ContainerAssigned"]


async def test_only_the_allocator_reserves_and_its_compare_and_set_spans_all_writers(
    secure_nats: SecureNats, admin: Client
) -> None:
    allocator = await secure_nats.connect("allocator")
    binder = await secure_nats.connect("binder")
    try:
        reserving = AllocationLog(allocator.jetstream(timeout=REFUSAL_WAIT_S))
        first = await reserving.append(reservation(NODE_B), expected_last_seq=0)
        bound = PodBound(id="bound", at=AT, node=NODE_B, pod=POD, reservation_id="reserve-uid-web")
        await refused(allocator, reserving.append(bound))  # the binder's to append
        assert await AllocationLog(binder.jetstream()).append(bound) == first + 1
        with pytest.raises(AppendConflict):  # the binder appended since `first`
            await reserving.append(reservation(NODE_B, uid="late"), expected_last_seq=first)
        assert await reserving.append(reservation(NODE_B, uid="late"), first + 1) == first + 2
    finally:
        await allocator.close()
        await binder.close()
    kinds = await subjects_of(admin, node_allocations(NODE_B))
    assert kinds == ["PodReserved", "PodBound", "PodReserved"]


@pytest.mark.parametrize("user", ["allocator", "binder", f"node-{NODE_A}", "auditor"])
async def test_no_service_can_delete_purge_or_rewrite_the_allocation_log(
    secure_nats: SecureNats, admin: Client, user: str
) -> None:
    await AllocationLog(admin.jetstream()).append(reservation(NODE_A))
    await admin.jetstream().pull_subscribe(ALL_ALLOCATIONS, durable="binder")  # the binders'
    client = await secure_nats.connect(user)
    js = client.jetstream(timeout=REFUSAL_WAIT_S)
    try:
        loose = allocation_config()
        loose.deny_delete = loose.deny_purge = False
        await asyncio.gather(  # each waits out its own refusal; together, one wait
            refused(client, js.delete_stream(ALLOCATION_STREAM)),
            refused(client, js.purge_stream(ALLOCATION_STREAM)),
            refused(client, js.delete_msg(ALLOCATION_STREAM, 1)),
            refused(client, js.update_stream(loose)),
            refused(client, js.delete_consumer(ALLOCATION_STREAM, "binder")),
        )
    finally:
        await client.close()
    info = await admin.jetstream().stream_info(ALLOCATION_STREAM)
    assert (info.state.messages, info.config.deny_delete, info.config.deny_purge) == (1, True, True)


async def test_even_admin_cannot_purge_or_delete_messages_from_the_log(admin: Client) -> None:
    js = admin.jetstream()
    await AllocationLog(js).append(reservation(NODE_A))
    with pytest.raises(APIError):
        await js.purge_stream(ALLOCATION_STREAM)
    with pytest.raises(APIError):
        await js.delete_msg(ALLOCATION_STREAM, 1)
    assert (await js.stream_info(ALLOCATION_STREAM)).state.messages == 1


async def test_the_auditor_reads_everything_and_writes_nothing(
    secure_nats: SecureNats, admin: Client
) -> None:
    await AllocationLog(admin.jetstream()).append(reservation(NODE_A))
    auditor = await secure_nats.connect("auditor")
    try:
        log = AllocationLog(auditor.jetstream(timeout=REFUSAL_WAIT_S))
        assert [type(e).__name__ async for _, e in log.read()] == ["PodReserved"]
        await refused(auditor, log.append(reservation(NODE_B)))
        js = auditor.jetstream()
        await refused(auditor, js.publish(inventory_subject(NODE_A), b"{}", timeout=REFUSAL_WAIT_S))
    finally:
        await auditor.close()


async def test_a_service_cannot_listen_to_another_services_replies(
    secure_nats: SecureNats,
) -> None:
    """Each user's replies and deliveries arrive under its own inbox prefix, and it may
    subscribe there only: a node cannot read the allocator's publish acks or its API answers."""
    node_a = await secure_nats.connect(f"node-{NODE_A}")
    try:
        assert node_a.new_inbox().startswith(inbox_prefix(f"node-{NODE_A}") + ".")
        for stolen in (f"{inbox_prefix('allocator')}.>", "_INBOX.>", ">"):
            await node_a.subscribe(stolen)
            await node_a.flush()
            said = f'permissions violation for subscription to "{stolen}"'.lower()
            await eventually(lambda: said in str(node_a.last_error).lower())  # noqa: B023
    finally:
        await node_a.close()


async def asked_until_answered(nc: Client, subject: str, attempts: int = 20) -> bytes:
    """The reply to a request on ``subject``, asked again while nobody answers yet (a CI
    run once got no responders right after the responder's flushed subscription)."""
    for _ in range(attempts - 1):
        try:
            return (await nc.request(subject, b"", timeout=2)).data
        except NoRespondersError:
            await asyncio.sleep(0.1)
    return (await nc.request(subject, b"", timeout=2)).data


async def test_a_node_answers_the_binders_readiness_question_for_itself_only(
    secure_nats: SecureNats,
) -> None:
    binder = await secure_nats.connect("binder")
    node_a = await secure_nats.connect(f"node-{NODE_A}")
    try:
        responder = ReadinessResponder(node_a, NODE_A, lambda: True)
        await responder.start()
        assert await asked_until_answered(binder, agent_ready_subject(NODE_A)) == AGENT_READY
        await node_a.subscribe(agent_ready_subject(NODE_B))  # pretending to be node B
        await node_a.flush()
        said = f'permissions violation for subscription to "{agent_ready_subject(NODE_B)}"'
        await eventually(lambda: said.lower() in str(node_a.last_error).lower())
        assert await AgentGate(binder, wait_seconds=0.5).wait_serving(NODE_B) is False
    finally:
        await node_a.close()
        await binder.close()
