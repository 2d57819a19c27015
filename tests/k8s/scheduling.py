"""Driving gpushare through the real kube-scheduler.

* GPU pods (:func:`gpu_pod`) and what became of them: read as the API serves them
  (:func:`api_pods`), waited for until bound (:func:`wait_bound`) or declared unschedulable
  (:func:`wait_unschedulable`, :func:`wait_scheduler_error`), the scheduler's events about
  them (:func:`scheduler_events`) and its queues and attempts (:func:`scheduler_queues`,
  :func:`scheduling_attempts`, from its ``/metrics``);
* the extender's own record of its filter calls (:func:`filter_decisions`) and the
  allocation log (:func:`log_events`);
* stacks started against a test's control plane (:func:`running_stack`), also with
  allocators that serve HTTPS (:class:`TlsStack`);
* what a test puts between kube-scheduler and the allocators: a Service's load balancing
  as kube-proxy does it (:class:`Balancer`), and a proxy that keeps a copy of every
  extender call (:class:`RecordingProxy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import ssl
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from gpushare.bus.connection import connect
from gpushare.bus.reading import read_records
from gpushare.bus.subjects import DECISION_STREAM, decision_subject
from gpushare.cli.stack import Stack, StackConfig, parse_node
from gpushare.core.annotations import ALLOCATION
from gpushare.core.events import (
    AnyDecision,
    AnyEvent,
    NodesFiltered,
    NodesScored,
    decode_decision,
)
from gpushare.core.requests import GPU_MEM, POLICY_ANNOTATION
from gpushare.embedded.k8s_cluster import ControlPlane
from tests.e2e.conftest import read_log
from tests.k8s.pods import eventually, host_pod

SLEEP = "sleep 3600"


# -- pods ---------------------------------------------------------------------------------


def gpu_pod(
    name: str,
    mib: int,
    *,
    nodes: Sequence[str] = (),
    policy: str | None = None,
) -> dict[str, Any]:
    """A pod asking ``mib`` of ``aliyun.com/gpu-mem``, runnable on a real node too;
    ``nodes``: a required node affinity to those hostnames (the scheduler's own filter);
    ``policy``: the ``gpushare.io/policy`` annotation."""
    annotations = {POLICY_ANNOTATION: policy} if policy else None
    pod = host_pod(name, SLEEP, limits={GPU_MEM: str(mib)}, annotations=annotations)
    if nodes:
        names = {"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [names]}]
                }
            }
        }
    return pod


def api_pods(api: client.CoreV1Api, namespace: str = "default") -> list[dict[str, Any]]:
    """The namespace's pods as the API serves them (JSON; fast for hundreds of pods)."""
    reply = api.list_namespaced_pod(namespace, _preload_content=False)
    return list(json.loads(reply.data)["items"])


def read_pod(api: client.CoreV1Api, name: str, namespace: str = "default") -> dict[str, Any]:
    reply = api.read_namespaced_pod(name, namespace, _preload_content=False)
    return dict(json.loads(reply.data))


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict(pod["metadata"].get("annotations") or {})


def is_bound(pod: Mapping[str, Any]) -> bool:
    """Bound by gpushare: a node, and the allocation the binder wrote with the binding."""
    return bool(pod["spec"].get("nodeName")) and ALLOCATION in annotations_of(pod)


def wait_bound(api: client.CoreV1Api, name: str, timeout: float = 60.0) -> dict[str, Any]:
    """The pod once bound (see :func:`is_bound`)."""

    def bound() -> dict[str, Any] | None:
        pod = read_pod(api, name)
        return pod if is_bound(pod) else None

    return dict(eventually(bound, f"pod {name} bound", timeout))


def scheduled_condition(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), None)


def wait_unschedulable(api: client.CoreV1Api, name: str, timeout: float = 60.0) -> str:
    """The message of the pod's ``PodScheduled=False`` condition once the scheduler
    declared it ``Unschedulable``; fails if the pod gets bound instead."""

    def declared() -> str | None:
        pod = read_pod(api, name)
        assert not pod["spec"].get("nodeName"), f"pod {name} was bound to {pod['spec']}"
        condition = scheduled_condition(pod) or {}
        if condition.get("status") == "False" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message", ""))
        return None

    return str(eventually(declared, f"pod {name} declared unschedulable", timeout))


def wait_scheduler_error(api: client.CoreV1Api, name: str, timeout: float = 60.0) -> str:
    """The message of the pod's ``PodScheduled=False`` condition once a scheduling attempt
    failed with an error (``SchedulerError``: an extender call failed, say)."""

    def failed() -> str | None:
        pod = read_pod(api, name)
        assert not pod["spec"].get("nodeName"), f"pod {name} was bound to {pod['spec']}"
        condition = scheduled_condition(pod) or {}
        if condition.get("status") == "False" and condition.get("reason") == "SchedulerError":
            return str(condition.get("message", ""))
        return None

    return str(eventually(failed, f"pod {name} failing with a scheduler error", timeout))


