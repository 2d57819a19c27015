"""Pod shapes the seeds and Kubernetes allow, generated: every dialect and mixes of them,
shares and whole cards, 1-4 app containers, 0-2 init containers, 0-2 native sidecars
(``restartPolicy: Always``), ``container-multiple-gpu`` lists; and what gpushare must do
with each (serve it, or refuse it with the rule :func:`validate_pod` names).

A :class:`Shape` is plain data: printed, it is the pod to create again (``describe``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hypothesis import strategies as st

from gpushare.core.pods import pod_from_dict
from gpushare.core.requests import (
    GPU_MEM,
    GPUSHARE_CORE,
    GPUSHARE_GPU,
    GPUSHARE_MEMORY,
    GPUSHARE_RATIO,
    KOORDINATOR_CORE,
    KOORDINATOR_RATIO,
    MGPU_CORE,
    MGPU_MEMORY,
    MULTIPLE_GPU_ANNOTATION,
    NVIDIA_GPU,
    PodRequest,
    validate_pod,
)
from tests.k8s.pods import TEST_IMAGE

Role = Literal["init", "sidecar", "app"]
DIALECTS = ("aliyun", "gpushare", "koordinator", "vke", "nvidia")
"""Every dialect the node agents serve in the shape runs."""


@dataclass(frozen=True)
class ContainerShape:
    name: str
    role: Role
    limits: Mapping[str, str]
    """Empty: a container that asks no GPU."""


@dataclass(frozen=True)
class Shape:
    """One pod: its containers in spec order (init containers and sidecars first)."""

    name: str
    containers: tuple[ContainerShape, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        """A ``hostNetwork`` busybox pod: init containers exit at once, the others stay."""
        spec: dict[str, Any] = {
            "hostNetwork": True,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [_container(c) for c in self.containers if c.role == "app"],
        }
        early = [_container(c) for c in self.containers if c.role != "app"]
        if early:
            spec["initContainers"] = early
        metadata: dict[str, Any] = {"name": self.name, "namespace": "default"}
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}

    def judged(self) -> PodRequest | str:
        """What gpushare must make of it: the request it serves, or the rule it breaks."""
        verdict = validate_pod(pod_from_dict(self.manifest()))
        return verdict if isinstance(verdict, PodRequest) else verdict.rule

    def describe(self) -> str:
        """The shape as a line to paste back into a test."""
        parts = [
            f"{c.role} {c.name} {dict(c.limits)}" if c.limits else f"{c.role} {c.name} (no GPU)"
            for c in self.containers
        ]
        said = f" annotations {dict(self.annotations)}" if self.annotations else ""
        return f"pod {self.name}:{said} " + "; ".join(parts)


def _container(shape: ContainerShape) -> dict[str, Any]:
    command = "true" if shape.role == "init" else "env; sleep 3600"
    made: dict[str, Any] = {
        "name": shape.name,
        "image": TEST_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
    }
    if shape.limits:
        made["resources"] = {"limits": dict(shape.limits), "requests": dict(shape.limits)}
    if shape.role == "sidecar":
        made["restartPolicy"] = "Always"
    return made


MIB = st.sampled_from([512, 1000, 2000, 3000, 4000, 6000])
PERCENT = st.sampled_from([10, 25, 30, 50])


def _aliyun(draw: st.DrawFn) -> dict[str, str]:
    return {GPU_MEM: str(draw(MIB))}


def _gpushare(draw: st.DrawFn) -> dict[str, str]:
    kind = draw(st.sampled_from(["core+ratio", "core+memory", "shorthand", "whole", "ratio"]))
    if kind == "core+ratio":
        return {GPUSHARE_CORE: str(draw(PERCENT)), GPUSHARE_RATIO: str(draw(PERCENT))}
    if kind == "core+memory":
        return {GPUSHARE_CORE: str(draw(PERCENT)), GPUSHARE_MEMORY: f"{draw(MIB)}Mi"}
    if kind == "shorthand":
        return {GPUSHARE_GPU: str(draw(st.sampled_from([25, 50, 100])))}
    if kind == "whole":
        return {GPUSHARE_CORE: "100"}
    return {GPUSHARE_RATIO: str(draw(PERCENT))}


def _koordinator(draw: st.DrawFn) -> dict[str, str]:
    if draw(st.booleans()):
        return {KOORDINATOR_CORE: "100"}
    return {KOORDINATOR_CORE: str(draw(PERCENT)), KOORDINATOR_RATIO: str(draw(PERCENT))}


def _vke(draw: st.DrawFn, cards: int) -> dict[str, str]:
    """mGPU's totals over ``cards`` cards: divisible, a whole card at 100 % each."""
    if draw(st.integers(0, 3)) == 0:
        return {MGPU_CORE: str(100 * cards)}
    core = draw(st.sampled_from([10, 25, 30, 33]))
    memory = draw(st.sampled_from([1000, 2000, 3000]))
    limits = {MGPU_CORE: str(core * cards)}
    if draw(st.booleans()):
        limits[MGPU_MEMORY] = str(memory * cards)
    return limits


