"""Reading what a real node's containerd says each container was started with."""

from __future__ import annotations

from tools.chaos_facts import RuntimeContainer, containerd_container, running_task_ids, waiting_on

TASKS = """TASK                                                                PID      STATUS
48e5bef993116f91b1faf65b6cf00b7f4674c9897cd019f37814b8e2c9997d7d    27825    RUNNING
1142c563c85b746b4cc4f357bc9470d5e14acb0b0a8271b0c1987fe05d442a6f    27857    RUNNING
77aa00000000000000000000000000000000000000000000000000000000beef    0        STOPPED
"""


def info(kind: str = "container") -> dict[str, object]:
    """``ctr containers info`` of a pod's container, as containerd 1.6 prints it (trimmed)."""
    return {
        "ID": "1142c563c85b",
        "Labels": {
            "io.cri-containerd.kind": kind,
            "io.kubernetes.container.name": "main",
            "io.kubernetes.pod.name": "chaos-7",
            "io.kubernetes.pod.namespace": "default",
            "io.kubernetes.pod.uid": "292d80b6",
        },
        "Spec": {
            "process": {
                "env": [
                    "PATH=/usr/local/sbin:/usr/local/bin",
                    "NVIDIA_VISIBLE_DEVICES=GPU-n-1",
                    "ALIYUN_COM_GPU_MEM_IDX=1",
                    "EMPTY=",
                    "WITH=equals=inside",
                ]
            }
        },
    }


def test_only_running_tasks_count() -> None:
    assert running_task_ids(TASKS) == {
        "48e5bef993116f91b1faf65b6cf00b7f4674c9897cd019f37814b8e2c9997d7d",
        "1142c563c85b746b4cc4f357bc9470d5e14acb0b0a8271b0c1987fe05d442a6f",
    }
    assert running_task_ids("TASK PID STATUS\n") == set()


def test_a_containers_environment_comes_from_its_oci_spec() -> None:
    assert containerd_container("n", info()) == RuntimeContainer(
        node="n",
        namespace="default",
        pod="chaos-7",
        container="main",
        env={
            "PATH": "/usr/local/sbin:/usr/local/bin",
            "NVIDIA_VISIBLE_DEVICES": "GPU-n-1",
            "ALIYUN_COM_GPU_MEM_IDX": "1",
            "EMPTY": "",
            "WITH": "equals=inside",
        },
        uid="292d80b6",
    )


def test_pod_sandboxes_and_foreign_containers_are_left_out() -> None:
    assert containerd_container("n", info(kind="sandbox")) is None
    assert containerd_container("n", {"Labels": {}, "Spec": {}}) is None


def test_a_pending_pod_says_what_it_waits_on() -> None:
    scheduled = {"type": "PodScheduled", "status": "True"}
    assert waiting_on({"phase": "Pending", "conditions": [scheduled]}) == (
        "no condition from a kubelet"
    )
    status = {
        "phase": "Pending",
        "conditions": [
            scheduled,
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
            {"type": "PodReadyToStartContainers", "status": "False"},
        ],
        "containerStatuses": [
            {"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}},
            {"name": "side", "state": {"running": {}}},
        ],
    }
    assert waiting_on(status) == (
        "ContainersReady: ContainersNotReady; PodReadyToStartContainers: no reason; "
        "main: ContainerCreating"
    )
