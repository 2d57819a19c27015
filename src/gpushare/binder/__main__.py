"""``gpushare binder``: bind reserved pods, release finished ones, advertise GPU counts.

gpushare binder --nats nats://nats:4222 --kubeconfig ~/.kube/config
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Mapping, Sequence

import uvloop

from gpushare.binder.gating import AgentGate
from gpushare.binder.service import Binder
from gpushare.binder.settings import BinderSettings
from gpushare.bus.connection import redact
from gpushare.collector import collect_rarely, freeze
from gpushare.settings_spec import read_settings, run_service

log = logging.getLogger(__name__)

PROG = "gpushare binder"
DESCRIPTION = "Bind reserved pods, release finished ones, advertise GPU counts."


def parse_settings(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> BinderSettings:
    """Flags, then the environment, then the defaults; exits 2 on a bad value (argparse)."""
    return read_settings(BinderSettings, argv, environ, prog=PROG, description=DESCRIPTION)


async def run(settings: BinderSettings) -> None:
    from gpushare.bus.connection import connect
    from gpushare.kube.client import KubeClient

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    kube = KubeClient.connect(settings.kubeconfig)
    nc = await connect(settings.nats_url, name="gpushare-binder")
    try:
        gate = AgentGate(nc, settings.agent_wait_s, reuse_seconds=settings.agent_ready_reuse_s)
        binder = Binder(nc.jetstream(), kube, settings, gate=gate)
        gate.ours = binder.inventoried
        await binder.start()
        freeze("binder")  # its modules and its fold of the log, once caught up
        await stopping.wait()
        await binder.stop()
    finally:
        await nc.close()
        await kube.aclose()


def start(settings: BinderSettings) -> int:
    from gpushare.logs import setup_logging
    from gpushare.telemetry.tracing import configure_tracing

    setup_logging("binder")
    configure_tracing("gpushare-binder")
    log.info("binder: NATS %s, memory unit %s", redact(settings.nats_url), settings.memory_unit)
    collect_rarely()
    uvloop.run(run(settings))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_service(parse_settings, argv, prog=PROG, start=start)


if __name__ == "__main__":
    sys.exit(main())
