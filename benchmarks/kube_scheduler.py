"""``make bench-kube``: the real kube-scheduler's throughput with and without gpushare.

One real control plane (the real-Kubernetes test tier's binaries) and one gpushare stack
as ``gpushare up`` runs it (allocator, binder, reporters, node agents, the test kubelet
serving every node). Each run stops kube-scheduler, creates the pods (they stay
Pending), starts kube-scheduler with the run's configuration, and times the bindings as
a watch sees them: pods/s = (pods − 1) / (last binding − first binding), so neither the
creation nor the scheduler's start-up counts. The same pods and nodes serve every
configuration, and the configurations take turns. Everything is measured twice: with the
node side (the test kubelet admitting pods, our node agents allocating) running on the
same cores, and with the test kubelet held (SIGSTOP) while kube-scheduler binds, as when
the nodes are other machines; it admits the pods after. A run ends once the node side
has run (or refused: it says how many, and why) every pod; then the pods are deleted,
and the next run waits until the test kubelet has let go of them.

The runs without an extender schedule the same pods, with the node side held and the
pods deleted before it resumes, in both rounds: nobody placed their card shares, so our
device plugin would refuse each one's ``Allocate`` after waiting for a binding that
never comes, and that work spilled into the next configuration's run (it also lost pods:
a late status landed on a same-named pod of the next run). So the baseline is the
scheduler alone, its node side idle. The configurations:

* no extender, kube-scheduler's stock client rate limit (50 qps: it throttles its own
  Binding POSTs);
* no extender, the client limit raised (the fair baseline: the scheduler alone);
* gpushare, ``nodeCacheCapable: true`` (as ``deploy/`` configures it) and ``false``;
* the reference: an extender that does nothing (:mod:`benchmarks.null_extender`: filter
  answers one of the names, bind POSTs the Binding), the least the two round trips of an
  extender with a bind verb cost in Python on this machine; its pods are deleted before
  the node side runs, as the baseline's are.

The extender's share of a scheduling cycle is kube-scheduler's own mean scheduling
algorithm duration (``scheduler_scheduling_algorithm_duration_seconds``: filter and score,
extender calls included, binding not) with gpushare minus without. Without the binaries
it says so and exits 0 (``make k8s-bin`` builds them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines
from prometheus_client.parser import text_string_to_metric_families
from urllib3.exceptions import HTTPError

from benchmarks.interrupt import unwind_on_sigterm
from gpushare.cli.stack import Stack, StackConfig, parse_node
from gpushare.core.plugin_resources import DEFAULT_DIALECTS, DIALECTS
from gpushare.core.requests import GPU_MEM
from gpushare.embedded.k8s_binaries import K8sBinaries, K8sBinariesMissing
from gpushare.embedded.k8s_cluster import ControlPlane
from gpushare.embedded.k8s_extender import ExtenderStanza, extender_url
from gpushare.embedded.kubelet import CONTAINERS
from gpushare.embedded.nats_server import free_port, wait_for_port

NAMESPACE = "default"
RAISED_QPS = 1000
REFERENCE_MODULE = "benchmarks.null_extender"
REFERENCE = "reference: do-nothing extender"
IDLE_SECONDS = 5.0
WATCH_RETRY_S = 0.5
"""How long the bench's pod watch waits before it tries again after a failure."""
WATCH_SECONDS = 60
"""How long kube-apiserver keeps one of the bench's pod watches open."""
WATCH_CONNECT_S = 5.0
"""How long the bench's pod watch waits for a connection to kube-apiserver."""
ALGORITHM_DURATION = "scheduler_scheduling_algorithm_duration_seconds"
"""Filter and score, the extender's calls included; binding is not in it."""


@dataclass(frozen=True)
class Scenario:
    name: str
    extenders: tuple[ExtenderStanza, ...]
    client_qps: int | None
    places_shares: bool = True
    """Whether its extender places card shares (False: its pods are deleted before the
    node side runs, as the baseline's are)."""


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
COMPONENTS = (
    "etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "nats-server",
)  # fmt: skip


