"""The Alibaba cluster-trace-gpu-v2023 ("openb") CSV files, read into typed rows.

Nodes: ``sn,cpu_milli,memory_mib,gpu,model``. Pods: ``name,cpu_milli,memory_mib,num_gpu,
gpu_milli[,gpu_spec,...]``; ``gpu_milli`` is per card (1000 = a whole card) and
``gpu_spec`` lists the accepted models, ``|``-separated.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import msgspec

from gpushare.core.policies.fragmentation import MILLI, TaskClass
from gpushare.core.requests import ContainerRequest, PodRequest

CARD_MEMORY = MILLI
"""The trace does not model GPU memory: a card's "memory" is its 1000 milli-GPU, so a
memory ratio and a core percent are the same share."""


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and the row."""


class TraceNode(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    affinity: tuple[tuple[int, ...], ...] = ()
    """Links between the cards as ``core.view.NodeView.affinity`` has them; the trace has
    none (``tracebench.topology`` gives 8-card nodes one)."""


class TracePod(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()

    @property
    def gpu_request_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def task_class(self) -> TaskClass:
        return TaskClass(
            cpu_milli=self.cpu_milli,
            gpus=self.num_gpu,
            gpu_milli=self.gpu_milli,
            models=self.gpu_spec,
        )

    def request(self) -> PodRequest:
        """The pod as gpushare's extender would read it (one container)."""
        containers: tuple[ContainerRequest, ...] = ()
        if self.num_gpu and self.gpu_milli >= MILLI:
            containers = (ContainerRequest(container="main", cards=self.num_gpu, exclusive=True),)
        elif self.num_gpu:
            percent = self.gpu_milli // 10
            containers = (
                ContainerRequest(container="main", core_percent=percent, memory_ratio=percent),
            )
        return PodRequest(
            containers=containers,
            models=self.gpu_spec,
            cpu_milli=self.cpu_milli,
            host_memory_mib=self.memory_mib,
        )


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [column for column in required if column not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
            yield from enumerate(reader, start=2)
    except OSError as error:
        raise TraceError(f"{path}: {error.strerror or error}") from error


def _int(path: Path, number: int, row: dict[str, str], column: str) -> int:
    value = (row.get(column) or "").strip()
    try:
        parsed = int(value)
    except ValueError:
        raise TraceError(f"{path}:{number}: {column} {value!r} is not a whole number") from None
    if parsed < 0:
        raise TraceError(f"{path}:{number}: {column} {parsed} is negative")
    return parsed


def read_nodes(path: Path) -> tuple[TraceNode, ...]:
    nodes = []
    for number, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        nodes.append(
            TraceNode(
                name=row["sn"],
                cpu_milli=_int(path, number, row, "cpu_milli"),
                memory_mib=_int(path, number, row, "memory_mib"),
                gpus=_int(path, number, row, "gpu"),
                model=(row.get("model") or "").strip(),
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return tuple(nodes)


def read_pods(path: Path) -> tuple[TracePod, ...]:
    pods = []
    for number, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        num_gpu = _int(path, number, row, "num_gpu")
        gpu_milli = min(MILLI, _int(path, number, row, "gpu_milli"))
        if num_gpu == 0:
            gpu_milli = 0
        elif gpu_milli == 0:
            raise TraceError(f"{path}:{number}: num_gpu {num_gpu} with gpu_milli 0")
        elif num_gpu > 1 and gpu_milli < MILLI:
            raise TraceError(f"{path}:{number}: a share of several cards is not in this trace")
        spec = tuple(
            dict.fromkeys(m.strip() for m in (row.get("gpu_spec") or "").split("|") if m.strip())
        )
        pods.append(
            TracePod(
                name=row["name"],
                cpu_milli=_int(path, number, row, "cpu_milli"),
                memory_mib=_int(path, number, row, "memory_mib"),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=spec,
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pods")
    return tuple(pods)
