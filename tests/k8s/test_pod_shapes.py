"""Generated pod shapes through the real kube-scheduler and the real kubelet (and the test
kubelet, for breadth): every container of every pod gpushare serves runs on the card the
log, the annotations and the kubelet's pod-resources name, no card is over capacity
counting the containers that run at once, and every pod gpushare cannot serve is refused
with the rule it breaks, never run without its card (issue 36).

The shapes are :mod:`tests.k8s.shapes`': 1-4 app containers, init containers and native
sidecars, every dialect and mixes of them, ``container-multiple-gpu`` lists, several pods
created together. CI runs a fixed seed and ``GPUSHARE_SHAPES_EXAMPLES`` batches (default
3 per kubelet); ``make shapes`` runs a long one (``SEED=``, ``EXAMPLES=``). A failure
prints the batch as lines to create again and Hypothesis' ``@reproduce_failure``.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from kubernetes import client

from gpushare.cli.stack import Stack
from gpushare.core.fit import check_fit
from gpushare.core.requests import (
    GPU_MEM,
    GPUSHARE_MEMORY,
    MGPU_CORE,
    MGPU_MEMORY,
    MULTIPLE_GPU_ANNOTATION,
    PodRequest,
)
from gpushare.embedded.k8s_cluster import ControlPlane
from tests.k8s.contract import NODE, Scenario, assert_contract, open_scenario
from tests.k8s.pods import eventually
from tests.k8s.shapes import DIALECTS, ContainerShape, Shape, batches, describe
from tools.chaos import replay

EXAMPLES = int(os.environ.get("GPUSHARE_SHAPES_EXAMPLES", "3"))
SEED = int(os.environ.get("GPUSHARE_SHAPES_SEED", "36"))
SETTLE_SECONDS = 150.0
"""How long a batch may take to settle: every pod Running, or Pending with a reason."""

pytestmark = pytest.mark.timeout(240 + 200 * EXAMPLES)

TALLY: Counter[str] = Counter()
"""What the shape runs saw: batches, pods, containers, outcomes, seconds."""


@pytest.fixture(params=["real-kubelet", "test-kubelet"])
def scenario(
    request: pytest.FixtureRequest,
    k8s_stack: Callable[..., Stack],
    k8s_api: client.CoreV1Api,
    k8s_clean: ControlPlane,
) -> Iterator[Scenario]:
    with open_scenario(
        request.param, k8s_stack, k8s_api, k8s_clean, cards=4, dialects=DIALECTS
    ) as scenario:
        yield scenario
    tally = {key: round(value, 1) for key, value in sorted(TALLY.items())}
    print(f"\nshapes on the {request.param}: {tally}")
    TALLY.clear()


def scheduling_events(api: client.CoreV1Api, pod: client.V1Pod) -> list[str]:
    """kube-scheduler's ``FailedScheduling`` messages about this pod (by UID: every batch
    names its pods alike)."""
    events = api.list_namespaced_event(
        "default", field_selector=f"involvedObject.uid={pod.metadata.uid}"
    ).items
    return [e.message or "" for e in events if e.reason == "FailedScheduling"]


def outcome(scenario: Scenario, shape: Shape, expected: PodRequest | str) -> str | None:
    """Where the pod stands, once it has settled: ``None`` while it has not."""
    pod = scenario.api.read_namespaced_pod(shape.name, "default")
    phase, node = pod.status.phase, pod.spec.node_name
    said = scheduling_events(scenario.api, pod)
    if isinstance(expected, str):  # refused: never bound, the rule in the scheduler's words
        assert node is None, f"{shape.describe()}: breaks {expected!r} yet was bound to {node}"
        return "refused" if any(f'rule "{expected}"' in m for m in said) else None
    if phase == "Running":
        return "running"
    assert phase == "Pending", f"{shape.describe()}: {phase} {pod.status.reason}"
    if node is None and said and not fits_now(scenario, expected):
        return "pending"  # no room beside the others: kube-scheduler says why
    return None


def fits_now(scenario: Scenario, request: PodRequest) -> bool:
    """Whether the node, as a fresh fold of the log holds it, has room for the pod."""
    _, state = replay(scenario.stack)
    return check_fit(state.node(NODE), request, datetime.now(UTC)).fits


def settle(scenario: Scenario, batch: Sequence[Shape]) -> Mapping[str, str]:
    """Every pod's outcome once each has one (fails, with the batch, if one never does)."""
    expected = {shape.name: shape.judged() for shape in batch}
    seen: dict[str, str] = {}

    def settled() -> bool:
        scenario.stack.check_alive()
        for shape in batch:
            if shape.name not in seen:
                found = outcome(scenario, shape, expected[shape.name])
                if found is not None:
                    seen[shape.name] = found
        return len(seen) == len(batch)

    try:
        eventually(settled, "every pod Running, Pending with a reason, or refused", SETTLE_SECONDS)
    except AssertionError as error:
        raise AssertionError(f"{error}; so far {seen}\n{describe(batch)}") from None
    return seen


def count(batch: Sequence[Shape], outcomes: Mapping[str, str]) -> None:
    TALLY["batches"] += 1
    for shape in batch:
        TALLY["pods"] += 1
        TALLY["containers"] += len(shape.containers)
        TALLY[outcomes[shape.name]] += 1


SEED_003 = Shape(
    name="seed-003",
    containers=(
        ContainerShape("c0", "app", {MGPU_CORE: "100", MGPU_MEMORY: "6000"}),
        ContainerShape("c1", "app", {MGPU_CORE: "100"}),
        ContainerShape("c2", "app", {MGPU_CORE: "99", MGPU_MEMORY: "3000"}),
    ),
    annotations={MULTIPLE_GPU_ANNOTATION: "2,1,3"},
)
"""Issue 36, defect 1: seed 003's own example; c1 (a whole card) ran on another card."""
SIDECAR = Shape(
    name="sidecar",
    containers=(
        ContainerShape("log", "sidecar", {GPU_MEM: "6000"}),
        ContainerShape("app", "app", {GPU_MEM: "8000"}),
    ),
)
"""Defect 2: the sidecar's 6,000 MiB were not counted."""
MEMORY_ONLY = Shape(
    name="memory-only", containers=(ContainerShape("c", "app", {GPUSHARE_MEMORY: "4Gi"}),)
)
"""Defect 3: reserved, then run with no card at all."""


@example(batch=(SEED_003,))
@example(batch=(SIDECAR, MEMORY_ONLY))
@seed(SEED)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    print_blob=True,
)
@given(batch=batches())
def test_generated_pod_shapes_get_their_cards_or_a_named_refusal(
    scenario: Scenario, batch: tuple[Shape, ...]
) -> None:
    started = time.monotonic()
    names = scenario.apply(shape.manifest() for shape in batch)
    try:
        outcomes = settle(scenario, batch)
        try:
            assert_contract(scenario)
        except AssertionError as error:
            raise AssertionError(f"{error}\nthe batch:\n{describe(batch)}") from None
        count(batch, outcomes)
    finally:
        scenario.delete(names)
        TALLY["seconds"] += time.monotonic() - started
