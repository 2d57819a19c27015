"""filter and prioritize over real HTTP, with the state folded from a real nats-server."""

from __future__ import annotations

import json

import pytest
from nats.js import JetStreamContext

from gpushare.core.events import InventoryReported
from tests.integration.allocator.serving import allocator_settings, extender, publish
from tests.unit.allocator.builders import (
    V100,
    card,
    first_chosen,
    fixture,
    gpu_pod,
    inventory,
    names_args,
    nodes_args,
    seed_000_filter_cluster,
)

FILTER = "/gpushare-scheduler/filter"
PRIORITIZE = "/gpushare-scheduler/prioritize"
NAMES = ["N1", "N2", "N3"]


def sample_nodes() -> list[InventoryReported]:
    """The two nodes of the recorded kube-scheduler calls: 2 cards of 16276 MiB each."""
    return [inventory(n, [card(n, 0), card(n, 1)]) for n in ("gpu-node-1", "gpu-node-2")]


async def test_seed_000_filter_example(js: JetStreamContext) -> None:
    await publish(js, seed_000_filter_cluster())
    async with extender(js) as (http, _):
        for body in (names_args(gpu_pod("p", 8138), NAMES), nodes_args(gpu_pod("p", 8138), NAMES)):
            response = await http.post(FILTER, content=body)
            assert response.status_code == 200
            answer = response.json()
            passed = answer["NodeNames"] or [
                item["metadata"]["name"] for item in answer["Nodes"]["items"]
            ]
            assert passed == ["N3"]
            assert set(answer["FailedNodes"]) == {"N1", "N2"}
            assert "the most free on any card is 4069 MiB" in answer["FailedNodes"]["N2"]
            assert answer["FailedAndUnresolvableNodes"] == {}
            assert answer["Error"] == ""


async def test_a_request_bigger_than_any_card_is_refused_on_every_node(
    js: JetStreamContext,
) -> None:
    await publish(js, seed_000_filter_cluster())
    async with extender(js) as (http, _):
        response = await http.post(FILTER, content=names_args(gpu_pod("p", V100 + 1), NAMES))
    answer = response.json()
    assert answer["NodeNames"] == []
    assert answer["FailedNodes"] == {}
    assert set(answer["FailedAndUnresolvableNodes"]) == set(NAMES)
    for reason in answer["FailedAndUnresolvableNodes"].values():
        assert f"needs {V100 + 1} MiB" in reason
        assert f"largest {V100} MiB" in reason


@pytest.mark.parametrize("choose", [True, False], ids=["choose-in-filter", "every-node"])
async def test_the_recorded_kube_scheduler_calls_get_accepted_answers(
    js: JetStreamContext, choose: bool
) -> None:
    """Each answer is the accepted response plus only the fields Go would also send; by
    default with only the node chosen."""
    await publish(js, sample_nodes())
    settings = allocator_settings(policy="binpack", choose_in_filter=choose)
    async with extender(js, settings) as (http, _):
        for mode in ("", ".nodecache"):
            accepted = json.loads(fixture(f"filter{mode}.accepted-response.json"))
            answer = (await http.post(FILTER, content=fixture(f"filter{mode}.request.json"))).json()
            assert answer == {
                "Nodes": None,
                "NodeNames": None,
                "FailedAndUnresolvableNodes": {},
                **(first_chosen(accepted) if choose else accepted),
            }
            scores = await http.post(PRIORITIZE, content=fixture(f"prioritize{mode}.request.json"))
            assert scores.json() == json.loads(fixture(f"prioritize{mode}.accepted-response.json"))


@pytest.mark.parametrize("choose", [True, False], ids=["choose-in-filter", "every-node"])
async def test_passing_nodes_come_back_byte_for_byte(js: JetStreamContext, choose: bool) -> None:
    await publish(js, sample_nodes())
    sent = fixture("filter.request.json")
    async with extender(js, allocator_settings(choose_in_filter=choose)) as (http, _):
        answer = (await http.post(FILTER, content=sent)).content
    items = json.loads(sent)["Nodes"]["items"]
    assert len(json.loads(answer)["Nodes"]["items"]) == (1 if choose else len(items))
    for item in items[: 1 if choose else None]:
        raw = json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode()
        assert raw in sent
        assert raw in answer


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b'{"Pod": []}', b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}'],
)
async def test_malformed_bodies_are_answered_400(js: JetStreamContext, body: bytes) -> None:
    async with extender(js) as (http, _):
        for verb in ("filter", "prioritize", "bind"):
            response = await http.post(f"/gpushare-scheduler/{verb}", content=body)
            assert response.status_code == 400
            assert response.json()["Error"].startswith(f"malformed {verb} request")
        assert (await http.get("/healthz")).status_code == 200