def _nvidia(draw: st.DrawFn) -> dict[str, str]:
    return {NVIDIA_GPU: "1"}


def _memory_only(draw: st.DrawFn) -> dict[str, str]:
    """Broken on purpose: no device plugin hands out a byte quantity's card."""
    return {GPUSHARE_MEMORY: f"{draw(MIB)}Mi"}


ASKS = {
    "aliyun": _aliyun,
    "gpushare": _gpushare,
    "koordinator": _koordinator,
    "nvidia": _nvidia,
    "memory-only": _memory_only,
}


@st.composite
def shapes(draw: st.DrawFn, name: str) -> Shape:
    """One pod of any shape: per container a dialect (or none), roles in any order."""
    apps = draw(st.integers(1, 4) if draw(st.integers(0, 3)) == 0 else st.integers(1, 2))
    roles: list[Role] = draw(
        st.lists(st.sampled_from(["init", "sidecar"]), max_size=3).filter(
            lambda r: r.count("init") <= 2 and r.count("sidecar") <= 2
        )
    )
    vke = draw(st.integers(0, 3)) == 0
    counts = [draw(st.sampled_from([1, 1, 2, 3])) for _ in range(apps)] if vke else []
    containers: list[ContainerShape] = []
    for position, role in enumerate([*roles, *(["app"] * apps)]):
        app_at = position - len(roles)
        containers.append(
            ContainerShape(
                name=f"{role}{position}",
                role=role,
                limits=_limits(draw, counts[app_at] if vke and app_at >= 0 else 1, vke),
            )
        )
    if not any(c.limits for c in containers):  # a GPU pod: the last app asks one
        asked = _vke(draw, counts[-1]) if vke else _aliyun(draw)
        containers[-1] = ContainerShape(containers[-1].name, "app", asked)
    annotations = {MULTIPLE_GPU_ANNOTATION: ",".join(map(str, counts))} if vke else {}
    return Shape(name=name, containers=tuple(containers), annotations=annotations)


def _limits(draw: st.DrawFn, cards: int, vke: bool) -> dict[str, str]:
    if vke:
        if draw(st.integers(0, 4)) == 0:
            return {}
        return _vke(draw, cards)
    dialect = draw(st.sampled_from([*ASKS, "none"]))
    return {} if dialect == "none" else ASKS[dialect](draw)


@st.composite
def batches(draw: st.DrawFn, size: int = 3) -> tuple[Shape, ...]:
    """Pods of several shapes created together (as one ``kubectl apply``)."""
    count = draw(st.integers(1, size))
    return tuple(draw(shapes(f"shape-{n}")) for n in range(count))


def describe(batch: Sequence[Shape]) -> str:
    return "\n".join(shape.describe() for shape in batch)
