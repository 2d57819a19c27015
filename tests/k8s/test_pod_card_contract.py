"""The pod↔card contract on a real kubelet: for every container, the card in its
environment = the card the kubelet's pod-resources reports = the card in the allocation
log = the card in the pod's annotations; no card over capacity by any of the four; no
pod failing admission; no false discrepancy; cards filled as the allocator planned.

Each scenario runs the real kube-scheduler (calling the extender), a real kubelet with
containerd, and gpushare's services as processes; the judge is the chaos run's
(:mod:`tools.chaos_truth`), fed from the API, containerd, pod-resources and a fresh fold
of the log. ``GPUSHARE_CONTRACT_ROUNDS`` sets how many rounds the batch scenario runs.

Every scenario runs a second time on our test kubelet (the fallback where no Kubernetes
binaries exist), whose record of what it started each container with stands in for
containerd: the double is held to what the real kubelet does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from gpushare.cli.stack import Stack
from gpushare.embedded.k8s_cluster import ControlPlane
from tests.k8s.contract import CARD_MIB, Scenario, assert_contract, gpu_mem, open_scenario
from tests.k8s.pods import eventually

ROUNDS = int(os.environ.get("GPUSHARE_CONTRACT_ROUNDS", "3"))

pytestmark = pytest.mark.timeout(300 + 120 * ROUNDS)


@pytest.fixture(params=["real-kubelet", "test-kubelet"])
def scenario(
    request: pytest.FixtureRequest,
    k8s_stack: Callable[..., Stack],
    k8s_api: client.CoreV1Api,
    k8s_clean: ControlPlane,
) -> Iterator[Scenario]:
    with open_scenario(request.param, k8s_stack, k8s_api, k8s_clean) as scenario:
        yield scenario


def batch(prefix: str, count: int, limits: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    return [(f"{prefix}-{n}", limits) for n in range(count)]


def test_same_size_pods_applied_at_once_fill_the_node_round_after_round(
    scenario: Scenario,
) -> None:
    per_node = 2 * (CARD_MIB // 2000)  # 16 pods of 2000 MiB fill both cards
    for round_ in range(ROUNDS):
        names = scenario.create(batch(f"r{round_}", per_node, gpu_mem(2000)))
        scenario.running(names)
        assert_contract(scenario)
        scenario.delete(names)


def test_mixed_sizes_applied_at_once(scenario: Scenario) -> None:
    pods = [
        *batch("large", 3, gpu_mem(4000)),
        *batch("medium", 4, gpu_mem(2000)),
        *batch("small", 6, gpu_mem(1000)),
    ]
    names = scenario.create(pods)
    scenario.running(names)
    assert_contract(scenario)


def test_two_resource_dialects_at_once(scenario: Scenario) -> None:
    ratio = {"gpushare.io/gpu-core": "25", "gpushare.io/gpu-memory-ratio": "25"}
    names = scenario.create([*batch("aliyun", 4, gpu_mem(4000)), *batch("share", 3, ratio)])
    scenario.running(names)
    assert_contract(scenario)


def test_pods_deleted_and_the_node_refilled(scenario: Scenario) -> None:
    first = scenario.create(batch("first", 16, gpu_mem(2000)))
    scenario.running(first)
    gone = first[::2]
    scenario.delete(gone)
    refill = scenario.create(batch("refill", len(gone), gpu_mem(2000)))
    scenario.running(refill)
    assert_contract(scenario)


AFTER_KUBELET_RESTART_SECONDS = 300.0
"""A restarted kubelet 1.36 takes a device list only after matching each advertised ID
against every allocated one (``ResourceHealthStatus``; ``docs/node-agent.md``, "The
kubelet's cost of many IDs"): 40.8 s on an idle machine with 16,000 MiB allocated, and
past the usual 120 s when the tier runs two clusters on two cores. The first batch holds
8,000 MiB so the pause is half that."""


def test_the_kubelet_restarted_between_batches(scenario: Scenario) -> None:
    before = scenario.create(batch("before", 8, gpu_mem(1000)))
    scenario.running(before)
    registered = scenario.registrations()
    scenario.restart_kubelet()
    eventually(lambda: scenario.registrations() > registered, "the plugin registered again", 60)
    after = scenario.create(batch("after", 8, gpu_mem(2000)))
    scenario.running([*before, *after], timeout=AFTER_KUBELET_RESTART_SECONDS)
    assert_contract(scenario)


def test_the_node_agent_killed_and_restarted_while_pods_are_admitted(
    scenario: Scenario,
) -> None:
    """Pods keep coming while the agent is SIGKILLed and comes back: the binder holds the
    bindings to its node until it serves again (the kubelet would refuse them for good),
    so none fails admission and every one lands on its planned card."""
    first = scenario.create(batch("before", 4, gpu_mem(2000)))
    scenario.running(first)
    scenario.stack.kill("node-agent")
    during = scenario.create(batch("during", 4, gpu_mem(2000)))
    time.sleep(1.0)  # kube-scheduler is placing them meanwhile
    scenario.stack.restart("node-agent")
    after = scenario.create(batch("after", 4, gpu_mem(2000)))
    scenario.running([*first, *during, *after])
    assert scenario.watch.failed == []
    assert_contract(scenario)