def scheduler_events(
    api: client.CoreV1Api, name: str, reason: str = "FailedScheduling"
) -> list[str]:
    """The messages of kube-scheduler's ``reason`` events about pod ``name``."""
    reply = api.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name}", _preload_content=False
    )
    return [
        str(event.get("message", ""))
        for event in json.loads(reply.data)["items"]
        if event.get("reason") == reason
    ]


def scheduler_queues(plane: ControlPlane) -> dict[str, float]:
    """kube-scheduler's pending pods by queue: ``active``, ``backoff``, ``unschedulable``,
    ``gated``."""
    return {
        labels["queue"]: value
        for labels, value in plane.scheduler_samples("scheduler_pending_pods")
    }


def scheduling_attempts(plane: ControlPlane, result: str) -> int:
    """How many scheduling attempts ended with ``result`` (``scheduled``,
    ``unschedulable``, ``error``), all profiles together."""
    samples = plane.scheduler_samples("scheduler_schedule_attempts_total")
    return int(sum(value for labels, value in samples if labels.get("result") == result))


# -- what gpushare recorded ---------------------------------------------------------------


def filter_decisions(stack: Stack, name: str, namespace: str = "default") -> list[NodesFiltered]:
    """The extender's records of its filter calls for pod ``name`` (``gpushare explain``'s)."""
    return [d for d in decisions(stack, name, namespace) if isinstance(d, NodesFiltered)]


def score_decisions(stack: Stack, name: str, namespace: str = "default") -> list[NodesScored]:
    """The extender's records of its prioritize calls for pod ``name``."""
    return [d for d in decisions(stack, name, namespace) if isinstance(d, NodesScored)]


def decisions(stack: Stack, name: str, namespace: str = "default") -> list[AnyDecision]:
    """Every record of the extender's calls about pod ``name``, in order."""

    async def read() -> list[AnyDecision]:
        credentials = stack.credentials("auditor")
        nc = await connect(stack.nats_url, name="k8s-test-decisions", credentials=credentials)
        try:
            js = nc.jetstream()
            subject = decision_subject(namespace, name)
            records = read_records(js, DECISION_STREAM, subject)
            return [decode_decision(record.data) async for record in records]
        finally:
            await nc.close()

    return asyncio.run(read())


def log_events(stack: Stack) -> list[AnyEvent]:
    """Every event of the allocation log, in order."""
    return [event for _, event in read_log(stack)]


def metric_values(url: str, name: str) -> dict[str, float]:
    """``name``'s samples from a ``/metrics`` page, keyed by their labels' values."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return {
        ",".join(sample.labels.values()): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def allocator_base(stack: Stack, allocator: str) -> str:
    """``http://127.0.0.1:PORT`` of one allocator replica."""
    return f"http://127.0.0.1:{stack.allocator_ports[allocator]}"


def cards_of(inspect_url: str) -> dict[str, list[Any]]:
    """Each node's cards as an allocator's ``/inspect`` shows them, in index order."""
    with urllib.request.urlopen(inspect_url, timeout=5) as reply:
        nodes = json.loads(reply.read())["nodes"]
    return {node["name"]: sorted(node["devs"], key=lambda c: c["index"]) for node in nodes}


# -- stacks ---------------------------------------------------------------------------------


class TlsStack(Stack):
    """A stack whose allocators serve HTTPS (their ``--tls-*`` flags in ``service_args``):
    it waits for them over HTTPS with :attr:`tls_context`."""

    tls_context: ssl.SSLContext | None = None

    def https_base(self, allocator: str = "allocator") -> str:
        return f"https://127.0.0.1:{self.allocator_ports[allocator]}"

    def wait_allocator(self, name: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"{self.https_base(name)}/readyz"
        while True:
            if self.processes[name].poll() is not None:
                raise RuntimeError(f"{name} exited:\n{self.log_tail(name)}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(url, timeout=1, context=self.tls_context) as reply,
            ):
                if reply.status == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"allocator {name} ({url}) not ready after {timeout:.0f}s")
            time.sleep(0.1)


