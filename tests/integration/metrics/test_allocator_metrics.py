"""The allocator's ``/metrics``: filter failures by reason, per-card gauges, log lag, binds."""

from __future__ import annotations

from nats.js import JetStreamContext

from gpushare.bus.log import AllocationLog
from tests.integration.allocator.doubles import BinderDouble
from tests.integration.allocator.serving import allocator_settings, extender, publish
from tests.integration.metrics.scraping import scrape
from tests.unit.allocator.builders import V100, binding_args, card, gpu_pod, names_args, node_events

FILTER = "/gpushare-scheduler/filter"
BIND = "/gpushare-scheduler/bind"
FAILED = "gpushare_filter_failed_nodes_total"


async def test_one_failing_node_counts_once_under_its_reason(js: JetStreamContext) -> None:
    await publish(js, [*node_events("full", [V100]), *node_events("free", [0])])
    async with extender(js) as (http, running):
        body = names_args(gpu_pod("p", 8138), ["full", "free", "unknown"])
        answer = (await http.post(FILTER, content=body)).json()
        scraped = await scrape(f"{running.url}/metrics")
    assert answer["NodeNames"] == ["free"]
    assert scraped.value(FAILED, kind="insufficient_free_memory") == 1
    assert scraped.value(FAILED, kind="no_inventory") == 1
    assert sum(scraped.labelled(FAILED).values()) == 2
    assert scraped.value("gpushare_extender_request_seconds_count", verb="filter") == 1


async def test_card_gauges_are_the_fold_and_the_lag_is_caught_up(js: JetStreamContext) -> None:
    await publish(js, [*node_events("n1", [12207, 0]), *node_events("n2", [0])])
    async with extender(js) as (_, running):
        scraped = await scrape(f"{running.url}/metrics")
        state = running.follower.state
        applied = running.follower.applied_seq
    last = await AllocationLog(js).last_seq()
    for name in ("n1", "n2"):
        node = state.node(name)
        for each, view in zip(node.cards, node.view.cards, strict=True):
            labels = {"node": name, "card": str(each.index), "uuid": each.uuid}
            used = node.used_mib.get(each.uuid, 0)
            assert scraped.value("gpushare_allocator_card_allocated_memory_mib", **labels) == used
            assert scraped.value("gpushare_allocator_card_free_memory_mib", **labels) == (
                view.free_mib
            )
            assert scraped.value("gpushare_allocator_card_memory_mib", **labels) == V100
            assert scraped.value("gpushare_allocator_card_free_core_percent", **labels) == (
                view.free_core
            )
    n1_gpu0 = {"node": "n1", "card": "0", "uuid": card("n1", 0).uuid}
    assert scraped.value("gpushare_allocator_card_allocated_memory_mib", **n1_gpu0) == 12207
    assert scraped.value("gpushare_allocator_card_free_memory_mib", **n1_gpu0) == V100 - 12207
    assert scraped.value("gpushare_allocator_card_containers", **n1_gpu0) == 1
    assert applied == last == 1
    assert scraped.value("gpushare_allocator_log_applied_seq") == last
    assert scraped.value("gpushare_allocator_log_lag_events") == 0
    idle = scraped.value("gpushare_allocator_log_idle_seconds")
    assert idle is not None
    assert idle >= 0


async def test_no_card_metrics_leaves_only_the_per_card_gauges_out(js: JetStreamContext) -> None:
    await publish(js, node_events("n1", [12207, 0]))
    settings = allocator_settings(card_metrics=False)
    async with extender(js, settings) as (_, running):
        scraped = await scrape(f"{running.url}/metrics")
    assert not [name for name, _ in scraped.samples if name.startswith("gpushare_allocator_card_")]
    assert scraped.value("gpushare_allocator_log_lag_events") == 0
    assert scraped.value("gpushare_extender_request_seconds_count", verb="filter") == 0


async def test_a_bind_moves_the_gauges_and_counts_its_outcome(js: JetStreamContext) -> None:
    await publish(js, node_events("n1", [0]))
    pod = gpu_pod("p", 4096)
    async with extender(js) as (http, running), BinderDouble(js):
        await http.post(FILTER, content=names_args(pod, ["n1"]))
        answer = (await http.post(BIND, content=binding_args(pod, "n1"))).json()
        scraped = await scrape(f"{running.url}/metrics")
    assert answer["Error"] == ""
    labels = {"node": "n1", "card": "0", "uuid": card("n1", 0).uuid}
    assert scraped.value("gpushare_allocator_card_allocated_memory_mib", **labels) == 4096
    assert scraped.value("gpushare_allocator_card_free_memory_mib", **labels) == V100 - 4096
    assert scraped.value("gpushare_bind_outcomes_total", outcome="bound") == 1
    assert scraped.value("gpushare_allocator_log_lag_events") == 0
    assert scraped.value("gpushare_allocator_log_applied_seq") == await AllocationLog(js).last_seq()
