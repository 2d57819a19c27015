"""The extender's HTTP surface in-process (ASGI): shapes, status codes, inspect, health, metrics."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpushare.allocator.assumed import ASSUME_SECONDS
from gpushare.allocator.extender import create_app
from gpushare.allocator.settings import AllocatorSettings
from gpushare.bus.follow import LogFollower
from gpushare.clock import SYSTEM_CLOCK
from gpushare.core.events import PodBound, PodReserved
from gpushare.core.ports import Clock
from tests.fakes import FakeClock, memory_log, offline_follower
from tests.unit.allocator.builders import (
    V100,
    binding_args,
    card,
    fixture,
    gpu_pod,
    names_args,
    node_events,
    nodes_args,
    now,
    occupant,
    seed_000_filter_cluster,
)

FILTER = "/gpushare-scheduler/filter"
PRIORITIZE = "/gpushare-scheduler/prioritize"
BIND = "/gpushare-scheduler/bind"
NAMES = ["N1", "N2", "N3"]


def app_over(
    events: Iterable[Any], clock: Clock = SYSTEM_CLOCK, **settings: Any
) -> tuple[FastAPI, LogFollower]:
    follower = offline_follower(events)
    app = create_app(follower, AllocatorSettings(replica_id="t", **settings), clock=clock)
    return app, follower


@pytest.fixture
async def seed_000() -> AsyncIterator[httpx.AsyncClient]:
    app, _ = app_over(seed_000_filter_cluster(), policy="binpack", inspect_open=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        yield c


async def test_filter_by_names_answers_names(seed_000: httpx.AsyncClient) -> None:
    response = await seed_000.post(FILTER, content=names_args(gpu_pod("p", 8138), NAMES))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == [
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    ]
    assert body["Nodes"] is None
    assert body["NodeNames"] == ["N3"]
    assert set(body["FailedNodes"]) == {"N1", "N2"}
    assert "4069 MiB" in body["FailedNodes"]["N2"]
    assert body["FailedAndUnresolvableNodes"] == {}
    assert body["Error"] == ""


async def test_filter_by_nodes_answers_the_passing_nodes_unchanged(
    seed_000: httpx.AsyncClient,
) -> None:
    sent = nodes_args(gpu_pod("p", 8138), NAMES)
    body = (await seed_000.post(FILTER, content=sent)).json()
    assert body["NodeNames"] is None
    assert body["Nodes"] == {"metadata": {}, "items": [json.loads(sent)["Nodes"]["items"][2]]}
    assert set(body["FailedNodes"]) == {"N1", "N2"}


async def test_a_pod_without_gpu_memory_passes_every_node_untouched(
    seed_000: httpx.AsyncClient,
) -> None:
    sent = fixture("filter.request.json").replace(b"aliyun.com/gpu-mem", b"example.com/other")
    response = await seed_000.post(FILTER, content=sent)
    assert response.json()["Nodes"] == json.loads(sent)["Nodes"]
    assert json.dumps(json.loads(sent)["Nodes"]["items"][0], separators=(",", ":")).encode() in (
        response.content
    )
    named = await seed_000.post(FILTER, content=names_args(gpu_pod("plain"), ["a", "b"]))
    assert named.json()["NodeNames"] == ["a", "b"]


async def test_an_invalid_request_fails_every_node_with_the_rule(
    seed_000: httpx.AsyncClient,
) -> None:
    pod = gpu_pod("p", 1024)
    pod["spec"]["containers"][0]["resources"]["requests"]["aliyun.com/gpu-mem"] = "2048"
    body = (await seed_000.post(FILTER, content=names_args(pod, NAMES))).json()
    assert body["NodeNames"] == []
    assert body["FailedNodes"] == {}
    assert set(body["FailedAndUnresolvableNodes"]) == set(NAMES)
    assert "requests-equal-limits" in body["FailedAndUnresolvableNodes"]["N1"]


async def test_a_request_larger_than_any_card_fails_everywhere(
    seed_000: httpx.AsyncClient,
) -> None:
    body = (await seed_000.post(FILTER, content=names_args(gpu_pod("p", V100 + 1), NAMES))).json()
    assert body["NodeNames"] == []
    assert set(body["FailedAndUnresolvableNodes"]) == set(NAMES)
    assert all(f"largest {V100} MiB" in r for r in body["FailedAndUnresolvableNodes"].values())


async def test_a_reason_carries_no_percent_sign_for_kube_scheduler_to_misread(
    seed_000: httpx.AsyncClient,
) -> None:
    """kube-scheduler passes its FailedScheduling message to ``Eventf`` as the format
    string: ``30 % core`` reached the pod's events as ``30 %!c(MISSING)ore``."""
    pod = gpu_pod("p")
    share = {"vke.volcengine.com/mgpu-core": "60", "vke.volcengine.com/mgpu-memory": "32000"}
    pod["spec"]["containers"][0]["resources"] = {"limits": share, "requests": dict(share)}
    pod["metadata"]["annotations"] = {"vke.volcengine.com/container-multiple-gpu": "2"}
    body = (await seed_000.post(FILTER, content=names_args(pod, NAMES))).json()
    reasons = [*body["FailedNodes"].values(), *body["FailedAndUnresolvableNodes"].values()]
    assert reasons
    assert all("%" not in reason for reason in reasons)
    assert all("percent" in reason for reason in reasons), reasons


