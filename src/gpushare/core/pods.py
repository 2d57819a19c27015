"""The parts of a Kubernetes Pod that gpushare reads, decoded straight from its JSON.

Unknown fields are ignored, so a full Pod from kube-scheduler or the API decodes fast.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from gpushare.core.constraints import Affinity, Toleration

Quantity = str | int | float


class ResourceRequirements(msgspec.Struct, frozen=True, kw_only=True):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class Container(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    resources: ResourceRequirements | None = None


class ObjectMeta(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    name: str = ""
    namespace: str = "default"
    uid: str = ""
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None


class PodSpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] | None = None
    node_name: str | None = None
    scheduler_name: str | None = None
    node_selector: dict[str, str] | None = None
    affinity: Affinity | None = None
    tolerations: tuple[Toleration, ...] | None = None
    """The last three are what bind re-checks a node against (``gpushare.core.constraints``)."""


class PodStatus(msgspec.Struct, frozen=True, kw_only=True):
    phase: str | None = None


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


def pod_from_dict(data: dict[str, Any]) -> Pod:
    """Read a Pod from its JSON-shaped dict (as the Kubernetes client serializes it)."""
    return msgspec.convert(data, Pod, strict=False)


TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
