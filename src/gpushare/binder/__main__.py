"""``gpushare binder``: bind reserved pods, release finished ones, advertise GPU counts.

gpushare binder --nats nats://nats:4222 --kubeconfig ~/.kube/config
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from gpushare.binder.gating import AgentGate
from gpushare.binder.service import Binder
from gpushare.binder.settings import BinderSettings
from gpushare.bus.connection import redact
from gpushare.flags import add_memory_unit_flag, add_nats_flag, add_stream_replicas_flag

log = logging.getLogger(__name__)


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(prog="gpushare binder", description=__doc__.split("\n\n")[0])
    add_nats_flag(parse, os.environ)
    add_stream_replicas_flag(parse, os.environ)
    parse.add_argument(
        "--kubeconfig", help="kubeconfig file (default, or 'in-cluster': the service account)"
    )
    add_memory_unit_flag(parse, os.environ)
    parse.add_argument(
        "--bind-timeout",
        type=float,
        default=120.0,
        help="release reservations not bound within this many seconds (default 120)",
    )
    parse.add_argument(
        "--agent-wait",
        type=float,
        default=8.0,
        help=(
            "seconds a binding waits for the node's agent to serve again (restarting, or "
            "the kubelet restarted) before binding anyway (default 8; below the "
            "allocator's --bind-wait)"
        ),
    )
    parse.add_argument(
        "--assign-timeout",
        type=float,
        default=600.0,
        help=(
            "report bound pods not fully assigned within this many seconds (default 600); "
            "their reservations are kept until the pod is deleted or finishes, never "
            "released by this timer"
        ),
    )
    parse.add_argument(
        "--sweep-interval",
        type=float,
        default=5.0,
        help="seconds between checks for overdue reservations (default 5)",
    )
    parse.add_argument(
        "--reconcile-interval",
        type=float,
        default=os.environ.get("GPUSHARE_RECONCILE_INTERVAL", "60"),
        help=(
            "seconds between passes comparing the log with the Kubernetes API "
            "(env GPUSHARE_RECONCILE_INTERVAL; default 60; 0: only at start)"
        ),
    )
    parse.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("GPUSHARE_METRICS_PORT", "0")),
        help="serve Prometheus /metrics on this port (env GPUSHARE_METRICS_PORT; 0: off)",
    )
    parse.add_argument(
        "--sync-devices",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep a gpushare.io Device custom resource per node (default on)",
    )
    parse.add_argument(
        "--device-sync-interval",
        type=float,
        default=5.0,
        help="write a node's Device at most every this many seconds (default 5)",
    )
    return parse


def settings_from(argv: list[str] | None) -> BinderSettings:
    args = parser().parse_args(argv)
    return BinderSettings(
        nats_url=args.nats,
        stream_replicas=args.stream_replicas,
        kubeconfig=args.kubeconfig,
        memory_unit=args.memory_unit,
        bind_timeout_s=args.bind_timeout,
        assign_timeout_s=args.assign_timeout,
        agent_wait_s=args.agent_wait,
        sweep_interval_s=args.sweep_interval,
        reconcile_interval_s=args.reconcile_interval,
        sync_devices=args.sync_devices,
        device_sync_interval_s=args.device_sync_interval,
        metrics_port=args.metrics_port or None,
    )


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
        gate = AgentGate(nc, settings.agent_wait_s)
        binder = Binder(nc.jetstream(), kube, settings, gate=gate)
        gate.ours = binder.inventoried
        await binder.start()
        await stopping.wait()
        await binder.stop()
    finally:
        await nc.close()
        kube.close()


def main(argv: list[str] | None = None) -> int:
    from gpushare.logs import setup_logging
    from gpushare.telemetry.tracing import configure_tracing

    settings = settings_from(sys.argv[1:] if argv is None else argv)
    setup_logging("binder")
    configure_tracing("gpushare-binder")
    log.info("binder: NATS %s, memory unit %s", redact(settings.nats_url), settings.memory_unit)
    asyncio.run(run(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
