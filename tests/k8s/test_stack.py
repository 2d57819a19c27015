"""The services against the real control plane: kube-scheduler calls the extender by itself,
and a real kubelet (or the test kubelet) runs what the binder bound."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes import config as kube_config

from gpushare.cli.stack import Stack, StackConfig, parse_node
from gpushare.core.annotations import ASSIGNED, IDX
from gpushare.core.quantity import parse_count
from gpushare.core.requests import GPU_MEM
from gpushare.embedded.k8s_binaries import K8sBinaries
from tests.k8s.pods import cards_by_index, eventually, host_pod, wait_for_phase

PRINT_CARD = 'echo "visible=$NVIDIA_VISIBLE_DEVICES idx=$ALIYUN_COM_GPU_MEM_IDX"; sleep 3600'


def test_a_gpu_pod_schedules_by_itself_onto_a_real_kubelet_and_sees_its_card(
    k8s_stack: Callable[..., Stack], k8s_api: client.CoreV1Api
) -> None:
    stack = k8s_stack(["gpu-a=16276,16276"])
    assert "kubelet" not in stack.processes  # the real kubelet serves gpu-a
    node = k8s_api.read_node("gpu-a")
    assert parse_count(node.status.allocatable[GPU_MEM]) == 2 * 16276

    k8s_api.create_namespaced_pod(
        "default", host_pod("trainer", PRINT_CARD, limits={GPU_MEM: "4000"})
    )

    wait_for_phase(k8s_api, "trainer", {"Running"})
    pod = k8s_api.read_namespaced_pod("trainer", "default")
    assert pod.spec.node_name == "gpu-a"
    eventually(
        lambda: (
            k8s_api.read_namespaced_pod("trainer", "default").metadata.annotations.get(ASSIGNED)
            == "true"
        ),
        "the pod marked assigned",
    )
    annotated = int(pod.metadata.annotations[IDX])
    card = cards_by_index(stack, "gpu-a")[annotated]
    assert card["used_mib"] == 4000
    logs = eventually(lambda: k8s_api.read_namespaced_pod_log("trainer", "default"), "logs")
    assert logs.strip() == f"visible={card['uuid']} idx={annotated}"


def test_test_kubelet_nodes_advertise_pods_cpu_and_memory_to_the_real_scheduler(
    k8s_stack: Callable[..., Stack], k8s_api: client.CoreV1Api
) -> None:
    # 1000 + 1000 MiB: the apiserver writes the 2000 IDs as "2k"
    stack = k8s_stack(["sim-a=16276", "sim-k=1000,1000"], real_kubelet=False)
    assert "kubelet" in stack.processes
    for name in ("sim-a", "sim-k"):
        allocatable = k8s_api.read_node(name).status.allocatable
        assert allocatable["pods"] == "110"
        assert parse_count(allocatable["cpu"]) >= 1
        assert allocatable["memory"].endswith("Ki")
    assert k8s_api.read_node("sim-k").status.allocatable[GPU_MEM] == "2k"

    k8s_api.create_namespaced_pod("default", host_pod("big", "true", limits={GPU_MEM: "8000"}))

    wait_for_phase(k8s_api, "big", {"Running", "Succeeded"})
    assert k8s_api.read_namespaced_pod("big", "default").spec.node_name == "sim-a"


def test_a_stack_with_k8s_bin_runs_its_own_control_plane_removes_it_and_keeps_its_logs(
    k8s_binaries: K8sBinaries, short_tmp: Path
) -> None:
    config = StackConfig(
        data_dir=short_tmp / "own",
        nodes=[parse_node("own-a=16276,16276")],
        extender_port=0,
        k8s_bin=k8s_binaries.directory,
    )
    with Stack(config).start(timeout=120) as stack:
        assert stack.control_plane is not None
        plane = stack.control_plane
        assert (
            f'"urlPrefix": "{stack.extender_url}"'
            in (plane.directory / "scheduler-config.yaml").read_text()
        )
        assert plane.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
        api = client.CoreV1Api(kube_config.new_client_from_config(str(stack.kubeconfig)))
        api.create_namespaced_pod("default", host_pod("on-own", "true", limits={GPU_MEM: "9000"}))

        wait_for_phase(api, "on-own", {"Running", "Succeeded"})
        assert api.read_namespaced_pod("on-own", "default").spec.node_name == "own-a"
        cards = cards_by_index(stack, "own-a")
        assert sorted(card["used_mib"] for card in cards.values()) == [0, 9000]
    assert stack.control_plane is None
    assert not plane.directory.exists()
    # what each component said outlives the removed directory, beside the services' logs
    kept = stack.logs_dir / "kubernetes"
    assert "kube-apiserver" in " ".join(p.name for p in (kept / "control-plane").iterdir())


@pytest.mark.timeout(240)  # a restarted kubelet reports the plugin's IDs again ~20 s later
def test_after_a_kubelet_restart_the_node_agent_registers_again_and_pods_still_get_cards(
    k8s_stack: Callable[..., Stack], k8s_api: client.CoreV1Api
) -> None:
    stack = k8s_stack(["gpu-r=16276"])
    k8s_api.create_namespaced_pod(
        "default", host_pod("before", PRINT_CARD, limits={GPU_MEM: "4000"})
    )
    wait_for_phase(k8s_api, "before", {"Running"})

    stack.restart_kubelet("gpu-r")

    k8s_api.create_namespaced_pod(
        "default", host_pod("after", PRINT_CARD, limits={GPU_MEM: "4000"})
    )
    wait_for_phase(k8s_api, "after", {"Running"})
    card = cards_by_index(stack, "gpu-r")[0]
    assert card["used_mib"] == 8000
    logs = eventually(lambda: k8s_api.read_namespaced_pod_log("after", "default"), "logs")
    assert logs.strip() == f"visible={card['uuid']} idx=0"
    assert k8s_api.read_namespaced_pod("before", "default").status.phase == "Running"
