"""Seeds 000/001's worked examples with the real kube-scheduler calling the extender and
binding through it (``gpushare demo`` replays them by calling the extender itself).

The filter example: three nodes of two 16276 MiB cards, loaded as in the seed's figure.
The scheduler's own fit check drops N1 (4069 MiB free in all); N2 and N3 have 8138 MiB
free each, N2 spread over two cards, N3 on one: the extender passes N3 alone, and a second
such pod stays Pending, its condition and its event carrying the extender's reason for N2.
The bind example: a node whose cards have 12207, 8138, 4069 and 16276 MiB free; binpack
gives the 8138 MiB pod GPU1. The sample deployment (``binpack-1``, 1024 MiB) runs on a
real kubelet and sees its card.

A pod the extender turned down must be scheduled once a release frees a card for it: the
binder annotates the node after each release, and a change of a node's annotations is
what makes kube-scheduler retry the pods an extender turned down.

The loads come from :mod:`gpushare.cli.demo` (one home for the seed's figures), each pod
placed by the real scheduler on its node with binpack.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client

from gpushare.cli.demo import BIND_NODE, CARD, FILTER_NODES, SETUP
from gpushare.cli.stack import Stack
from gpushare.core.annotations import (
    ALLOCATION,
    ASSIGNED,
    ASSUME_TIME,
    DEV,
    IDX,
    POD,
    read_allocation,
)
from gpushare.core.events import PodReserved
from gpushare.core.requests import GPU_MEM
from gpushare.embedded.k8s_cluster import ControlPlane
from tests.k8s.pods import eventually, host_pod, wait_for_phase
from tests.k8s.scheduling import (
    annotations_of,
    cards_of,
    filter_decisions,
    gpu_pod,
    log_events,
    read_pod,
    scheduler_events,
    scheduler_queues,
    scheduling_attempts,
    wait_bound,
    wait_unschedulable,
)

BINPACK = "binpack"
TOO_SPREAD = "needs 8138 MiB of GPU memory on one card; the most free on any card is 4069 MiB"
"""The extender's reason for N2: 8138 MiB free, but 4069 on each card."""


def free_by_card(stack: Stack, node: str) -> list[int]:
    cards = cards_of(f"{stack.extender_url}/inspect")[node]
    return [card["total_mib"] - card["used_mib"] for card in cards]


def on_cards(stack: Stack, name: str) -> bool:
    return any(
        pod["name"] == name
        for cards in cards_of(f"{stack.extender_url}/inspect").values()
        for card in cards
        for pod in card["pods"]
    )


def load_node(stack: Stack, api: client.CoreV1Api, node: str) -> None:
    """Schedule and delete ``node``'s pods in the seed's order, each on ``node`` only."""
    for name, mib in SETUP[node]:
        if name.startswith("-"):
            api.delete_namespaced_pod(name[1:], "default", grace_period_seconds=0)
            eventually(lambda n=name[1:]: not on_cards(stack, n), f"{name[1:]} released")
        else:
            api.create_namespaced_pod("default", gpu_pod(name, mib, nodes=[node], policy=BINPACK))
            pod = wait_bound(api, name)
            assert pod["spec"]["nodeName"] == node


@pytest.fixture
def seed_cluster(k8s_stack: Callable[..., Stack], k8s_api: client.CoreV1Api) -> Stack:
    """N1..N3 (two cards) and N4 (four), on test kubelets, loaded as in the seed."""
    nodes = [f"{name}={CARD},{CARD}" for name in FILTER_NODES]
    stack = k8s_stack([*nodes, f"{BIND_NODE}={CARD},{CARD},{CARD},{CARD}"], real_kubelet=False)
    with ThreadPoolExecutor(max_workers=len(SETUP)) as pool:
        for loaded in [pool.submit(load_node, stack, k8s_api, node) for node in SETUP]:
            loaded.result()
    return stack


