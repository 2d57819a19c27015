"""The bench's reference extender speaks kube-scheduler's protocol: a pod it binds is bound."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import uvloop

from benchmarks.null_extender import Binder, serve
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.embedded.nats_server import free_port
from gpushare.kube.client import KubeClient

SAMPLES = Path(__file__).resolve().parents[2] / "fixtures" / "kube-scheduler"


@contextlib.asynccontextmanager
async def serving(kubeconfig: Path) -> AsyncIterator[str]:
    port, ready = free_port(), asyncio.Event()
    task = asyncio.create_task(serve(port, Binder(KubeClient.connect(kubeconfig)), ready))
    await asyncio.wait_for(ready.wait(), 10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
async def extender(kubeconfig: Path) -> AsyncIterator[str]:
    async with serving(kubeconfig) as url:
        yield url


async def test_filter_answers_one_name_at_a_time_in_turn(extender: str) -> None:
    request = (SAMPLES / "filter.nodecache.request.json").read_bytes()
    async with aiohttp.ClientSession() as session:
        chosen = []
        for _ in range(2):
            async with session.post(f"{extender}/filter", data=request) as response:
                assert response.status == 200
                chosen.append(await response.json())
    assert [answer["NodeNames"] for answer in chosen] == [["gpu-node-1"], ["gpu-node-2"]]
    assert chosen[0]["Error"] == ""


async def test_bind_binds_the_pod_through_the_api(extender: str, kube_api: KubeApiServer) -> None:
    kube_api.create_node("gpu-node-2")
    args = json.loads((SAMPLES / "bind.nodecache.request.json").read_text())
    created = kube_api.create_pod(
        {
            "metadata": {"name": args["PodName"]},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        },
        namespace=args["PodNamespace"],
    )
    args["PodUID"] = created["metadata"]["uid"]
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{extender}/bind", json=args) as response,
    ):
        assert (response.status, await response.json()) == (200, {"Error": ""})
    pod = kube_api.get("pods", args["PodName"], args["PodNamespace"])
    assert pod is not None
    assert pod["spec"]["nodeName"] == "gpu-node-2"


async def test_a_failed_binding_and_a_malformed_request_say_why(extender: str) -> None:
    args = {"PodName": "absent", "PodNamespace": "default", "PodUID": "u", "Node": "n"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{extender}/bind", json=args) as response:
            assert response.status == 200
            assert (await response.json())["Error"].startswith("binding: 404")
        async with session.post(f"{extender}/bind", data=b"{") as response:
            assert response.status == 400
            assert (await response.json())["Error"]


def test_it_serves_on_uvloop_as_the_bench_runs_it(tmp_path: Path) -> None:
    """uvloop's transports are not ``asyncio.Transport`` subclasses."""

    async def filter_once() -> list[str]:
        request = (SAMPLES / "filter.nodecache.request.json").read_bytes()
        api = await KubeApiServer().start()
        try:
            async with (
                serving(api.write_kubeconfig(tmp_path / "kubeconfig")) as url,
                aiohttp.ClientSession() as session,
                session.post(f"{url}/filter", data=request) as response,
            ):
                answer: list[str] = (await response.json())["NodeNames"]
        finally:
            await api.stop()
        return answer

    assert uvloop.run(asyncio.wait_for(filter_once(), 10)) == ["gpu-node-1"]