PROC = Path("/proc")


def _measured(process: Path) -> str | None:
    """The name a process is measured under: a control-plane component's, ``gpushare
    <service>`` for ours, ``reference extender``; ``None`` for any other process."""
    try:
        argv = (process / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    name = Path(argv[0].decode(errors="replace")).name
    if REFERENCE_MODULE.encode() in argv:
        return "reference extender"
    if name in COMPONENTS:
        return name
    if b"gpushare.cli.main" in argv:
        return "gpushare " + argv[argv.index(b"gpushare.cli.main") + 1].decode()
    return None


IO_CALLS = {"syscr": "reads", "syscw": "writes"}
"""The lines of ``/proc/<pid>/io`` that count system calls, and what they count."""


class Usage(NamedTuple):
    """What the control-plane components and gpushare services have used so far, each
    by the name :func:`_measured` gives it."""

    cpu_seconds: dict[str, float]
    """CPU time (user + system)."""
    io_calls: Counter[tuple[str, str]]
    """Read and write system calls (``syscr``, ``syscw``), by ``(name, "reads" |
    "writes")``: Go, libuv (uvloop) and etcd's store make theirs with ``read`` and
    ``write``, so a message through NATS is a write by its sender, a read and a write by
    nats-server (and its store's write), and a read by each receiver."""


def usage(proc: Path = PROC) -> Usage:
    """Every measured process's :class:`Usage`, from one pass over ``/proc``."""
    used: dict[str, float] = {}
    calls: Counter[tuple[str, str]] = Counter()
    for process in proc.glob("[0-9]*"):
        name = _measured(process)
        if name is None:
            continue
        try:
            fields = (process / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        with contextlib.suppress(OSError, ValueError):
            for line in (process / "io").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in IO_CALLS:
                    calls[name, IO_CALLS[key]] += int(value)
    return Usage(used, calls)


def api_requests(plane: ControlPlane) -> Counter[str]:
    """kube-apiserver's requests so far by verb and resource (``POST pods/binding``)."""
    counts: Counter[str] = Counter()
    for labels, value in plane.apiserver_samples("apiserver_request_total"):
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        counts[f"{labels.get('verb', '?')} {resource}"] += int(value)
    return counts


FILTER_SECONDS = "gpushare_extender_request_seconds"
FILTER_QUEUED = "gpushare_extender_queue_seconds"


def allocator_counts(stack: Stack) -> Counter[str]:
    """The allocators' answers to bind so far, by outcome (``bound``, ``no_fit``, ...),
    and for filter and bind their calls (``filter calls``), time spent answering them
    (``filter µs``: from the verb's start to its answer) and waiting for the event loop
    before that (``filter queued µs``: from the call's first bytes to the verb's start)."""
    counts: Counter[str] = Counter()
    for port in stack.extender_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if family.name == "gpushare_bind_outcomes" and sample.name.endswith("_total"):
                    counts[sample.labels["outcome"]] += int(sample.value)
                elif (verb := sample.labels.get("verb")) not in ("filter", "bind"):
                    continue
                elif family.name == FILTER_SECONDS and sample.name.endswith("_count"):
                    counts[f"{verb} calls"] += int(sample.value)
                elif family.name == FILTER_SECONDS and sample.name.endswith("_sum"):
                    counts[f"{verb} µs"] += int(sample.value * 1e6)
                elif family.name == FILTER_QUEUED and sample.name.endswith("_sum"):
                    counts[f"{verb} queued µs"] += int(sample.value * 1e6)
    return counts


@dataclass(frozen=True)
class RunResult:
    pods_per_second: float
    cpu_ms_per_pod: dict[str, float]
    """CPU each component spent per pod over the run (milliseconds)."""
    io_calls_per_pod: dict[str, tuple[float, float]]
    """Each component's read and write calls per pod over the run (:attr:`Usage.io_calls`)."""
    requests_per_pod: dict[str, float]
    """kube-apiserver requests per pod over the run, by verb and resource."""
    cycle_ms: float
    """kube-scheduler's mean scheduling algorithm (filter and score), in milliseconds."""
    binds_per_pod: dict[str, float]
    """The allocators' answers to bind per pod, by outcome (a refused bind sends its pod
    back to kube-scheduler's queue, with a back-off)."""
    refused: Counter[str]
    """Pods the node side refused to run (admission errors), by reason: none, or a bug."""
    filter_ms: float
    """The allocators' mean time answering a filter call, in milliseconds (0 without
    an extender). The rest of the extender's share is :attr:`filter_queued_ms` and what
    lies outside the allocator: the HTTP round trip, kube-scheduler's side of the call,
    and waiting for a core."""
    filter_queued_ms: float
    """The allocators' mean wait for their event loop before a filter call's verb began
    (from its first bytes read), in milliseconds."""
    bind_ms: float = 0.0
    """The allocators' mean time answering a bind, reservation to the binder's verdict,
    in milliseconds: while bindings trail kube-scheduler, it holds that many binds open
    (and opens connections for them)."""


def pod(name: str, mib: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "bench-kube"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {GPU_MEM: str(mib)}},
                }
            ],
        },
    }


