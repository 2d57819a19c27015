"""How the stack wires the services to real and test kubelets, and reads node quantities."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client

from gpushare.cli.stack import Stack, StackConfig, parse_node
from gpushare.core.requests import GPU_MEM
from gpushare.embedded.k8s_cluster import KubeletEndpoints
from gpushare.embedded.nats_server import NatsServer
from gpushare.kube import bringup as stack_kube


def node(allocatable: dict[str, str] | None, kubelet_version: str = "") -> client.V1Node:
    info = client.V1NodeSystemInfo(
        architecture="amd64",
        boot_id="",
        container_runtime_version="",
        kernel_version="",
        kube_proxy_version="",
        kubelet_version=kubelet_version,
        machine_id="",
        operating_system="linux",
        os_image="",
        system_uuid="",
    )
    status = client.V1NodeStatus(allocatable=allocatable, node_info=info)
    return client.V1Node(metadata=client.V1ObjectMeta(name="n"), status=status)


@pytest.mark.parametrize(
    ("allocatable", "count"),
    [({GPU_MEM: "2k"}, 2000), ({GPU_MEM: "32552"}, 32552), ({}, 0), (None, 0)],
)
def test_node_quantities_are_read_as_kubernetes_quantities(
    allocatable: dict[str, str] | None, count: int
) -> None:
    assert stack_kube.allocatable_count(node(allocatable), GPU_MEM) == count


def test_a_real_kubelet_is_told_by_the_version_it_reports() -> None:
    assert stack_kube.kubelet_version(node({}, "v1.36.3")) == "v1.36.3"
    assert stack_kube.kubelet_version(node({})) == ""
    assert stack_kube.kubelet_version(client.V1Node(status=None)) == ""


def started_with(tmp_path: Path, endpoints: dict[str, KubeletEndpoints]) -> dict[str, list[str]]:
    """The ``gpushare`` arguments each process would get (nothing is started; plain NATS:
    ``tests/unit/embedded/test_secure_bus.py`` wires the users)."""
    nodes = [parse_node("real-a=16276"), parse_node("sim-b=8000")]
    config = StackConfig(
        data_dir=tmp_path, nodes=nodes, extender_port=0, kubelet_nodes=endpoints, secure=False
    )
    stack = Stack(config, nats=NatsServer(tmp_path / "js", port=4222), kubeconfig=tmp_path / "kc")
    spawned: dict[str, list[str]] = {}
    stack.spawn = spawned.setdefault  # type: ignore[method-assign,assignment]
    stack._choose_allocator_ports()
    stack._start_kubelets()
    stack._start_services()
    return spawned


def test_nodes_a_real_kubelet_serves_get_its_sockets_and_no_test_kubelet(tmp_path: Path) -> None:
    real = KubeletEndpoints(tmp_path / "n" / "device-plugins", tmp_path / "n" / "pr.sock")

    spawned = started_with(tmp_path, {"real-a": real})

    agent = spawned["node-agent-real-a"]
    assert f"real-a={real.device_plugin_dir}" in agent
    assert f"real-a={real.pod_resources_socket}" in agent
    simulated = spawned["node-agent-sim-b"]
    assert f"sim-b={tmp_path / 'kubelet' / 'sim-b' / 'device-plugins'}" in simulated
    assert "--pod-resources-socket" not in simulated
    kubelet = spawned["kubelet"]
    assert [kubelet[i + 1] for i, arg in enumerate(kubelet) if arg == "--node"] == [
        f"sim-b={tmp_path / 'kubelet' / 'sim-b' / 'device-plugins'}"
    ]


def test_no_test_kubelet_runs_when_real_kubelets_serve_every_node(tmp_path: Path) -> None:
    endpoints = {
        name: KubeletEndpoints(tmp_path / name / "dp", tmp_path / name / "pr.sock")
        for name in ("real-a", "sim-b")
    }

    spawned = started_with(tmp_path, endpoints)

    assert "kubelet" not in spawned
    assert spawned["reporter-real-a"].count("--node") == 1
    assert "sim-b=8000" in spawned["reporter-sim-b"]


def test_real_kubelets_without_a_control_plane_are_refused(tmp_path: Path) -> None:
    config = StackConfig(data_dir=tmp_path, nodes=[parse_node("a=1000")], real_kubelet=True)
    stack = Stack(config)
    with pytest.raises(ValueError, match="give k8s_bin"):
        stack._start_kube_api(timeout=1)


def test_services_started_to_die_with_their_parent_do_when_it_is_killed() -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, time\n"
            "from gpushare.cli.stack import _die_with_parent\n"
            "child = subprocess.Popen(['sleep', '60'], preexec_fn=_die_with_parent)\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None
    with parent.stdout:
        child = int(parent.stdout.readline())
    assert Path(f"/proc/{child}").exists()

    parent.kill()
    parent.wait()

    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and "Z" not in state_of(child):
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.05)


def state_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
