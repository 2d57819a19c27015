"""High availability: allocator and binder replicas die mid-work, nothing is done twice.

Correctness rests on the log alone: a reservation is appended with compare-and-set, and
a second bind for a pod that already holds one waits on it instead of reserving again;
binder replicas share one durable consumer, so each reservation is bound by one of them
and a dead replica's unacknowledged work is delivered to another.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpushare.cli.stack import Stack
from gpushare.core.annotations import read_allocation
from gpushare.core.events import BindFailed, PodBound, PodReserved
from gpushare.core.invariants import check_cluster
from gpushare.core.state import memory_by_card
from gpushare.embedded.scheduler import ExtenderCallFailed, ExtenderClient
from tests.e2e.conftest import core_api, eventually, fold_log, gpu_pod, read_log, start_stack
from tools.chaos_sources import read_api_pods

NODE = "gpu-a"


def reservations_of(stack: Stack, uid: str) -> list[PodReserved]:
    return [
        event
        for _, event in read_log(stack)
        if isinstance(event, PodReserved) and event.pod.uid == uid
    ]


def test_kube_schedulers_retry_through_another_allocator_binds_once(short_tmp: Path) -> None:
    with start_stack(short_tmp, [f"{NODE}=16276,16276"], allocators=2) as stack:
        api, serialize = core_api(stack)
        pod = serialize(api.create_namespaced_pod("default", gpu_pod("trainer", 4096)))
        uid = pod["metadata"]["uid"]
        first = ExtenderClient(stack.extender_url_of("allocator"))
        second = ExtenderClient(stack.extender_url_of("allocator-1"))
        stack.pause("binder")  # the reservation is made, but cannot be bound yet
        outcome: list[object] = []

        def kube_scheduler() -> None:
            try:
                outcome.append(first.schedule(pod, [NODE]))
            except (ExtenderCallFailed, OSError) as error:
                outcome.append(error)

        call = threading.Thread(target=kube_scheduler)
        call.start()
        eventually(lambda: bool(reservations_of(stack, uid)), "the PodReserved")
        stack.kill("allocator")
        call.join(timeout=30)
        assert not call.is_alive()
        assert isinstance(outcome[0], OSError), "kube-scheduler sees the bind call fail"

        stack.resume("binder")
        retry = second.schedule(pod, [NODE])

        assert retry.error == ""
        assert retry.node == NODE
        (reservation,) = reservations_of(stack, uid)
        assert reservation.reserved_by == "allocator"
        bound = api.read_namespaced_pod("trainer", "default")
        assert bound.spec.node_name == NODE
        annotated = read_allocation(bound.metadata.annotations or {})
        assert annotated is not None
        assert annotated.reservation == reservation.id
        assert [share.memory_mib for share in annotated.containers["main"]] == [4096]
        state = fold_log(stack)
        node = state.node(NODE)
        assert dict(node.used_mib) == memory_by_card(reservation.shares)
        assert sum(node.used_mib.values()) == 4096
        assert node.pods[uid].bound


PODS = 40
NODES = [f"gpu-{n}=16276,16276" for n in range(4)]


def bound_lines(stack: Any, binder: str) -> int:
    return sum(" bound " in line for line in stack.log_tail(binder, 10_000).splitlines())


def bound_everywhere(stack: Any, api: Any) -> bool:
    """Every pod bound in the API, and every reservation of the log bound in it."""
    if any(pod.node is None for pod in read_api_pods(api)):
        return False
    log = [event for _, event in read_log(stack)]
    reserved = {e.id for e in log if isinstance(e, PodReserved)}
    return reserved == {e.reservation_id for e in log if isinstance(e, PodBound)}


@pytest.mark.timeout(240)
def test_a_binder_killed_mid_stream_leaves_every_pod_bound_once(short_tmp: Path) -> None:
    # the dead replica's claims come back after --ack-wait (60 s by default)
    ack_wait = {"binder": ["--ack-wait", "10"]}
    with start_stack(short_tmp, NODES, binders=2, service_args=ack_wait) as stack:
        api, serialize = core_api(stack)
        names = [node.split("=")[0] for node in NODES]
        extender = ExtenderClient(stack.extender_url, timeout=20)
        pods = [
            serialize(api.create_namespaced_pod("default", gpu_pod(f"p{i}", 1024)))
            for i in range(PODS)
        ]

        def schedule(pod: dict[str, Any]) -> None:
            # A bind may time out while the killed binder's claim waits for redelivery;
            # whatever kube-scheduler does then, the binder finishes the reservation.
            for _ in range(3):
                with contextlib.suppress(ExtenderCallFailed):
                    if extender.schedule(pod, names).node is not None:
                        return

        with ThreadPoolExecutor(max_workers=4) as pool:
            scheduling = [pool.submit(schedule, pod) for pod in pods]
            eventually(
                lambda: bound_lines(stack, "binder") > 0 and bound_lines(stack, "binder-1") > 0,
                "both binders binding",
            )
            stack.kill("binder-1")
            for future in scheduling:
                future.result()
        # the dead replica's unacknowledged claims come back after the consumer's ack wait
        eventually(lambda: bound_everywhere(stack, api), "every pod bound", timeout=90)

        log = [event for _, event in read_log(stack)]
        reserved = Counter(e.pod.uid for e in log if isinstance(e, PodReserved))
        bound = Counter(e.reservation_id for e in log if isinstance(e, PodBound))
        assert len(reserved) == PODS
        assert set(reserved.values()) == {1}, "one reservation per pod"
        assert set(bound.values()) == {1}, "one PodBound per reservation"
        assert not any(isinstance(e, BindFailed) for e in log)
        assert check_cluster(fold_log(stack), [p.facts for p in read_api_pods(api)]) == []
