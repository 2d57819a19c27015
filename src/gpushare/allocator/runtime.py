"""Running the allocator: in-process (tests, benchmarks) or as the service (``__main__``).

:func:`running_allocator` is the one way to run it: it starts a :class:`LogFollower`
on the given JetStream context, waits for it to replay the log, and serves the
extender app with uvicorn on ``settings.host:settings.port`` (0 picks a free port).
:func:`run_allocator` adds the NATS connection and stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Generator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from gpushare.allocator.extender import create_app
from gpushare.allocator.settings import AllocatorSettings, TlsSettings
from gpushare.allocator.tls import ClientCertificateProtocol, ServerCertificates, watching
from gpushare.bus.connection import connect
from gpushare.bus.decisions import DecisionRecorder
from gpushare.bus.follow import LogFollower
from gpushare.bus.nats_types import JetStreamContext
from gpushare.bus.streams import ensure_streams
from gpushare.clock import SYSTEM_CLOCK
from gpushare.collector import collect_rarely, freeze_when
from gpushare.core.dra_claims import ClaimSpecs
from gpushare.core.ports import AllocationLog, Clock, PodSource
from gpushare.kube.pod_source import KubernetesPodSource
from gpushare.redaction import describe_settings
from gpushare.tasks import unless_stopped

log = logging.getLogger(__name__)


STARTUP_TIMEOUT_SECONDS = 30.0


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the caller decides when to stop.

    (uvicorn re-raises a caught SIGTERM after shutdown, which would skip our clean-up,
    and it would fight over handlers when several servers share a process.)
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@dataclass(frozen=True, kw_only=True)
class RunningAllocator:
    url: str
    """Base URL, e.g. ``http://127.0.0.1:41234``; the verbs are under ``settings.url_prefix``."""
    app: FastAPI
    follower: LogFollower


@contextlib.asynccontextmanager
async def serve_app(
    app: FastAPI, host: str, port: int, tls: TlsSettings | None = None
) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn in this event loop (HTTPS with ``tls``); yields its base URL."""
    certificates = ServerCertificates(tls) if tls is not None else None
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        log_config=None,
        access_log=False,
        ssl_context_factory=certificates.uvicorn_factory if certificates else None,
        http=ClientCertificateProtocol,  # tells the app which requests hold a client cert
    )
    server = _Server(config)
    task = asyncio.create_task(_serve(server), name=f"uvicorn {host}:{port}")
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT_SECONDS):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError(f"uvicorn stopped before serving on {host}:{port}")
                await asyncio.sleep(0.01)
        bound_port = server.servers[0].sockets[0].getsockname()[1]
        shown = "127.0.0.1" if host in {"0.0.0.0", "::", ""} else host
        async with watching(certificates):
            yield f"{'https' if tls else 'http'}://{shown}:{bound_port}"
    finally:
        server.should_exit = True
        if not task.done():
            await task


async def _serve(server: uvicorn.Server) -> None:
    """uvicorn exits the process when it cannot listen; make that an ordinary error."""
    try:
        await server.serve()
    except SystemExit as error:
        raise RuntimeError(
            f"the extender HTTP server could not start (exit {error.code})"
        ) from None


@contextlib.asynccontextmanager
async def running_allocator(
    js: JetStreamContext,
    settings: AllocatorSettings,
    *,
    log: AllocationLog | None = None,
    pod_source: PodSource | None = None,
    clock: Clock = SYSTEM_CLOCK,
    wait_ready: bool = True,
    decisions: DecisionRecorder | None = None,
    claim_specs: ClaimSpecs | None = None,
) -> AsyncIterator[RunningAllocator]:
    """A replica serving on ``settings.host:settings.port``.

    With ``wait_ready`` (tests, benchmarks) it serves only once the log is replayed;
    the service serves at once so that ``/readyz`` can say it is still replaying.
    With ``decisions`` it records every filter and prioritize call (started and
    stopped here).
    """
    follower = LogFollower(js)
    await follower.start()
    if decisions is not None:
        await decisions.start()
    try:
        if wait_ready:
            async with asyncio.timeout(STARTUP_TIMEOUT_SECONDS):
                await follower.ready.wait()
        app = create_app(
            follower,
            settings,
            log=log,
            pod_source=pod_source,
            clock=clock,
            decisions=decisions,
            claim_specs=claim_specs,
        )
        async with serve_app(app, settings.host, settings.port, settings.tls) as url:
            yield RunningAllocator(url=url, app=app, follower=follower)
    finally:
        if decisions is not None:
            await decisions.stop()
        await follower.stop()


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def run_allocator(settings: AllocatorSettings, stop: asyncio.Event | None = None) -> int:
    """The service: connect, ensure the streams, replay, serve until ``stop`` or a signal.

    NATS may be down when the allocator starts: the connection keeps trying (as the
    bus's ``connect`` does) until NATS answers or the allocator is told to stop.
    """
    if stop is None:
        stop = asyncio.Event()
        _stop_on_signals(stop)
    log.info("allocator settings: %s", describe_settings(settings))
    if settings.tls is None:
        log.info("serving plain HTTP: kube-apiserver calls the admission webhook over HTTPS only")
    pod_source = (
        KubernetesPodSource.from_kubeconfig(settings.kubeconfig, dra=settings.dra_scoring)
        if settings.kubeconfig
        else None
    )
    claim_specs = pod_source.claim_spec if pod_source is not None and settings.dra_scoring else None
    name = f"gpushare-allocator-{settings.replica_id}"
    nc = await unless_stopped(connect(settings.nats_url, name=name), stop)
    if nc is None:
        log.info("allocator %s stopped before NATS answered", settings.replica_id)
        return 0
    if pod_source is not None:
        pod_source.start()
    collect_rarely()
    try:
        js = nc.jetstream()
        await ensure_streams(js, settings.stream_replicas)
        async with running_allocator(
            js,
            settings,
            pod_source=pod_source,
            wait_ready=False,
            decisions=DecisionRecorder(nc),
            claim_specs=claim_specs,
        ) as running:
            log.info("allocator %s serving on %s", settings.replica_id, running.url)
            settle = asyncio.create_task(freeze_when(running.follower.ready, "allocator"))
            await stop.wait()
            settle.cancel()
            log.info("allocator %s stopping", settings.replica_id)
    finally:
        if pod_source is not None:
            await pod_source.stop()
        await nc.close()
    return 0
