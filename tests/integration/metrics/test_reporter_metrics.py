"""The reporter's ``/metrics`` (``--metrics-port``): publishes, backend errors, cards by health."""

from __future__ import annotations

import asyncio

import pynvml
from prometheus_client import REGISTRY

from gpushare.core.model import Card
from gpushare.embedded.nats_server import NatsServer, free_port
from gpushare.reporter.__main__ import parse_settings
from gpushare.reporter.running import open_backends, serve
from gpushare.reporter.simulated import SimulatedBackend
from tests.integration.kube.waiting import eventually
from tests.integration.metrics.scraping import scrape
from tests.integration.reporter.test_reporting import InventoryWatch, watch  # noqa: F401
from tests.unit.reporter.fakes import FakeNvml

PUBLISHES = "gpushare_reporter_inventory_publishes_total"
CARDS = "gpushare_reporter_cards"


class FailsFirstRead(SimulatedBackend):
    """A backend whose first read of the cards raises, as a failing NVML would."""

    failed = False

    def read_cards(self) -> tuple[Card, ...]:
        if not self.failed:
            self.failed = True
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return super().read_cards()


async def test_publishes_errors_and_cards_by_health(
    nats_server: NatsServer,
    watch: InventoryWatch,  # noqa: F811
) -> None:
    port = free_port()
    argv = ["--nats", nats_server.url, "--heartbeat", "60", "--metrics-port", str(port)]
    settings = parse_settings([*argv, "--node", "metrics-a=1000"], {})
    assert settings.metrics_port == port
    backend = FailsFirstRead("metrics-a", (1000, 2000))
    stopping = asyncio.Event()
    serving = asyncio.create_task(serve(settings, {"metrics-a": backend}, stopping))
    try:
        await watch.wait_for(lambda: len(watch.of("metrics-a")) == 1)
        backend.mark_unhealthy(1, "XID 79")
        await watch.wait_for(lambda: len(watch.of("metrics-a")) == 2)
        changed = {"node": "metrics-a", "outcome": "changed"}
        await eventually(lambda: REGISTRY.get_sample_value(PUBLISHES, changed) == 2)  # acked
        scraped = await scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        stopping.set()
        assert await serving == 0
    assert scraped.value(PUBLISHES, node="metrics-a", outcome="changed") == 2
    assert scraped.value(PUBLISHES, node="metrics-a", outcome="failed") is None
    errors = "gpushare_reporter_backend_errors_total"
    assert scraped.value(errors, node="metrics-a", operation="read") == 1
    assert scraped.value(CARDS, node="metrics-a", health="healthy") == 1
    assert scraped.value(CARDS, node="metrics-a", health="unhealthy") == 1


async def test_nvml_query_errors_are_counted_and_the_card_reported_unhealthy(
    nats_server: NatsServer,
    watch: InventoryWatch,  # noqa: F811
) -> None:
    port = free_port()
    argv = ["--nats", nats_server.url, "--heartbeat", "60", "--metrics-port", str(port)]
    settings = parse_settings([*argv, "--node-name", "nvml-node", "--mps", "off"], {})
    nvml = FakeNvml.from_fixture()
    nvml.fail("nvmlDeviceGetMemoryInfo", 0, pynvml.NVML_ERROR_UNKNOWN)
    call = {"call": "nvmlDeviceGetMemoryInfo"}
    errors = "gpushare_reporter_nvml_errors_total"
    before = REGISTRY.get_sample_value(errors, call) or 0.0
    stopping = asyncio.Event()
    serving = asyncio.create_task(serve(settings, open_backends(settings, nvml), stopping))
    try:
        await watch.wait_for(lambda: bool(watch.of("nvml-node")))
        scraped = await scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        stopping.set()
        assert await serving == 0
    cards = len(nvml.recording.devices)
    assert scraped.value(CARDS, node="nvml-node", health="unhealthy") == 1
    assert scraped.value(CARDS, node="nvml-node", health="healthy") == cards - 1
    assert (scraped.value(errors, **call) or 0.0) - before >= 1
    reads = nvml.calls.count("nvmlDeviceGetMemoryInfo") // cards
    assert REGISTRY.get_sample_value(errors, call) == before + reads
