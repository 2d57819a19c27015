"""In-memory stand-ins for the allocator's unit tests (the log's and the clock's fakes
are in :mod:`tests.fakes`)."""

from __future__ import annotations

from typing import Any

from gpushare.core.constraints import Node, NodeMeta
from gpushare.core.pods import Pod, pod_from_dict


class DictPodSource:
    """A PodSource over pods given as Kubernetes JSON dicts."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.reads = 0

    async def read_pod(self, namespace: str, name: str, uid: str = "") -> Pod | None:
        self.reads += 1
        found = self.pods.get((namespace, name))
        return None if found is None else pod_from_dict(found)

    async def read_node(self, name: str) -> Node | None:
        """Every node exists, with no labels and no taints."""
        return Node(metadata=NodeMeta(name=name))
