"""The DRA kubelet plugin on real unix sockets, over a real nats-server: registration as
the kubelet's plugin watcher sees it, and claims prepared from the allocation log."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import grpc
import pytest

from gpushare.bus.log import publish_inventory
from gpushare.core.cdi import CDI_KIND
from gpushare.core.dra import DRIVER
from gpushare.core.events import ClaimAllocated, ClaimShare, InventoryReported
from gpushare.core.model import ClaimRef
from gpushare.kubelet_api.dra.v1 import api_pb2 as dra_pb2
from gpushare.kubelet_api.dra.v1 import api_pb2_grpc as dra_grpc
from gpushare.kubelet_api.pluginregistration.v1 import api_pb2 as reg_pb2
from gpushare.kubelet_api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from gpushare.node_agent.dra_plugin import spec_path
from gpushare.node_agent.settings import NodeTarget
from tests.integration.kube.waiting import eventually
from tests.integration.node_agent.conftest import FAST, StartAgent
from tests.integration.node_agent.logbook import Logbook, gpu
from tests.unit.node_agent.builders import T0, at

CARD = gpu(0, mib=16384)


def claim_allocated(uid: str, memory_mib: int) -> ClaimAllocated:
    return ClaimAllocated(
        id=f"claim-{uid}",
        at=T0,
        node="n1",
        claim=ClaimRef(namespace="ns", name=f"pod-{uid}-gpu", uid=uid),
        shares=(
            ClaimShare(
                request="gpu",
                device="gpu-0",
                card_index=0,
                card_uuid=CARD.uuid,
                memory_mib=memory_mib,
                core_percent=0,
                share_id="9b2e",
            ),
        ),
    )


async def report_dra(book: Logbook) -> None:
    await publish_inventory(
        book.js,
        InventoryReported(
            id="inv-dra",
            at=at(1),
            node="n1",
            cards=(CARD,),
            source="fixture",
            heartbeat_seconds=5,
            front_door="dra",
        ),
    )


def claim(uid: str, name: str = "") -> dra_pb2.Claim:
    return dra_pb2.Claim(namespace="ns", uid=uid, name=name or f"pod-{uid}-gpu")


async def test_the_plugin_registers_and_prepares_claims_from_the_log(
    js: object, target: NodeTarget, short_dir: Path, start_agent: StartAgent
) -> None:
    book = Logbook(js)  # type: ignore[arg-type]
    await report_dra(book)
    await book.log.append(claim_allocated("c1", 4096))
    settings = dataclasses.replace(FAST, front_door="dra", cdi_dir=short_dir / "cdi")
    agent = await start_agent(target, settings)
    await eventually(target.dra_registration_socket.exists)

    async with grpc.aio.insecure_channel(f"unix://{target.dra_registration_socket}") as channel:
        info = await reg_grpc.RegistrationStub(channel).GetInfo(reg_pb2.InfoRequest())  # type: ignore[no-untyped-call]
        assert (info.type, info.name) == ("DRAPlugin", DRIVER)
        assert list(info.supported_versions) == ["v1.DRAPlugin"]
        assert info.endpoint == str(target.dra_socket)
        await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(  # type: ignore[no-untyped-call]
            reg_pb2.RegistrationStatus(plugin_registered=True)
        )
    assert agent.dra is not None
    assert agent.dra.registration.registered

    async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as channel:
        plugin = dra_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
        # c2 is allocated only while the kubelet waits: prepared once the log has it
        pending = plugin.NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=[claim("c1"), claim("c2"), claim("")])
        )
        await book.log.append(claim_allocated("c2", 2048))
        answer = await pending
        assert set(answer.claims) == {"c1", "c2", ""}
        assert "has no UID" in answer.claims[""].error
        (device,) = answer.claims["c1"].devices
        assert not answer.claims["c1"].error
        assert (list(device.request_names), device.pool_name, device.device_name) == (
            ["gpu"],
            "n1",
            "gpu-0",
        )
        assert device.share_id == "9b2e"
        (cdi_id,) = device.cdi_device_ids
        assert cdi_id.startswith(f"{CDI_KIND}=c1-")
        spec = json.loads(spec_path(short_dir / "cdi", "c1").read_text())
        (cdi_device,) = spec["devices"]
        assert f"{CDI_KIND}={cdi_device['name']}" == cdi_id
        assert f"NVIDIA_VISIBLE_DEVICES={CARD.uuid}" in cdi_device["containerEdits"]["env"]
        assert "GPUSHARE_MEMORY_LIMIT_MIB=4096" in cdi_device["containerEdits"]["env"]
        assert answer.claims["c2"].devices[0].device_name == "gpu-0"

        unknown = await plugin.NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=[claim("nobody")])
        )
        assert "not allocated on node n1" in unknown.claims["nobody"].error

        gone = await plugin.NodeUnprepareResources(
            dra_pb2.NodeUnprepareResourcesRequest(claims=[claim("c1"), claim("never")])
        )
        assert not gone.claims["c1"].error
        assert not gone.claims["never"].error
        assert not spec_path(short_dir / "cdi", "c1").exists()
        assert spec_path(short_dir / "cdi", "c2").exists()


async def test_bytes_that_are_no_request_get_an_error_and_the_plugin_lives_on(
    js: object, target: NodeTarget, short_dir: Path, start_agent: StartAgent
) -> None:
    settings = dataclasses.replace(FAST, front_door="dra", cdi_dir=short_dir / "cdi")
    await start_agent(target, settings)
    await eventually(target.dra_socket.exists)
    async with grpc.aio.insecure_channel(f"unix://{target.dra_socket}") as channel:
        raw = channel.unary_unary(
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            request_serializer=lambda body: body,
            response_deserializer=lambda body: body,
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await raw(b"\xff\xff\xff not a protobuf")
        assert "Wire format was corrupt" in str(refused.value.details())
        plugin = dra_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
        answer = await plugin.NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=[claim("")])
        )
        assert "has no UID" in answer.claims[""].error


async def test_the_plugin_serves_again_when_its_sockets_are_removed(
    js: object, target: NodeTarget, short_dir: Path, start_agent: StartAgent
) -> None:
    """A restarted kubelet may clean its plugin directories: the sockets come back."""
    settings = dataclasses.replace(FAST, front_door="dra", cdi_dir=short_dir / "cdi")
    agent = await start_agent(target, settings)
    assert agent.dra is not None
    await eventually(target.dra_registration_socket.exists)
    target.dra_registration_socket.unlink()
    await eventually(lambda: agent.dra is not None and agent.dra.starts == 2)
    assert target.dra_registration_socket.exists()


async def test_an_extender_node_serves_no_dra_plugin(
    js: object, target: NodeTarget, start_agent: StartAgent
) -> None:
    agent = await start_agent(target)
    assert agent.dra is None
    assert not target.dra_registration_socket.exists()
