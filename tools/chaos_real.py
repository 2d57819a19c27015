"""Chaos against the real-Kubernetes tier (``python -m tools.chaos --real-kubelet``).

The stack runs on a real control plane it starts (kube-apiserver, kube-scheduler calling
the first allocator as its extender, kube-controller-manager) with a **real kubelet**,
containerd and runc per node (``gpushare.cli.stack``, ``k8s_bin`` and ``real_kubelet``;
root). So kube-scheduler schedules the load's pods by itself, and what each container got
comes from containerd: the environment of its OCI spec (:func:`read_containerd`), beside
the kubelet's own pod-resources. The faults add kubelet restarts (containerd and the pods
stay, the device plugin registers again).

The pods are ``hostNetwork`` busybox pods (the tier has no pod network and pulls nothing)
that leave at once on SIGTERM, so a deleted pod's container goes within a second.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from gpushare.cli.stack import Stack
from gpushare.core.requests import GPU_MEM
from tools.chaos_facts import RuntimeContainer
from tools.chaos_sources import read_containerd

REAL_NODES = ("chaos-a=16276,16276", "chaos-b=16276,16276")
"""Two real kubelets (each a containerd and a kubelet) are what a 2-core machine carries."""
TEST_IMAGE = "localhost/busybox:1"
"""Imported into each real node's containerd by ``kubelet-up.sh``; never pulled."""
SLEEP = "trap 'exit 0' TERM; while true; do sleep 1; done"
"""Runs until SIGTERM, then leaves within a second."""
KUBELET = "kubelet"
"""The fault thread's name for a kubelet restart (``kubelet:<node>``)."""


def host_gpu_pod(name: str, mib: int) -> dict[str, Any]:
    """A pod the real kube-scheduler places: ``mib`` of ``aliyun.com/gpu-mem``."""
    limits = {GPU_MEM: str(mib)}
    container = {
        "name": "main",
        "image": TEST_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", SLEEP],
        "resources": {"limits": limits, "requests": limits},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "chaos"}},
        "spec": {
            "hostNetwork": True,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [container],
        },
    }


class RealKubelets:
    """Where real nodes keep the truth: containerd (each running container's environment)
    and the kubelet's pod-resources socket."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack

    def runtime(self) -> list[RuntimeContainer]:
        return [
            container
            for name, node in sorted(self._stack.real_nodes.items())
            for container in read_containerd(name, node.containerd_address)
        ]

    def pod_resources(self) -> dict[str, Path]:
        return {name: self._stack.pod_resources_socket(name) for name in self._stack.real_nodes}


def kubelet_victims(stack: Stack) -> list[str]:
    """``kubelet:<node>`` for every real kubelet the fault thread may restart."""
    return [f"{KUBELET}:{name}" for name in sorted(stack.real_nodes)]


def restart_kubelet(stack: Stack, victim: str) -> None:
    """Restart the real kubelet ``kubelet:<node>`` names (raises if it does not come back)."""
    stack.restart_kubelet(victim.partition(":")[2])


def keep_node_logs(stack: Stack) -> None:
    """Copy each real node's logs (kubelet, containerd) into the stack's logs, since the
    node's directory goes with it."""
    for name, node in stack.real_nodes.items():
        if node.logs_dir.is_dir():
            shutil.copytree(node.logs_dir, stack.logs_dir / name, dirs_exist_ok=True)
