"""The parts of a Kubernetes Pod that gpushare reads, decoded straight from its JSON.

Unknown fields are ignored, so a full Pod from kube-scheduler or the API decodes fast.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from gpushare.core.constraints import Affinity, Toleration, TopologySpreadConstraint

Quantity = str | int | float


class ResourceRequirements(msgspec.Struct, frozen=True, kw_only=True):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class Container(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    name: str
    resources: ResourceRequirements | None = None
    restart_policy: str | None = None
    """Only on init containers: ``Always`` makes it a native sidecar (KEP-753), started in
    its place among the init containers and running for the pod's whole life."""

    @property
    def sidecar(self) -> bool:
        return self.restart_policy == "Always"


class ObjectMeta(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    name: str = ""
    namespace: str = "default"
    uid: str = ""
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None


class PodResourceClaim(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One entry of ``spec.resourceClaims``: a DRA claim the pod uses, by name or template."""

    name: str = ""
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None


class PodSpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] | None = None
    node_name: str | None = None
    scheduler_name: str | None = None
    node_selector: dict[str, str] | None = None
    affinity: Affinity | None = None
    tolerations: tuple[Toleration, ...] | None = None
    """The last three are what bind re-checks a node against (``gpushare.core.constraints``)."""
    topology_spread_constraints: tuple[TopologySpreadConstraint, ...] | None = None
    """Read for whether any only scores (``constraints.stated_preferences``)."""
    resource_claims: tuple[PodResourceClaim, ...] | None = None
    """DRA claims: the extender scores nodes for those of our DeviceClass (``core.dra``)."""


class ContainerStateDetail(msgspec.Struct, frozen=True, kw_only=True):
    """A container's ``waiting`` or ``terminated`` state: why, in the kubelet's words."""

    reason: str | None = None
    message: str | None = None


class ContainerState(msgspec.Struct, frozen=True, kw_only=True):
    waiting: ContainerStateDetail | None = None
    terminated: ContainerStateDetail | None = None


class ContainerStatus(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    state: ContainerState | None = None


class PodStatus(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    phase: str | None = None
    reason: str | None = None
    """Why the pod is in its phase, e.g. the kubelet's ``UnexpectedAdmissionError``."""
    message: str | None = None
    container_statuses: tuple[ContainerStatus, ...] | None = None


class Pod(msgspec.Struct, frozen=True, kw_only=True):
    metadata: ObjectMeta = ObjectMeta()
    spec: PodSpec = PodSpec()
    status: PodStatus | None = None

    @property
    def annotations(self) -> dict[str, str]:
        return self.metadata.annotations or {}

    @property
    def phase(self) -> str:
        return (self.status.phase if self.status else None) or "Pending"


def phase_detail(pod: Pod) -> str:
    """The phase with the kubelet's reason and message, and each container's
    terminated/waiting reason (``Failed: UnexpectedAdmissionError: Allocate failed ...;
    container main: ContainerCannotRun``); the phase alone when it gave none."""
    status = pod.status
    said = [pod.phase]
    if status is not None:
        said += [part for part in (status.reason, status.message) if part]
    parts = [": ".join(said)]
    for container in (status.container_statuses if status else None) or ():
        state = container.state
        detail = state and (state.terminated or state.waiting)
        if detail and (detail.reason or detail.message):
            why = ": ".join(part for part in (detail.reason, detail.message) if part)
            parts.append(f"container {container.name}: {why}")
    return "; ".join(parts)


def pod_from_dict(data: dict[str, Any]) -> Pod:
    """Read a Pod from its JSON-shaped dict (as the Kubernetes client serializes it)."""
    return msgspec.convert(data, Pod, strict=False)


TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