class _Named(msgspec.Struct, rename={"resource_version": "resourceVersion"}):
    name: str = ""
    resource_version: str = ""


class _Placed(msgspec.Struct, rename="camel"):
    node_name: str = ""


class _Pod(msgspec.Struct):
    metadata: _Named = msgspec.field(default_factory=_Named)
    spec: _Placed = msgspec.field(default_factory=_Placed)


class _WatchEvent(msgspec.Struct):
    type: str
    object: _Pod
    """A pod's name, version and node only; an ``ERROR`` event's Status decodes as a
    nameless pod."""


_watch_event = msgspec.json.Decoder(_WatchEvent)


class BindingWatch:
    """When each pod got its node, as a watch on the namespace's pods sees it.

    The watch reads each event's name and node and nothing else, rather than decoding
    every pod into the official client's models (``watch.Watch``): this process shares
    the cores with the stack it measures.
    """

    def __init__(self, api: client.CoreV1Api, expected: int) -> None:
        self.api = api
        self.expected = expected
        self.bound: dict[str, float] = {}
        self.done = threading.Event()
        self._response: Any = None
        self._version = ""
        """The last resourceVersion seen: where a watch started again resumes."""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> BindingWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        """Watch until every pod is bound. A watch the apiserver ends (its timeout, or a
        consumer it finds too slow: 800 pods on 40 nodes, the run then waited for ever)
        is started again from the last resourceVersion seen, as an informer resumes. A
        watch without one is served from the watch cache only once it has caught up with
        etcd: on a saturated machine, kube-apiserver's pod cache lagged etcd for minutes
        after it had closed its slow watchers, and each such watch was an ``ERROR``
        ("Too large resource version") while the run waited for its last bindings."""
        while not self.done.is_set():
            try:
                self._response = self.api.list_namespaced_pod(
                    NAMESPACE,
                    label_selector="app=bench-kube",
                    watch=True,
                    resource_version=self._version or None,
                    timeout_seconds=WATCH_SECONDS,
                    _preload_content=False,
                    _request_timeout=(WATCH_CONNECT_S, WATCH_SECONDS + 30),
                )
            except (HTTPError, client.ApiException) as error:  # the API away for a moment
                print(f"  the pod watch could not start ({error}); trying again", file=sys.stderr)
                time.sleep(WATCH_RETRY_S)
                continue
            try:
                for line in iter_resp_lines(self._response):
                    self._event(_watch_event.decode(line))
            except (HTTPError, AttributeError, ValueError, msgspec.DecodeError) as error:
                if not self.done.is_set():
                    print(f"  the pod watch ended ({error}); watching again", file=sys.stderr)
            finally:
                self._response.release_conn()

    def _event(self, event: _WatchEvent) -> None:
        if event.type == "ERROR":  # 410 Gone (the version compacted away) among others
            print("  the pod watch failed; watching every pod again", file=sys.stderr)
            self._version = ""
            time.sleep(WATCH_RETRY_S)
            return
        self._version = event.object.metadata.resource_version or self._version
        self._seen(event.object)

    def _seen(self, pod: _Pod) -> None:
        name = pod.metadata.name
        if pod.spec.node_name and name not in self.bound:
            self.bound[name] = time.monotonic()
            if len(self.bound) >= self.expected:
                self.done.set()
                self._response.close()

    def rate(self) -> float:
        times = sorted(self.bound.values())
        return (len(times) - 1) / (times[-1] - times[0])


