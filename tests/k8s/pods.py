"""Pods that run on a real node of the tier, and waiting for them."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from gpushare.cli.stack import Stack

TEST_IMAGE = "localhost/busybox:1"
"""Imported into each real node's containerd by kubelet-up.sh; never pulled."""


def host_pod(
    name: str,
    command: str,
    *,
    limits: Mapping[str, str] | None = None,
    node: str | None = None,
    annotations: Mapping[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """A ``hostNetwork`` busybox pod (a real node has no pod network) running ``sh -c``."""
    container: dict[str, Any] = {
        "name": "main",
        "image": TEST_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
    }
    if limits:
        container["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    if node:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def eventually(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """``condition()``'s first truthy value, polled; ``AssertionError`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def pod_phase(api: client.CoreV1Api, name: str, namespace: str = "default") -> str:
    return str(api.read_namespaced_pod(name, namespace).status.phase)


def wait_for_phase(
    api: client.CoreV1Api, name: str, phases: set[str], timeout: float = 60.0
) -> str:
    """Until the pod is in one of ``phases``; fails at once if it reaches another terminal one."""

    def reached() -> str | None:
        phase = pod_phase(api, name)
        if phase in {"Succeeded", "Failed"} and phase not in phases:
            status = api.read_namespaced_pod(name, "default").status
            raise AssertionError(f"pod {name} {phase}: {status.reason} {status.message}")
        return phase if phase in phases else None

    try:
        return str(eventually(reached, f"pod {name} in {sorted(phases)}", timeout))
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}\n{pod_story(api, name)}") from None


def pod_story(api: client.CoreV1Api, name: str, namespace: str = "default") -> str:
    """Where ``name`` got to: its node, phase, conditions, annotations and events (for a
    failure message: which of scheduler, binder and kubelet it is waiting on)."""
    pod = api.read_namespaced_pod(name, namespace)
    conditions = [
        f"{c.type}={c.status} {c.reason or ''} {c.message or ''}".strip()
        for c in pod.status.conditions or []
    ]
    events = api.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    ).items
    told = [
        f"{e.last_timestamp or e.event_time} {e.source.component if e.source else ''} "
        f"{e.reason}: {e.message}"
        for e in events
    ]
    return "\n".join(
        [
            f"node={pod.spec.node_name} phase={pod.status.phase}",
            f"conditions: {conditions}",
            f"annotations: {pod.metadata.annotations}",
            "events:",
            *told,
        ]
    )


def cards_by_index(stack: Stack, node: str) -> dict[int, dict[str, Any]]:
    """``node``'s cards as the allocator's ``/inspect`` shows them (uuid, used_mib, pods)."""
    with urllib.request.urlopen(f"{stack.extender_url}/inspect", timeout=5) as reply:
        nodes = json.loads(reply.read())["nodes"]
    [entry] = [n for n in nodes if n["name"] == node]
    return {card["index"]: card for card in entry["devs"]}
