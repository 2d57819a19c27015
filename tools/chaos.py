"""``python -m tools.chaos --duration 60 --seed N [--json] [--real-kubelet]``: load and faults.

It starts the whole stack (two allocators, two binders, several simulated nodes), then
for ``--duration`` seconds at once:

* a **load** thread creates pods of random ``aliyun.com/gpu-mem`` sizes through the
  official client and schedules each as kube-scheduler does (filter, prioritize, bind
  over HTTP against a random live allocator, retrying on errors), and deletes random pods;
* a **fault** thread SIGKILLs a random service (allocator, binder, node-agent, reporter)
  every few seconds and starts it again, and sometimes restarts nats-server (SIGTERM or
  SIGKILL) on the same port and store.

With ``--real-kubelet`` the same runs on a real control plane and a real kubelet per node
(:mod:`tools.chaos_real`): kube-scheduler places the pods, containerd says what each
container got, and the faults restart kubelets too.

Then it stops both, lets the system settle (bounded) and judges it from independent
truth (:mod:`tools.chaos_truth`): for every running container, the card its environment
names, the card the kubelet's pod-resources reports, the card the log holds and the card
the pod's annotations name must be one; no card may be fuller than it is by any of them;
no pod bound through gpushare may fail admission (a pod watch sees those the load
deletes); no running pod may have lost its reservation; and the log's own invariants
(:mod:`gpushare.core.invariants`) hold, each live allocator's ``GET .../inspect`` equal to
the same view of a fresh fold at the sequence it has applied. It prints a summary and
exits 1 on any violation. See ``docs/chaos.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import logging
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import msgspec
from kubernetes import client, config

from gpushare.allocator.inspection import inspect_cluster
from gpushare.bus.connection import connect
from gpushare.bus.nats_types import JetStreamContext
from gpushare.bus.provenance import decode_from, origin_of
from gpushare.bus.reading import read_records
from gpushare.bus.subjects import (
    ALL_ALLOCATIONS,
    ALL_INVENTORY,
    ALLOCATION_STREAM,
    INVENTORY_STREAM,
)
from gpushare.cli.stack import Stack, StackConfig, parse_node
from gpushare.core.invariants import Violation, compare_inspections
from gpushare.core.requests import GPU_MEM
from gpushare.core.state import ClusterState, Folded, Unfolded, fold_events
from gpushare.embedded.k8s_binaries import bin_dir
from gpushare.embedded.k8s_cluster import GPU_NODE_KUBELET_CONFIG
from gpushare.embedded.kubelet import CONTAINERS
from gpushare.embedded.scheduler import ExtenderCallFailed, ExtenderClient
from tools.chaos_facts import FaultWindow, RuntimeContainer
from tools.chaos_real import (
    KUBELET,
    REAL_NODES,
    RealKubelets,
    host_gpu_pod,
    keep_node_logs,
    kubelet_victims,
    restart_kubelet,
)
from tools.chaos_sources import (
    AdmissionWatch,
    SourceUnreadable,
    read_api_pods,
    read_containers_file,
    read_pod_resources,
)
from tools.chaos_truth import KILLED_MID_CALL, PERMANENT, Truth, count_kinds, judge

NODES = ("chaos-a=16276,16276", "chaos-b=16276,16276", "chaos-c=32510", "chaos-d=16276,16276,16276")
SIZES_MIB = (512, 1024, 2048, 4096, 8192)
VICTIMS = ("allocator", "binder", "node-agent", "reporter")
REAL_DEFAULTS: dict[str, Any] = {
    "real_kubelet": True,
    "nodes": REAL_NODES,
    "create_every_s": 0.4,
    "max_live_pods": 30,
}
"""What a 2-core machine carries with a real kubelet, containerd and runc per node."""
CALL_ERRORS = (ExtenderCallFailed, OSError, http.client.HTTPException, ValueError)
"""What kube-scheduler sees as a failed extender call: an HTTP error, a dead socket, junk."""


@dataclass(frozen=True)
class ChaosConfig:
    duration_s: float = 60.0
    seed: int = 0
    data_dir: Path | None = None
    """Where the stack keeps its store and logs (default: a temporary directory)."""
    nodes: tuple[str, ...] = NODES
    allocators: int = 2
    binders: int = 2
    fault_every_s: float = 3.0
    """Mean pause between two faults."""
    nats_restart_chance: float = 0.2
    kubelet_restart_chance: float = 0.15
    """Of a fault restarting a real kubelet instead (``real_kubelet`` only)."""
    create_every_s: float = 0.15
    delete_chance: float = 0.35
    max_live_pods: int = 60
    bind_attempts: int = 5
    """kube-scheduler's retries of one pod, here bounded."""
    settle_timeout_s: float = 90.0
    """Longer than the binder's reconcile interval (60 s by default), which heals what a
    fault made it miss."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for every service, e.g. ``GPUSHARE_RECONCILE_INTERVAL``."""
    real_kubelet: bool = False
    """Run on a real control plane with a real kubelet per node (:mod:`tools.chaos_real`):
    kube-scheduler places the pods, containerd says what each container got."""
    k8s_bin: Path | None = None
    """The Kubernetes binaries (default ``$GPUSHARE_K8S_BIN_DIR``, else ~/.cache/gpushare/k8s)."""