def algorithm_totals(plane: ControlPlane) -> tuple[float, float]:
    """kube-scheduler's scheduling algorithm so far (it starts afresh with each run):
    (seconds in all, how many times)."""
    seconds = sum(value for _, value in plane.scheduler_samples(ALGORITHM_DURATION + "_sum"))
    count = sum(value for _, value in plane.scheduler_samples(ALGORITHM_DURATION + "_count"))
    return seconds, count


def run_once(
    plane: ControlPlane,
    stack: Stack,
    api: client.CoreV1Api,
    scenario: Scenario,
    sizes: Sequence[int],
    *,
    hold_nodes: bool,
) -> RunResult:
    plane.stop_scheduler()
    names = [f"bench-{i}" for i in range(len(sizes))]
    pods = [pod(name, mib) for name, mib in zip(names, sizes, strict=True)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda body: api.create_namespaced_pod(NAMESPACE, body), pods))
    bindings = BindingWatch(api, len(names)).start()
    sharing = bool(scenario.extenders) and scenario.places_shares
    kubelets = stack.names("kubelet") if hold_nodes or not sharing else []
    for kubelet in kubelets:
        stack.pause(kubelet)
    try:
        before, calls_before = usage()
        requests_before = api_requests(plane)
        counts_before = allocator_counts(stack)
        plane.reconfigure_scheduler(scenario.extenders, client_qps=scenario.client_qps)
        if not bindings.done.wait(300):
            raise TimeoutError(f"{scenario.name}: {len(bindings.bound)} of {len(names)} bound")
        after, calls_after = usage()
        calls = calls_after - calls_before
        requests = api_requests(plane) - requests_before
        counts = allocator_counts(stack) - counts_before
        filter_calls, filter_us = counts.pop("filter calls", 0), counts.pop("filter µs", 0)
        queued_us = counts.pop("filter queued µs", 0)
        bind_calls, bind_us = counts.pop("bind calls", 0), counts.pop("bind µs", 0)
        counts.pop("bind queued µs", 0)
        if not sharing:  # gone before the node side sees them: nobody placed their shares
            delete_all(api, len(names))
    finally:
        for kubelet in kubelets:
            stack.resume(kubelet)
    seconds, count = algorithm_totals(plane)
    failed = wait_started(api, len(names)) if sharing else Counter[str]()
    delete_all(api, len(names))
    wait_node_side_idle(stack)
    spent = {
        name: 1000 * (after[name] - before.get(name, 0.0)) / len(names)
        for name in sorted(after, key=lambda n: before.get(n, 0.0) - after[n])
    }
    per_pod = {key: count / len(names) for key, count in requests.most_common()}
    return RunResult(
        bindings.rate(),
        spent,
        {
            name: (calls[name, "reads"] / len(names), calls[name, "writes"] / len(names))
            for name in spent
        },
        per_pod,
        1000 * seconds / count if count else 0.0,
        {outcome: n / len(names) for outcome, n in counts.most_common()},
        failed,
        filter_us / filter_calls / 1000 if filter_calls else 0.0,
        queued_us / filter_calls / 1000 if filter_calls else 0.0,
        bind_us / bind_calls / 1000 if bind_calls else 0.0,
    )


