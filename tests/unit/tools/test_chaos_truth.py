"""The chaos judge, case by case: a world where every source names a card for every
container, then one thing wrong at a time, and what the judge says about it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import pytest

from gpushare.core.annotations import GPU_INDEX_CONTAINER, IDX, binding_annotations
from gpushare.core.events import PodBound, PodReserved
from gpushare.core.invariants import Violation
from gpushare.core.model import ContainerShare, PodRef
from gpushare.core.state import ClusterState
from tests.unit.core.factories import T0, V100, inventory, make_card
from tools.chaos_facts import (
    ApiPod,
    FaultWindow,
    HeldDevices,
    RuntimeContainer,
    SeenAt,
    api_pod,
    runtime_containers,
)
from tools.chaos_readings import NodeCards, device_reading, env_reading
from tools.chaos_truth import (
    ADMISSION_FAILED,
    FAULT_GRACE_S,
    KILLED_MID_CALL,
    MISMATCH,
    NOT_STARTED,
    OVER_CAPACITY,
    PERMANENT,
    RELEASED_WHILE_RUNNING,
    STRAY,
    UNFITTABLE,
    Truth,
    count_kinds,
    judge,
)

NODE = "n"
CARDS = (make_card(0, node=NODE), make_card(1, node=NODE))
SHORT = {0: "n0", 1: "n1"}
"""The device-ID prefix of each card (``GPU-n-0`` → ``n0``)."""
MISSING = -1
"""A source that says nothing about the container."""


@dataclass(frozen=True)
class Pod:
    """One single-container pod and the card each source names for it."""

    name: str
    mib: int = 4096
    env: int = 0
    pod_resources: int = 0
    log: int = 0
    annotations: int = 0
    phase: str = "Running"
    reason: str = ""
    in_api: bool = True
    annotation_changes: dict[str, str] = field(default_factory=dict)
    env_changes: dict[str, str] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return f"uid-{self.name}"

    def ref(self) -> PodRef:
        return PodRef(namespace="default", name=self.name, uid=self.uid)

    def reservation(self, card: int) -> PodReserved:
        share = ContainerShare(
            container="main",
            card_index=card,
            card_uuid=CARDS[card].uuid,
            memory_mib=self.mib,
        )
        return PodReserved(id=f"r-{self.name}", at=T0, node=NODE, pod=self.ref(), shares=(share,))


def raw_pod(pod: Pod) -> dict[str, Any]:
    limits = {"aliyun.com/gpu-mem": str(pod.mib)}
    annotations = {}
    if pod.annotations != MISSING:
        annotations = binding_annotations(pod.reservation(pod.annotations), V100, "MiB")
    annotations.update(pod.annotation_changes)
    status: dict[str, Any] = {"phase": pod.phase}
    if pod.reason:
        status.update(reason=pod.reason, message=f"Allocate failed due to {pod.reason}")
    return {
        "metadata": {
            "namespace": "default",
            "name": pod.name,
            "uid": pod.uid,
            "annotations": annotations,
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "resources": {"limits": limits}}],
        },
        "status": status,
    }


def state_of(pods: list[Pod]) -> ClusterState:
    state = ClusterState()
    state.apply(inventory(NODE, CARDS))
    seq = 0
    for pod in pods:
        if pod.log == MISSING:
            continue
        reserved = pod.reservation(pod.log)
        bound = PodBound(
            id=f"{reserved.id}.bound", at=T0, node=NODE, pod=pod.ref(), reservation_id=reserved.id
        )
        for event in (reserved, bound):
            seq += 1
            state.apply(event, seq)
    return state


def runtime_of(pod: Pod) -> list[RuntimeContainer]:
    if pod.env == MISSING:
        return []
    card = CARDS[pod.env]
    env = {"NVIDIA_VISIBLE_DEVICES": card.uuid, "ALIYUN_COM_GPU_MEM_IDX": str(card.index)}
    env.update(pod.env_changes)
    return [RuntimeContainer(NODE, "default", pod.name, "main", env, uid=pod.uid)]


def held_of(pod: Pod) -> list[HeldDevices]:
    if pod.pod_resources == MISSING:
        return []
    ids = tuple(f"{SHORT[pod.pod_resources]}-{n}" for n in range(pod.mib))
    return [HeldDevices(NODE, "default", pod.name, "main", "aliyun.com/gpu-mem", ids)]


def world(*pods: Pod, **changes: Any) -> Truth:
    truth = Truth(
        state=state_of(list(pods)),
        pods=[api_pod(raw_pod(pod)) for pod in pods if pod.in_api],
        runtime=[c for pod in pods for c in runtime_of(pod)],
        held=[h for pod in pods for h in held_of(pod)],
    )
    return replace(truth, **changes)


def kinds(truth: Truth) -> dict[str, int]:
    return count_kinds(judge(truth))


def test_a_world_where_every_source_agrees_is_clean() -> None:
    truth = world(Pod("a"), Pod("b", 8000, 1, 1, 1, 1), Pod("c", 8276, 1, 1, 1, 1))
    assert judge(truth) == []


@pytest.mark.parametrize(
    ("pod", "said"),
    [
        pytest.param(Pod("a", env=1), "env card 1, pod-resources card 0", id="env"),
        pytest.param(Pod("a", pod_resources=1), "pod-resources card 1, log card 0", id="kubelet"),
        pytest.param(Pod("a", log=1), "log card 1, annotations card 0", id="log"),
        pytest.param(Pod("a", annotations=1), "log card 0, annotations card 1", id="annotations"),
        pytest.param(Pod("a", env=MISSING), "env nothing, pod-resources card 0", id="no runtime"),
        pytest.param(Pod("a", pod_resources=MISSING), "pod-resources nothing", id="not listed"),
        pytest.param(Pod("a", annotations=MISSING), "annotations nothing", id="no annotation"),
        pytest.param(
            Pod("a", annotation_changes={IDX: "1"}),
            "annotations card 0 [allocation JSON 0, ALIYUN_COM_GPU_MEM_IDX 1]",
            id="IDX annotation",
        ),
        pytest.param(
            Pod("a", annotation_changes={f"{GPU_INDEX_CONTAINER}main": "1"}),
            "[allocation JSON 0, gpushare.io/gpu-index-container-main 1]",
            id="per-container annotation",
        ),
        pytest.param(
            Pod("a", env_changes={"ALIYUN_COM_GPU_MEM_IDX": "1"}),
            "env card 0 [ALIYUN_COM_GPU_MEM_IDX=1 but NVIDIA_VISIBLE_DEVICES names card 0]",
            id="IDX env",
        ),
    ],
)
def test_a_container_the_sources_disagree_on_is_a_mismatch(pod: Pod, said: str) -> None:
    (violation,) = judge(world(pod))
    assert violation.check == MISMATCH
    assert violation.where == "pod default/a container main on n"
    assert said in violation.detail


def test_a_source_not_read_is_not_judged() -> None:
    truth = world(Pod("a", env=MISSING, pod_resources=MISSING), observed=frozenset())
    assert judge(truth) == []


def test_a_running_pod_the_log_released_is_named_once() -> None:
    (violation,) = judge(world(Pod("a", log=MISSING)))
    assert violation.check == RELEASED_WHILE_RUNNING
    assert violation.where == "pod default/a on n"


@pytest.mark.parametrize(
    ("source", "pods"),
    [
        pytest.param("env", [Pod("a", 10000), Pod("b", 8000, 0, 1, 1, 1)], id="env"),
        pytest.param("pod-resources", [Pod("a", 10000), Pod("b", 8000, 1, 0, 1, 1)], id="kubelet"),
        pytest.param("log", [Pod("a", 10000), Pod("b", 8000, 1, 1, 0, 1)], id="log"),
        pytest.param("annotations", [Pod("a", 10000), Pod("b", 8000, 1, 1, 1, 0)], id="ann"),
    ],
)
def test_a_card_over_capacity_by_any_one_source_is_a_violation(
    source: str, pods: list[Pod]
) -> None:
    found = judge(world(*pods))
    assert count_kinds(found) == {MISMATCH: 1, OVER_CAPACITY: 1}
    (over,) = [v for v in found if v.check == OVER_CAPACITY]
    assert over.where == f"n card 0 ({CARDS[0].uuid})"
    assert over.detail == f"by {source}: 18000 MiB of {V100} MiB: default/a(10000), default/b(8000)"


def test_pod_resources_count_memory_by_device_ids() -> None:
    cards = NodeCards.of(CARDS)
    ids = {"aliyun.com/gpu-mem": ["n0-1", "n0-2", "n1-7", "bogus-3"]}
    reading = device_reading(ids, None, cards, unit_mib=1024)
    assert dict(reading.mib) == {CARDS[0].uuid: 2048, CARDS[1].uuid: 1024}
    assert reading.note == "device IDs bogus-3 name no card"


def test_the_env_without_a_pod_to_read_the_ask_from_uses_its_limit() -> None:
    env = {
        "NVIDIA_VISIBLE_DEVICES": f"{CARDS[1].uuid},{CARDS[0].uuid}",
        "GPUSHARE_MEMORY_LIMIT_MIB": "3000",
    }
    reading = env_reading(env, None, NodeCards.of(CARDS))
    assert dict(reading.mib) == {CARDS[1].uuid: 3000, CARDS[0].uuid: 3000}
    assert reading.note == ""


@pytest.mark.parametrize(
    ("pod", "seen", "expected", "detail"),
    [
        pytest.param(
            Pod("a", log=MISSING, phase="Failed", reason="UnexpectedAdmissionError"),
            False,
            ADMISSION_FAILED,
            "UnexpectedAdmissionError: Allocate failed",
            id="in the API",
        ),
        pytest.param(
            Pod("a", log=MISSING, phase="Failed", reason="UnexpectedAdmissionError", in_api=False),
            True,
            ADMISSION_FAILED,
            "(seen during the run; deleted since)",
            id="seen, deleted since",
        ),
        pytest.param(
            Pod("a", log=MISSING, phase="Failed", reason="OutOfaliyun.com/gpu-mem"),
            True,
            ADMISSION_FAILED,
            "OutOfaliyun.com/gpu-mem",
            id="out of devices",
        ),
        pytest.param(
            Pod("a", 20000, log=MISSING, phase="Failed", reason="UnexpectedAdmissionError"),
            False,
            UNFITTABLE,
            "no card of the node can hold it",
            id="could never fit",
        ),
    ],
)
def test_a_bound_pod_that_failed_admission_is_a_violation(
    pod: Pod, seen: bool, expected: str, detail: str
) -> None:
    pod = replace(pod, env=MISSING, pod_resources=MISSING)
    failed = [api_pod(raw_pod(replace(pod, in_api=True)))] if seen else []
    (violation,) = judge(world(pod, failed_admissions=failed))
    assert violation.check == expected
    assert violation.where == "pod default/a on n"
    assert detail in violation.detail


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_pod_that_finished_otherwise_is_not_an_admission_failure(phase: str) -> None:
    pod = Pod("a", env=MISSING, pod_resources=MISSING, log=MISSING, phase=phase, reason="Error")
    assert judge(world(pod)) == []


def test_cards_held_for_a_pod_the_api_no_longer_has_are_strays() -> None:
    (violation,) = judge(world(Pod("gone", log=MISSING, in_api=False)))
    assert violation.check == STRAY
    assert violation.where == "pod default/gone on n"
    assert (
        violation.detail == "env and pod-resources hold cards for it, but the API has no such pod"
    )


def test_the_log_invariants_still_hold_bound_pending_pods_and_orphans() -> None:
    pending = Pod("p", env=MISSING, pod_resources=MISSING, log=MISSING, phase="Pending")
    orphan = Pod("o", env=MISSING, pod_resources=MISSING, in_api=False)
    assert kinds(world(pending, orphan)) == {"orphaned": 1, "unallocated": 1, NOT_STARTED: 1}


def test_a_bound_pod_the_kubelet_has_not_started_yet_is_waited_for() -> None:
    (violation,) = judge(world(Pod("a", env=MISSING, pod_resources=MISSING, phase="Pending")))
    assert violation == Violation(
        NOT_STARTED, "pod default/a on n", "bound, but still Pending (no condition from a kubelet)"
    )
    assert NOT_STARTED not in PERMANENT


def test_a_pod_asking_no_gpu_is_not_judged() -> None:
    raw = raw_pod(Pod("plain", annotations=MISSING))
    raw["spec"]["containers"][0]["resources"] = {}
    truth = Truth(state=state_of([]), pods=[api_pod(raw)])
    assert judge(truth) == []


def test_api_pods_read_phase_reason_asks_and_deletion() -> None:
    raw = raw_pod(Pod("a", 2048, phase="Failed", reason="UnexpectedAdmissionError"))
    raw["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    pod = api_pod(raw)
    assert isinstance(pod, ApiPod)
    assert (pod.key, pod.node, pod.facts.phase, pod.reason) == (
        "default/a",
        "n",
        "Failed",
        "UnexpectedAdmissionError",
    )
    assert pod.deleting
    assert pod.failed_admission
    assert {name: ask.memory_mib for name, ask in pod.asks.items()} == {"main": 2048}


def test_the_test_kubelets_containers_file_reads_as_runtime_containers() -> None:
    document = {
        "u1": {
            "namespace": "ml",
            "name": "p",
            "containers": {
                "main": {"env": {"NVIDIA_VISIBLE_DEVICES": "GPU-n-1"}, "devices": {}},
                "side": {"env": {}, "devices": {}},
            },
        }
    }
    assert runtime_containers("n", document) == [
        RuntimeContainer("n", "ml", "p", "main", {"NVIDIA_VISIBLE_DEVICES": "GPU-n-1"}, uid="u1"),
        RuntimeContainer("n", "ml", "p", "side", {}, uid="u1"),
    ]


def test_violations_are_counted_by_kind_in_a_stable_order() -> None:
    truth = world(Pod("a", env=1), Pod("b", log=MISSING), Pod("c", 20000, 1, 1, 1, 1))
    assert kinds(truth) == {
        MISMATCH: 1,
        OVER_CAPACITY: 4,
        RELEASED_WHILE_RUNNING: 1,
    }
    assert msgspec.json.decode(msgspec.json.encode(judge(truth)))  # plain values


def test_a_pod_being_deleted_whose_cards_are_still_held_is_a_stray_until_they_go() -> None:
    truth = world(Pod("a"))
    raw = raw_pod(Pod("a"))
    raw["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    (violation,) = judge(replace(truth, pods=[api_pod(raw)]))
    assert violation.check == STRAY
    assert violation.detail.endswith("but the API is deleting it (Running)")


def refused(*names: str, message: str) -> Truth:
    """Pods the kubelet refused with ``message``."""
    pods = [
        Pod(
            n,
            log=MISSING,
            env=MISSING,
            pod_resources=MISSING,
            phase="Failed",
            reason="UnexpectedAdmissionError",
        )
        for n in names
    ]
    truth = world(*pods)
    return replace(truth, pods=[replace(pod, message=message) for pod in truth.pods])


def seen(bound: float, refused: float, *names: str) -> SeenAt:
    """The watch saw each of ``names`` bound at ``bound`` and refused at ``refused``."""
    return SeenAt(
        bound={f"uid-{n}": bound for n in names}, refused={f"uid-{n}": refused for n in names}
    )


KILL = FaultWindow(start=100.0, end=101.0)
"""A node agent killed at 100 s and started again at 101 s."""


def test_every_pod_waiting_for_admission_when_the_plugin_died_is_the_faults() -> None:
    """Pods bound moments before the kill wait in the kubelet's queue; each one it
    admits before the new plugin's device list arrives is refused."""
    gone = "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices"
    truth = replace(refused("a", "b", "c", message=gone), seen=seen(99.5, 100.4, "a", "b", "c"))
    assert kinds(truth) == {ADMISSION_FAILED: 3}
    assert kinds(replace(truth, plugin_faults=[KILL])) == {KILLED_MID_CALL: 3}


