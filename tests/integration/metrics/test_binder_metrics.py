"""The binder's ``/metrics`` (``metrics_port``): bindings, API calls, reconciling, lag."""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext
from prometheus_client import REGISTRY

from gpushare.binder.service import Binder
from gpushare.bus.log import AllocationLog
from gpushare.bus.subjects import ALLOCATION_STREAM, allocation_subject
from gpushare.core.events import PodBound
from gpushare.embedded.kube_api import KubeApiServer
from tests.fakes import FakeClock
from tests.integration.binder.conftest import StartBinder
from tests.integration.binder.test_binder import (
    NODE,
    create_pod,
    first_logged,
    report_cards,
    reserve,
)
from tests.integration.binder.test_reconciling import annotated_for, lost_reservation, running_pod
from tests.integration.kube.waiting import POLL_S, eventually
from tests.integration.metrics.scraping import Scrape, scrape

BINDINGS = "gpushare_binder_bindings_total"
API_CALLS = "gpushare_kube_api_request_seconds_count"
BINDING_CALL = "create_namespaced_pod_binding"


def now(name: str, **labels: str) -> float:
    """The process-wide sample before the test acts (counters are shared by the process)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def caught_up(binder: Binder) -> Scrape:
    """A scrape once the binder has folded the whole log."""
    assert binder.metrics is not None
    for _ in range(int(20 / POLL_S)):
        scraped = await scrape(binder.metrics.url)
        if scraped.value("gpushare_binder_log_lag_events") == 0:
            return scraped
        await asyncio.sleep(POLL_S)
    raise AssertionError("the binder's log lag never reached 0")


async def test_a_binding_is_counted_with_its_api_call(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    await report_cards(js, clock)
    pod = create_pod(kube_api, "p")
    bound, calls = now(BINDINGS, outcome="bound"), now(API_CALLS, call=BINDING_CALL)
    binder = await start_binder(metrics_port=0)
    await reserve(js, clock, pod)
    await first_logged(js, PodBound)
    scraped = await caught_up(binder)
    assert scraped.value(BINDINGS, outcome="bound") == bound + 1
    assert scraped.value(API_CALLS, call=BINDING_CALL) == calls + 1
    assert scraped.value("gpushare_binder_log_applied_seq") == await AllocationLog(js).last_seq()
    assert "gpushare_binder_log_idle_seconds" in scraped.families


async def test_an_adoption_at_start_is_a_finding_and_needs_no_binding(
    js: JetStreamContext, kube_api: KubeApiServer, clock: FakeClock, start_binder: StartBinder
) -> None:
    kube_api.create_node(NODE)
    await report_cards(js, clock)
    pod = running_pod(kube_api, "pod-s", annotated_for(lost_reservation(clock, "s")))
    passes = now("gpushare_binder_reconcile_passes_total")
    not_needed = now(BINDINGS, outcome="not_needed")

    binder = await start_binder(metrics_port=0)

    await eventually(lambda: binder.follower.state.allocation(pod.uid) is not None)
    scraped = await caught_up(binder)
    assert scraped.value("gpushare_binder_reconcile_passes_total") == passes + 1
    assert scraped.value("gpushare_binder_reconcile_findings", kind="adoption") == 1
    assert scraped.value("gpushare_binder_reconcile_findings", kind="release") == 0
    # the adoption is the binders' own event: their consumer is not even handed it
    assert now(BINDINGS, outcome="not_needed") == not_needed
    assert not kube_api.requests("POST", "/binding$")


async def test_a_poison_message_is_counted_as_rejected(
    js: JetStreamContext, clock: FakeClock, start_binder: StartBinder
) -> None:
    labels = {"stream": ALLOCATION_STREAM, "recorded": "yes"}
    rejected = now("gpushare_rejected_messages_total", **labels)
    binder = await start_binder(metrics_port=0)

    await js.publish(allocation_subject(NODE), b"not an event")

    await eventually(lambda: now("gpushare_rejected_messages_total", **labels) == rejected + 1)
    scraped = await caught_up(binder)
    assert scraped.value("gpushare_rejected_messages_total", **labels) == rejected + 1