def wait_started(api: client.CoreV1Api, count: int, timeout: float = 300) -> Counter[str]:
    """Until the node side has run or refused every pod (not timed); the pods it refused,
    by reason. The next run starts only then: a node still admitting this run's pods
    once they are deleted would wait for bindings that never come, on the next run's time.
    """
    deadline = time.monotonic() + timeout
    while True:
        pods = api.list_namespaced_pod(NAMESPACE, label_selector="app=bench-kube").items
        waiting = [p for p in pods if p.status.phase not in ("Running", "Succeeded", "Failed")]
        if not waiting:
            return Counter(p.status.reason or "Failed" for p in pods if p.status.phase == "Failed")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(waiting)} of {count} bench pods never started")
        time.sleep(0.5)


def wait_node_side_idle(stack: Stack, timeout: float = 120) -> None:
    """Until every test kubelet has let go of the deleted pods (its containers file is
    empty): releasing them is the node side's work of this run, not of the next."""
    files = [stack.plugin_dir(node.name) / CONTAINERS for node in stack.config.nodes]
    deadline = time.monotonic() + timeout
    while busy := [path.parent.parent.name for path in files if _holds_pods(path)]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"test kubelets still hold pods: {', '.join(busy)}")
        time.sleep(0.5)


def _holds_pods(containers: Path) -> bool:
    try:
        return bool(json.loads(containers.read_bytes()))
    except FileNotFoundError:
        return False


def delete_all(api: client.CoreV1Api, count: int) -> None:
    api.delete_collection_namespaced_pod(
        NAMESPACE, label_selector="app=bench-kube", grace_period_seconds=0
    )
    deadline = time.monotonic() + 120
    while api.list_namespaced_pod(NAMESPACE, label_selector="app=bench-kube").items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {count} bench pods were not deleted")
        time.sleep(0.5)


def wait_advertised(api: client.CoreV1Api, nodes: Sequence[str], timeout: float = 120) -> None:
    """Until every node's kubelet has taken each of its agent's device lists (the node
    advertises every resource of the agents' dialects). A run that holds the kubelets
    before then measures the binder waiting for an agent that cannot register, not
    scheduling: an agent is ready only once the kubelet took all its lists, and a held
    first round that started with some still missing ran at 7-27 pods/s."""
    wanted = [name for dialect in DEFAULT_DIALECTS for name in DIALECTS[dialect]]
    deadline = time.monotonic() + timeout
    while True:
        advertising = {
            node.metadata.name
            for node in api.list_node().items
            if all((node.status.allocatable or {}).get(name, "0") != "0" for name in wanted)
        }
        waiting = [name for name in nodes if name not in advertising]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes never advertised {', '.join(wanted)}: {', '.join(waiting)}")
        time.sleep(0.5)


