"""The facts a chaos run judges, as each source serves them, decoded into plain values.

* :class:`ApiPod`: a pod as the Kubernetes API has it (phase, reason, annotations, and
  what each container asks of the GPUs);
* :class:`RuntimeContainer`: a container as its runtime started it (its environment);
* :class:`HeldDevices`: a container's device IDs as the kubelet's pod-resources lists them;
* :class:`SeenAt` and :class:`FaultWindow`: when the run saw pods bound and refused, and
  when its faults took a node's device plugin away.

Pure: documents in, values out. Reading them is :mod:`tools.chaos_sources`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.core.errors import GpushareError
from gpushare.core.invariants import PodFacts, pod_facts
from gpushare.core.pods import pod_from_dict
from gpushare.core.requests import ContainerRequest, read_gpu_request

ADMISSION_REASON = "UnexpectedAdmissionError"
"""The kubelet's reason when a device plugin's Allocate fails."""


@dataclass(frozen=True)
class SeenAt:
    """When the run's pod watch first saw each pod (by UID) bound, and refused (monotonic s)."""

    bound: Mapping[str, float] = field(default_factory=dict)
    refused: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class FaultWindow:
    """From a fault that took device plugins away (a node agent SIGKILLed, a kubelet
    restarting) to when the run had started it again (monotonic s)."""

    start: float
    end: float


def is_admission_failure(phase: str, reason: str) -> bool:
    """The kubelet refused the pod at admission (a device plugin's Allocate, or too few IDs)."""
    return phase == "Failed" and (reason == ADMISSION_REASON or reason.startswith("OutOf"))


@dataclass(frozen=True)
class ApiPod:
    """What the Kubernetes API says about one pod."""

    facts: PodFacts
    reason: str = ""
    message: str = ""
    deleting: bool = False
    asks: Mapping[str, ContainerRequest] = field(default_factory=dict)
    """Container → what it asks of the GPUs (init containers too); empty: no GPU."""
    waiting: str = ""
    """What a pod that has not started waits on, as its status says (its conditions not
    met, its containers' waiting reasons); empty once it runs."""

    @property
    def key(self) -> str:
        return self.facts.key

    @property
    def node(self) -> str | None:
        return self.facts.node

    @property
    def running(self) -> bool:
        return self.facts.phase == "Running" and not self.deleting

    @property
    def failed_admission(self) -> bool:
        return self.node is not None and is_admission_failure(self.facts.phase, self.reason)


def api_pod(raw: Mapping[str, Any], memory_unit: str = "MiB") -> ApiPod:
    """A pod as the API serves it (JSON, camelCase keys)."""
    status = raw.get("status") or {}
    try:
        request = read_gpu_request(pod_from_dict(dict(raw)), memory_unit)
        asks = {ask.container: ask for ask in request.containers}
    except GpushareError:
        asks = {}
    return ApiPod(
        facts=pod_facts(raw),
        reason=str(status.get("reason") or ""),
        message=str(status.get("message") or ""),
        deleting=bool((raw.get("metadata") or {}).get("deletionTimestamp")),
        asks=asks,
        waiting=waiting_on(status),
    )


def waiting_on(status: Mapping[str, Any]) -> str:
    """A pod status's unmet conditions and its containers' waiting reasons, in a line:
    ``"no condition from a kubelet"`` when only the scheduler has written it."""
    conditions = status.get("conditions") or []
    if not any(c.get("type") != "PodScheduled" for c in conditions):
        return "no condition from a kubelet"
    unmet = [
        _said(str(c.get("type")), c.get("reason"), c.get("message"))
        for c in conditions
        if c.get("status") != "True"
    ]
    statuses = [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]
    waits = [
        _said(str(s.get("name")), waiting.get("reason"), waiting.get("message"))
        for s in statuses
        if (waiting := (s.get("state") or {}).get("waiting")) is not None
    ]
    return "; ".join(unmet + waits)


def _said(what: str, reason: object, message: object) -> str:
    return f"{what}: {' '.join(str(part) for part in (reason, message) if part) or 'no reason'}"


@dataclass(frozen=True)
class RuntimeContainer:
    """A container as its runtime started it: the environment it really has."""

    node: str
    namespace: str
    pod: str
    container: str
    env: Mapping[str, str]
    uid: str = ""


def runtime_containers(node: str, document: Mapping[str, Any]) -> list[RuntimeContainer]:
    """The test kubelet's ``containers.json``: ``{uid: {namespace, name, containers:
    {name: {env, devices}}}}``."""
    return [
        RuntimeContainer(
            node=node,
            namespace=str(pod.get("namespace", "default")),
            pod=str(pod.get("name", "")),
            container=name,
            env=dict(container.get("env") or {}),
            uid=uid,
        )
        for uid, pod in document.items()
        for name, container in (pod.get("containers") or {}).items()
    ]


@dataclass(frozen=True)
class HeldDevices:
    """One container's device IDs of one resource, as the kubelet's pod-resources lists them."""

    node: str
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


CONTAINERD_KIND = "io.cri-containerd.kind"
POD_NAME_LABEL = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
POD_UID_LABEL = "io.kubernetes.pod.uid"
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"


def running_task_ids(tasks_ls: str) -> set[str]:
    """The container IDs ``ctr tasks ls`` lists as ``RUNNING``."""
    ids = set()
    for line in tasks_ls.splitlines()[1:]:
        words = line.split()
        if len(words) >= 3 and words[2] == "RUNNING":
            ids.add(words[0])
    return ids


def containerd_container(node: str, info: Mapping[str, Any]) -> RuntimeContainer | None:
    """A Kubernetes container from ``ctr containers info`` (its OCI spec's environment);
    ``None`` for a pod sandbox or a container the kubelet did not make."""
    labels = info.get("Labels") or {}
    if labels.get(CONTAINERD_KIND) != "container" or POD_NAME_LABEL not in labels:
        return None
    process = (info.get("Spec") or {}).get("process") or {}
    env = dict(entry.partition("=")[::2] for entry in process.get("env") or ())
    return RuntimeContainer(
        node=node,
        namespace=str(labels.get(POD_NAMESPACE_LABEL, "default")),
        pod=str(labels[POD_NAME_LABEL]),
        container=str(labels.get(CONTAINER_NAME_LABEL, "")),
        env=env,
        uid=str(labels.get(POD_UID_LABEL, "")),
    )