@pytest.mark.timeout(180)
def test_seed_000_filter_and_bind_examples_through_the_real_scheduler(
    seed_cluster: Stack, k8s_api: client.CoreV1Api
) -> None:
    stack = seed_cluster
    assert {node: free_by_card(stack, node) for node in FILTER_NODES} == {
        "n1": [0, 4069],
        "n2": [4069, 4069],
        "n3": [8138, 0],
    }

    # the filter example: only N3 holds 8138 MiB on one card
    k8s_api.create_namespaced_pod("default", gpu_pod("filter-8138", 8138, nodes=FILTER_NODES))
    placed = wait_bound(k8s_api, "filter-8138")
    assert placed["spec"]["nodeName"] == "n3"
    assert annotations_of(placed)[IDX] == "0"
    # kube-scheduler's fit check left N1 out (4069 MiB free in all); the extender saw
    # N2 and N3 and turned N2 down with its reason
    decision = eventually(lambda: filter_decisions(stack, "filter-8138"), "record")[0]
    assert (decision.passed, sorted(decision.failed)) == (("n3",), ["n2"]), decision
    assert decision.failed["n2"].startswith(TOO_SPREAD)

    # a second such pod: N3 is full now, N2's 8138 MiB are on two cards
    k8s_api.create_namespaced_pod("default", gpu_pod("pending-8138", 8138, nodes=FILTER_NODES))
    message = wait_unschedulable(k8s_api, "pending-8138")
    assert message.startswith("0/4 nodes are available:"), message
    assert f"1 {TOO_SPREAD}" in message, message
    assert f"2 Insufficient {GPU_MEM}" in message, message
    assert "1 node(s) didn't match Pod's node affinity/selector" in message, message
    events = eventually(lambda: scheduler_events(k8s_api, "pending-8138"), "FailedScheduling")
    assert any(TOO_SPREAD in event for event in events), events

    # the bind example: binpack picks GPU1, the fullest card that fits
    assert free_by_card(stack, BIND_NODE) == [12207, 8138, 4069, 16276]
    k8s_api.create_namespaced_pod(
        "default", gpu_pod("bind-8138", 8138, nodes=[BIND_NODE], policy=BINPACK)
    )
    bound = wait_bound(k8s_api, "bind-8138")
    assert bound["spec"]["nodeName"] == BIND_NODE
    assert_seed_annotations(annotations_of(bound), card=1, mib=8138, node=BIND_NODE)
    reserved = [
        e for e in log_events(stack) if isinstance(e, PodReserved) and e.pod.name == "bind-8138"
    ]
    assert [(s.card_index, s.memory_mib) for e in reserved for s in e.shares] == [(1, 8138)]
    assert free_by_card(stack, BIND_NODE) == [12207, 0, 4069, 16276]


class StillPending(AssertionError):
    """The pod was not bound although its card has room."""


@pytest.mark.timeout(120)
def test_a_pod_the_extender_turned_down_is_retried_once_a_release_frees_its_card(
    k8s_stack: Callable[..., Stack], k8s_api: client.CoreV1Api, k8s_clean: ControlPlane
) -> None:
    stack = k8s_stack([f"q={CARD},{CARD}"], real_kubelet=False)
    for name in ("q-a", "q-b"):  # 12207 MiB on each card: 4069 + 4069 MiB left
        k8s_api.create_namespaced_pod("default", gpu_pod(name, 12207, policy=BINPACK))
        wait_bound(k8s_api, name)
    for name in ("q-a", "q-b"):  # from here on nothing changes on the node
        eventually(
            lambda n=name: annotations_of(read_pod(k8s_api, n)).get(ASSIGNED) == "true",
            f"{name} assigned",
        )
    freed = int(annotations_of(read_pod(k8s_api, "q-a"))[IDX])
    before = scheduling_attempts(k8s_clean, "unschedulable")  # earlier tests' pods
    k8s_api.create_namespaced_pod("default", gpu_pod("q-wait", 8138))
    assert TOO_SPREAD in wait_unschedulable(k8s_api, "q-wait")
    tried = parked(k8s_clean, stack, before)

    stack.pause("binder")  # the release comes late, as from a busy or restarting binder
    k8s_api.delete_namespaced_pod("q-a", "default", grace_period_seconds=0)
    eventually(
        lambda: scheduling_attempts(k8s_clean, "unschedulable") - before > tried,
        "kube-scheduler's retry at the deletion",
    )
    parked(k8s_clean, stack, before)
    refused = filter_decisions(stack, "q-wait")
    assert all("q" in decision.failed for decision in refused), "the release was late"
    stack.resume("binder")  # releases, then annotates the node: the scheduler retries

    try:
        bound = wait_bound(k8s_api, "q-wait", timeout=30)
    except AssertionError as error:
        raise StillPending(f"{error}; scheduler queues {scheduler_queues(k8s_clean)}") from None
    assert (bound["spec"]["nodeName"], annotations_of(bound)[IDX]) == ("q", str(freed))


