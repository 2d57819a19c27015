"""``gpushare binder`` as its own process: it binds, and SIGTERM stops it cleanly."""

from __future__ import annotations

import asyncio
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path

from nats.js import JetStreamContext

from gpushare.bus.log import AllocationLog
from gpushare.core.events import PodBound
from gpushare.embedded.kube_api import KubeApiServer
from gpushare.embedded.nats_server import NatsServer
from tests.fakes import FakeClock
from tests.integration.binder.test_binder import NODE, create_pod, first_logged, reservation


async def test_the_binder_process_binds_and_stops_on_sigterm(
    nats_server: NatsServer,
    js: JetStreamContext,
    kube_api: KubeApiServer,
    clock: FakeClock,
    tmp_path: Path,
) -> None:
    clock.set(datetime.now(UTC))  # the process runs on the real clock: a fresh reservation
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    log_file = tmp_path / "binder.log"
    with log_file.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "gpushare.cli.main", "binder"),
            *("--nats", nats_server.url, "--kubeconfig", str(kubeconfig)),
            stdout=output,
            stderr=output,
        )
    try:
        pod = create_pod(kube_api, "p1")
        await AllocationLog(js).append(reservation(clock, pod))
        bound = await first_logged(js, PodBound, within=60)
        assert bound.node == NODE
        stored = kube_api.get("pods", "p1", "ns")
        assert stored is not None
        assert stored["spec"]["nodeName"] == NODE
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0, log_file.read_text()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
