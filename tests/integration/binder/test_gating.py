"""The binder asks a node's agent before binding to it, over a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext
from prometheus_client import REGISTRY

from gpushare.binder.gating import AgentGate
from gpushare.binder.service import Binder
from gpushare.bus.log import AllocationLog
from gpushare.bus.subjects import AGENT_WAITING
from gpushare.core.events import PodBound
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.kube.client import KubeClient
from gpushare.node_agent.readiness import ReadinessResponder
from tests.fakes import FakeClock
from tests.integration.binder.conftest import FAST
from tests.integration.binder.test_binder import (
    NODE,
    create_pod,
    first_logged,
    report_cards,
    reservation,
    reserve,
)
from tests.integration.kube.waiting import eventually


class Switch:
    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self) -> bool:
        return self.on


async def test_a_node_no_agent_of_ours_ever_answered_is_not_waited_for(nc: Client) -> None:
    gate = AgentGate(nc, wait_seconds=30.0)
    assert await asyncio.wait_for(gate.wait_serving("plain-node"), 2.0) is False


async def test_a_serving_agent_lets_the_binding_through(nc: Client) -> None:
    responder = ReadinessResponder(nc, "n1", Switch(True))
    await responder.start()
    try:
        assert await AgentGate(nc, wait_seconds=30.0).wait_serving("n1") is True
    finally:
        await responder.stop()


async def test_an_agent_gone_after_answering_is_waited_for_until_it_serves_again(
    nc: Client,
) -> None:
    gate = AgentGate(nc, wait_seconds=30.0)
    first = ReadinessResponder(nc, "n1", Switch(True))
    await first.start()
    assert await gate.wait_serving("n1") is True
    await first.stop()  # the agent dies: no responders from now on

    waiting = asyncio.create_task(gate.wait_serving("n1"))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    registering = Switch(False)
    again = ReadinessResponder(nc, "n1", registering)
    await again.start()  # back, but not registered with the kubelet yet
    await asyncio.sleep(0.5)
    assert not waiting.done()
    registering.on = True
    try:
        assert await asyncio.wait_for(waiting, 5.0) is True
    finally:
        await again.stop()


async def test_the_wait_ends_and_the_binding_goes_ahead(nc: Client) -> None:
    responder = ReadinessResponder(nc, "n1", Switch(False))
    await responder.start()
    try:
        started = asyncio.get_running_loop().time()
        assert await AgentGate(nc, wait_seconds=0.5).wait_serving("n1") is False
        assert asyncio.get_running_loop().time() - started < 5.0
    finally:
        await responder.stop()


@contextlib.asynccontextmanager
async def answering(nc: Client, node: str, readiness: Switch) -> AsyncIterator[None]:
    """``node``'s agent answering the binder's readiness requests from ``readiness``."""
    responder = ReadinessResponder(nc, node, readiness)
    await responder.start()
    try:
        yield
    finally:
        await responder.stop()


class Counting(Switch):
    """A readiness that counts how often the agent was asked."""

    def __init__(self, on: bool) -> None:
        super().__init__(on)
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.on


async def test_a_ready_answer_serves_the_nodes_next_bindings_for_the_reuse_time(
    nc: Client, clock: FakeClock
) -> None:
    readiness = Counting(True)
    gate = AgentGate(nc, wait_seconds=30.0, clock=clock, reuse_seconds=0.1)
    async with answering(nc, "n1", readiness):
        assert await gate.wait_serving("n1") is True
        clock.advance(0.05)
        assert await gate.wait_serving("n1") is True
        assert readiness.asked == 1
        clock.advance(0.06)  # past 0.1 s after the answer: asked again
        assert await gate.wait_serving("n1") is True
        assert readiness.asked == 2


async def test_a_waiting_answer_is_never_reused(nc: Client, clock: FakeClock) -> None:
    """The agent stops serving (the kubelet restarted) right after a reused ``ready``
    runs out: the next binding asks, hears ``waiting``, and waits until ``ready``."""
    readiness = Counting(True)
    gate = AgentGate(nc, wait_seconds=30.0, clock=clock, reuse_seconds=0.1)
    async with answering(nc, "n1", readiness):
        assert await gate.wait_serving("n1") is True
        readiness.on = False
        clock.advance(0.11)
        waiting = asyncio.create_task(gate.wait_serving("n1"))
        await eventually(lambda: readiness.asked >= 3)  # asked again while it waits
        assert not waiting.done()
        readiness.on = True
        assert await asyncio.wait_for(waiting, 5.0) is True


def questions(answer: str) -> float:
    return (
        REGISTRY.get_sample_value("gpushare_binder_agent_questions_total", {"answer": answer})
        or 0.0
    )


async def test_without_reuse_every_binding_asks(nc: Client, clock: FakeClock) -> None:
    readiness = Counting(True)
    gate = AgentGate(nc, wait_seconds=30.0, clock=clock)
    before = questions("ready")
    async with answering(nc, "n1", readiness):
        for _ in range(3):
            assert await gate.wait_serving("n1") is True
        assert readiness.asked == 3
    assert questions("ready") - before == 3


async def test_each_question_is_counted_by_its_answer(nc: Client, clock: FakeClock) -> None:
    gate = AgentGate(nc, wait_seconds=30.0, clock=clock, reuse_seconds=0.1)
    counted = {answer: questions(answer) for answer in ("ready", "waiting", "none")}
    async with answering(nc, "n1", Counting(False)):
        assert await gate.ask("n1") == AGENT_WAITING
    assert await gate.ask("n2") is None  # no agent
    async with answering(nc, "n1", Counting(True)):
        assert await gate.wait_serving("n1") is True
        assert await gate.wait_serving("n1") is True  # reused: not asked
    assert {answer: questions(answer) - before for answer, before in counted.items()} == {
        "ready": 1,
        "waiting": 1,
        "none": 1,
    }


async def test_a_node_our_reporter_inventoried_is_waited_for_by_a_binder_that_just_started(
    nc: Client,
) -> None:
    """The agent died before this binder asked it anything: the log's inventory says the
    node is ours, so the binding waits for the agent rather than failing admission."""
    gate = AgentGate(nc, wait_seconds=30.0, ours=lambda node: node == "n1")
    waiting = asyncio.create_task(gate.wait_serving("n1"))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    responder = ReadinessResponder(nc, "n1", Switch(True))
    await responder.start()
    try:
        assert await asyncio.wait_for(waiting, 5.0) is True
    finally:
        await responder.stop()


async def test_a_binding_waiting_for_one_nodes_agent_holds_up_no_other_nodes_binding(
    nc: Client,
    js: JetStreamContext,
    kube: KubeClient,
    kube_api: KubeApiServer,
    clock: FakeClock,
) -> None:
    """One node's agent is registering (it answers "waiting"): its pod waits, and a pod
    reserved after it on a node whose agent serves is bound meanwhile. A binder stopped
    while it waits leaves that reservation to the next binder at once."""
    registering = Switch(False)
    responders = [
        ReadinessResponder(nc, "slow-node", registering),
        ReadinessResponder(nc, NODE, Switch(True)),
    ]
    for responder in responders:
        await responder.start()
    binders: list[Binder] = []

    async def start_binder() -> Binder:
        gate = AgentGate(nc, wait_seconds=30.0)
        binders.append(await Binder(js, kube, FAST, clock, gate=gate).start())
        return binders[-1]

    def node_of(name: str) -> str | None:
        stored = kube_api.get("pods", name, "ns")
        assert stored is not None
        return stored["spec"].get("nodeName")

    try:
        first = await start_binder()
        await report_cards(js, clock)
        waits = create_pod(kube_api, "waits")
        await AllocationLog(js).append(
            msgspec.structs.replace(
                reservation(clock, waits), node="slow-node", id=f"reserve-{waits.uid}"
            )
        )
        goes = create_pod(kube_api, "goes")
        await reserve(js, clock, goes)

        bound = await first_logged(js, PodBound, within=5.0)
        assert bound.pod == goes
        assert node_of("waits") is None

        await asyncio.wait_for(first.stop(), 5.0)  # not the 30 s the binding would wait
        registering.on = True
        await start_binder()
        await eventually(lambda: node_of("waits") == "slow-node")
    finally:
        for binder in binders:
            await binder.stop()
        for responder in responders:
            await responder.stop()