async def test_a_pod_holding_a_reservation_not_bound_yet_passes_only_on_its_node() -> None:
    """Its bind timed out while the binder was still at it; kube-scheduler tries again:
    only the node holding the reservation passes (bind there waits for that binding),
    and once bound elsewhere nothing is restricted by it any more."""
    events = [*node_events("n1", [0]), *node_events("n2", [0]), *node_events("n3", [0])]
    reserved = occupant("n2", card("n2", 0), 1024, "p")
    app, follower = app_over([*events, reserved], choose_in_filter=False)  # every node that fits
    pod = gpu_pod("p", 1024)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        body = (await c.post(FILTER, content=names_args(pod, ["n1", "n2", "n3"]))).json()
        assert body["NodeNames"] == ["n2"]
        assert body["FailedNodes"] == {}
        assert set(body["FailedAndUnresolvableNodes"]) == {"n1", "n3"}
        assert "holds reservation reserve-p on node n2" in body["FailedAndUnresolvableNodes"]["n1"]

        memory_log(follower).write(
            PodBound(id="b", at=now(), node="n2", pod=reserved.pod, reservation_id=reserved.id),
            deliver=True,
        )
        body = (await c.post(FILTER, content=names_args(pod, ["n1", "n2", "n3"]))).json()
        assert body["NodeNames"] == ["n1", "n2", "n3"]


PREFERENCES = {
    "preferred node affinity": {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "preference": {
                        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
                    },
                }
            ]
        }
    },
    "preferred pod anti-affinity": {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app": "web"}},
                    },
                }
            ]
        }
    },
}


def fitting_on_three() -> list[Any]:
    """n1 half used, n2 empty, n3 almost full: a 4000 MiB pod fits on each, best on n1
    by binpack, and n3 too small for it."""
    return [
        *node_events("n1", [V100 // 2]),
        *node_events("n2", [0]),
        *node_events("n3", [V100 - 1000]),
    ]


async def test_filter_answers_only_the_node_the_policy_places_the_pod_best_on() -> None:
    """kube-scheduler skips prioritize (and its own scores) when one node passes: the pod
    lands where the policy places it best, in one call. The nodes that fit but lose are
    left out, not failed; those that do not fit are failed as ever, with their reason."""
    app, _ = app_over(fitting_on_three(), policy="binpack")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        body = await c.post(FILTER, content=names_args(gpu_pod("p", 4000), ["n2", "n1", "n3"]))
        assert body.json()["NodeNames"] == ["n1"]
        assert list(body.json()["FailedNodes"]) == ["n3"]  # preemption could free it
        assert "the most free on any card is 1000 MiB" in body.json()["FailedNodes"]["n3"]
        assert body.json()["FailedAndUnresolvableNodes"] == {}
        nodes = await c.post(FILTER, content=nodes_args(gpu_pod("q", 4000), ["n2", "n1"]))
        assert nodes.json()["NodeNames"] is None
        assert [n["metadata"]["name"] for n in nodes.json()["Nodes"]["items"]] == ["n1"]
        spread, _ = app_over(fitting_on_three(), policy="spread")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=spread), base_url="http://x"
        ) as other:
            answer = await other.post(FILTER, content=names_args(gpu_pod("p", 4000), ["n1", "n2"]))
            assert answer.json()["NodeNames"] == ["n2"]


