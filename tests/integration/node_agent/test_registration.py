"""Registering with a kubelet that is slow to answer ``Register``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from gpushare.kubelet_api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpushare.node_agent import registration
from gpushare.node_agent.registration import PluginEndpoint, socket_address
from gpushare.node_agent.settings import NodeTarget
from tests.integration.kube.waiting import eventually


class Options(api_pb2_grpc.DevicePluginServicer):
    def __init__(self) -> None:
        self.options_asked = 0

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        self.options_asked += 1
        return api_pb2.DevicePluginOptions()


class SlowKubelet(api_pb2_grpc.RegistrationServicer):
    """Dials the plugin back and asks its options, as the kubelet does, then takes long."""

    def __init__(self, plugin_dir: Path, answer_after: float) -> None:
        self.plugin_dir = plugin_dir
        self.answer_after = answer_after
        self.registers = 0

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Empty:
        self.registers += 1
        address = socket_address(self.plugin_dir / request.endpoint)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            await stub.GetDevicePluginOptions(api_pb2.Empty())
        await asyncio.sleep(self.answer_after)
        return api_pb2.Empty()


async def test_a_register_the_kubelet_took_but_answered_late_is_not_repeated(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Registering twice is what the kubelet cannot survive: the first registration's
    stream, when it ends, disconnects the second."""
    monkeypatch.setattr(registration, "REGISTER_TIMEOUT_SECONDS", 0.3)
    target = NodeTarget(name="n1", plugin_dir=short_dir / "device-plugins")
    target.plugin_dir.mkdir(parents=True)
    kubelet = SlowKubelet(target.plugin_dir, answer_after=1.0)
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(socket_address(target.kubelet_socket))
    await server.start()
    servicer = Options()
    endpoint = PluginEndpoint(
        target, servicer, "aliyun.com/gpu-mem", poll_seconds=0.05, retry_seconds=0.05
    )
    stop = asyncio.Event()
    running = asyncio.create_task(endpoint.run(stop))
    try:
        await eventually(lambda: endpoint.registrations > 0)
        await asyncio.sleep(0.5)  # time enough for a second Register, if it were sent
        assert kubelet.registers == 1
        assert endpoint.registrations == 1
        assert servicer.options_asked == 1
    finally:
        stop.set()
        await running
        await server.stop(0)