@dataclass
class Summary:
    seed: int
    duration_s: float
    pods: dict[str, int] = field(default_factory=dict)
    """created, deleted, scheduled, unschedulable (no room), unschedulable_stale (a node's
    inventory looked stale to the allocator), gave_up, call_failures, bind_errors."""
    faults: dict[str, int] = field(default_factory=dict)
    """By victim: allocator, binder, node-agent, reporter, nats-server (and crashed ones)."""
    crashes: list[str] = field(default_factory=list)
    """Processes that died without being killed: each is a finding."""
    final: dict[str, int] = field(default_factory=dict)
    settle_s: float = 0.0
    settling: dict[str, str] = field(default_factory=dict)
    """The first violation of each kind seen while the system settled (transient ones)."""
    violations: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    """Pods the kubelet refused because a killed plugin died under their admission (the
    kubelet never retries one): the fault's, not a violation; bounded by the judge."""
    kinds: dict[str, int] = field(default_factory=dict)
    """Violations by kind (``mismatch``, ``admission failed``, ...; ``crash``)."""
    data_dir: str = ""

    def count(self, what: str, lock: threading.Lock) -> None:
        with lock:
            self.pods[what] = self.pods.get(what, 0) + 1

    def fault(self, victim: str) -> None:
        self.faults[victim] = self.faults.get(victim, 0) + 1


def replay(stack: Stack, until_seq: int | None = None) -> tuple[int, ClusterState]:
    """A fresh fold of ``stack``'s allocation log up to ``until_seq`` (default: all of it)
    and of every node's last inventory, read straight from the streams as its ``auditor``;
    and that sequence."""

    async def read() -> tuple[int, ClusterState]:
        credentials = stack.credentials("auditor")
        nc = await connect(stack.nats_url, name="gpushare-chaos", credentials=credentials)
        try:
            js = nc.jetstream()
            last = (await js.stream_info(ALLOCATION_STREAM)).state.last_seq
            end = last if until_seq is None else min(last, until_seq)
            pairs: list[tuple[int, Folded]] = []
            async for record in read_records(js, ALLOCATION_STREAM, ALL_ALLOCATIONS, until_seq=end):
                try:  # folded as every service folds it: checked against its subject
                    pairs.append((record.seq, decode_from(record.subject, record.data)))
                except msgspec.MsgspecError:
                    origin = origin_of(record.subject)
                    if origin is not None:
                        pairs.append((record.seq, Unfolded(node=origin.node)))
            return int(end), fold_events([*pairs, *await last_inventories(js)])
        finally:
            await nc.close()

    return asyncio.run(read())


async def last_inventories(js: JetStreamContext) -> list[tuple[int, Folded]]:
    """Every node's last inventory. The stream keeps one per node, so a heartbeat stored
    during the read deletes the message the read was about to reach and lands past its
    end: read again until the stream did not move meanwhile."""
    for _ in range(INVENTORY_READS):
        before = (await js.stream_info(INVENTORY_STREAM)).state.last_seq
        found: list[tuple[int, Folded]] = []
        async for record in read_records(js, INVENTORY_STREAM, ALL_INVENTORY):
            with contextlib.suppress(msgspec.MsgspecError):
                found.append((0, decode_from(record.subject, record.data)))
        if (await js.stream_info(INVENTORY_STREAM)).state.last_seq == before:
            return found
    raise RuntimeError(f"the inventory stream moved during each of {INVENTORY_READS} reads")


INVENTORY_READS = 20


def kube_api(stack: Stack) -> client.CoreV1Api:
    """A client of the stack's Kubernetes API (one per thread that uses it)."""
    return client.CoreV1Api(config.new_client_from_config(str(stack.kubeconfig)))  # type: ignore[no-untyped-call]


