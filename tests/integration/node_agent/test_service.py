"""``gpushare node-agent``'s serve loop: one process, several simulated nodes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.js import JetStreamContext

from gpushare.embedded.nats_server import NatsServer
from gpushare.node_agent.__main__ import serve
from gpushare.node_agent.settings import AgentSettings, NodeTarget
from tests.integration.node_agent.conftest import StartKubelet
from tests.integration.node_agent.logbook import RESOURCE, Logbook, gpu


async def test_serves_several_nodes_until_stopped(
    nats_server: NatsServer, js: JetStreamContext, short_dir: Path, start_kubelet: StartKubelet
) -> None:
    targets = [NodeTarget(name=n, plugin_dir=short_dir / n / "device-plugins") for n in ("a", "b")]
    await Logbook(js, node="a").report(gpu(0, mib=1024))
    await Logbook(js, node="b").report(gpu(0, mib=1024), gpu(1, mib=1024))
    kubelets = [await start_kubelet(target) for target in targets]
    settings = AgentSettings(
        nats_url=nats_server.url, registration_poll_seconds=0.05, register_retry_seconds=0.05
    )
    stop = asyncio.Event()
    service = asyncio.create_task(serve(settings, targets, stop))

    await kubelets[0].wait_for_devices(RESOURCE, lambda devices: len(devices) == 1024)
    await kubelets[1].wait_for_devices(RESOURCE, lambda devices: len(devices) == 2048)
    stop.set()
    await service

    assert not any(target.plugin_socket.exists() for target in targets)
