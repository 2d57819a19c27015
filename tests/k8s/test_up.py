"""``gpushare up --k8s-bin --real-kubelet`` as an operator runs it: a real control plane and a
real kubelet, pods that schedule by themselves, and nothing left behind after Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes import config as kube_config

from gpushare.core.requests import GPU_MEM
from gpushare.embedded.k8s_binaries import K8sBinaries
from gpushare.embedded.k8s_ports import reserve_ports
from tests.k8s.pods import eventually, host_pod, wait_for_phase


def field(output: str, name: str) -> str:
    match = re.search(rf"^  {name}:\s+(.*)$", output, re.MULTILINE)
    assert match, output
    return match[1]


def test_up_runs_a_real_control_plane_and_kubelet_and_cleans_up_on_ctrl_c(
    kubelet_binaries: K8sBinaries, short_tmp: Path
) -> None:
    ports = reserve_ports(1)
    out = short_tmp / "up.out"
    args = ["--data-dir", str(short_tmp / "up"), "--nats-port", "0", "--port", str(ports.ports[0])]
    args += ["--k8s-bin", str(kubelet_binaries.directory), "--real-kubelet"]
    with out.open("wb") as output:
        up = subprocess.Popen(
            [sys.executable, "-m", "gpushare.cli.main", "up", *args, "--node", "up-a=16276"],
            stdout=output,
            stderr=subprocess.STDOUT,
        )

    def started() -> str | None:
        text = out.read_text()
        assert up.poll() is None, f"gpushare up exited with {up.returncode}:\n{text}"
        return text if "gpushare is up." in text else None

    try:
        text = eventually(started, "gpushare up", timeout=100)
        assert "real control plane (v1.36.3)" in text or kubelet_binaries.version is None
        assert "up-a (1 cards, real kubelet)" in text
        plane_dir = Path(re.findall(r"state in (\S+)", text)[0])
        api = client.CoreV1Api(kube_config.new_client_from_config(field(text, "kubeconfig")))
        pod = host_pod("by-itself", "sleep 3600", limits={GPU_MEM: "1000"})

        api.create_namespaced_pod("default", pod)

        wait_for_phase(api, "by-itself", {"Running"})
        assert api.read_namespaced_pod("by-itself", "default").spec.node_name == "up-a"
        assert_the_webhooks_judge_and_rename_new_pods(api)
        assert plane_dir.exists()
        assert "up-a" in Path("/etc/hosts").read_text()
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(90)
        ports.release()
    assert code == 0, out.read_text()
    assert "gpushare stopped." in out.read_text()
    assert not plane_dir.exists()
    assert "up-a" not in Path("/etc/hosts").read_text()
    assert str(plane_dir) not in Path("/proc/self/mountinfo").read_text()


def assert_the_webhooks_judge_and_rename_new_pods(api: client.CoreV1Api) -> None:
    """As on a deployed cluster (issue 36): seed 002's ``kubernetes.io/gpu: 50`` is renamed
    ``gpushare.io/gpu`` at creation and runs on a card; a memory amount alone, which would
    run without a GPU, is refused at creation with the rule it breaks."""
    seed_002 = host_pod("seed-002", "env; sleep 3600", limits={"kubernetes.io/gpu": "50"})
    api.create_namespaced_pod("default", seed_002)
    created = api.read_namespaced_pod("seed-002", "default")
    assert created.spec.containers[0].resources.limits == {"gpushare.io/gpu": "50"}
    wait_for_phase(api, "seed-002", {"Running"})
    logs = eventually(
        lambda: api.read_namespaced_pod_log("seed-002", "default"), "the container's env"
    )
    assert "NVIDIA_VISIBLE_DEVICES=GPU-" in logs
    memory_only = host_pod("memory-only", "sleep 3600", limits={"gpushare.io/gpu-memory": "4Gi"})
    with pytest.raises(client.ApiException) as refused:
        api.create_namespaced_pod("default", memory_only)
    assert refused.value.status == 403
    assert "memory-without-device-resource" in refused.value.body