def wait_released(stack: Stack, timeout: float = 120) -> None:
    """Until the allocator holds no pod (the binder releases deleted pods)."""
    url = f"http://127.0.0.1:{stack.extender_ports[0]}/gpushare-scheduler/inspect"
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(url, timeout=5) as reply:
            nodes = json.loads(reply.read())["nodes"]
        if not any(node["pod_count"] for node in nodes):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the allocator still holds pods")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parse = argparse.ArgumentParser(prog="make bench-kube", description=__doc__.split("\n\n")[0])
    parse.add_argument("--nodes", type=int, default=20)
    parse.add_argument("--cards", type=int, default=4)
    parse.add_argument("--card-mib", type=int, default=32768)
    parse.add_argument("--pods", type=int, default=300)
    parse.add_argument("--runs", type=int, default=3, help="runs per configuration (median)")
    parse.add_argument(
        "--only", default="", help="run the configurations whose name contains one of these (a,b)"
    )
    parse.add_argument(
        "--node-side",
        choices=("both", "running", "held"),
        default="both",
        help="measure with the node side running, held, or both (in that order)",
    )
    parse.add_argument(
        "--keep",
        type=Path,
        help="keep the stack's data and logs, and the control plane's logs, in this directory",
    )
    args = parse.parse_args(argv)
    unwind_on_sigterm()
    try:
        binaries = K8sBinaries.find()
    except K8sBinariesMissing as error:
        print(f"bench-kube: no real control plane ({error}); `make k8s-bin` builds one")
        return 0
    sizes = random.Random(300).choices(range(1000, 8001, 500), k=args.pods)
    port, reference_port = free_port(), free_port()
    cached = ExtenderStanza(url_prefix=extender_url(port), node_cache_capable=True)
    scenarios = [
        Scenario("no extender, stock client limit (50 qps)", (), None),
        Scenario(f"no extender, client limit {RAISED_QPS} qps", (), RAISED_QPS),
        Scenario("gpushare, nodeCacheCapable: true", (cached,), RAISED_QPS),
        Scenario(
            "gpushare, nodeCacheCapable: false",
            (replace(cached, node_cache_capable=False),),
            RAISED_QPS,
        ),
        Scenario(
            REFERENCE,
            (ExtenderStanza(url_prefix=extender_url(reference_port)),),
            RAISED_QPS,
            places_shares=False,
        ),
    ]
    wanted = args.only.split(",")
    scenarios = [s for s in scenarios if any(part in s.name for part in wanted)]
    cards = ",".join([str(args.card_mib)] * args.cards)
    print(
        f"bench-kube: real kube-scheduler ({binaries.directory}), {args.nodes} nodes x "
        f"{args.cards} cards of {args.card_mib} MiB, {args.pods} pods of 1,000-8,000 MiB, "
        f"median of {args.runs}",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory(prefix="gs-bench-kube-", dir="/tmp") as tmp,
        ControlPlane(
            binaries=binaries,
            extenders=[cached],
            logs_kept_in=args.keep / "kubernetes" if args.keep else None,
        ) as plane,
    ):
        stack_config = StackConfig(
            data_dir=(args.keep or Path(tmp)) / "stack",
            nodes=[parse_node(f"bench{n}={cards}") for n in range(args.nodes)],
            extender_port=port,
            kubeconfig=plane.kubeconfig,
        )
        with (
            Stack(stack_config).start(180) as stack,
            reference_extender(plane, reference_port, wanted=REFERENCE in names(scenarios)),
        ):
            config.load_kube_config(str(plane.kubeconfig))
            api = client.CoreV1Api()
            wait_advertised(api, [node.name for node in stack_config.nodes])
            idle_before, calls_before = usage()
            time.sleep(IDLE_SECONDS)
            idle, calls_after = usage()
            calls = calls_after - calls_before
            load = {
                name: (idle[name] - idle_before.get(name, 0.0)) / IDLE_SECONDS
                for name in sorted(idle, key=lambda n: idle_before.get(n, 0.0) - idle[n])
            }
            print(
                "idle load (CPU seconds per second): "
                + ", ".join(f"{name} {used:.3f}" for name, used in load.items() if used >= 0.001)
                + "\nidle read/write calls per second: "
                + ", ".join(
                    f"{name} {calls[name, 'reads'] / IDLE_SECONDS:.0f}/"
                    f"{calls[name, 'writes'] / IDLE_SECONDS:.0f}"
                    for name in load
                    if calls[name, "reads"] + calls[name, "writes"] >= IDLE_SECONDS
                ),
                flush=True,
            )
            rounds = {"both": (False, True), "running": (False,), "held": (True,)}
            for hold_nodes in rounds[args.node_side]:
                print(
                    "\nnode side held (SIGSTOP) while kube-scheduler binds: nodes are other "
                    "machines in a cluster"
                    if hold_nodes
                    else "\nnode side running: the test kubelet and node agents admit pods "
                    "on the same 2 cores",
                    flush=True,
                )
                results = measure(
                    plane, stack, api, scenarios, sizes, runs=args.runs, hold_nodes=hold_nodes
                )
                report(results)
    return 0