def gpu_pod(name: str, mib: int) -> client.V1Pod:
    limits = {GPU_MEM: str(mib)}
    resources = client.V1ResourceRequirements(limits=limits, requests=limits)
    container = client.V1Container(name="main", image="example.invalid/cuda", resources=resources)
    meta = client.V1ObjectMeta(name=name, namespace="default", labels={"app": "chaos"})
    return client.V1Pod(metadata=meta, spec=client.V1PodSpec(containers=[container]))


class Load:
    """Creates, schedules (as kube-scheduler) and deletes pods until stopped."""

    def __init__(self, stack: Stack, config_: ChaosConfig, summary: Summary) -> None:
        self.api = kube_api(stack)
        self._serialize = self.api.api_client.sanitize_for_serialization
        self._stack, self._config, self._summary = stack, config_, summary
        self._rng = random.Random(config_.seed)
        self._lock = threading.Lock()
        self._live: dict[str, dict[str, Any]] = {}
        self._nodes = [parse_node(node).name for node in config_.nodes]
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kube-scheduler")
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self._config.create_every_s):
            crowded = len(self._live) >= self._config.max_live_pods
            if self._live and (crowded or self._rng.random() < self._config.delete_chance):
                self._delete(self._rng.choice(sorted(self._live)))
            else:
                self._create(f"chaos-{self._summary.pods.get('created', 0)}")
        self._pool.shutdown(wait=True)

    def _create(self, name: str) -> None:
        mib = self._rng.choice(SIZES_MIB)
        pod: Any = host_gpu_pod(name, mib) if self._config.real_kubelet else gpu_pod(name, mib)
        try:
            created = self._serialize(self.api.create_namespaced_pod("default", pod))
        except client.ApiException:
            self._summary.count("api_errors", self._lock)
            return
        with self._lock:
            self._live[name] = created
        self._summary.count("created", self._lock)
        if not self._config.real_kubelet:  # else the real kube-scheduler places it
            self._pool.submit(self._schedule, created, random.Random(self._rng.random()))

    def _delete(self, name: str) -> None:
        with self._lock:
            self._live.pop(name, None)
        try:
            self.api.delete_namespaced_pod(name, "default")
        except client.ApiException:
            self._summary.count("api_errors", self._lock)
            return
        self._summary.count("deleted", self._lock)

    def _schedule(self, pod: dict[str, Any], rng: random.Random) -> None:
        """One pod's scheduling cycles, as kube-scheduler retries them (bounded)."""
        name = pod["metadata"]["name"]
        for _ in range(self._config.bind_attempts):
            if self.stopping.is_set() or name not in self._live:
                return
            allocators = [a for a in self._stack.names("allocator") if a not in self._stack.down]
            url = self._stack.extender_url_of(rng.choice(allocators or ["allocator"]))
            try:
                result = ExtenderClient(url, timeout=15).schedule(pod, self._nodes)
            except CALL_ERRORS:
                self._summary.count("call_failures", self._lock)
            else:
                if result.node is not None:
                    self._summary.count("scheduled", self._lock)
                    return
                if not result.passed:
                    stale = any("stale" in reason for reason in result.failed.values())
                    self._summary.count(
                        "unschedulable_stale" if stale else "unschedulable", self._lock
                    )
                    return
                self._summary.count("bind_errors", self._lock)
            self.stopping.wait(0.3)
        self._summary.count("gave_up", self._lock)