def parked(plane: ControlPlane, stack: Stack, before: int) -> int:
    """Once the only pending pod, ``q-wait``, waits in kube-scheduler's unschedulable
    queue and the extender recorded each of its attempts (those past ``before``): how
    many attempts it had."""

    seen: list[object] = []

    def settled() -> int | None:
        attempts = scheduling_attempts(plane, "unschedulable") - before
        recorded = len(filter_decisions(stack, "q-wait"))
        queues = scheduler_queues(plane)
        seen[:] = [attempts, recorded, queues]
        return attempts if queues == PARKED and recorded == attempts else None

    try:
        return int(eventually(settled, "the pod parked as unschedulable", timeout=30))
    except AssertionError as error:
        raise AssertionError(f"{error}: attempts, records, queues: {seen}") from None


PARKED = {"active": 0, "backoff": 0, "gated": 0, "unschedulable": 1}


def assert_seed_annotations(
    annotations: dict[str, str], *, card: int, mib: int, node: str, container: str = "main"
) -> None:
    """Seed 000's keys, and gpushare's whole allocation beside them."""
    assert annotations[IDX] == str(card)
    assert annotations[POD] == str(mib)
    assert annotations[DEV] == str(CARD)
    assert re.fullmatch(r"[0-9]{19}", annotations[ASSUME_TIME]), annotations[ASSUME_TIME]
    assert annotations[ASSIGNED] in {"false", "true"}
    allocation = read_allocation(annotations)
    assert allocation is not None, annotations[ALLOCATION]
    assert allocation.node == node
    assert [(s.card_index, s.memory_mib) for s in allocation.containers[container]] == [(card, mib)]


PRINT_ENV = "env | grep -E '^(NVIDIA_VISIBLE_DEVICES|ALIYUN_COM_GPU_MEM_)' | sort; sleep 3600"


def sample_deployment() -> dict[str, Any]:
    """Seed 001's test sample: Deployment ``binpack-1``, one replica of 1024 MiB."""
    spec = host_pod("unused", PRINT_ENV, limits={GPU_MEM: "1024"})["spec"]
    spec["restartPolicy"] = "Always"
    spec["containers"][0]["name"] = "binpack-1"
    template = {"metadata": {"labels": {"app": "binpack-1"}}, "spec": spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "binpack-1", "labels": {"app": "binpack-1"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "binpack-1"}},
            "template": template,
        },
    }


@pytest.fixture
def apps_api(k8s_api: client.CoreV1Api) -> Iterator[client.AppsV1Api]:
    apps = client.AppsV1Api(k8s_api.api_client)
    try:
        yield apps
    finally:  # before the pods are cleaned away, or its ReplicaSet makes them again
        for deployment in apps.list_namespaced_deployment("default").items:
            apps.delete_namespaced_deployment(
                deployment.metadata.name, "default", propagation_policy="Foreground"
            )
        eventually(
            lambda: not apps.list_namespaced_replica_set("default").items, "ReplicaSets gone"
        )


@pytest.mark.timeout(180)
def test_the_seeds_sample_deployment_runs_on_a_real_kubelet_with_its_card(
    k8s_stack: Callable[..., Stack], k8s_api: client.CoreV1Api, apps_api: client.AppsV1Api
) -> None:
    stack = k8s_stack([f"gpu-d={CARD},{CARD}"])
    apps_api.create_namespaced_deployment("default", sample_deployment())

    (pod,) = eventually(
        lambda: k8s_api.list_namespaced_pod("default", label_selector="app=binpack-1").items,
        "the ReplicaSet's pod",
    )
    name = pod.metadata.name
    assert [owner.kind for owner in pod.metadata.owner_references] == ["ReplicaSet"]
    wait_for_phase(k8s_api, name, {"Running"}, timeout=90)
    eventually(
        lambda: annotations_of(read_pod(k8s_api, name)).get(ASSIGNED) == "true",
        "the device plugin's assignment",
    )
    annotations = annotations_of(read_pod(k8s_api, name))
    card = int(annotations[IDX])
    assert_seed_annotations(annotations, card=card, mib=1024, node="gpu-d", container="binpack-1")
    uuid = cards_of(f"{stack.extender_url}/inspect")["gpu-d"][card]["uuid"]
    logs = eventually(
        lambda: k8s_api.read_namespaced_pod_log(name, "default", container="binpack-1"), "logs"
    )
    env = dict(line.split("=", 1) for line in logs.strip().splitlines())
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert env["ALIYUN_COM_GPU_MEM_IDX"] == str(card)
    assert env["ALIYUN_COM_GPU_MEM_POD"] == "1024"
    assert env["ALIYUN_COM_GPU_MEM_DEV"] == str(CARD)