@contextlib.contextmanager
def running_stack(
    plane: ControlPlane,
    data_dir: Path,
    nodes: Sequence[str],
    *,
    extender_port: int = 0,
    allocators: int = 1,
    binders: int = 1,
    service_args: Mapping[str, list[str]] | None = None,
    tls_context: ssl.SSLContext | None = None,
    timeout: float = 120.0,
) -> Iterator[Stack]:
    """The services as processes against ``plane``, the test kubelet serving ``nodes``
    (``NAME=MIB,...``); allocator ``allocator`` on ``extender_port`` (0: any free port,
    each replica its own); HTTPS allocators with ``tls_context``."""
    config = StackConfig(
        data_dir=data_dir,
        nodes=[parse_node(spec) for spec in nodes],
        extender_port=extender_port,
        kubeconfig=plane.kubeconfig,
        allocators=allocators,
        binders=binders,
        service_args=dict(service_args or {}),
    )
    stack = Stack(config) if tls_context is None else TlsStack(config)
    if isinstance(stack, TlsStack):
        stack.tls_context = tls_context
    stack.start(timeout)
    try:
        yield stack
    finally:
        stack.stop()


# -- between kube-scheduler and the allocators -------------------------------------------------


class Balancer:
    """A Service's virtual IP as kube-proxy makes it, on ``127.0.0.1:port``.

    Each TCP connection goes to one *ready* endpoint (here in turn; kube-proxy picks at
    random) and bytes are copied both ways until either side closes. An endpoint is ready
    while its ``/readyz`` answers 200, probed every ``probe_seconds`` (the allocator
    Deployment's readiness probe, shortened); a connection refused marks it unready at
    once. Like kube-proxy, it never retries: a call cut by a dying endpoint fails, and
    the caller (kube-scheduler) sees the failure.
    """

    def __init__(self, port: int, backends: Mapping[str, int], probe_seconds: float = 0.5):
        self.port = port
        self.backends = dict(backends)
        self.probe_seconds = probe_seconds
        self.ready: set[str] = set()
        self.connections: Counter[str] = Counter()
        """Connections handed to each endpoint."""
        self.refused: Counter[str] = Counter()
        """Connections cut because their endpoint refused them."""
        self._turn = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="balancer", daemon=True)
        self._up = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __enter__(self) -> Balancer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> Balancer:
        self._thread.start()
        if not self._up.wait(10):
            raise TimeoutError("the balancer did not start")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._thread.is_alive() and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        except OSError as error:
            self._error = error
            self._up.set()
            return
        await self._probe_all()
        prober = asyncio.create_task(self._probe_forever())
        self._up.set()
        await self._stop.wait()
        server.close()
        prober.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(prober, *self._tasks, return_exceptions=True)
        await server.wait_closed()

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.probe_seconds)
            await self._probe_all()

    async def _probe_all(self) -> None:
        for name, port in self.backends.items():
            if await _ready(port):
                self.ready.add(name)
            else:
                self.ready.discard(name)

    def _pick(self) -> str | None:
        ready = sorted(self.ready)
        if not ready:
            return None
        self._turn += 1
        return ready[self._turn % len(ready)]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._forward(reader, writer)
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = self._pick()
        if name is None:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.backends[name])
        except OSError:
            self.ready.discard(name)
            self.refused[name] += 1
            writer.transport.abort()
            return
        self.connections[name] += 1
        copies = {
            asyncio.create_task(_copy(reader, up_writer)),
            asyncio.create_task(_copy(up_reader, writer)),
        }
        try:
            await asyncio.wait(copies, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for copy in copies:
                copy.cancel()
            await asyncio.gather(*copies, return_exceptions=True)
            up_writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await up_writer.wait_closed()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


async def _ready(port: int) -> bool:
    """``GET /readyz`` answers 200."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 1)
        return status.split()[1:2] == [b"200"]
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@dataclass(frozen=True)
class Call:
    """One extender call kube-scheduler made, as it went over the wire."""

    verb: str
    request: Any
    status: int
    answer: Any


class RecordingProxy:
    """Between kube-scheduler and one plain-HTTP allocator, on ``127.0.0.1:port``: forwards
    every call unchanged and keeps a copy of each request and answer in :attr:`calls`."""

    def __init__(self, port: int, backend_port: int) -> None:
        self.calls: list[Call] = []
        lock = threading.Lock()
        calls = self.calls

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                upstream = http.client.HTTPConnection("127.0.0.1", backend_port, timeout=30)
                try:
                    upstream.request("POST", self.path, body, dict(self.headers.items()))
                    reply = upstream.getresponse()
                    answer = reply.read()
                    status = reply.status
                finally:
                    upstream.close()
                with lock:
                    calls.append(
                        Call(self.path.rsplit("/", 1)[-1], json.loads(body), status, _json(answer))
                    )
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def of(self, verb: str) -> list[Call]:
        return [call for call in list(self.calls) if call.verb == verb]


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")