async def test_pods_placed_but_not_bound_yet_count_on_their_node() -> None:
    """kube-scheduler binds a pod while it schedules the next ones: the next filter counts
    it on its node (its reservation is not in the log yet), as kube-scheduler counts the
    pods it assumed, until its reservation folds or ASSUME_SECONDS pass."""
    clock = FakeClock(now())
    # a: 10276 MiB free on its card (binpack's pick), b: an empty card
    app, follower = app_over(
        [*node_events("a", [V100 - 10276]), *node_events("b", [0])], clock, policy="binpack"
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:

        async def placed(name: str) -> dict[str, Any]:
            sent = names_args(gpu_pod(name, 8000), ["a", "b"])
            answer: dict[str, Any] = (await c.post(FILTER, content=sent)).json()
            return answer

        assert (await placed("first"))["NodeNames"] == ["a"]
        second = await placed("second")
        assert second["NodeNames"] == ["b"]
        assert "the 1 pod(s) kube-scheduler is binding to this node" in second["FailedNodes"]["a"]
        assert (await placed("first"))["NodeNames"] == ["a"]  # its own placement is not counted

        clock.advance(ASSUME_SECONDS + 1)  # its cycle failed after filter: no bind came
        assert (await placed("second"))["NodeNames"] == ["a"]

        # "second" is now assumed on a; its reservation folding hands the count to the fold
        memory_log(follower).write(occupant("a", card("a", 0), 8000, "second"), deliver=True)
        third = await placed("third")
        assert third["NodeNames"] == ["b"]
        assert "the most free on any card is 2276 MiB" in third["FailedNodes"]["a"]


async def test_each_pod_is_reserved_on_the_card_filter_planned_whatever_order_binds_come_in() -> (
    None
):
    """Filter places "first" on n1 and plans it on card 0 of its two empty cards (binpack:
    the first of equals), then "second" on card 1 (card 0 holds "first"). Bind for
    "second" comes first: planned afresh it would take card 0, the card "first" was
    judged with; it keeps card 1, and "first" gets card 0. (On a nearly full node, the
    pod whose card was taken found no card left at bind: refused, and back to
    kube-scheduler's queue with a back-off.)"""
    app, follower = app_over(
        [*node_events("n1", [0, 0]), *node_events("n2", [0, 0])], policy="binpack"
    )
    log = memory_log(follower)

    def bind_now(seq: int, event: Any, node: Any) -> None:
        if isinstance(event, PodReserved):
            bound = PodBound(
                id=f"bound-{event.id}", at=now(), node=event.node, pod=event.pod,
                reservation_id=event.id,
            )  # fmt: skip
            log.write(bound, deliver=True)

    follower.listen(bind_now)
    first, second = gpu_pod("first", 10000), gpu_pod("second", 10000)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        for pod in (first, second):
            answer = (await c.post(FILTER, content=names_args(pod, ["n1", "n2"]))).json()
            assert answer["NodeNames"] == ["n1"]
        for pod in (second, first):
            answer = (await c.post(BIND, content=binding_args(pod, "n1"))).json()
            assert answer == {"Error": ""}
    pods = follower.state.node("n1").pods
    cards = {
        pod["metadata"]["name"]: [share.card_index for share in pods[pod["metadata"]["uid"]].shares]
        for pod in (first, second)
    }
    assert cards == {"first": [0], "second": [1]}


async def test_equally_good_nodes_go_to_the_first_kube_scheduler_named() -> None:
    app, _ = app_over([*node_events("a", [0]), *node_events("b", [0])], policy="binpack")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        for names in (["a", "b"], ["b", "a"]):
            body = (await c.post(FILTER, content=names_args(gpu_pod("p", 4000), names))).json()
            assert body["NodeNames"] == names[:1]


@pytest.mark.parametrize("stated", sorted(PREFERENCES))
async def test_a_pod_stating_a_preference_gets_every_node_that_fits(stated: str) -> None:
    """Only kube-scheduler's scores weigh such a preference: filter leaves it the choice."""
    app, _ = app_over(fitting_on_three(), policy="binpack")
    pod = gpu_pod("p", 4000)
    pod["spec"]["affinity"] = PREFERENCES[stated]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        body = (await c.post(FILTER, content=names_args(pod, ["n2", "n1", "n3"]))).json()
    assert body["NodeNames"] == ["n2", "n1"]


async def test_a_schedule_anyway_spread_gets_every_node_that_fits() -> None:
    app, _ = app_over(fitting_on_three(), policy="binpack")
    pod = gpu_pod("p", 4000)
    pod["spec"]["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
    ]
    strict = gpu_pod("q", 4000)
    strict["spec"]["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
    ]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        anyway = (await c.post(FILTER, content=names_args(pod, ["n2", "n1"]))).json()
        filtered = (await c.post(FILTER, content=names_args(strict, ["n2", "n1"]))).json()
    assert anyway["NodeNames"] == ["n2", "n1"]
    assert filtered["NodeNames"] == ["n1"]  # kube-scheduler's filter already applied it


async def test_without_choose_in_filter_every_node_that_fits_passes() -> None:
    app, _ = app_over(fitting_on_three(), policy="binpack", choose_in_filter=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        body = (await c.post(FILTER, content=names_args(gpu_pod("p", 4000), ["n2", "n1"]))).json()
        scores = await c.post(PRIORITIZE, content=names_args(gpu_pod("p", 4000), ["n2", "n1"]))
    assert body["NodeNames"] == ["n2", "n1"]
    by_host = {entry["Host"]: entry["Score"] for entry in scores.json()}
    assert by_host["n1"] > by_host["n2"]


async def test_the_kube_scheduler_samples_are_answered(seed_000: httpx.AsyncClient) -> None:
    for name in ("filter.request.json", "filter.nodecache.request.json"):
        response = await seed_000.post(FILTER, content=fixture(name))
        assert response.status_code == 200
        body = response.json()
        # gpu-node-1/2 never reported inventory here, so both are listed as unresolvable.
        assert set(body["FailedAndUnresolvableNodes"]) == {"gpu-node-1", "gpu-node-2"}
    response = await seed_000.post(PRIORITIZE, content=fixture("prioritize.request.json"))
    assert response.json() == json.loads(fixture("prioritize.accepted-response.json"))


async def test_the_default_policy_ranks_nodes_by_fragmentation() -> None:
    app, _ = app_over(seed_000_filter_cluster())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        response = await c.post(PRIORITIZE, content=names_args(gpu_pod("p", 4069), NAMES))
    scores = {entry["Host"]: entry["Score"] for entry in response.json()}
    assert set(scores) == set(NAMES)
    assert all(0 <= score <= 10 for score in scores.values())


async def test_prioritize_scores_each_node(seed_000: httpx.AsyncClient) -> None:
    response = await seed_000.post(PRIORITIZE, content=names_args(gpu_pod("p", 4069), NAMES))
    assert response.json() == [
        {"Host": "N1", "Score": 10},
        {"Host": "N2", "Score": 9},
        {"Host": "N3", "Score": 9},
    ]


@pytest.mark.parametrize("path", [FILTER, PRIORITIZE, BIND])
@pytest.mark.parametrize(
    "body", [b"", b"{not json", b"[1,2]", b'{"Pod": 5}', b'{"Pod":{},"NodeNames":[3]}']
)
async def test_malformed_bodies_are_400_with_a_reason(
    seed_000: httpx.AsyncClient, path: str, body: bytes
) -> None:
    response = await seed_000.post(path, content=body)
    assert response.status_code == 400
    assert response.json()["Error"].startswith("malformed ")


async def test_filter_before_the_log_is_replayed_is_an_error() -> None:
    app, follower = app_over(seed_000_filter_cluster())
    follower.ready.clear()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        body = (await c.post(FILTER, content=names_args(gpu_pod("p", 1), NAMES))).json()
        assert "still replaying" in body["Error"]
        assert (await c.get("/readyz")).status_code == 503
        follower.ready.set()
        assert (await c.get("/readyz")).status_code == 200
        assert (await c.get("/healthz")).json() == {"status": "ok"}


async def test_bind_over_http_answers_after_the_binder() -> None:
    app, follower = app_over(node_events("n1", [0]))
    log = memory_log(follower)
    pod = gpu_pod("p", 1024)

    def bind_now(seq: int, event: Any, node: Any) -> None:
        if isinstance(event, PodReserved) and event.pod.name == "p":
            bound = PodBound(id="b", at=now(), node="n1", pod=event.pod, reservation_id=event.id)
            log.write(bound, deliver=True)

    follower.listen(bind_now)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        await c.post(FILTER, content=names_args(pod, ["n1"]))
        response = await c.post(BIND, content=binding_args(pod, "n1"))
        assert response.status_code == 200
        assert response.content == b'{"Error":""}'


async def test_inspect_answers_aliyuns_shape_with_gpushares_keys_beside(
    seed_000: httpx.AsyncClient,
) -> None:
    everything = (await seed_000.get("/gpushare-scheduler/inspect")).json()
    assert list(everything) == ["nodes"]
    assert [node["name"] for node in everything["nodes"]] == NAMES
    one = (await seed_000.get("/gpushare-scheduler/inspect/N3")).json()
    assert list(one) == ["nodes"]
    [n3] = one["nodes"]
    assert n3 == next(node for node in everything["nodes"] if node["name"] == "N3")
    # Aliyun's keys (gpushare-scheduler-extender pkg/scheduler/gpushare-inspect.go), first.
    assert list(n3)[:4] == ["name", "totalGPU", "usedGPU", "devs"]
    assert (n3["totalGPU"], n3["usedGPU"]) == (2 * V100, 8138 + V100)
    gpu0 = n3["devs"][0]
    assert list(gpu0)[:4] == ["id", "totalGPU", "usedGPU", "pods"]
    assert {k: gpu0[k] for k in ("id", "totalGPU", "usedGPU")} == {
        "id": 0,
        "totalGPU": V100,
        "usedGPU": 8138,
    }
    [occupant] = gpu0["pods"]
    assert {k: occupant[k] for k in ("name", "namespace", "usedGPU")} == {
        "name": "N3-gpu0-occupant",
        "namespace": "occupants",
        "usedGPU": 8138,
    }
    # gpushare's own keys, beside them.
    assert {k: gpu0[k] for k in ("index", "total_mib", "used_mib", "free_mib", "healthy")} == {
        "index": 0,
        "total_mib": V100,
        "used_mib": 8138,
        "free_mib": 8138,
        "healthy": True,
    }
    assert (occupant["mib"], occupant["state"]) == (8138, "reserved")
    assert (n3["max_free_mib"], n3["stale"], n3["pod_count"]) == (8138, False, 2)


async def test_inspect_counts_in_the_clusters_memory_unit() -> None:
    app, _ = app_over(seed_000_filter_cluster(), memory_unit="GiB", inspect_open=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        [n3] = (await c.get("/gpushare-scheduler/inspect/N3")).json()["nodes"]
    gpu0 = n3["devs"][0]
    assert (gpu0["totalGPU"], gpu0["usedGPU"], gpu0["used_mib"]) == (
        V100 // 1024,
        8138 // 1024,
        8138,
    )
    assert gpu0["pods"][0]["usedGPU"] == 8138 // 1024


async def test_inspect_of_an_unknown_node_is_404_in_the_same_shape(
    seed_000: httpx.AsyncClient,
) -> None:
    missing = await seed_000.get("/gpushare-scheduler/inspect/nope")
    assert missing.status_code == 404
    assert missing.json() == {"nodes": [], "error": 'node "nope" not found'}


async def test_metrics_count_latency_and_failure_kinds(seed_000: httpx.AsyncClient) -> None:
    await seed_000.post(FILTER, content=names_args(gpu_pod("p", 8138), [*NAMES, "ghost"]))
    await seed_000.post(FILTER, content=b"nope")
    text = (await seed_000.get("/metrics")).text
    assert 'gpushare_extender_request_seconds_count{verb="filter"} 2.0' in text
    assert 'gpushare_filter_failed_nodes_total{kind="insufficient_free_memory"} 2.0' in text
    assert 'gpushare_filter_failed_nodes_total{kind="no_inventory"} 1.0' in text
    assert 'gpushare_extender_bad_requests_total{verb="filter"} 1.0' in text