class Faults:
    """SIGKILLs a random service every few seconds and starts it again; restarts NATS
    (and real kubelets)."""

    def __init__(self, stack: Stack, config_: ChaosConfig, summary: Summary) -> None:
        self._stack, self._config, self._summary = stack, config_, summary
        self._rng = random.Random(config_.seed + 1)
        self.stopping = threading.Event()
        self.plugin_faults: list[FaultWindow] = []
        """Each node agent killed and each kubelet restarted, until started again."""

    def run(self) -> None:
        pause = self._config.fault_every_s
        while not self.stopping.wait(self._rng.uniform(0.5, 1.5) * pause):
            draw = self._rng.random()
            kubelets = kubelet_victims(self._stack)
            if draw < self._config.nats_restart_chance:
                self._restart_nats(hard=self._rng.random() < 0.5)
            elif (
                kubelets
                and draw < self._config.nats_restart_chance + self._config.kubelet_restart_chance
            ):
                self._restart_kubelet(self._rng.choice(kubelets))
            else:
                victims = [n for kind in VICTIMS for n in self._stack.names(kind)]
                name = self._rng.choice(victims)
                kind = self._stack.argv[name][0]
                started = time.monotonic()
                self._stack.kill(name)
                self._summary.fault(kind)
                self.stopping.wait(self._rng.uniform(0.0, 1.0))
                self._restart(name)
                if kind == "node-agent":
                    self.plugin_faults.append(FaultWindow(started, time.monotonic()))
            self.revive()

    def _restart_kubelet(self, victim: str) -> None:
        self._summary.fault(KUBELET)
        started = time.monotonic()
        try:
            restart_kubelet(self._stack, victim)
        except (OSError, RuntimeError, TimeoutError) as error:
            self._summary.crashes.append(f"{victim} did not come back: {error}")
        self.plugin_faults.append(FaultWindow(started, time.monotonic()))

    def _restart_nats(self, hard: bool) -> None:
        self._summary.fault("nats-server")
        try:
            self._stack.restart_nats(hard=hard)
        except (OSError, TimeoutError) as error:
            self._summary.crashes.append(f"nats-server did not come back: {error}")

    def revive(self) -> None:
        """Start again what is down: killed and not yet back, or died on its own (a crash)."""
        for name, process in list(self._stack.processes.items()):
            if process.poll() is None:
                continue
            if name not in self._stack.down:
                self._summary.crashes.append(f"{name} exited with {process.returncode}")
            self._restart(name)

    def _restart(self, name: str) -> None:
        try:
            self._stack.restart(name, timeout=60)
        except (RuntimeError, TimeoutError) as error:
            self._summary.crashes.append(f"{name} did not come back: {error}")


