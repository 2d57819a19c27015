"""The node agent's ``/metrics``: Allocate outcomes, preferred allocations, log lag by node."""

from __future__ import annotations

import asyncio

import pytest
from nats.js import JetStreamContext
from prometheus_client import REGISTRY

from gpushare.bus.subjects import ALLOCATION_STREAM, node_allocations
from gpushare.embedded.kubelet import AdmissionError
from gpushare.exposition import MetricsServer
from gpushare.node_agent.__main__ import serve_agent_metrics
from gpushare.node_agent.settings import NodeTarget
from tests.integration.kube.waiting import POLL_S
from tests.integration.metrics.scraping import Scrape, scrape
from tests.integration.node_agent.conftest import StartAgent, StartKubelet
from tests.integration.node_agent.logbook import RESOURCE, Logbook, gpu, pod_spec

ALLOCATIONS = "gpushare_node_agent_allocations_total"
PREFERRED = "gpushare_node_agent_preferred_allocations_total"


def now(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def caught_up(server: MetricsServer, js: JetStreamContext, node: str) -> Scrape:
    """A scrape once the node's follower has folded the node's last event."""
    last = (await js.get_last_msg(ALLOCATION_STREAM, node_allocations(node))).seq
    for _ in range(int(20 / POLL_S)):
        scraped = await scrape(server.url)
        if scraped.value("gpushare_node_agent_log_applied_seq", node=node) == last:
            return scraped
        await asyncio.sleep(POLL_S)
    raise AssertionError(f"the node agent never folded seq {last}")


async def test_allocate_outcomes_and_lag(
    js: JetStreamContext, target: NodeTarget, start_agent: StartAgent, start_kubelet: StartKubelet
) -> None:
    book = Logbook(js)
    await book.report(gpu(0), gpu(1))
    kubelet = await start_kubelet(target)
    agent = await start_agent(target)
    await kubelet.wait_for_devices(RESOURCE, lambda devices: len(devices) == 8192)
    server = await serve_agent_metrics(js, [agent], 0)
    node = target.name
    assigned, refused = (
        now(ALLOCATIONS, node=node, outcome="assigned"),
        now(ALLOCATIONS, node=node, outcome="refused"),
    )
    matched = now(PREFERRED, node=node, outcome="matched")
    try:
        await book.bind(await book.reserve("p", [("c", gpu(1), 1024, False)]))
        await kubelet.admit(pod_spec("p", {"c": 1024}))
        with pytest.raises(AdmissionError):
            await kubelet.admit(pod_spec("stray", {"c": 2048}))
        scraped = await caught_up(server, js, node)
    finally:
        await server.stop()
    assert scraped.value(ALLOCATIONS, node=node, outcome="assigned") == assigned + 1
    assert scraped.value(ALLOCATIONS, node=node, outcome="refused") == refused + 1
    assert scraped.value(PREFERRED, node=node, outcome="matched") == matched + 1
    assert scraped.value("gpushare_node_agent_log_lag_events", node=node) == 0
    assert scraped.value("gpushare_node_agent_log_idle_seconds", node=node) is not None
