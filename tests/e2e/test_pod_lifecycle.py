"""One pod's whole life through the four services running as separate processes."""

from __future__ import annotations

from pathlib import Path

from gpushare.core.annotations import ALLOCATION, ASSIGNED, IDX, read_allocation
from gpushare.core.events import ContainerAssigned, PodBound, PodReleased, PodReserved
from gpushare.embedded.scheduler import ExtenderClient
from tests.e2e.conftest import core_api, eventually, gpu_pod, inspect, read_log, start_stack


def test_a_pod_is_filtered_bound_assigned_and_released(short_tmp: Path) -> None:
    with start_stack(short_tmp, ["gpu-a=16276,16276", "gpu-b=8000"]) as stack:
        api, serialize = core_api(stack)

        def node_allocatable(name: str) -> dict[str, str]:
            return dict(api.read_node(name).status.allocatable or {})

        # the test kubelet reports the device plugin's IDs; the binder adds the card count
        assert node_allocatable("gpu-a")["aliyun.com/gpu-mem"] == "32552"
        eventually(
            lambda: node_allocatable("gpu-a").get("aliyun.com/gpu-count") == "2",
            "the binder's gpu-count",
        )
        pod = serialize(api.create_namespaced_pod("default", gpu_pod("trainer", 10000)))
        extender = ExtenderClient(stack.extender_url)

        result = extender.schedule(pod, ["gpu-a", "gpu-b"])

        assert result.error == ""
        assert result.node == "gpu-a"
        assert "gpu-b" in result.failed
        assert "10000 MiB" in result.failed["gpu-b"]
        annotations = api.read_namespaced_pod("trainer", "default").metadata.annotations
        assert annotations[IDX] == "0"
        allocation = read_allocation(annotations)
        assert allocation is not None
        assert allocation.containers["main"][0].memory_mib == 10000

        def assigned() -> bool:
            meta = api.read_namespaced_pod("trainer", "default").metadata
            return meta.annotations.get(ASSIGNED) == "true"

        eventually(assigned, "the device plugin's assignment")
        types = [type(event) for _, event in read_log(stack)]
        assert types[:3] == [PodReserved, PodBound, ContainerAssigned]
        nodes = inspect(stack)["nodes"]
        card = next(n for n in nodes if n["name"] == "gpu-a")["devs"][0]
        assert card["used_mib"] == 10000

        api.delete_namespaced_pod("trainer", "default")

        def released() -> bool:
            return any(isinstance(event, PodReleased) for _, event in read_log(stack))

        eventually(released, "the release after deletion")
        release = next(e for _, e in read_log(stack) if isinstance(e, PodReleased))
        assert release.reason == "deleted"
        assert ALLOCATION in annotations
