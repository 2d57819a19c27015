"""A real Kubernetes on loopback, for tests and ``gpushare up --k8s-bin``.

:class:`ControlPlane` runs etcd, kube-apiserver, kube-scheduler (with gpushare's extender
stanzas) and kube-controller-manager through ``k8s/k8s-up.sh``; :class:`RealNode` adds a
real kubelet with containerd and runc through ``k8s/kubelet-up.sh`` (root). Ports are
picked free below the ephemeral range and locked, so clusters can run side by side.

Everything is undone by ``stop()``, also after a failed start: processes (by the PIDs the
scripts recorded), containers, mounts, cgroups and ``/etc/hosts`` lines. A harness whose
Python process died without stopping (SIGKILL, a test timeout) is reaped by the next
:class:`ControlPlane` that starts on this machine.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import ssl
import subprocess
import tempfile
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpushare.embedded.k8s_binaries import K8sBinaries
from gpushare.embedded.k8s_extender import ExtenderStanza, extenders_flow_list
from gpushare.embedded.k8s_ports import PortReservation, reserve_ports

log = logging.getLogger(__name__)

SCRIPTS = Path(__file__).resolve().parent / "k8s"
TEMP_PREFIX = "gsk-"
"""Directories the harness makes itself (short: unix socket paths stay under 107 bytes)."""
OWNER_FILE = "owner"
HARNESS_LOG = "harness.log"


class ClusterError(RuntimeError):
    """A script failed; the message ends with its output's last lines."""


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks (with the PID: an identity not reused);
    None when it is gone or a zombie (dead, waiting for its parent to reap it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in {"Z", "X"} else fields[19]


def _owner_alive(directory: Path) -> bool:
    try:
        pid, start = (directory / OWNER_FILE).read_text().split()
    except (OSError, ValueError):
        return True  # not ours to judge
    return _process_start(int(pid)) == start


def read_env_file(path: Path) -> dict[str, str]:
    """``export KEY='value'`` lines, as the scripts write them."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            values[key] = value
    return values


def run_script(
    script: str, args: Sequence[str], env: Mapping[str, str], log_file: Path, timeout: float
) -> None:
    """Run ``k8s/<script> args``, its output appended to ``log_file``; raise on failure."""
    command = ["bash", str(SCRIPTS / script), *args]
    with log_file.open("ab") as output:
        output.write(f"$ {shlex.join(command)}\n".encode())
        output.flush()
        start = output.tell()
        try:
            result = subprocess.run(
                command,
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                timeout=timeout,
                start_new_session=True,  # Ctrl-C of the caller leaves the stop to stop()
                check=False,
            )
            failure = None if result.returncode == 0 else f"exit status {result.returncode}"
        except subprocess.TimeoutExpired:
            failure = f"not done after {timeout:.0f} s"
    if failure is not None:
        with log_file.open("rb") as output:
            output.seek(start)
            tail = output.read().decode(errors="replace").splitlines()[-25:]
        raise ClusterError(f"{script} {' '.join(args)}: {failure}\n" + "\n".join(tail))


def reap_stale(parent: Path | None = None) -> list[Path]:
    """Stop and remove harness directories whose owning process is gone."""
    reaped = []
    for directory in sorted(Path(parent or tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*")):
        if not (directory / OWNER_FILE).exists() or _owner_alive(directory):
            continue
        log.warning("reaping the Kubernetes harness left in %s", directory)
        stop_directory(directory, timeout=60)
        shutil.rmtree(directory, ignore_errors=True)
        reaped.append(directory)
    return reaped


def _recorded(directory: Path) -> bool:
    """The scripts recorded a process here that was not stopped yet."""
    return any((directory / "pids").glob("*.pid"))


def stop_directory(directory: Path, timeout: float = 120) -> None:
    """Stop every node, then the control plane, that the scripts recorded in ``directory``."""
    log_file = directory / HARNESS_LOG
    for node in sorted((directory / "nodes").glob("*")):
        if not _recorded(node):
            continue
        try:
            run_script("kubelet-up.sh", ["stop", str(directory), node.name], {}, log_file, timeout)
        except ClusterError as error:
            log.warning("stopping node %s: %s", node.name, error)
    if _recorded(directory):
        try:
            run_script("k8s-up.sh", ["stop", str(directory)], {}, log_file, timeout)
        except ClusterError as error:
            log.warning("stopping the control plane in %s: %s", directory, error)


@dataclass(frozen=True)
class KubeletEndpoints:
    """Where a device plugin meets a kubelet: its registry directory and pod-resources API."""

    device_plugin_dir: Path
    pod_resources_socket: Path


@dataclass(frozen=True)
class ControlPlanePorts:
    etcd: int
    etcd_peer: int
    api: int
    scheduler: int
    controller_manager: int

    def env(self) -> dict[str, str]:
        return {
            "K8S_ETCD_PORT": str(self.etcd),
            "K8S_ETCD_PEER_PORT": str(self.etcd_peer),
            "K8S_API_PORT": str(self.api),
            "K8S_SCHED_PORT": str(self.scheduler),
            "K8S_CM_PORT": str(self.controller_manager),
        }


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler (+ kube-controller-manager) on 127.0.0.1.

    ``directory`` None: a fresh short temporary directory, removed by :meth:`stop`; a given
    one is kept (its ``logs/`` say what each component did). ``env`` reaches k8s-up.sh
    (``K8S_DISABLE_ADMISSION``, ``K8S_CM_CONTROLLERS``, ``K8S_*_EXTRA_ARGS``, ...).
    ``logs_kept_in``: where :meth:`stop` copies every component's logs, the nodes' too
    (``control-plane/``, ``<node>/``), before it removes a temporary directory.
    """

    def __init__(
        self,
        directory: Path | None = None,
        *,
        binaries: K8sBinaries | None = None,
        extenders: Sequence[ExtenderStanza] = (),
        controller_manager: bool = True,
        ports: ControlPlanePorts | None = None,
        env: Mapping[str, str] | None = None,
        logs_kept_in: Path | None = None,
    ) -> None:
        self.binaries = binaries or K8sBinaries.find()
        self.logs_kept_in = logs_kept_in
        self.extenders = tuple(extenders)
        self.controller_manager = controller_manager
        self.ports = ports
        self.extra_env = dict(env or {})
        self._owns_directory = directory is None
        self.directory = directory.resolve() if directory else Path()
        self._reservation: PortReservation | None = None
        self._values: dict[str, str] = {}
        self.nodes: dict[str, RealNode] = {}
        self.started = False

    # -- what a client needs ------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return Path(self._env("KUBECONFIG"))

    @property
    def api_url(self) -> str:
        return self._env("K8S_API_URL")

    @property
    def token(self) -> str:
        return self._env("K8S_TOKEN")

    @property
    def ca_file(self) -> Path:
        return Path(self._env("K8S_CA_FILE"))

    @property
    def logs_dir(self) -> Path:
        return self.directory / "logs"

    def _env(self, key: str) -> str:
        if not self._values:
            raise RuntimeError("the control plane is not started")
        return self._values[key]

    def get(self, path: str, timeout: float = 10.0) -> Any:
        """GET ``path`` from kube-apiserver as the admin, decoded from JSON."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(
            self.api_url + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=timeout, context=context) as reply:
            return json.loads(reply.read())

    def scheduler_samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """``name``'s samples (labels, value) from kube-scheduler's ``/metrics`` (its
        serving certificate is self-signed; the admin token may read it)."""
        assert self.ports is not None
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return self._samples(f"https://127.0.0.1:{self.ports.scheduler}/metrics", context, name)

    def apiserver_samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """``name``'s samples (labels, value) from kube-apiserver's ``/metrics``."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        return self._samples(f"{self.api_url}/metrics", context, name)

    def _samples(
        self, url: str, context: ssl.SSLContext, name: str
    ) -> list[tuple[dict[str, str], float]]:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=5, context=context) as reply:
            text = reply.read().decode()
        return [
            (dict(sample.labels), sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def server_version(self) -> str:
        """kube-apiserver's ``gitVersion`` (``v1.36.3``)."""
        return str(self.get("/version")["gitVersion"])

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self if self.started else self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def script_env(self) -> dict[str, str]:
        assert self.ports is not None
        env = {
            "K8S_BIN_DIR": str(self.binaries.directory),
            "ETCD_BIN": str(self.binaries.etcd),
            "K8S_CONTROLLER_MANAGER": "true" if self.controller_manager else "false",
            **self.ports.env(),
            **self._extender_env(self.extenders),
        }
        return {**env, **self.extra_env}

    @staticmethod
    def _extender_env(extenders: Sequence[ExtenderStanza]) -> dict[str, str]:
        if not extenders:
            return {"EXTENDER_ENABLED": "false", "K8S_SCHEDULER_EXTENDERS": ""}
        return {
            "EXTENDER_ENABLED": "true",
            "K8S_SCHEDULER_EXTENDERS": extenders_flow_list(extenders),
        }

    def start(self, timeout: float = 180.0) -> ControlPlane:
        reap_stale()
        if self._owns_directory:
            self.directory = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=tempfile.gettempdir()))
        self.directory.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        (self.directory / OWNER_FILE).write_text(f"{pid} {_process_start(pid)}\n")
        self.started = True
        try:
            if self.ports is None:
                self._reservation = reserve_ports(5)
                self.ports = ControlPlanePorts(*self._reservation.ports)
            self._run("k8s-up.sh", ["start", str(self.directory)], self.script_env(), timeout)
            self._values = read_env_file(self.directory / "env")
        except BaseException:
            self.stop()
            raise
        log.info("control plane up at %s (%s)", self.api_url, self.directory)
        return self

    def reconfigure_scheduler(
        self,
        extenders: Sequence[ExtenderStanza],
        timeout: float = 120.0,
        *,
        client_qps: int | None = None,
    ) -> None:
        """Restart kube-scheduler with these extender stanzas (the rest stays up);
        ``client_qps``: its API client's rate limit (qps and burst; None: the stock 50/100)."""
        self.extenders = tuple(extenders)
        env = self.script_env()
        if client_qps is not None:
            env.update(K8S_SCHEDULER_QPS=str(client_qps), K8S_SCHEDULER_BURST=str(client_qps))
        self._run("k8s-up.sh", ["reconfigure-scheduler", str(self.directory)], env, timeout)

    def stop_scheduler(self, timeout: float = 60.0) -> None:
        """Stop kube-scheduler alone: pods created meanwhile stay Pending until
        :meth:`reconfigure_scheduler` starts it again."""
        self._run("k8s-up.sh", ["stop-scheduler", str(self.directory)], self.script_env(), timeout)

    def _run(
        self, script: str, args: Sequence[str], env: Mapping[str, str], timeout: float
    ) -> None:
        run_script(script, args, env, self.directory / HARNESS_LOG, timeout)

    def stop(self, timeout: float = 120.0) -> None:
        """Stop the nodes started on it, then the control plane; idempotent."""
        if not self.started:
            return
        for node in list(self.nodes.values()):
            try:
                node.stop(timeout)
            except ClusterError as error:  # stop_directory tries it again
                log.warning("stopping node %s: %s", node.name, error)
        stop_directory(self.directory, timeout)
        if self.logs_kept_in is not None:
            self._keep_logs(self.logs_kept_in)
        if self._reservation is not None:
            self._reservation.release()
            self._reservation = None
            self.ports = None
        (self.directory / OWNER_FILE).unlink(missing_ok=True)
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
        self._values = {}
        self.started = False

    def _keep_logs(self, into: Path) -> None:
        copies = {"control-plane": self.logs_dir}
        copies.update((node.parent.name, node) for node in self.directory.glob("nodes/*/logs"))
        for name, logs in copies.items():
            try:
                shutil.copytree(logs, into / name, dirs_exist_ok=True)
            except OSError as error:  # a log is evidence, never a reason to fail a stop
                log.warning("keeping the logs of %s: %s", name, error)


