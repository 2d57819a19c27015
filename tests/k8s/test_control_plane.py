"""The tier's own ground: the real control plane and a real kubelet do what Kubernetes does."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path

from kubernetes import client

from gpushare.embedded.k8s_binaries import K8sBinaries
from gpushare.embedded.k8s_cluster import ControlPlane, RealNode
from gpushare.embedded.k8s_extender import ExtenderStanza, extender_url
from tests.k8s.pods import eventually, host_pod, wait_for_phase

PINNED = re.search(
    r"^require k8s\.io/kubernetes (v\S+)$",
    (Path(__file__).parent / "build" / "go.mod").read_text(),
    re.MULTILINE,
)


def test_the_apiserver_is_the_version_the_project_builds(
    control_plane: ControlPlane, k8s_binaries: K8sBinaries
) -> None:
    assert PINNED is not None
    version = control_plane.server_version()
    if k8s_binaries.version is None:  # official release binaries: any v1.x.y
        assert re.fullmatch(r"v1\.\d+\.\d+", version)
    else:
        assert version == k8s_binaries.version == PINNED[1] == "v1.36.3"


def test_the_scheduler_calls_gpushares_extender_as_deploy_configures_it(
    control_plane: ControlPlane, extender_port: int
) -> None:
    config = (control_plane.directory / "scheduler-config.yaml").read_text()
    assert f'"urlPrefix": "http://127.0.0.1:{extender_port}/gpushare-scheduler"' in config
    assert '"bindVerb": "bind"' in config
    assert '"nodeCacheCapable": true' in config
    assert '{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": false}' in config


def test_a_real_node_registers_ready_and_runs_a_host_network_pod(
    real_nodes: Callable[[str], RealNode], k8s_api: client.CoreV1Api
) -> None:
    node = real_nodes("smoke-1")
    ready = [c for c in k8s_api.read_node("smoke-1").status.conditions if c.type == "Ready"]
    assert [c.status for c in ready] == ["True"]
    assert k8s_api.read_node("smoke-1").status.node_info.kubelet_version.startswith("v1.")
    assert (node.device_plugin_dir / "kubelet.sock").is_socket()
    assert node.pod_resources_socket.is_socket()

    k8s_api.create_namespaced_pod("default", host_pod("hello", "echo hello from $(hostname)"))

    wait_for_phase(k8s_api, "hello", {"Succeeded"})
    assert k8s_api.read_namespaced_pod("hello", "default").spec.node_name == "smoke-1"
    logs = k8s_api.read_namespaced_pod_log("hello", "default")
    assert logs.startswith("hello from ")


def test_a_kubelet_restart_keeps_containerd_and_the_running_pods(
    real_nodes: Callable[[str], RealNode], k8s_api: client.CoreV1Api
) -> None:
    node = real_nodes("smoke-2")
    k8s_api.create_namespaced_pod("default", host_pod("sleeper", "echo up; sleep 3600"))
    wait_for_phase(k8s_api, "sleeper", {"Running"})
    before = k8s_api.read_namespaced_pod("sleeper", "default").status.container_statuses[0]
    socket = node.device_plugin_dir / "kubelet.sock"
    old_socket = socket.stat().st_ctime_ns

    node.restart_kubelet()

    assert socket.is_socket()
    assert socket.stat().st_ctime_ns != old_socket
    after = eventually(
        lambda: k8s_api.read_namespaced_pod("sleeper", "default").status.container_statuses[0],
        "the pod's status after the restart",
    )
    assert after.container_id == before.container_id
    assert after.restart_count == 0
    assert after.state.running is not None

    def logs() -> str | None:  # the new kubelet serves a pod's logs once it has synced it
        with contextlib.suppress(client.ApiException):
            return str(k8s_api.read_namespaced_pod_log("sleeper", "default"))
        return None

    assert eventually(logs, "the pod's logs through the new kubelet") == "up\n"


def test_the_scheduler_can_be_restarted_with_other_extender_stanzas(
    control_plane: ControlPlane, extender_port: int
) -> None:
    pid_file = control_plane.directory / "pids" / "kube-scheduler.pid"
    before = pid_file.read_text()
    deployed = control_plane.extenders
    stanza = ExtenderStanza(extender_url(extender_port), node_cache_capable=False)
    try:
        control_plane.reconfigure_scheduler([stanza])

        config = (control_plane.directory / "scheduler-config.yaml").read_text()
        assert '"nodeCacheCapable": false' in config
        assert pid_file.read_text() != before
        assert Path(f"/proc/{pid_file.read_text().strip()}").exists()
    finally:
        control_plane.reconfigure_scheduler(deployed)
    assert (
        '"nodeCacheCapable": true'
        in (control_plane.directory / "scheduler-config.yaml").read_text()
    )
