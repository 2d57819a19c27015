"""What a pod asks of the GPUs, read from its containers' resources.

``aliyun.com/gpu-mem`` counts memory units (MiB by default, GiB where the cluster is
configured so), per container. All GPU containers of a pod share one card (seeds
000/001): the card must hold the app containers' sum, or the largest init container,
whichever is more, since init containers finish before the app containers start.
"""

from __future__ import annotations

import msgspec

from gpushare.core.errors import InvalidRequest
from gpushare.core.pods import Container, Pod
from gpushare.core.quantity import parse_count

GPU_MEM = "aliyun.com/gpu-mem"
GPU_COUNT = "aliyun.com/gpu-count"

MEMORY_UNITS_MIB = {"MiB": 1, "GiB": 1024}


class ContainerRequest(msgspec.Struct, frozen=True, kw_only=True):
    container: str
    memory_mib: int
    init: bool = False


class PodRequest(msgspec.Struct, frozen=True, kw_only=True):
    containers: tuple[ContainerRequest, ...]

    @property
    def memory_mib(self) -> int:
        """What the pod holds on its card at its peak."""
        app = sum(c.memory_mib for c in self.containers if not c.init)
        init = max((c.memory_mib for c in self.containers if c.init), default=0)
        return max(app, init)

    @property
    def wants_gpu(self) -> bool:
        return bool(self.containers)


def _container_units(container: Container, resource: str) -> int | None:
    resources = container.resources
    if resources is None:
        return None
    limit = (resources.limits or {}).get(resource)
    request = (resources.requests or {}).get(resource)
    try:
        limit_units = None if limit is None else parse_count(limit)
        request_units = None if request is None else parse_count(request)
    except ValueError as error:
        raise InvalidRequest(
            "quantity", f"container {container.name!r}: {resource} {error}"
        ) from None
    if limit_units is not None and request_units is not None and limit_units != request_units:
        raise InvalidRequest(
            "requests-equal-limits",
            f"container {container.name!r}: {resource} request {request_units} "
            f"differs from limit {limit_units}; extended resources need them equal",
        )
    return limit_units if limit_units is not None else request_units


def read_gpu_request(pod: Pod, memory_unit: str = "MiB") -> PodRequest:
    """The pod's GPU memory request in MiB per container. Raises :class:`InvalidRequest`."""
    unit_mib = MEMORY_UNITS_MIB[memory_unit]
    requests: list[ContainerRequest] = []
    groups = ((pod.spec.init_containers or (), True), (pod.spec.containers, False))
    for containers, init in groups:
        for container in containers:
            units = _container_units(container, GPU_MEM)
            if units is None or units == 0:
                continue
            requests.append(
                ContainerRequest(container=container.name, memory_mib=units * unit_mib, init=init)
            )
    return PodRequest(containers=tuple(requests))


def to_units(memory_mib: int, memory_unit: str) -> int:
    """MiB back to the cluster's unit (whole units, rounded down as the device plugin counts)."""
    return memory_mib // MEMORY_UNITS_MIB[memory_unit]