def test_a_plugin_gone_refusal_outside_every_fault_stays_a_violation() -> None:
    gone = "Allocate failed due to rpc error: code = Unavailable desc = Socket closed"
    truth = replace(refused("before", "after", message=gone), plugin_faults=[KILL])
    refused_before_the_kill = seen(90.0, 95.0, "before")
    bound_long_after = seen(KILL.end + FAULT_GRACE_S + 1, 120.0, "after")
    both = SeenAt(
        bound={**refused_before_the_kill.bound, **bound_long_after.bound},
        refused={**refused_before_the_kill.refused, **bound_long_after.refused},
    )
    assert kinds(replace(truth, seen=both)) == {ADMISSION_FAILED: 2}
    assert kinds(replace(truth, seen=SeenAt())) == {ADMISSION_FAILED: 2}  # never seen
    bound_just_after = seen(KILL.end + FAULT_GRACE_S - 1, 112.0, "before", "after")
    assert kinds(replace(truth, seen=bound_just_after)) == {KILLED_MID_CALL: 2}


def test_a_refusal_that_names_no_missing_plugin_stays_a_violation_whatever_was_killed() -> None:
    truth = refused("a", message="no bound pod on node n waits for 2000 MiB on GPU0")
    during = replace(truth, plugin_faults=[KILL], seen=seen(99.5, 100.4, "a"))
    assert kinds(during) == {ADMISSION_FAILED: 1}