GPU_NODE_KUBELET_CONFIG = """featureGates:
  ResourceHealthStatus: false
  ResourceHealthStatusMessage: false"""
"""What ``docs/node-agent.md`` recommends for a GPU node's kubelet with MiB units: without
it, the kubelet's device health check costs IDs × allocated IDs (tens of seconds, admission
blocked) after each kubelet restart or plugin re-registration."""


class RealNode:
    """A real kubelet (containerd, runc) registered as Node ``name``; needs root.

    Pods on it must be ``hostNetwork: true`` and use :attr:`test_image`
    (``localhost/busybox:1``) with ``imagePullPolicy: Never``. Device plugins register on
    :attr:`device_plugin_dir`; the pod-resources API is :attr:`pod_resources_socket`.
    """

    def __init__(
        self, control_plane: ControlPlane, name: str, *, env: Mapping[str, str] | None = None
    ) -> None:
        self.control_plane = control_plane
        self.name = name
        self.extra_env = dict(env or {})
        self._reservation: PortReservation | None = None
        self._values: dict[str, str] = {}
        self.started = False

    @property
    def directory(self) -> Path:
        return self.control_plane.directory / "nodes" / self.name

    @property
    def logs_dir(self) -> Path:
        return self.directory / "logs"

    @property
    def device_plugin_dir(self) -> Path:
        return Path(self._env("KUBELET_DEVICE_PLUGIN_DIR"))

    @property
    def pod_resources_socket(self) -> Path:
        return Path(self._env("KUBELET_POD_RESOURCES_SOCKET"))

    @property
    def containerd_address(self) -> Path:
        return Path(self._env("CONTAINERD_ADDRESS"))

    @property
    def endpoints(self) -> KubeletEndpoints:
        return KubeletEndpoints(self.device_plugin_dir, self.pod_resources_socket)

    def _env(self, key: str) -> str:
        if not self._values:
            raise RuntimeError(f"node {self.name} is not started")
        return self._values[key]

    def __enter__(self) -> RealNode:
        return self if self.started else self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _script_env(self) -> dict[str, str]:
        return {
            "K8S_BIN_DIR": str(self.control_plane.binaries.directory),
            **self.extra_env,
        }

    def start(self, timeout: float = 180.0) -> RealNode:
        if not self.control_plane.started:
            raise RuntimeError("start the control plane first")
        if self.name in self.control_plane.nodes:
            raise RuntimeError(f"node {self.name} already runs on this control plane")
        self.control_plane.nodes[self.name] = self
        self.started = True
        try:
            self._reservation = reserve_ports(2)
            kubelet, healthz = self._reservation.ports
            env = {
                **self._script_env(),
                "K8S_KUBELET_PORT": str(kubelet),
                "K8S_KUBELET_HEALTHZ_PORT": str(healthz),
            }
            self._run(["start", str(self.control_plane.directory), self.name], env, timeout)
            self._values = read_env_file(self.directory / "env")
        except BaseException:
            self.stop()
            raise
        log.info("real node %s up (%s)", self.name, self.directory)
        return self

    def restart_kubelet(self, timeout: float = 120.0) -> None:
        """SIGTERM the kubelet and start it again; containerd and the pods stay, device
        plugins must register again (the kubelet deletes their sockets)."""
        args = ["restart-kubelet", str(self.control_plane.directory), self.name]
        self._run(args, self._script_env(), timeout)

    def _run(self, args: Sequence[str], env: Mapping[str, str], timeout: float) -> None:
        log_file = self.control_plane.directory / HARNESS_LOG
        run_script("kubelet-up.sh", args, env, log_file, timeout)

    def stop(self, timeout: float = 120.0) -> None:
        """Stop the kubelet, every container and containerd; delete the Node; idempotent."""
        if not self.started:
            return
        try:
            args = ["stop", str(self.control_plane.directory), self.name]
            self._run(args, self._script_env(), timeout)
        finally:
            if self._reservation is not None:
                self._reservation.release()
                self._reservation = None
            self.control_plane.nodes.pop(self.name, None)
            self._values = {}
            self.started = False
