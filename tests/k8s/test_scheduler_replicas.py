"""Two allocator replicas behind one Service, driven by the real kube-scheduler: 500 pods
created at once, and an allocator SIGKILLed in the middle of a burst.

``deploy/`` runs the allocator as a Deployment of two replicas behind the Service
``gpushare-allocator``, and kube-scheduler's extender stanza names that Service: kube-proxy
hands each of the scheduler's connections to one ready replica. Here a :class:`Balancer`
on the stanza's port does what kube-proxy does (a connection to a ready endpoint, an
endpoint ready while ``/readyz`` answers, nothing retried), so filter, prioritize and bind
of one pod may each reach another replica, and both reserve on the same nodes at once:
only the log's compare-and-set keeps them from handing out the same memory twice.

Judged from the outside: the allocation log folded afresh (``tools.chaos.replay``) against
the pods in the API (``gpushare.core.invariants.check_cluster``: no card oversubscribed,
every bound pod backed by the allocation its annotations name, no orphan), the annotations
summed per card, and one reservation and one ``PodBound`` per pod.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpushare.cli.stack import Stack
from gpushare.core.annotations import RESERVATION, read_allocation
from gpushare.core.events import AnyEvent, BindFailed, PodBound, PodReserved
from gpushare.core.invariants import check_cluster, pod_facts
from gpushare.embedded.k8s_cluster import ControlPlane
from tests.k8s.pods import eventually
from tests.k8s.scheduling import (
    Balancer,
    allocator_base,
    api_pods,
    gpu_pod,
    is_bound,
    log_events,
    metric_values,
    running_stack,
    scheduling_attempts,
)
from tools.chaos import compare_allocators, replay

CARD_MIB = 8192
CARDS = ",".join([str(CARD_MIB)] * 4)

pytestmark = pytest.mark.timeout(240)


@dataclass
class Replicas:
    """The stack (two allocators), the Service in front of them, the control plane."""

    stack: Stack
    service: Balancer
    plane: ControlPlane
    api: client.CoreV1Api

    def create(self, sizes: Sequence[int], prefix: str) -> list[str]:
        """Create one pod per size, 8 at a time (as a controller would); their names."""
        names = [f"{prefix}-{i}" for i in range(len(sizes))]
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(
                pool.map(
                    lambda pair: self.api.create_namespaced_pod("default", gpu_pod(*pair)),
                    zip(names, sizes, strict=True),
                )
            )
        return names

    def bound(self) -> list[dict[str, Any]]:
        return [pod for pod in api_pods(self.api) if is_bound(pod)]

    def wait_all_bound(self, count: int, timeout: float) -> list[dict[str, Any]]:
        def every() -> list[dict[str, Any]] | None:
            pods = api_pods(self.api)
            return pods if sum(map(is_bound, pods)) == count else None

        try:
            return list(eventually(every, f"{count} pods bound", timeout))
        except AssertionError as error:
            raise AssertionError(f"{error}: {len(self.bound())} bound") from None

    def binds(self) -> dict[str, dict[str, float]]:
        """Each replica's answers to bind, by outcome (its ``/metrics``)."""
        return {
            name: metric_values(f"{allocator_base(self.stack, name)}/metrics", BINDS)
            for name in self.stack.names("allocator")
            if name not in self.stack.down
        }


BINDS = "gpushare_bind_outcomes_total"


@pytest.fixture
def replicas(
    k8s_clean: ControlPlane, k8s_api: client.CoreV1Api, extender_port: int, short_tmp: Path
) -> Iterator[Callable[[Sequence[str]], Replicas]]:
    """``replicas(nodes)``: two allocators (and two binders) behind the Service on the
    control plane's extender port, the test kubelet serving ``nodes``."""
    with ExitStack() as resources:

        def start(nodes: Sequence[str]) -> Replicas:
            stack = resources.enter_context(
                running_stack(k8s_clean, short_tmp / "replicas", nodes, allocators=2, binders=2)
            )
            backends = {name: stack.allocator_ports[name] for name in stack.names("allocator")}
            service = resources.enter_context(Balancer(extender_port, backends))
            eventually(lambda: service.ready == set(backends), "both replicas ready")
            return Replicas(stack, service, k8s_clean, k8s_api)

        yield start


def assert_judged(replicas: Replicas, pods: list[dict[str, Any]]) -> list[AnyEvent]:
    """The fold of the log against the API, the annotations per card, one reservation
    and one PodBound per pod; the log's events."""
    _, state = replay(replicas.stack)
    assert check_cluster(state, [pod_facts(pod) for pod in pods]) == []
    used: Counter[tuple[str, str]] = Counter()
    for pod in pods:
        allocation = read_allocation(pod["metadata"]["annotations"])
        assert allocation is not None
        assert allocation.node == pod["spec"]["nodeName"]
        for shares in allocation.containers.values():
            for share in shares:
                used[allocation.node, share.card_uuid] += share.memory_mib
    assert max(used.values()) <= CARD_MIB, used.most_common(3)
    events = log_events(replicas.stack)
    uids = {pod["metadata"]["uid"] for pod in pods}
    reserved = Counter(e.pod.uid for e in events if isinstance(e, PodReserved))
    bound = Counter(e.pod.uid for e in events if isinstance(e, PodBound))
    assert set(reserved) == uids == set(bound)
    assert set(reserved.values()) == {1}, "one reservation per pod"
    assert set(bound.values()) == {1}, "one PodBound per pod"
    assert not [e for e in events if isinstance(e, BindFailed)]
    return events