def test_a_restarted_kubelets_own_accounting_refusal_is_excused_only_after_a_restart() -> None:
    counted = "requested number of devices unavailable for aliyun.com/gpu-mem. Requested: 8192"
    truth = refused("a", message=f"Allocate failed due to {counted}, which is unexpected")
    during = replace(truth, plugin_faults=[KILL], seen=seen(99.5, 100.4, "a"))
    assert kinds(during) == {ADMISSION_FAILED: 1}
    assert kinds(replace(during, kubelet_restarts=1)) == {KILLED_MID_CALL: 1}


def test_ids_spanning_cards_after_a_kubelet_restart_are_its_accounting_too() -> None:
    """The plugin refuses the IDs a restarted kubelet offered (too few on any one card,
    as it still counts devices of pods it has not cleaned up); the same window applies."""
    split = "the device IDs span cards GPU0 (GPU-1), GPU1 (GPU-2); a container's memory"
    truth = refused("a", message=f"Allocate failed due to rpc error: desc = {split}")
    during = replace(truth, plugin_faults=[KILL], seen=seen(99.5, 100.4, "a"))
    assert kinds(during) == {ADMISSION_FAILED: 1}
    assert kinds(replace(during, kubelet_restarts=1)) == {KILLED_MID_CALL: 1}
