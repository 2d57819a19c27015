"""The binder asks a node's agent before binding to it, over a real nats-server."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from gpushare.binder.gating import AgentGate
from gpushare.node_agent.readiness import ReadinessResponder


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
