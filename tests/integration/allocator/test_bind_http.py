"""bind over real HTTP and a real nats-server: reserve, compare-and-set, wait for the binder."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx
from nats.js import JetStreamContext

from gpushare.bus.connection import connect
from gpushare.bus.log import AllocationLog
from gpushare.core.events import PodReserved
from gpushare.core.state import ClusterState, fold_events
from gpushare.embedded.nats_server import NatsServer
from tests.integration.allocator.doubles import BinderDouble, RacingLog
from tests.integration.allocator.serving import allocator_settings, extender, publish
from tests.unit.allocator.builders import (
    V100,
    binding_args,
    card,
    gpu_pod,
    inventory,
    names_args,
    node_events,
    occupant,
    seed_000_bind_node,
)

FILTER = "/gpushare-scheduler/filter"
BIND = "/gpushare-scheduler/bind"


async def filter_then_bind(http: httpx.AsyncClient, pod: dict[str, Any], node: str) -> str:
    """What kube-scheduler does: filter (the allocator remembers the pod), then bind."""
    filtered = (await http.post(FILTER, content=names_args(pod, [node]))).json()
    assert filtered["Error"] == ""
    response = await http.post(BIND, content=binding_args(pod, node))
    assert response.status_code == 200
    error: str = response.json()["Error"]
    return error


async def replay(js: JetStreamContext, nodes: Sequence[str]) -> ClusterState:
    """The allocation log folded from scratch: the truth every replica converges on."""
    log = AllocationLog(js)
    events = [pair for node in nodes async for pair in log.read_node(node, 0)]
    return fold_events(sorted(events, key=lambda pair: pair[0]))


def reservations_of(state: ClusterState, node: str, name: str) -> int:
    return sum(1 for a in state.node(node).pods.values() if a.pod.name == name)


async def test_seed_000_bind_example_answers_after_pod_bound(js: JetStreamContext) -> None:
    await publish(js, seed_000_bind_node())
    inspecting = allocator_settings(inspect_open=True)
    async with extender(js, inspecting) as (http, _), BinderDouble(js) as binder:
        assert await filter_then_bind(http, gpu_pod("p", 8138), "N1") == ""
        [inspected] = (await http.get("/gpushare-scheduler/inspect/N1")).json()["nodes"]
    [answer] = [event for event in binder.answered if event.pod.name == "p"]
    state = await replay(js, ["N1"])
    mine = state.allocation("uid-p")
    assert mine is not None
    assert mine.bound
    assert mine.reservation_id == answer.reservation_id
    assert [share.card_index for share in mine.shares] == [1]
    card_1 = inspected["devs"][1]
    assert [pod["name"] for pod in card_1["pods"]] == ["N1-gpu1-occupant", "p"]
    assert card_1["free_mib"] == 0


async def test_bind_failed_is_answered_with_its_reason(js: JetStreamContext) -> None:
    await publish(js, node_events("n1", [0]))
    async with (
        extender(js, allocator_settings(inspect_open=True)) as (http, _),
        BinderDouble(js, lambda _: 'pods "p" not found') as _binder,
    ):
        assert await filter_then_bind(http, gpu_pod("p", 1024), "n1") == 'pods "p" not found'
        # The failed reservation is void: the memory is free again.
        [inspected] = (await http.get("/gpushare-scheduler/inspect/n1")).json()["nodes"]
    assert inspected["devs"][0]["usedGPU"] == inspected["devs"][0]["used_mib"] == 0


async def test_without_a_binder_bind_times_out_with_an_error(js: JetStreamContext) -> None:
    await publish(js, node_events("n1", [0]))
    async with extender(js, allocator_settings(bind_wait_seconds=0.3)) as (http, _):
        error = await filter_then_bind(http, gpu_pod("p", 1024), "n1")
        metrics = (await http.get("/metrics")).text
    assert "was not bound within 0.3s" in error
    assert 'gpushare_bind_outcomes_total{outcome="timeout"} 1.0' in metrics


async def test_a_repeated_bind_waits_on_the_same_reservation(js: JetStreamContext) -> None:
    await publish(js, node_events("n1", [0]))
    pod = gpu_pod("p", 1024)
    async with extender(js) as (http, running):
        reserved = asyncio.Event()
        running.follower.listen(
            lambda seq, event, node: reserved.set() if isinstance(event, PodReserved) else None
        )
        first = asyncio.create_task(filter_then_bind(http, pod, "n1"))
        await reserved.wait()
        second = asyncio.create_task(filter_then_bind(http, pod, "n1"))
        await asyncio.sleep(0.2)
        assert not first.done()  # reserved, but not answered before the binder binds
        assert not second.done()
        async with BinderDouble(js):
            assert await first == ""
            assert await second == ""
    assert reservations_of(await replay(js, ["n1"]), "n1", "p") == 1
    log = AllocationLog(js)
    reserved = [e async for _, e in log.read_node("n1", 0) if isinstance(e, PodReserved)]
    assert len(reserved) == 1


async def test_binds_arriving_together_for_one_node_are_decided_one_after_another(
    js: JetStreamContext,
) -> None:
    """A packing policy sends pod after pod to one node, and kube-scheduler binds them
    concurrently: one replica decides them in turn, each on the fold with the last
    reservation in it, so none loses the compare-and-set to its own replica (one attempt
    each is enough) and none oversubscribes."""
    await publish(js, node_events("n1", [0, 0]))
    pods = [gpu_pod(f"p{i}", 4000) for i in range(9)]  # 8 fit on two cards
    async with extender(js, allocator_settings(bind_attempts=1)) as (http, running):
        reserved: list[PodReserved] = []
        all_reserved = asyncio.Event()

        def count(seq: int, event: object, node: object) -> None:
            if isinstance(event, PodReserved):
                reserved.append(event)
                if len(reserved) == 8:
                    all_reserved.set()

        running.follower.listen(count)
        binds = asyncio.gather(*(filter_then_bind(http, pod, "n1") for pod in pods))
        await asyncio.wait_for(all_reserved.wait(), 30)
        async with BinderDouble(js):
            errors = await binds
        metrics = (await http.get("/metrics")).text
    assert errors.count("") == 8
    (refused,) = [error for error in errors if error]
    assert refused.startswith("cannot reserve a GPU on n1"), refused
    assert "gpushare_append_conflicts_total 0.0" in metrics
    node = (await replay(js, ["n1"])).node("n1")
    assert node.used_mib == {card("n1", 0).uuid: 16000, card("n1", 1).uuid: 16000}


async def test_an_append_conflict_is_re_decided_never_oversubscribed(js: JetStreamContext) -> None:
    # GPU0 has 8138 free (binpack's pick), GPU1 16276; a rival fills GPU0 between our fold
    # and our append, so the compare-and-set fails and the allocator must choose again.
    await publish(js, node_events("n1", [8138, 0]))
    rival = occupant("n1", card("n1", 0), 8138, "rival")
    async with (
        extender(js, log=RacingLog(js, rival)) as (http, _),
        BinderDouble(js),
    ):
        assert await filter_then_bind(http, gpu_pod("p", 8138), "n1") == ""
        metrics = (await http.get("/metrics")).text
    assert "gpushare_append_conflicts_total 1.0" in metrics
    state = await replay(js, ["n1"])
    mine = state.allocation("uid-p")
    assert mine is not None
    assert [share.card_index for share in mine.shares] == [1]
    node = state.node("n1")
    assert all(node.free_mib(each) >= 0 for each in node.cards)
    assert node.used_mib == {card("n1", 0).uuid: V100, card("n1", 1).uuid: 8138}


async def test_two_allocators_binding_at_once_never_oversubscribe(
    js: JetStreamContext, nats_server: NatsServer
) -> None:
    """Ten pods of 4000 MiB race for one 16000 MiB card through two replicas: four fit."""
    await publish(js, [inventory("n1", [card("n1", 0, 16000)])])
    pods = [gpu_pod(f"p{i}", 4000) for i in range(10)]
    second = await connect(nats_server.url, name="allocator-b")
    try:
        js_b = second.jetstream()
        settings_b = allocator_settings(replica_id="allocator-b", bind_attempts=16)
        async with (
            extender(js, allocator_settings(bind_attempts=16)) as (http_a, _),
            extender(js_b, settings_b) as (http_b, _),
            BinderDouble(js),
        ):
            clients = [http_a, http_b]
            errors = await asyncio.gather(
                *(filter_then_bind(clients[i % 2], pod, "n1") for i, pod in enumerate(pods))
            )
    finally:
        await second.close()
    assert errors.count("") == 4
    assert all(e.startswith("cannot reserve a GPU on n1") for e in errors if e)
    node = (await replay(js, ["n1"])).node("n1")
    assert node.used_mib == {card("n1", 0).uuid: 16000}
    assert len(node.pods) == 4
    assert all(allocation.bound for allocation in node.pods.values())
