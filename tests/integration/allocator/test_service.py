"""The allocator as a service: in-process until told to stop, and as a process until a signal."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from gpushare.allocator.runtime import run_allocator
from gpushare.embedded.nats_server import NatsServer, free_port
from tests.integration.allocator.serving import allocator_settings

KUBERNETES_VARIABLES = {"KUBECONFIG", "KUBERNETES_SERVICE_HOST"}


async def wait_ready(url: str, seconds: float = 30.0) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=2) as http, asyncio.timeout(seconds):
        while True:
            try:
                response = await http.get("/readyz")
            except httpx.TransportError:
                response = None
            if response is not None and response.status_code == 200:
                return response
            await asyncio.sleep(0.05)


@asynccontextmanager
async def allocator_process(*flags: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """``python -m gpushare.cli.main allocator FLAGS``, killed if still running at the end."""
    # No Kubernetes here: the pod-source fallback stays off whatever the caller's shell has.
    environ = {k: v for k, v in os.environ.items() if k not in KUBERNETES_VARIABLES}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpushare.cli.main",
        "allocator",
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=environ,
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_run_allocator_serves_until_stopped(nats_server: NatsServer) -> None:
    port = free_port()
    stop = asyncio.Event()
    settings = allocator_settings(nats_url=nats_server.url, port=port)
    service = asyncio.create_task(run_allocator(settings, stop))
    ready = await wait_ready(f"http://127.0.0.1:{port}")
    assert ready.json()["ready"] is True
    stop.set()
    assert await asyncio.wait_for(service, 30) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_the_process_stops_cleanly_on_a_signal(
    nats_server: NatsServer, sig: signal.Signals
) -> None:
    port = str(free_port())
    flags = ("--nats", nats_server.url, "--host", "127.0.0.1", "--port", port)
    async with allocator_process(*flags) as process:
        await wait_ready(f"http://127.0.0.1:{port}")
        process.send_signal(sig)
        output, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, output.decode()
    assert b"stopping" in output


async def test_a_signal_stops_it_while_nats_is_still_unreachable() -> None:
    flags = ("--nats", f"nats://127.0.0.1:{free_port()}", "--port", str(free_port()))
    async with allocator_process(*flags) as process:
        assert process.stdout is not None
        first_line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert b"nats:" in first_line  # it keeps trying to connect
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0


async def test_a_port_already_in_use_exits_1(nats_server: NatsServer) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        flags = ("--nats", nats_server.url, "--host", "127.0.0.1", "--port", port)
        async with allocator_process(*flags) as process:
            output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    assert b"could not start" in output
