"""The pod↔card contract's scenario on a real node: the stack, the API, the admissions
seen, and the judge's verdict (:mod:`tools.chaos_truth`) fed from the API, the runtime
(containerd, or the test kubelet's record), pod-resources and a fresh fold of the log.
Shared by the contract's chosen scenarios and the generated pod shapes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from gpushare.cli.stack import Stack
from gpushare.core.events import AllocationCorrected, AnyEvent, DiscrepancyFound, PodReserved
from gpushare.core.invariants import Violation
from gpushare.core.model import ContainerShare
from gpushare.embedded.k8s_cluster import ControlPlane
from gpushare.embedded.kubelet import CONTAINERS
from tests.e2e.conftest import read_log
from tests.k8s.pods import eventually, host_pod
from tools.chaos import replay
from tools.chaos_sources import (
    AdmissionWatch,
    read_api_pods,
    read_containerd,
    read_containers_file,
    read_pod_resources,
)
from tools.chaos_truth import Truth, judge

NODE = "gpu-a"
CARD_MIB = 16276
SETTLE_SECONDS = 60.0


@dataclass
class Scenario:
    """One real node, the stack around it, and everything seen while pods come and go."""

    stack: Stack
    api: client.CoreV1Api
    plane: ControlPlane
    watch: AdmissionWatch
    real: bool
    """A real kubelet with containerd; else the test kubelet."""
    created: list[str] = field(default_factory=list)

    def create(self, pods: Iterable[tuple[str, dict[str, str]]]) -> list[str]:
        """Create every ``(name, limits)`` at once (as one ``kubectl apply`` would)."""
        names = []
        for name, limits in pods:
            self.api.create_namespaced_pod(
                "default", host_pod(name, "env; sleep 3600", limits=limits)
            )
            names.append(name)
        self.created += names
        return names

    def apply(self, manifests: Iterable[dict[str, Any]]) -> list[str]:
        """Create every pod manifest at once (as one ``kubectl apply``)."""
        names = []
        for manifest in manifests:
            self.api.create_namespaced_pod(manifest["metadata"]["namespace"], manifest)
            names.append(str(manifest["metadata"]["name"]))
        self.created += names
        return names

    def delete(self, names: Sequence[str]) -> None:
        for name in names:
            self.api.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        eventually(lambda: not self._present(names), "the pods gone", timeout=90)

    def _present(self, names: Sequence[str]) -> set[str]:
        listed = {pod.metadata.name for pod in self.api.list_namespaced_pod("default").items}
        return listed & set(names)

    def running(self, names: Sequence[str], timeout: float = 120.0) -> None:
        def all_running() -> bool:
            self.stack.check_alive()  # a service that died says so now, with its log
            phases = {p.metadata.name: p.status.phase for p in self._pods(names)}
            failed = {n: p for n, p in phases.items() if p == "Failed"}
            assert not failed, f"pods failed: {failed}"
            return all(phases.get(name) == "Running" for name in names)

        try:
            eventually(all_running, f"{len(names)} pods Running", timeout=timeout)
        except AssertionError as error:
            states = {p.metadata.name: (p.status.phase, p.status.reason) for p in self._pods(names)}
            raise AssertionError(f"{error}: {states}\n{self.logs()}") from None

    def logs(self) -> str:
        """What the binder, the node agent and (real) the kubelet's device manager said."""
        tails = [
            f"--- {name}:\n{self.stack.log_tail(name, 40)}" for name in ("binder", "node-agent")
        ]
        if self.real:
            kubelet = self.plane.nodes[NODE].logs_dir / "kubelet.log"
            lines = kubelet.read_text(errors="replace").splitlines() if kubelet.exists() else []
            device = [line for line in lines if any(w in line.lower() for w in ("device", "admit"))]
            tails.append("--- kubelet (device manager, admission):\n" + "\n".join(device[-40:]))
        else:
            tails.append(f"--- test kubelet:\n{self.stack.log_tail('kubelet', 40)}")
        return "\n".join(tails)

    def _pods(self, names: Sequence[str]) -> list[client.V1Pod]:
        wanted = set(names)
        return [
            p for p in self.api.list_namespaced_pod("default").items if p.metadata.name in wanted
        ]

    def violations(self) -> list[Violation]:
        _, state = replay(self.stack)
        if self.real:
            runtime = read_containerd(NODE, self.plane.nodes[NODE].containerd_address)
        else:
            runtime = read_containers_file(NODE, self.stack.plugin_dir(NODE) / CONTAINERS)
        return judge(
            Truth(
                state=state,
                pods=read_api_pods(self.api),
                runtime=runtime,
                held=read_pod_resources({NODE: self.stack.pod_resources_socket(NODE)}),
                failed_admissions=self.watch.failed,
            )
        )

    def restart_kubelet(self) -> None:
        """The kubelet goes and comes back; containers keep running, plugins re-register."""
        if self.real:
            self.plane.nodes[NODE].restart_kubelet()
        else:
            self.stack.restart("kubelet")

    def settled(self) -> list[Violation]:
        """The judge's verdict once it stops changing for the better (or the wait ends)."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            found = self.violations()
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.5)

    def registrations(self) -> int:
        """How often the node agent registered ``aliyun.com/gpu-mem`` with the kubelet."""
        text = (self.stack.logs_dir / "node-agent.log").read_text(errors="replace")
        return text.count(f"node {NODE}: registered aliyun.com/gpu-mem with the kubelet")

    def log(self) -> list[AnyEvent]:
        return [event for _, event in read_log(self.stack)]


def planned_vs_final(
    events: Sequence[AnyEvent], state_shares: dict[str, tuple[ContainerShare, ...]]
) -> list[str]:
    """Pods whose live shares differ from what the allocator reserved for them."""
    reserved = {e.pod.uid: e.shares for e in events if isinstance(e, PodReserved)}
    return sorted(uid for uid, shares in state_shares.items() if reserved.get(uid) != shares)


def assert_contract(scenario: Scenario) -> None:
    found = scenario.settled()
    assert found == [], "\n".join(str(violation) for violation in found)
    events = scenario.log()
    false_records = [e for e in events if isinstance(e, DiscrepancyFound)]
    assert false_records == [], [e.detail for e in false_records]
    moved = [e for e in events if isinstance(e, AllocationCorrected)]
    assert moved == [], [e.reason for e in moved]
    _, state = replay(scenario.stack)
    live = {a.pod.uid: a.shares for n in state.nodes.values() for a in n.pods.values()}
    assert planned_vs_final(events, live) == []


def gpu_mem(mib: int) -> dict[str, str]:
    return {"aliyun.com/gpu-mem": str(mib)}


@contextmanager
def open_scenario(
    kubelet: str,
    k8s_stack: Callable[..., Stack],
    k8s_api: client.CoreV1Api,
    k8s_clean: ControlPlane,
    *,
    cards: int = 2,
    **stack_options: Any,
) -> Iterator[Scenario]:
    """``NODE`` with ``cards`` cards of ``CARD_MIB`` on the ``real-kubelet`` (containerd)
    or the ``test-kubelet``, gpushare's stack around it, admissions watched."""
    real = kubelet == "real-kubelet"
    spec = ",".join([str(CARD_MIB)] * cards)
    stack = k8s_stack([f"{NODE}={spec}"], real_kubelet=real, **stack_options)
    with AdmissionWatch(k8s_api) as watch:
        yield Scenario(stack=stack, api=k8s_api, plane=k8s_clean, watch=watch, real=real)