def assert_views_agree(replicas: Replicas) -> None:
    """Every live allocator's ``/inspect`` equals a fresh fold of the log at the sequence
    it has applied (the log still grows while the kubelets admit pods: replay until the
    allocators are seen at the replay's sequence)."""

    def compared() -> tuple[list[Any]] | None:
        seq, state = replay(replicas.stack)
        found = compare_allocators(replicas.stack, seq, state)
        return None if found is None else (found,)

    (found,) = eventually(compared, "the allocators at a replayed sequence")
    assert found == []


PODS = 500
NODES = [f"r{n}={CARDS}" for n in range(10)]
"""40 cards of 8192 MiB: the pods ask about 72 % of the memory and 78 % of the
16-containers-a-card slots, so the replicas keep meeting on the same cards."""


def test_500_pods_at_once_through_two_allocators_bind_once_and_oversubscribe_nothing(
    replicas: Callable[[Sequence[str]], Replicas],
) -> None:
    cluster = replicas(NODES)
    sizes = random.Random(500).choices([256, 512, 1024], weights=[3, 2, 1], k=PODS)
    results = ("scheduled", "unschedulable", "error")
    before = {result: scheduling_attempts(cluster.plane, result) for result in results}

    started = time.monotonic()
    cluster.create(sizes, "burst")
    created = time.monotonic()
    pods = cluster.wait_all_bound(PODS, timeout=150)
    done = time.monotonic()

    assert_judged(cluster, pods)
    binds = cluster.binds()
    conflicts = {
        name: sum(
            metric_values(f"{allocator_base(cluster.stack, name)}/metrics", CONFLICTS).values()
        )
        for name in binds
    }
    attempts = {r: scheduling_attempts(cluster.plane, r) - before[r] for r in results}
    wall = done - started
    print(
        f"\n{PODS} pods, 2 allocators behind one Service, real kube-scheduler:"
        f" created in {created - started:.1f} s, all bound {wall:.1f} s after the first"
        f" ({PODS / wall:.1f} pods/s); scheduling attempts {attempts};"
        f" connections {dict(cluster.service.connections)}; bind answers {binds};"
        f" compare-and-set conflicts {conflicts}"
    )
    assert all(outcomes.get("bound", 0) > 0 for outcomes in binds.values()), binds
    assert_views_agree(cluster)


CONFLICTS = "gpushare_append_conflicts_total"


def unbound_reservations(events: Sequence[AnyEvent], by: str) -> dict[str, PodReserved]:
    """Reservations ``by`` made that no PodBound confirmed yet, by reservation id."""
    bound = {e.reservation_id for e in events if isinstance(e, PodBound)}
    return {
        e.id: e
        for e in events
        if isinstance(e, PodReserved) and e.reserved_by == by and e.id not in bound
    }


FAILOVER_PODS = 200
IN_FLIGHT = 3


def test_an_allocator_killed_mid_burst_loses_no_pod_and_books_no_card_twice(
    replicas: Callable[[Sequence[str]], Replicas],
) -> None:
    cluster = replicas([f"f{n}={CARDS}" for n in range(6)])
    stack = cluster.stack
    sizes = random.Random(200).choices([256, 512, 1024], weights=[3, 2, 1], k=FAILOVER_PODS)
    errors_before = scheduling_attempts(cluster.plane, "error")

    cluster.create(sizes, "fo")
    eventually(lambda: len(cluster.bound()) >= FAILOVER_PODS // 4, "the burst under way")
    served = cluster.binds()
    assert all(outcomes.get("bound", 0) > 0 for outcomes in served.values()), served
    # hold the binders back for a moment, so that the victim has binds in flight: it
    # appended their reservations and waits for the binders' verdict
    stack.pause("binder")
    stack.pause("binder-1")
    in_flight = eventually(
        lambda: (
            (found := unbound_reservations(log_events(stack), "allocator"))
            and len(found) >= IN_FLIGHT
            and found
        ),
        f"{IN_FLIGHT} reservations of allocator awaiting their binding",
    )
    stack.kill("allocator")
    stack.resume("binder")
    stack.resume("binder-1")

    pods = cluster.wait_all_bound(FAILOVER_PODS, timeout=150)

    assert_judged(cluster, pods)
    by_reservation = {pod["metadata"]["annotations"][RESERVATION]: pod for pod in pods}
    for reservation in in_flight.values():  # the victim's decisions stand, made once
        pod = by_reservation[reservation.id]
        assert pod["metadata"]["uid"] == reservation.pod.uid
        assert pod["spec"]["nodeName"] == reservation.node
    errors = scheduling_attempts(cluster.plane, "error") - errors_before
    assert errors >= len(in_flight), "kube-scheduler saw each bind held by the victim fail"
    after = cluster.binds()
    assert after["allocator-1"]["bound"] > served["allocator-1"]["bound"], (served, after)
    print(
        f"\nfailover: allocator killed with {len(in_flight)} binds in flight;"
        f" scheduling attempts that failed: {errors};"
        f" connections {dict(cluster.service.connections)},"
        f" refused {dict(cluster.service.refused)};"
        f" survivor's bind answers {served['allocator-1']} before, {after['allocator-1']} after"
    )

    stack.restart("allocator")  # as its Deployment would: it replays the log and serves
    eventually(lambda: cluster.service.ready == {"allocator", "allocator-1"}, "back in service")
    assert_views_agree(cluster)
