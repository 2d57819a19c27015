"""500 pods bound concurrently through two allocator processes never oversubscribe a card.

Asserted twice: from the allocation log (a fresh fold of every event) and from the
Kubernetes API (the ``gpushare.io/allocation`` annotations of the bound pods).
"""

from __future__ import annotations

import random
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpushare.core.annotations import read_allocation
from gpushare.embedded.scheduler import ExtenderCallFailed, ExtenderClient
from tests.e2e.conftest import core_api, fold_log, gpu_pod, start_stack

PODS = 500
NODES = [f"gpu-{n}=16276,16276,16276,16276" for n in range(8)]
CARD_MIB = 16276
ATTEMPTS = 5
"""kube-scheduler retries an unschedulable pod; so do we, a bounded number of times."""


def test_500_concurrent_binds_through_two_allocators(short_tmp: Path) -> None:
    sizes = random.Random(42).choices([512, 1024, 1536, 4096], k=PODS)
    with start_stack(short_tmp, NODES, allocators=2) as stack:
        api, serialize = core_api(stack)
        node_names = [node.name for node in stack.config.nodes]
        replicas = [
            ExtenderClient(f"http://127.0.0.1:{port}/gpushare-scheduler")
            for port in stack.extender_ports
        ]
        pods = [
            serialize(api.create_namespaced_pod("default", gpu_pod(f"p{i}", mib)))
            for i, mib in enumerate(sizes)
        ]

        def schedule(index: int) -> str | None:
            for attempt in range(ATTEMPTS):
                extender = replicas[(index + attempt) % len(replicas)]
                try:
                    result = extender.schedule(pods[index], node_names)
                except ExtenderCallFailed:
                    continue
                if result.node is not None:
                    return result.node
            return None

        with ThreadPoolExecutor(max_workers=32) as pool:
            placed = list(pool.map(schedule, range(PODS)))

        bound = [i for i, node in enumerate(placed) if node is not None]
        assert len(bound) > PODS // 2, "most pods fit: capacity is about the demand"

        state = fold_log(stack)
        for node in state.nodes.values():
            for card in node.cards:
                assert node.used_mib.get(card.uuid, 0) <= card.memory_mib, (node.name, card)

        used_from_api: dict[tuple[str, str], int] = defaultdict(int)
        bound_uids = set()
        for pod in api.list_namespaced_pod("default").items:
            allocation = read_allocation(pod.metadata.annotations or {})
            if allocation is None:
                continue
            assert pod.spec.node_name == allocation.node
            bound_uids.add(pod.metadata.uid)
            for shares in allocation.containers.values():
                for share in shares:
                    used_from_api[allocation.node, share.card_uuid] += share.memory_mib
        assert len(bound_uids) == len(bound)
        assert all(used <= CARD_MIB for used in used_from_api.values())
        live = {uid for node in state.nodes.values() for uid in node.pods}
        assert live == bound_uids, "the log and the API agree on who holds a card"
