"""End-to-end fixtures: the whole system as separate processes (``gpushare.cli.stack``)."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from gpushare.bus.connection import connect
from gpushare.bus.log import AllocationLog
from gpushare.cli.stack import Stack, StackConfig, parse_node
from gpushare.core.events import AnyEvent
from gpushare.core.state import ClusterState
from tools.chaos import replay


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under ~107 bytes."""
    with tempfile.TemporaryDirectory(prefix="gs-", dir="/tmp") as path:
        yield Path(path)


def start_stack(
    data_dir: Path,
    nodes: list[str],
    allocators: int = 1,
    binders: int = 1,
    service_args: dict[str, list[str]] | None = None,
) -> Stack:
    config_ = StackConfig(
        data_dir=data_dir,
        nodes=[parse_node(node) for node in nodes],
        extender_port=0,
        allocators=allocators,
        binders=binders,
        service_args=service_args or {},
    )
    return Stack(config_).start(timeout=90)


def core_api(stack: Stack) -> tuple[client.CoreV1Api, Callable[[Any], Any]]:
    api_client = config.new_client_from_config(str(stack.kubeconfig))
    return client.CoreV1Api(api_client), api_client.sanitize_for_serialization


def gpu_pod(name: str, mib: int) -> client.V1Pod:
    limits = {"aliyun.com/gpu-mem": str(mib)}
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="default"),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main",
                    image="example.invalid/cuda:none",
                    resources=client.V1ResourceRequirements(limits=limits, requests=limits),
                )
            ]
        ),
    )


def read_log(stack: Stack) -> list[tuple[int, AnyEvent]]:
    """Every event of ``stack``'s allocation log, read as its ``auditor``."""

    async def read() -> list[tuple[int, AnyEvent]]:
        credentials = stack.credentials("auditor")
        nc = await connect(stack.nats_url, name="e2e-reader", credentials=credentials)
        try:
            return [pair async for pair in AllocationLog(nc.jetstream()).read()]
        finally:
            await nc.close()

    return asyncio.run(read())


def fold_log(stack: Stack) -> ClusterState:
    """A fresh fold of the whole allocation log and every node's last inventory."""
    return replay(stack)[1]


def eventually(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def inspect(stack: Stack) -> dict[str, Any]:
    with urllib.request.urlopen(f"{stack.extender_url}/inspect", timeout=5) as reply:
        return dict(json.loads(reply.read()))