def names(scenarios: Sequence[Scenario]) -> set[str]:
    return {scenario.name for scenario in scenarios}


@contextlib.contextmanager
def reference_extender(plane: ControlPlane, port: int, *, wanted: bool) -> Iterator[None]:
    """The do-nothing extender (:mod:`benchmarks.null_extender`) on ``port``, if wanted."""
    if not wanted:
        yield
        return
    command = [sys.executable, "-m", REFERENCE_MODULE, "--port", str(port)]
    process = subprocess.Popen([*command, "--kubeconfig", str(plane.kubeconfig)])
    try:
        wait_for_port(port, timeout=30)
        yield
    finally:
        process.terminate()
        process.wait(10)


def measure(
    plane: ControlPlane,
    stack: Stack,
    api: client.CoreV1Api,
    scenarios: Sequence[Scenario],
    sizes: Sequence[int],
    *,
    runs: int,
    hold_nodes: bool,
) -> dict[str, list[RunResult]]:
    results: dict[str, list[RunResult]] = {}
    for _ in range(runs):  # configurations alternate, so that a slow spell hits them alike
        for scenario in scenarios:
            wait_released(stack)
            result = run_once(plane, stack, api, scenario, sizes, hold_nodes=hold_nodes)
            results.setdefault(scenario.name, []).append(result)
            top = ", ".join(
                f"{name} {ms:.1f}" for name, ms in result.cpu_ms_per_pod.items() if ms >= 0.1
            )
            calls = ", ".join(
                f"{key} {n:.2f}" for key, n in result.requests_per_pod.items() if n >= 0.05
            )
            io = ", ".join(
                f"{name} {reads:.1f}/{writes:.1f}"
                for name, (reads, writes) in result.io_calls_per_pod.items()
                if reads + writes >= 0.5
            )
            answers = ", ".join(f"{key} {n:.2f}" for key, n in result.binds_per_pod.items())
            refused = ", ".join(f"{reason} {n}" for reason, n in result.refused.most_common())
            print(
                f"  {scenario.name:<42} {result.pods_per_second:7.1f} pods/s  "
                f"filter+score {result.cycle_ms:6.2f} ms"
                + (
                    f" (allocator: filter {result.filter_ms:.2f} after waiting "
                    f"{result.filter_queued_ms:.2f} for its loop; bind {result.bind_ms:.0f})"
                    if result.filter_ms
                    else ""
                )
                + f"\n    CPU ms per pod: {top}\n"
                f"    read/write calls per pod: {io}\n"
                f"    API requests per pod: {calls}"
                + (f"\n    bind answers per pod: {answers}" if answers else "")
                + (f"\n    pods the node side refused: {refused}" if refused else ""),
                flush=True,
            )
    return results


def report(results: dict[str, list[RunResult]]) -> None:
    medians = {
        name: (
            statistics.median(r.pods_per_second for r in runs),
            statistics.median(r.cycle_ms for r in runs),
        )
        for name, runs in results.items()
    }
    baseline = medians.get(f"no extender, client limit {RAISED_QPS} qps")
    print("\n| kube-scheduler | pods/s | vs unthrottled | filter+score | extender's share |")
    print("|---|---|---|---|---|")
    for name, (rate, cycle) in medians.items():
        ratio = share = ""
        if baseline is not None:
            ratio = f"{rate / baseline[0]:.2f}x"
            if "no extender" not in name:
                share = f"{cycle - baseline[1]:.2f} ms"
        print(f"| {name} | {rate:.0f} | {ratio} | {cycle:.2f} ms | {share} |")


if __name__ == "__main__":
    sys.exit(main())
