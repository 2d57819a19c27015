"""A node agent and a test kubelet on real unix sockets, over a real nats-server."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from gpushare.embedded.kubelet import EmbeddedKubelet
from gpushare.node_agent.agent import NodeAgent
from gpushare.node_agent.settings import AgentSettings, NodeTarget

FAST = AgentSettings(
    registration_poll_seconds=0.05,
    register_retry_seconds=0.05,
    match_wait_seconds=1.0,
    reconcile_interval_seconds=0,
    reconcile_after_allocate=False,
    reconcile_at_start=False,
    missing_grace_seconds=0,
)
"""Quick to notice a kubelet restart; Allocate gives up on an unexplained call after 1 s;
the pod-resources check runs only when a test calls it."""

StartAgent = Callable[..., Awaitable[NodeAgent]]
StartKubelet = Callable[..., Awaitable[EmbeddedKubelet]]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths must stay under ~107 bytes; pytest's tmp_path may be longer."""
    path = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def target(short_dir: Path) -> NodeTarget:
    return NodeTarget(name="n1", plugin_dir=short_dir / "device-plugins")


@pytest.fixture
async def start_agent(js: JetStreamContext) -> AsyncIterator[StartAgent]:
    agents: list[NodeAgent] = []

    async def start(target: NodeTarget, settings: AgentSettings = FAST) -> NodeAgent:
        agent = NodeAgent(js, target, settings)
        await agent.start()
        agents.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in agents:
            await agent.stop()


@pytest.fixture
async def start_kubelet() -> AsyncIterator[StartKubelet]:
    kubelets: list[EmbeddedKubelet] = []

    async def start(
        target: NodeTarget, seed: int = 0, serve_pod_resources: bool = True
    ) -> EmbeddedKubelet:
        kubelet = EmbeddedKubelet(
            target.name,
            target.plugin_dir,
            seed=seed,
            serve_pod_resources=serve_pod_resources,
            keep_checkpoint=True,
        )
        await kubelet.start()
        kubelets.append(kubelet)
        return kubelet

    try:
        yield start
    finally:
        for kubelet in kubelets:
            await kubelet.stop()