def get_json(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return dict(json.loads(reply.read()))
    except urllib.error.HTTPError as error:
        return dict(json.loads(error.read() or b"{}"))


def applied_seq(stack: Stack, allocator: str) -> int:
    url = stack.extender_url_of(allocator).rsplit("/", 1)[0] + "/readyz"
    try:
        return int(get_json(url).get("applied_seq", -1))
    except (OSError, ValueError):
        return -1


def compare_allocators(stack: Stack, seq: int, state: ClusterState) -> list[Violation] | None:
    """Each allocator's inspect against the fresh fold at ``seq``; None if one is not there."""
    replayed = json.loads(msgspec.json.encode(inspect_cluster(state, datetime.now(UTC))))
    found: list[Violation] = []
    for allocator in stack.names("allocator"):
        if applied_seq(stack, allocator) != seq:
            return None
        live = get_json(f"{stack.extender_url_of(allocator)}/inspect")
        if applied_seq(stack, allocator) != seq:
            return None
        found += compare_inspections(live, replayed, name=allocator)
    return found


class StackKubelets:
    """Where the stack's test kubelets keep the truth: each node's ``containers.json``
    (what it started every container with) and its pod-resources socket."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self.nodes = [node.name for node in stack.config.nodes]

    def runtime(self) -> list[RuntimeContainer]:
        return [
            container
            for node in self.nodes
            for container in read_containers_file(node, self._stack.plugin_dir(node) / CONTAINERS)
        ]

    def pod_resources(self) -> dict[str, Path]:
        return {node: self._stack.pod_resources_socket(node) for node in self.nodes}


class Nodes(Protocol):
    """Where a run reads what each container got and what the kubelet says it holds."""

    def runtime(self) -> list[RuntimeContainer]: ...

    def pod_resources(self) -> dict[str, Path]: ...


@dataclass
class Verdict:
    violations: list[Violation]
    truth: Truth | None = None
    """What was judged (``None`` when nothing could be)."""
    seq: int = 0
    """The log's last sequence when it was judged."""


@dataclass
class Checker:
    """Reads every source and judges, until the system has settled."""

    stack: Stack
    api: client.CoreV1Api
    nodes: Nodes
    watcher: AdmissionWatch
    why_not: str = ""
    """Why the last check could not judge (a source unreadable, the log moving)."""
    plugin_faults: Sequence[FaultWindow] = ()
    """When node agents were SIGKILLed and kubelets restarted during the run."""
    kubelet_restarts: int = 0

    def observe(self) -> Truth:
        """Every source at one moment: the API's pods, each node's runtime and
        pod-resources, and a fresh fold of the log. Raises :class:`SourceUnreadable`."""
        pods = read_api_pods(self.api)
        runtime = self.nodes.runtime()
        held = read_pod_resources(self.nodes.pod_resources())
        _, state = replay(self.stack)
        return Truth(
            state,
            pods,
            runtime,
            held,
            failed_admissions=self.watcher.failed,
            plugin_faults=self.plugin_faults,
            kubelet_restarts=self.kubelet_restarts,
            seen=self.watcher.seen(),
        )

    def check_once(self) -> Verdict | None:
        """The judge's verdict at one log sequence; None while the log or an allocator
        still moves, or a source cannot be read."""
        seq = replay(self.stack)[0]
        try:
            truth = self.observe()
        except SourceUnreadable as error:
            self.why_not = f"unreadable: {error}"
            return None
        violations = judge(truth)
        compared = compare_allocators(self.stack, seq, truth.state)
        if compared is None or replay(self.stack)[0] != seq:
            self.why_not = "the log or an allocator moved while it was read"
            return None
        return Verdict(violations + compared, truth, seq)

    def settle(self, timeout: float, seen: dict[str, str]) -> Verdict:
        """Judge until only violations no waiting heals are left (``PERMANENT``: a pod
        that failed admission), or ``timeout`` runs out; the last verdict.

        ``seen`` collects the first of each kind of transient violation, for the summary.
        """
        deadline = time.monotonic() + timeout
        last: Verdict | None = None
        while time.monotonic() < deadline:
            verdict = self.check_once()
            if verdict is None:
                seen.setdefault("unjudged", f"unjudged: {self.why_not}")
            else:
                last = verdict
                if all(violation.check in PERMANENT for violation in verdict.violations):
                    return verdict
                for violation in verdict.violations:
                    seen.setdefault(violation.check, str(violation))
            time.sleep(0.5)
        if last is None:
            seqs = {a: applied_seq(self.stack, a) for a in self.stack.names("allocator")}
            detail = f"never judged ({self.why_not}); allocators applied {seqs}"
            last = Verdict([Violation("unsettled", "log", detail)])
        return last


def run_chaos(config_: ChaosConfig) -> Summary:
    """One chaos run; the summary says what happened and what is broken."""
    data_dir = config_.data_dir or Path(tempfile.mkdtemp(prefix="gs-chaos-", dir="/tmp"))
    summary = Summary(seed=config_.seed, duration_s=config_.duration_s, data_dir=str(data_dir))
    real = config_.real_kubelet
    stack_config = StackConfig(
        data_dir=data_dir.resolve(),
        nodes=[parse_node(node) for node in config_.nodes],
        extender_port=0,
        allocators=config_.allocators,
        binders=config_.binders,
        extra_env=dict(config_.env),
        k8s_bin=(config_.k8s_bin or bin_dir()) if real else None,
        real_kubelet=real,
        # kubelets restart every few seconds here: as docs/node-agent.md advises for MiB units
        kubelet_env={"K8S_KUBELET_CONFIG_EXTRA": GPU_NODE_KUBELET_CONFIG},
    )
    with Stack(stack_config) as stack:
        nodes: Nodes = RealKubelets(stack) if real else StackKubelets(stack)
        with AdmissionWatch(kube_api(stack)) as watcher:
            checker = Checker(stack, kube_api(stack), nodes, watcher)
            checker.plugin_faults = exercise(stack, config_, summary).plugin_faults
            checker.kubelet_restarts = summary.faults.get("kubelet", 0)
            if real:  # kube-scheduler bound them, not the load
                summary.pods["scheduled"] = len(watcher.bound)
            started = time.monotonic()
            verdict = checker.settle(config_.settle_timeout_s, summary.settling)
        summary.settle_s = round(time.monotonic() - started, 1)
        finish(summary, verdict)
        if summary.violations:
            keep_node_logs(stack)
    return summary


def finish(summary: Summary, verdict: Verdict) -> None:
    """The verdict and the final state into ``summary``."""
    lost = [v for v in verdict.violations if v.check == KILLED_MID_CALL]
    broken = [v for v in verdict.violations if v.check != KILLED_MID_CALL]
    summary.lost = [str(v) for v in lost]
    summary.violations = [str(v) for v in broken] + summary.crashes
    summary.kinds = count_kinds(broken)
    if summary.crashes:
        summary.kinds["crash"] = len(summary.crashes)
    if verdict.truth is not None:
        summary.final = final_counts(verdict.truth, verdict.seq)


def exercise(stack: Stack, config_: ChaosConfig, summary: Summary) -> Faults:
    """Load and faults for the run's duration; returns once both have stopped and every
    service runs again."""
    load, faults = Load(stack, config_, summary), Faults(stack, config_, summary)
    threads = [threading.Thread(target=load.run), threading.Thread(target=faults.run)]
    for thread in threads:
        thread.start()
    try:
        load.stopping.wait(config_.duration_s)  # the run's length, not a synchronisation
    finally:
        faults.stopping.set()
        threads[1].join()
        load.stopping.set()
        threads[0].join()
    faults.revive()
    return faults


def final_counts(truth: Truth, seq: int) -> dict[str, int]:
    """What the last judgement saw."""
    pods, state = truth.pods, truth.state
    return {
        "pods": len(pods),
        "bound": sum(pod.node is not None and pod.facts.alive for pod in pods),
        "running": sum(pod.running for pod in pods),
        "failed": sum(not pod.facts.alive for pod in pods),
        "failed_admission": len({pod.facts.uid for pod in truth.failed_admissions}),
        "pending": sum(pod.node is None for pod in pods),
        "runtime_containers": len(truth.runtime),
        "pod_resources_containers": len(
            {(h.node, h.namespace, h.pod, h.container) for h in truth.held}
        ),
        "log_events": seq,
        "live_allocations": sum(len(node.pods) for node in state.nodes.values()),
    }


def render(summary: Summary) -> str:
    pods, final = Counter(summary.pods), summary.final
    faults = ", ".join(f"{kind} {n}" for kind, n in sorted(summary.faults.items())) or "none"
    lines = [
        f"gpushare chaos: seed {summary.seed}, {summary.duration_s:g} s of load and faults",
        f"  pods: {pods['created']} created, {pods['deleted']} deleted, {pods['scheduled']} "
        f"bound by the extender, {pods['unschedulable']} unschedulable (no room), "
        f"{pods['unschedulable_stale']} unschedulable (stale inventory), {pods['gave_up']} "
        f"given up; {pods['call_failures']} failed calls, {pods['bind_errors']} bind errors",
        f"  faults survived: {sum(summary.faults.values())} ({faults})",
        f"  settled: {summary.settle_s:g} s; then {final.get('pods', 0)} pods in the API "
        f"({final.get('bound', 0)} bound, {final.get('running', 0)} running, "
        f"{final.get('pending', 0)} pending, {final.get('failed', 0)} finished), "
        f"{final.get('live_allocations', 0)} live allocations, "
        f"{final.get('log_events', 0)} events in the log; judged against "
        f"{final.get('runtime_containers', 0)} containers in the runtime, "
        f"{final.get('pod_resources_containers', 0)} in pod-resources",
        *(f"    while settling: {violation}" for violation in summary.settling.values()),
        f"  admissions lost to a killed plugin: {len(summary.lost) or 'none'}",
        *(f"    {lost}" for lost in summary.lost),
        f"  violations: {len(summary.violations) or 'none'}{_kinds(summary.kinds)}",
        *(f"    {violation}" for violation in summary.violations),
    ]
    if summary.violations:
        lines.append(f"  logs: {summary.data_dir}/logs")
    return "\n".join(lines)


def _kinds(kinds: dict[str, int]) -> str:
    return f" ({', '.join(f'{kind} {n}' for kind, n in kinds.items())})" if kinds else ""


def main(argv: list[str] | None = None) -> int:
    parse = argparse.ArgumentParser(
        prog="python -m tools.chaos", description=__doc__.split("\n\n")[0]
    )
    parse.add_argument("--duration", type=float, default=60.0, help="seconds of load and faults")
    parse.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parse.add_argument("--json", action="store_true", help="print the summary as JSON")
    parse.add_argument("--data-dir", type=Path, help="keep the stack's store and logs here")
    parse.add_argument(
        "--real-kubelet",
        action="store_true",
        help="real kube-apiserver, kube-scheduler and a real kubelet per node (root)",
    )
    parse.add_argument("--k8s-bin", type=Path, help="the Kubernetes binaries (--real-kubelet)")
    args = parse.parse_args(argv)
    logging.getLogger("gpushare").setLevel(logging.ERROR)  # our NATS reader's reconnect chatter
    seed = random.randrange(1 << 16) if args.seed is None else args.seed
    chosen = ChaosConfig(duration_s=args.duration, seed=seed, data_dir=args.data_dir)
    if args.real_kubelet:
        chosen = replace(chosen, **REAL_DEFAULTS, k8s_bin=args.k8s_bin)
    summary = run_chaos(chosen)
    print(json.dumps(asdict(summary), indent=2) if args.json else render(summary))
    if args.data_dir is None and not summary.violations:
        shutil.rmtree(summary.data_dir, ignore_errors=True)
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())
