"""Reading the truth :mod:`tools.chaos_truth` judges, from outside the services.

* the pods, from the Kubernetes API (:func:`read_api_pods`), and every pod that failed
  admission while the run went on, from a pod watch (:class:`AdmissionWatch`: the load
  deletes pods, a failed one among them);
* what each container really got, from the runtime: the test kubelet writes it into
  ``<plugin dir>/containers.json`` (:func:`read_containers_file`); on a real kubelet,
  containerd has each running container's OCI spec (:func:`read_containerd`, through
  ``ctr``);
* the kubelet's view, from its pod-resources API (:func:`read_pod_resources`);
* the log, folded afresh (``tools.chaos.replay``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client, watch

from gpushare.node_agent.podresources import list_pod_resources
from tools.chaos_facts import (
    ApiPod,
    HeldDevices,
    RuntimeContainer,
    SeenAt,
    api_pod,
    containerd_container,
    running_task_ids,
    runtime_containers,
)

log = logging.getLogger(__name__)


class SourceUnreadable(Exception):
    """A source could not be read this time (a socket away, a file half written)."""


def read_api_pods(api: client.CoreV1Api, memory_unit: str = "MiB") -> list[ApiPod]:
    listed = api.api_client.sanitize_for_serialization(api.list_pod_for_all_namespaces())
    return [api_pod(pod, memory_unit) for pod in listed.get("items") or []]


def read_containers_file(node: str, path: Path) -> list[RuntimeContainer]:
    """The test kubelet's record of what it started each container with (none yet: empty)."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:
        raise SourceUnreadable(f"{path}: {error}") from error
    return runtime_containers(node, document)


def _ctr(address: Path, *args: str) -> str:
    command = ["ctr", "--address", str(address), "--namespace", "k8s.io", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SourceUnreadable(f"{' '.join(command[:5])}: {error}") from error
    if done.returncode != 0:
        raise SourceUnreadable(f"ctr {' '.join(args)}: {done.stderr.strip()[-200:]}")
    return done.stdout


def read_containerd(node: str, address: Path) -> list[RuntimeContainer]:
    """Every running Kubernetes container on a real node, with the environment containerd
    started it with (``ctr tasks ls``, then ``ctr containers info`` for each)."""
    found: list[RuntimeContainer] = []
    for task in sorted(running_task_ids(_ctr(address, "tasks", "ls"))):
        try:
            info = json.loads(_ctr(address, "containers", "info", task))
        except SourceUnreadable:
            continue  # gone since the listing
        except ValueError as error:
            raise SourceUnreadable(f"ctr containers info {task}: {error}") from error
        container = containerd_container(node, info)
        if container is not None:
            found.append(container)
    return found


def read_pod_resources(sockets: Mapping[str, Path]) -> list[HeldDevices]:
    """Every container's device IDs, from each node's pod-resources ``List``."""

    async def read() -> list[HeldDevices]:
        held: list[HeldDevices] = []
        for node, socket in sockets.items():
            try:
                response = await list_pod_resources(socket)
            except grpc.aio.AioRpcError as error:
                raise SourceUnreadable(f"{node} pod-resources: {error.code().name}") from error
            held += [
                HeldDevices(
                    node=node,
                    namespace=pod.namespace,
                    pod=pod.name,
                    container=container.name,
                    resource=devices.resource_name,
                    device_ids=tuple(devices.device_ids),
                )
                for pod in response.pod_resources
                for container in pod.containers
                for devices in container.devices
            ]
        return held

    return asyncio.run(read())


class AdmissionWatch:
    """Watches every pod while the run goes on and keeps each one seen failing admission,
    so a failed pod the load deletes afterwards is still judged (and counts the pods
    seen bound: on the real tier kube-scheduler binds them, not the load)."""

    WATCH_SECONDS = 5

    def __init__(self, api: client.CoreV1Api, memory_unit: str = "MiB") -> None:
        self._api, self._unit = api, memory_unit
        self._serialize = api.api_client.sanitize_for_serialization
        self._failed: dict[str, ApiPod] = {}
        self.bound: dict[str, float] = {}
        """UIDs of every pod seen bound to a node, with when it was first (monotonic s)."""
        self.refused: dict[str, float] = {}
        """UIDs of the pods seen failing admission, with when it was first (monotonic s)."""
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="admission-watch", daemon=True)
        self.errors = 0

    def __enter__(self) -> AdmissionWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        self._thread.join(self.WATCH_SECONDS + 5)

    @property
    def failed(self) -> list[ApiPod]:
        with self._lock:
            return list(self._failed.values())

    def seen(self) -> SeenAt:
        """When each pod was first seen bound, and refused, so far."""
        with self._lock:
            return SeenAt(bound=dict(self.bound), refused=dict(self.refused))

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._watch_once()
            except Exception as error:  # the API away a moment: watch again
                self.errors += 1
                log.debug("admission watch: %s", error)
                self._stopping.wait(0.5)

    def _watch_once(self) -> None:
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        for event in stream.stream(  # type: ignore[no-untyped-call]
            self._api.list_pod_for_all_namespaces, timeout_seconds=self.WATCH_SECONDS
        ):
            self.see(event["raw_object"])
            if self._stopping.is_set():
                stream.stop()  # type: ignore[no-untyped-call]

    def see(self, raw: Mapping[str, Any]) -> None:
        pod = api_pod(raw, self._unit)
        now = time.monotonic()
        with self._lock:
            if pod.node is not None:
                self.bound.setdefault(pod.facts.uid, now)
            if pod.failed_admission:
                self._failed.setdefault(pod.facts.uid, pod)
                self.refused.setdefault(pod.facts.uid, now)
